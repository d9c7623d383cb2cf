"""A participant's heartbeat: its report recorded, the movements it hosts paid for the time
since (`api.services.offers.accrue`), its load history kept, and what it answers: the change
notices not acknowledged yet and its partners' liveness (`api.services.changes`)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Row, bindparam, delete, insert, select, update
from sqlalchemy.orm import Session

from api import schemas
from api.auth import Principal
from api.errors import Forbidden
from api.models import Failover, LoadSample, Participant, Task
from api.services import changes, events, offers, participants

# The heartbeat's statements, built once: it is the registry's most frequent request, and
# building a statement costs more CPU than running it.
_tasks, _samples = Task.__table__, LoadSample.__table__
_REPORT_LOADS = (
    update(_tasks).where(_tasks.c.id == bindparam("task_id"), _tasks.c.host_id == bindparam("host")).values(load=bindparam("load"))
)
_ADD_SAMPLE = insert(_samples)
_TRIM_SAMPLES = delete(_samples).where(_samples.c.participant_id == bindparam("host"), _samples.c.at < bindparam("before"))


def heartbeat(session: Session, caller: Principal, name: str, body: schemas.Heartbeat, now: datetime,
              timeout_s: float | None = None) -> Participant:
    """Record the participant's load report, in a fixed number of statements however many
    tasks it reports (an agent's heartbeat is the registry's most frequent request). A
    heartbeat after a silence past `timeout_s` is recorded as the participant being
    reachable again (`participant.healed`)."""
    mine = caller.participant is not None and caller.participant.name == name
    participant = caller.participant if mine else participants.get(session, name)
    if not mine:
        raise Forbidden(f"only {name} may send its heartbeat")
    previous = participant.heartbeat_at
    if previous is not None and timeout_s is not None and (now - previous).total_seconds() > timeout_s:
        _healed(session, participant, previous, now)
    participant.heartbeat_at = now
    participant.load = body.load
    participant.threshold = body.threshold
    participant.marginal_cost = body.marginal_cost
    participant.report = {"tasks": [t.model_dump() for t in body.tasks], **body.details}
    reported = {t.task_id: t.load for t in body.tasks}
    if reported:
        # Only the current host's measurement counts; a stale report about a task that moved is ignored.
        # The movements of a task are paid on what its host measures, not what the mover declared.
        session.connection().execute(_REPORT_LOADS, [{"task_id": t, "load": load, "host": participant.id} for t, load in sorted(reported.items())])
        offers.accrue(session, participant, reported, body.load, now)
    connection = session.connection()
    connection.execute(_ADD_SAMPLE, {"participant_id": participant.id, "at": now, "load": body.load, "threshold": body.threshold})
    if previous is None or int(previous.timestamp() // 60) != int(now.timestamp() // 60):  # trimmed once a minute
        connection.execute(_TRIM_SAMPLES, {"host": participant.id, "before": now - participants.SAMPLE_RETENTION})
    session.flush()
    return participant


def _healed(session: Session, participant: Participant, silent_since: datetime, now: datetime) -> None:
    """Record that `participant`, silent since `silent_since` (crashed, or cut off by a
    partition: the registry cannot tell), is heard from again, and what was failed over
    from it meanwhile: tasks it no longer hosts, whose output its epoch may no longer write."""
    lost = session.execute(
        select(Failover.task_id, Failover.to_epoch, Task.name)
        .join(Task, Task.id == Failover.task_id)
        .where(Failover.failed_id == participant.id, Failover.kind == "failover", Failover.detected_at >= silent_since)
        .order_by(Failover.id)
    ).all()
    gap = (now - silent_since).total_seconds()
    taken = f"; failed over from it meanwhile: {', '.join(f'#{t} {n} (now epoch {e})' for t, e, n in lost)}" if lost else ""
    events.record(
        session, "participant.healed", f"{participant.name} is reachable again after {gap:.1f} s of silence{taken}",
        actor=participant.name, subject=participant.name,
        data={"silent_s": round(gap, 3), "failed_over_task_ids": [t for t, _, _ in lost]}, at=now,
    )


def feed(session: Session, participant: Participant, acknowledged: list[int]) -> tuple[list[Row], list[Row]]:
    """The participant's unacknowledged change notices, `(id, kind)` (after deleting those
    acknowledged), and the participants whose liveness concerns it, `(name, heartbeat_at)`
    (`api.services.changes`)."""
    return changes.pending(session, participant.id, acknowledged), changes.partners(session, participant.id)
