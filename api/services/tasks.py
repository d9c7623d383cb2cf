"""Tasks: registered by their origin, which hosts them until an accepted offer moves them."""

from __future__ import annotations

from datetime import datetime
from urllib.parse import urlsplit

from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, joinedload, selectinload

from api import schemas
from api.auth import Principal
from api.errors import Conflict, Forbidden, Invalid, NotFound
from api.models import Participant, Task, TaskLineage
from api.pages import PageQuery
from api.services import changes, events, participants
from bpm.keygroups import KeyGroupError, StreamLocation, halves, merged, parse_location


def register(session: Session, caller: Principal, body: schemas.TaskCreate) -> Task:
    me = caller.require_participant()
    where = None
    if body.input_uri:  # a task names its origin's broker stream, or no input at all (a simulated participant's)
        where = _location(body.input_uri)
        if where.participant != me.name:
            raise Invalid(f"a task of {me.name}'s reads {me.name}'s own stream, not {where.participant}'s: {body.input_uri}")
        _on_own_host(where, me)
    taken = session.scalar(select(Task.id).where(Task.origin_id == me.id, Task.name == body.name))
    if taken is not None:
        raise Conflict(f"{me.name} already has a task named {body.name!r} (#{taken})", task_id=taken)
    parents = _parents(session, me, body.from_tasks, where)
    if bool(parents) != (body.since_s is not None):
        raise Invalid("since_s comes with from_tasks: a task a split or merge makes starts where the tasks it came from end")
    differs = [p for p in parents if (p.query, p.query_digest) != (body.query, body.query_digest)]
    if differs:
        raise Invalid(f"a task a split or merge makes runs the query of the tasks it came from: #{differs[0].id} runs "
                      f"{differs[0].query or 'none'} ({differs[0].query_digest or 'no digest'}), not {body.query or 'none'} ({body.query_digest or 'no digest'})")
    task = Task(
        name=body.name,
        origin=me,
        host=me,
        load=body.load,
        input_uri=body.input_uri,
        params=body.params,
        query=body.query,
        query_digest=body.query_digest,
        ha_mode=body.ha_mode,
        since_s=body.since_s,
    )
    session.add(task)
    session.flush()
    if parents:
        _end_inputs(session, parents, body.since_s)
        try:
            with session.begin_nested():
                session.add_all(TaskLineage(child_id=task.id, parent_id=p.id, groups=where.prefix) for p in parents)
        except IntegrityError:  # a concurrent registration took the same share first
            raise Conflict(f"key groups {where.prefix!r} of task(s) {body.from_tasks} were handed over already") from None
        session.expire(task, ["lineage"])
    changes.task_changed(session, [task.id])
    how = f" from task(s) {', '.join(f'#{p.id}' for p in parents)}" if parents else ""
    events.record(session, "task.registered", f"{me.name} registered task #{task.id} {body.name}{how}", actor=me.name,
                  data={"task_id": task.id, "from_tasks": [p.id for p in parents]})
    return task


def _location(uri: str) -> StreamLocation:
    try:
        return parse_location(uri)
    except ValueError as exc:
        raise Invalid(str(exc)) from None


def _on_own_host(where: StreamLocation, me: Participant) -> None:
    """Refuse a broker that is not on the origin's own host, the one its endpoint names: a
    partner's agent connects to a task's broker, and a hostile origin would otherwise point it
    at any address its network reaches."""
    broker, agent = urlsplit(where.url).hostname, urlsplit(me.endpoint).hostname
    if broker is None or agent is None or broker.lower() != agent.lower():
        raise Invalid(f"a task's broker runs on its origin's own host: {where.url} is not on {agent}, the host of {me.name}'s endpoint {me.endpoint}")


def _parents(session: Session, me: Participant, ids: list[int], where: StreamLocation | None) -> list[Task]:
    """The tasks a new task of `me`'s over `where` comes from: one whose key groups it halves
    (a split), or two halves whose share it is (a merge), all `me`'s, on the same stream."""
    if not ids:
        return []
    if len(set(ids)) != len(ids):
        raise Invalid(f"from_tasks names a task twice: {ids}")
    if where is None:
        raise Invalid("a task made by a split or a merge reads its origin's stream: input_uri is required")
    parents = [get(session, i) for i in ids]
    groups = []
    for parent in parents:
        if parent.origin_id != me.id:
            raise Forbidden(f"task #{parent.id} is {parent.origin.name}'s: a task comes only from its origin's own tasks")
        stream = _location(parent.input_uri) if parent.input_uri else None
        if stream is None or (stream.url, stream.participant, stream.input) != (where.url, where.participant, where.input):
            raise Invalid(f"task #{parent.id} does not read the stream {where.url}/{where.participant}, input {where.input}")
        groups.append(stream.prefix)
    try:
        ok = where.prefix in halves(groups[0]) if len(groups) == 1 else merged(*groups) == where.prefix
    except KeyGroupError as exc:
        raise Invalid(str(exc)) from None
    if not ok:
        made = "a half of" if len(groups) == 1 else "the share made by"
        raise Invalid(f"key groups {where.prefix!r} are not {made} key groups {' and '.join(map(repr, groups))} of task(s) {ids}")
    return parents


def _end_inputs(session: Session, parents: list[Task], at: int) -> None:
    """The tasks a split or merge hands key groups over from end their input at `at`: each at
    one time only, at home, not retired, and after its own span starts. One conditional
    update each, so that two concurrent registrations cannot end a task at two times, nor
    a movement take it away meanwhile (an offer's acceptance moves only tasks not ending)."""
    for parent in parents:
        if parent.since_s is not None and at <= parent.since_s:
            raise Invalid(f"task #{parent.id} starts at {parent.since_s}: it cannot hand its key groups over at {at}")
        ended = session.execute(
            update(Task)
            .where(Task.id == parent.id, Task.host_id == Task.origin_id, Task.retired_at.is_(None),
                   or_(Task.until_s.is_(None), Task.until_s == at))
            .values(until_s=at)
            .execution_options(synchronize_session=False)
        ).rowcount
        if not ended:
            session.refresh(parent)
            why = (f"it runs at {parent.host.name}, not at home" if parent.host_id != parent.origin_id
                   else "it is retired" if parent.retired_at is not None else f"it ends at {parent.until_s} already")
            raise Conflict(f"task #{parent.id} cannot hand its key groups over at {at}: {why}", task_id=parent.id)
        session.expire(parent, ["until_s"])


def retire(session: Session, caller: Principal, task_id: int, now: datetime) -> Task:
    """The origin retires a task that handed its key groups over, once its last window is out:
    it runs nowhere again (its host stops it). 409 when its input has not ended or it is
    retired already; 403 for another's task."""
    me = caller.require_participant()
    task = get(session, task_id)
    if task.origin_id != me.id:
        raise Forbidden(f"task #{task.id} is {task.origin.name}'s: only its origin retires it")
    retired = session.execute(
        update(Task)
        .where(Task.id == task.id, Task.until_s.is_not(None), Task.retired_at.is_(None))
        .values(retired_at=now)
        .execution_options(synchronize_session=False)
    ).rowcount
    session.refresh(task)
    if not retired:
        why = "it is retired already" if task.retired_at is not None else "its input has not ended: it hands no key groups over"
        raise Conflict(f"task #{task.id} cannot retire: {why}", task_id=task.id)
    changes.task_changed(session, [task.id])
    events.record(session, "task.retired", f"{me.name} retired task #{task.id} {task.name}: its windows until {task.until_s} are out",
                  actor=me.name, data={"task_id": task.id, "until_s": task.until_s})
    return task


def get(session: Session, task_id: int) -> Task:
    task = session.get(Task, task_id)
    if task is None:
        raise NotFound(f"no task #{task_id}")
    return task


def list_tasks(session: Session, host: str | None, origin: str | None, involving: str | None = None, page: PageQuery | None = None) -> list[Task]:
    """Tasks (with their origin and host loaded in the same statement, their lineage in one
    more), filtered by host, origin, or the participant they concern (`changes.involved_tasks`)."""
    query = select(Task).options(joinedload(Task.origin), joinedload(Task.host), selectinload(Task.lineage))
    if involving:
        query = query.where(Task.id.in_(changes.involved_tasks(participants.get(session, involving).id)))
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
        query=task.query,
        query_digest=task.query_digest,
        ha_mode=task.ha_mode,
        epoch=task.epoch,
        from_tasks=[link.parent_id for link in task.lineage],
        since_s=task.since_s,
        until_s=task.until_s,
        retired=task.retired_at is not None,
    )
