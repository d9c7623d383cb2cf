"""Tasks: registered by their origin, which hosts them until an accepted offer moves them."""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, joinedload

from api import schemas
from api.auth import Principal
from api.errors import Conflict, Invalid, NotFound
from api.models import Replica, Task
from api.pages import PageQuery
from api.services import changes, events, participants
from bpm.keygroups import parse_location


def register(session: Session, caller: Principal, body: schemas.TaskCreate) -> Task:
    me = caller.require_participant()
    if body.input_uri:  # a task names its origin's broker stream, or no input at all (a simulated participant's)
        try:
            where = parse_location(body.input_uri)
        except ValueError as exc:
            raise Invalid(str(exc)) from None
        if where.participant != me.name:
            raise Invalid(f"a task of {me.name}'s reads {me.name}'s own stream, not {where.participant}'s: {body.input_uri}")
    taken = session.scalar(select(Task.id).where(Task.origin_id == me.id, Task.name == body.name))
    if taken is not None:
        raise Conflict(f"{me.name} already has a task named {body.name!r} (#{taken})", task_id=taken)
    task = Task(
        name=body.name,
        origin=me,
        host=me,
        load=body.load,
        input_uri=body.input_uri,
        params=body.params,
        ha_mode=body.ha_mode,
    )
    session.add(task)
    session.flush()
    changes.task_changed(session, [task.id])
    events.record(session, "task.registered", f"{me.name} registered task #{task.id} {body.name}", actor=me.name, data={"task_id": task.id})
    return task


def get(session: Session, task_id: int) -> Task:
    task = session.get(Task, task_id)
    if task is None:
        raise NotFound(f"no task #{task_id}")
    return task


def involved_tasks(participant_id: int):
    """Ids of tasks a participant originates, hosts or holds a replica of: what concerns it."""
    held = select(Replica.task_id).where(Replica.participant_id == participant_id)
    return select(Task.id).where(or_(Task.origin_id == participant_id, Task.host_id == participant_id, Task.id.in_(held)))


def list_tasks(session: Session, host: str | None, origin: str | None, involving: str | None = None, page: PageQuery | None = None) -> list[Task]:
    """Tasks (with their origin and host loaded in the same statement), filtered by host,
    origin, or the participant they concern (`involved_tasks`)."""
    query = select(Task).options(joinedload(Task.origin), joinedload(Task.host))
    if involving:
        query = query.where(Task.id.in_(involved_tasks(participants.get(session, involving).id)))
    if host:
        query = query.where(Task.host_id == participants.get(session, host).id)
    if origin:
        query = query.where(Task.origin_id == participants.get(session, origin).id)
    return (page or PageQuery.whole()).rows(session, query, Task.id)


def to_out(task: Task) -> schemas.TaskOut:
    return schemas.TaskOut(
        id=task.id,
        name=task.name,
        origin=task.origin.name,
        host=task.host.name,
        away=task.host_id != task.origin_id,
        load=task.load,
        input_uri=task.input_uri,
        params=task.params,
        ha_mode=task.ha_mode,
        epoch=task.epoch,
    )
