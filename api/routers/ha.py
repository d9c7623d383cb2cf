from __future__ import annotations

from fastapi import Request

from api import schemas
from api.deps import Caller, DbSession, Now
from api.services import ha as service
from api.routing import Router

router = Router(tags=["high availability"])


@router.get("/replicas", response_model=list[schemas.ReplicaOut])
def list_replicas(session: DbSession, caller: Caller, task_id: schemas.IdQuery = None, participant: schemas.NameQuery = None):
    """Replicas of the tasks that concern the caller (all, for the operator), by task then id."""
    return [service.replica_out(r) for r in service.list_replicas(session, caller, task_id, participant)]


@router.post("/tasks/{task_id}/replicas", status_code=201, response_model=schemas.ReplicaCreated)
def create_replica(task_id: schemas.IdPath, body: schemas.ReplicaCreate, session: DbSession, caller: Caller, now: Now):
    """Place a standby of the task at another participant (the task's origin or host only)."""
    replica, repair = service.create_replica(session, caller, task_id, body, now)
    return service.replica_out(replica, schemas.ReplicaCreated, repair_id=repair.id if repair else None)


@router.post("/replicas/{replica_id}/sync", response_model=schemas.ReplicaOut)
def sync_replica(replica_id: schemas.IdPath, body: schemas.ReplicaSync, session: DbSession, caller: Caller, now: Now):
    """Record a checkpoint copy or a replica's batch (holder or host); 409 for an older epoch."""
    return service.replica_out(service.sync_replica(session, caller, replica_id, body, now))


@router.post("/replicas/{replica_id}/drop", response_model=schemas.ReplicaOut)
def drop_replica(replica_id: schemas.IdPath, session: DbSession, caller: Caller, now: Now):
    """Stop keeping a replica (the task's origin, its host or the holder)."""
    return service.replica_out(service.drop_replica(session, caller, replica_id, now))


@router.post("/tasks/{task_id}/failover", status_code=201, response_model=schemas.FailoverOut)
def failover(task_id: schemas.IdPath, body: schemas.FailoverCreate, request: Request, session: DbSession, caller: Caller, now: Now):
    """Move the task off its failed host to a live participant (origin or replica holder; first valid request wins)."""
    record = service.failover(session, caller, task_id, body, now, request.app.state.settings.heartbeat_timeout_s)
    return service.failover_out(record)


@router.post("/failovers/{failover_id}/complete", response_model=schemas.FailoverOut)
def complete_failover(failover_id: schemas.IdPath, session: DbSession, caller: Caller, now: Now, body: schemas.FailoverComplete | None = None):
    """Record the recovery of a failover or repair (the new host, the task's host or the operator)."""
    return service.failover_out(service.complete(session, caller, failover_id, body or schemas.FailoverComplete(), now))


@router.get("/failovers", response_model=list[schemas.FailoverOut])
def list_failovers(session: DbSession, caller: Caller, task_id: schemas.IdQuery = None):
    """Failovers and repairs of the tasks that concern the caller (all, for the operator), oldest first."""
    return [service.failover_out(f) for f in service.list_failovers(session, caller, task_id)]
