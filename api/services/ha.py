"""High availability of moved tasks: replicas, failovers and repairs as the registry records them.

The registry does not detect failures by itself or choose who takes over (the agents
decide with `bpm.ha`); it holds the facts and enforces the rules that make acting on
them safe without consensus:

- A failover is allowed only when the host is silent past the heartbeat timeout, only to
  a live participant, and only for the epoch the caller saw: the host change is a
  conditional `UPDATE ... WHERE epoch = expected`, so of two racing requests exactly one
  wins and the other gets 409, as with offers.
- The epoch is the fence. A host that comes back after a failover holds an older epoch:
  its replica syncs are refused, and its heartbeat shows it no longer hosts the task.
- Writes that check the task's host or epoch lock its row first, so they serialise with
  a failover on PostgreSQL too (SQLite serialises all writers anyway).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import case, func, or_, select, union, update
from sqlalchemy.orm import Session

from api import schemas
from api.auth import Principal
from api.errors import Conflict, Forbidden, Invalid, NotFound
from api.models import Contract, Failover, Movement, Participant, Replica, Task
from api.services import changes, contracts, events, participants
from bpm.ha import REPLICATED_MODES, is_failed, task_mode
from bpm.negotiation import MovementState


def task_label(task: Task) -> str:
    return f"{task.origin.name}.{task.name}"


def _locked_task(session: Session, task_id: int) -> Task:
    """The task, its row locked until the transaction ends, read after the lock was granted.

    Only the id is selected `FOR UPDATE`: PostgreSQL re-checks a locked row that changed
    meanwhile without re-joining the others, so a joined host would read as missing.
    """
    if session.scalar(select(Task.id).where(Task.id == task_id).with_for_update()) is None:
        raise NotFound(f"no task #{task_id}")
    return session.get(Task, task_id, populate_existing=True)


def mode_of(session: Session, task: Task) -> str:
    """The task's HA mode now (`bpm.ha.task_mode`, the rule the agents use too): the mode of
    the failover that put it where it is, else its own, else the mode of the contract it
    moved under while that movement runs or after it failed."""
    movement = session.execute(
        select(Movement.state, Contract.ha_mode).join(Contract, Contract.id == Movement.contract_id)
        .where(Movement.task_id == task.id).order_by(Movement.id.desc()).limit(1)
    ).first()
    took = session.scalar(
        select(Failover.mode).where(Failover.task_id == task.id, Failover.kind == "failover", Failover.to_epoch == task.epoch)
        .order_by(Failover.id.desc()).limit(1)
    )
    return task_mode(task.ha_mode, movement_state=None if movement is None else movement.state,
                     contract_mode=None if movement is None else movement.ha_mode, failover_mode=took)


def may_keep(session: Session, task: Task, participant: Participant, now: datetime, what: str) -> None:
    """A task's replicas and failovers go only to its origin or to a participant holding a
    contract in force with the origin: nobody else has agreed to keep or run it."""
    if participant.id == task.origin_id:
        return
    contract = contracts.active_between(session, task.origin_id, participant.id)
    if contract is None or not contracts.in_force(contract, now):
        raise Forbidden(f"{participant.name} has no contract in force with task #{task.id}'s origin {task.origin.name}; {what}")


# Replicas


def list_replicas(session: Session, caller: Principal, task_id: int | None, participant: str | None) -> list[Replica]:
    query = select(Replica).order_by(Replica.task_id, Replica.id)
    if not caller.is_operator:
        query = query.where(replicas_concerning(caller.participant.id))
    if task_id is not None:
        query = query.where(Replica.task_id == task_id)
    if participant:
        query = query.where(Replica.participant_id == participants.get(session, participant).id)
    return list(session.scalars(query))


def _get_replica(session: Session, replica_id: int) -> Replica:
    replica = session.get(Replica, replica_id)
    if replica is None:
        raise NotFound(f"no replica #{replica_id}")
    return replica


def _live_replica(session: Session, task_id: int, participant_id: int) -> Replica | None:
    return session.scalar(
        select(Replica).where(
            Replica.task_id == task_id, Replica.participant_id == participant_id, Replica.state != "dropped"
        )
    )


def create_replica(
    session: Session, caller: Principal, task_id: int, body: schemas.ReplicaCreate, now: datetime
) -> tuple[Replica, Failover | None]:
    """A new standby of the task at `body.participant`, by the task's origin or host.

    With `repair_of` (a failover of this task) a repair record is written too: the
    replica restores the replication level that failover lost.
    """
    me = caller.require_participant()
    task = _locked_task(session, task_id)
    if me.id not in (task.origin_id, task.host_id):
        raise Forbidden(f"only task #{task.id}'s origin {task.origin.name} or its host {task.host.name} may place its replicas")
    mode = mode_of(session, task)
    role = body.role or (mode if mode in REPLICATED_MODES else None)
    if role is None:
        raise Invalid(f"task #{task.id}'s HA mode is {mode}, which keeps no replica; give a role to place one anyway")
    holder = participants.get(session, body.participant)
    may_keep(session, task, holder, now, "a replica lives only at the origin or a contract partner of it")
    if holder.id == task.host_id:
        raise Conflict(f"{holder.name} hosts task #{task.id}; a replica must live elsewhere")
    existing = _live_replica(session, task.id, holder.id)
    if existing is not None:
        raise Conflict(
            f"{holder.name} already holds replica #{existing.id} of task #{task.id} ({existing.state}); drop it first",
            replica_id=existing.id,
        )
    lost = None
    if body.repair_of is not None:
        lost = session.get(Failover, body.repair_of)
        if lost is None or lost.task_id != task.id:
            raise NotFound(f"no failover #{body.repair_of} of task #{task.id}")
    replica = Replica(
        task_id=task.id,
        participant_id=holder.id,
        role=role,
        state="active",
        epoch=task.epoch,
        bytes_copied=0,
        created_at=now,
        updated_at=now,
    )
    session.add(replica)
    session.flush()
    repair = None
    if lost is not None:
        repair = Failover(
            task_id=task.id,
            kind="repair",
            mode=mode,
            failed_id=lost.failed_id,
            from_host_id=task.host_id,
            to_host_id=holder.id,
            from_epoch=task.epoch,
            to_epoch=task.epoch,
            reason=f"replication level restored after failover #{lost.id}",
            detected_at=now,
            started_at=now,
            details={"repair_of": lost.id, "replica_id": replica.id, "role": role},
        )
        session.add(repair)
        session.flush()
    changes.task_changed(session, [task.id])
    events.record(
        session,
        "replica.created",
        f"{me.name} placed a {role} replica (#{replica.id}) of task #{task.id} {task_label(task)} at {holder.name}"
        + (f", repairing failover #{lost.id}" if lost is not None else ""),
        actor=me.name,
        subject=holder.name,
        data={"replica_id": replica.id, "task_id": task.id, "role": role, "repair_id": repair.id if repair else None},
        at=now,
    )
    return replica, repair


def sync_replica(session: Session, caller: Principal, replica_id: int, body: schemas.ReplicaSync, now: datetime) -> Replica:
    """Record a copy (passive) or a batch (active) at the replica, by its holder or the task's host."""
    me = caller.require_participant()
    replica = _get_replica(session, replica_id)
    task = _locked_task(session, replica.task_id)
    session.refresh(replica)  # after the lock: a failover that committed meanwhile is seen
    if me.id not in (replica.participant_id, task.host_id):
        raise Forbidden(f"only replica #{replica.id}'s holder {replica.participant.name} or task #{task.id}'s host may sync it")
    if replica.state != "active":
        raise Conflict(f"replica #{replica.id} is {replica.state}", state=replica.state)
    if body.epoch < task.epoch:
        raise Conflict(
            f"epoch {body.epoch} is older than task #{task.id}'s epoch {task.epoch}: the writer was fenced off by a change of host",
            epoch=task.epoch,
            host=task.host.name,
        )
    if body.epoch > task.epoch:
        raise Invalid(f"epoch {body.epoch} is newer than task #{task.id}'s epoch {task.epoch}")
    replica.epoch = body.epoch
    if body.position is not None:
        replica.position = body.position
    replica.bytes_copied += body.bytes_copied or 0
    replica.synced_at = now
    replica.updated_at = now
    session.flush()
    return replica


def drop_replica(session: Session, caller: Principal, replica_id: int, now: datetime) -> Replica:
    """Stop keeping the replica, by the task's origin, its host or the holder."""
    me = caller.require_participant()
    replica = _get_replica(session, replica_id)
    task = replica.task
    if me.id not in (task.origin_id, task.host_id, replica.participant_id):
        raise Forbidden(f"only task #{task.id}'s origin, its host or the holder may drop replica #{replica.id}")
    changed = session.execute(
        update(Replica)
        .where(Replica.id == replica.id, Replica.state != "dropped")
        .values(state="dropped", updated_at=now)
        .execution_options(synchronize_session=False)
    ).rowcount
    if changed != 1:
        raise Conflict(f"replica #{replica.id} is already dropped")
    session.refresh(replica)
    changes.task_changed(session, [task.id])
    events.record(
        session,
        "replica.dropped",
        f"{me.name} dropped replica #{replica.id} of task #{task.id} {task_label(task)} at {replica.participant.name}",
        actor=me.name,
        subject=replica.participant.name,
        data={"replica_id": replica.id, "task_id": task.id},
        at=now,
    )
    return replica


def replica_out(replica: Replica, cls=schemas.ReplicaOut, **extra) -> schemas.ReplicaOut:
    return cls(
        id=replica.id,
        task_id=replica.task_id,
        task=task_label(replica.task),
        participant=replica.participant.name,
        role=replica.role,
        state=replica.state,
        epoch=replica.epoch,
        position=replica.position,
        synced_at=replica.synced_at,
        bytes_copied=replica.bytes_copied,
        created_at=replica.created_at,
        updated_at=replica.updated_at,
        **extra,
    )


# Failovers


def failover(
    session: Session, caller: Principal, task_id: int, body: schemas.FailoverCreate, now: datetime, timeout_s: float
) -> Failover:
    """Move the task from its failed host to `body.to`, by its origin or a live replica holder.

    No consensus: the first valid request for the epoch wins. The task's running movement
    ends as failed (its payments stop now), the replica at the new host is promoted and
    those at the failed host are marked failed.
    """
    me = caller.require_participant()
    task = _locked_task(session, task_id)
    # The epoch first: every loser of a race learns that it lost, whatever the winner changed.
    if body.expected_epoch != task.epoch:
        raise Conflict(
            f"task #{task.id} is at epoch {task.epoch}, not {body.expected_epoch}: its host changed meanwhile",
            epoch=task.epoch,
            host=task.host.name,
        )
    holds = session.scalar(
        select(Replica.id).where(Replica.task_id == task.id, Replica.participant_id == me.id, Replica.state == "active")
    )
    if me.id != task.origin_id and holds is None:
        raise Forbidden(f"only task #{task.id}'s origin {task.origin.name} or a holder of a live replica may fail it over")
    failed = task.host
    status, age = participants.liveness(failed, now, timeout_s)
    if not is_failed(status):
        raise Conflict(f"task #{task.id}'s host {failed.name} is {status}; failover needs it suspected or failed", status=status)
    target = participants.get(session, body.to)
    may_keep(session, task, target, now, "a task fails over only to its origin or a contract partner of it")
    to_status, _ = participants.liveness(target, now, timeout_s)
    if to_status != "alive":
        raise Conflict(f"{target.name} is {to_status}; a task fails over only to a live participant", status=to_status)
    mode = mode_of(session, task)
    moved = session.execute(
        update(Task)
        .where(Task.id == task.id, Task.epoch == body.expected_epoch, Task.host_id == failed.id)
        .values(host_id=target.id, epoch=body.expected_epoch + 1)
        .execution_options(synchronize_session=False)
    ).rowcount
    if moved != 1:
        raise Conflict(f"task #{task.id} changed host or epoch meanwhile; nothing failed over")
    session.refresh(task)
    ended = list(
        session.scalars(select(Movement.id).where(Movement.task_id == task.id, Movement.state == MovementState.ACTIVE))
    )
    if ended:
        # Every movement of the chain stops now: each payer pays up to now and no further, both sides together.
        session.execute(
            update(Movement)
            .where(Movement.id.in_(ended), Movement.state == MovementState.ACTIVE)
            .values(state=MovementState.FAILED, ended_at=now, ended_by_id=me.id)
            .execution_options(synchronize_session=False)
        )
    promoted = list(
        session.scalars(
            select(Replica.id).where(Replica.task_id == task.id, Replica.participant_id == target.id, Replica.state == "active")
        )
    )
    lost = list(
        session.scalars(
            select(Replica.id).where(
                Replica.task_id == task.id, Replica.participant_id == failed.id, Replica.state.in_(("active", "promoted"))
            )
        )
    )
    for ids, state in ((promoted, "promoted"), (lost, "failed")):
        if ids:
            session.execute(
                update(Replica).where(Replica.id.in_(ids)).values(state=state, updated_at=now).execution_options(synchronize_session=False)
            )
    record = Failover(
        task_id=task.id,
        kind="failover",
        mode=mode,
        failed_id=failed.id,
        from_host_id=failed.id,
        to_host_id=target.id,
        from_epoch=body.expected_epoch,
        to_epoch=task.epoch,
        reason=body.reason,
        detected_at=now,
        started_at=failed.heartbeat_at + timedelta(seconds=timeout_s),
        details={
            "requested_by": me.name,
            "heartbeat_age_s": age,
            "failed_movement_ids": ended,
            "promoted_replica_ids": promoted,
            "failed_replica_ids": lost,
        },
    )
    session.add(record)
    session.flush()
    chain = session.execute(select(Movement.from_id, Movement.to_id).where(Movement.id.in_(ended))).all() if ended else []
    changes.task_changed(session, [task.id], failed.id, *(p for pair in chain for p in pair))
    events.record(
        session,
        "task.failover",
        f"{me.name} failed task #{task.id} {task_label(task)} over from {failed.name} (unreachable: silent {age:.1f} s, {status}) "
        f"to {target.name} ({mode}); epoch {body.expected_epoch} -> {task.epoch}"
        + (f": {body.reason}" if body.reason else ""),
        actor=me.name,
        subject=failed.name,
        data={"failover_id": record.id, "task_id": task.id, "to": target.name, "mode": mode, "epoch": task.epoch},
        at=now,
    )
    return record


def complete(session: Session, caller: Principal, failover_id: int, body: schemas.FailoverComplete, now: datetime) -> Failover:
    """Record that the task produces output again (failover) or the new replica holds a copy (repair).

    By the new host (`to_host`), the task's current host, or the operator. Without
    `recovery_s` the registry counts from `started_at` to now.
    """
    record = session.get(Failover, failover_id)
    if record is None:
        raise NotFound(f"no failover #{failover_id}")
    if not caller.is_operator and caller.participant.id not in (record.to_host_id, record.task.host_id):
        raise Forbidden(f"only {record.to_host.name} or task #{record.task_id}'s host may complete {record.kind} #{record.id}")
    rewritten = sorted(k for k, v in (body.details or {}).items() if k in record.details and record.details[k] != v)
    if rewritten:  # what the registry recorded at the failover (its replicas, movements, requester) others act on
        raise Invalid(f"{record.kind} #{record.id}'s details {rewritten} were recorded when it began; completing it adds details, it does not change them")
    recovery = body.recovery_s if body.recovery_s is not None else max(0.0, (now - record.started_at).total_seconds())
    changed = session.execute(
        update(Failover)
        .where(Failover.id == record.id, Failover.completed_at.is_(None))
        .values(completed_at=now, recovery_s=recovery, details={**record.details, **(body.details or {})})
        .execution_options(synchronize_session=False)
    ).rowcount
    if changed != 1:
        raise Conflict(f"{record.kind} #{record.id} is already complete")
    session.refresh(record)
    changes.task_changed(session, [record.task_id])
    events.record(
        session,
        "failover.completed",
        f"{caller.name} completed {record.kind} #{record.id} of task #{record.task_id} {task_label(record.task)} "
        f"at {record.to_host.name}: recovery {recovery:.2f} s",
        actor=caller.name,
        subject=record.failed.name if record.failed else None,
        data={"failover_id": record.id, "task_id": record.task_id, "kind": record.kind, "recovery_s": recovery},
        at=now,
    )
    return record


def failovers_concerning(me: int, *columns):
    """The failovers participant `me` may read (their ids, or `columns` of them): of tasks it
    is involved in, or with it failed, left or taken to. A union of index lookups, for the
    reason `changes.involved_tasks` gives."""
    columns = columns or (Failover.id,)
    return union(
        select(*columns).where(Failover.task_id.in_(changes.involved_tasks(me))),
        select(*columns).where(Failover.failed_id == me),
        select(*columns).where(Failover.from_host_id == me),
        select(*columns).where(Failover.to_host_id == me),
    )


def replicas_concerning(me: int):
    """The replicas participant `me` may read: of the tasks it is involved in."""
    return Replica.task_id.in_(changes.involved_tasks(me))


def failovers_in_view(session: Session, participant_id: int) -> list[Failover]:
    """The failovers in a participant's view: of those it may read (`failovers_concerning`),
    each task's newest failover and the records after it (the repairs of it), and any not
    complete. That is all its agent decides on (where a failover put a task:
    `bpm.federation.views.current_failover`; whether the copy it lost was made again:
    `bpm.ha.machine.unrepaired_failover`; the repairs and failovers underway), however many
    the task has had; the whole history is `list_failovers`'. The ids first, then the
    records by id: in one statement PostgreSQL planned the records' joins for a whole
    table's rows."""
    seen = failovers_concerning(participant_id, Failover.id, Failover.task_id, Failover.kind, Failover.completed_at).subquery()
    newest = func.max(case((seen.c.kind == "failover", seen.c.id))).over(partition_by=seen.c.task_id)
    ranked = select(seen.c.id, seen.c.completed_at, newest.label("newest")).subquery()
    ids = session.scalars(select(ranked.c.id).where(or_(ranked.c.id >= ranked.c.newest, ranked.c.completed_at.is_(None)))).all()
    return list(session.scalars(select(Failover).where(Failover.id.in_(ids)).order_by(Failover.id)))


def list_failovers(session: Session, caller: Principal, task_id: int | None) -> list[Failover]:
    query = select(Failover).order_by(Failover.id)
    if not caller.is_operator:
        query = query.where(Failover.id.in_(failovers_concerning(caller.participant.id)))
    if task_id is not None:
        query = query.where(Failover.task_id == task_id)
    return list(session.scalars(query))


def failover_out(record: Failover) -> schemas.FailoverOut:
    return schemas.FailoverOut(
        id=record.id,
        task_id=record.task_id,
        task=task_label(record.task),
        kind=record.kind,
        mode=record.mode,
        failed=record.failed.name if record.failed else None,
        from_host=record.from_host.name,
        to_host=record.to_host.name,
        from_epoch=record.from_epoch,
        to_epoch=record.to_epoch,
        reason=record.reason,
        detected_at=record.detected_at,
        started_at=record.started_at,
        completed_at=record.completed_at,
        recovery_s=record.recovery_s,
        details=record.details,
        at=record.detected_at,
    )

