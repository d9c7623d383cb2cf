"""The high-availability effects of a participant's agent (docs/ha.md, "In the federation").

What to do is decided by `bpm.ha.machine.HAMachine` (through the participant's one machine,
`bpm.agent.participant`) from what the agent last read of the
registry and what runs here; this module executes its instructions: registry calls
(failover, replicas, repairs), the data-plane work of `spark_agents.ha`'s building blocks
reached through the agent's task host (`SparkTasks` in `spark_agents.runtime`, a stepped
fake in tests), and the files a holder keeps. It also does what only data can decide:

- **As the host** under an HA mode, the duties `PrimaryDuties` runs (acknowledgements; for
  passive standby a delta checkpoint shipped every interval over HTTP to the backup's
  agent, `POST /ha/{task}/delta`), with output through the fence at the task's epoch.
- **As a replica holder**: apply the deltas that arrive (`PassiveBackup`), refused unless
  the registry says the sender hosts the task at that epoch, and record them (`sync_replica`).
- **As the new host** after a failover: take the task over per mode (`take_over`, with
  `bpm.ha.recovery`: promote the active replica, restart from the passive copy and replay,
  replay from the acknowledged position, or newest input for none) and complete the
  failover with the recovery time, from the registry's detection to the task's first
  output after it.
"""

from __future__ import annotations

import functools

import shutil
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from bpm_http.client import RegistryError
from bpm.clock import seconds
from bpm.federation.views import task_ha_mode
from bpm.names import inside, task_key
from bpm.ha import is_failed, recovery
from bpm.ha.machine import (
    CompleteRepair,
    DropBackup,
    DropReplica,
    Duty,
    FailOver,
    Here,
    Instruction,
    NoFailover,
    Observed,
    PlaceReplica,
    StartDuties,
    StartStandby,
    StopDuties,
    StopStandby,
    Trim,
)
from spark_agents import handover
from spark_agents.ha.roles import PassiveBackup, consumer_name
from spark_agents.races import Refused

if TYPE_CHECKING:
    from spark_agents.agent import Agent, Seen

# How long a new host waits for the task's first output before it completes the failover anyway.
FIRST_OUTPUT_WAIT_S = 60.0
PROBE_S = 1.0  # how long the origin waits for a silent host's own answer before it fails its tasks over


class NotHolder(Refused):
    """A delta for a task this participant holds no active passive replica of (at that epoch)."""


@dataclass
class Pending:
    """A failover this participant took over and has not completed yet."""

    failover_id: int
    key: str
    mode: str
    took_at: float
    detected_at: float
    details: dict


def ship_over_http(client: Callable[[], httpx.Client], endpoint: str, key: str, epoch: int, token: Callable[[], str]) -> Callable[[bytes], Any]:
    """A `ship` for `PrimaryDuties`: POST the delta to the backup's agent (with `client()`, the
    connection to it), with the registry's grant of the call (`token()`: one is reused while
    fresh); it returns once applied."""

    def ship(data: bytes) -> Any:
        response = client().post(
            f"{endpoint.rstrip('/')}/ha/{key}/delta", params={"epoch": epoch}, content=data, headers={"Authorization": f"Bearer {token()}"}
        )
        response.raise_for_status()
        return response.json()

    return ship


class HADuties:
    """One agent's HA part. `observe` takes what the agent read of the registry and its
    partners' liveness (`spark_agents.agent.Seen`), `act` does the duties.

    Attributes:
        modes: each visible task's effective HA mode (by key), as of the last observation.
        duties: the host's running duties per task key.
        backups: passive-standby copies held here per task key.
        standby: active-standby replicas running here: task key -> replica id.
        checkpoints: tasks whose checkpoint is not the agent's usual folder (a promoted replica's copy).
        pending: failovers taken over here, waiting for the task's first output.
        deltas_applied: deltas applied here as a backup.
    """

    def __init__(self, agent: Agent, *, interval_s: float = 2.0) -> None:
        self.agent = agent
        self.interval_s = interval_s
        self.modes: dict[str, str] = {}
        self.duties: dict[str, Duty] = {}
        self.backups: dict[str, PassiveBackup] = {}
        self.standby: dict[str, int] = {}
        self.checkpoints: dict[str, Path] = {}
        self.pending: dict[int, Pending] = {}
        self.deltas_applied = 0
        self.resync = False
        self.reachable: set[str] = set()  # hosts of my tasks silent to the registry that answer me directly
        self._lock = threading.RLock()
        self._view: dict[str, Any] = {"tasks": [], "replicas": [], "partners": {}, "failovers": [], "contracts": [], "movements": []}

    @property
    def me(self) -> str:
        return self.agent.config.name

    @property
    def host(self):
        return self.agent.host

    def note(self, kind: str, message: str, **kw: Any) -> None:
        self.agent.note(kind, message, **kw)

    def backup_dir(self, key: str) -> Path:
        return inside(self.agent.config.workdir / "backups", key)

    def replica_dir(self, key: str, replica_id: int) -> Path:
        """One folder per replica: a promoted replica's folder stays the task's checkpoint."""
        return inside(self.agent.config.workdir / "replicas", f"{key}-{replica_id}")

    # -- observation -----------------------------------------------------------------------

    def observe(self, seen: Seen) -> None:
        """What the agent last read of the registry, and its partners' liveness."""
        modes = {task_key(t): task_ha_mode(t, seen.movements, seen.contracts, seen.failovers) for t in seen.tasks}
        with self._lock:
            self.modes = modes
            self._view = {"tasks": seen.tasks, "replicas": list(seen.replicas), "partners": seen.partners, "failovers": seen.failovers,
                          "contracts": seen.contracts, "movements": seen.movements}

    def standby_keys(self) -> set[str]:
        with self._lock:
            return set(self.standby)

    # -- the tick --------------------------------------------------------------------------

    def act(self) -> None:
        """Decide with the participant's machine (`bpm.agent.participant`, which hands the
        observation to `bpm.ha.machine`), then execute each instruction on its own: one that
        fails stops no other."""
        guard = self.agent.guarded
        with self._lock:
            here = Here(running=frozenset(self.agent.hosting()), duties=dict(self.duties), standby=dict(self.standby),
                        backups={k: b.applied is not None for k, b in self.backups.items()})
            # Snapshots: the participant's journal keeps the observation as it was decided on.
            seen = Observed(now_s=self.agent.clock(), tasks=tuple(self._view["tasks"]), replicas=tuple(self._view["replicas"]),
                            failovers=tuple(self._view["failovers"]), modes=self.modes, status=self._status(), partners=self._partners(), here=here)
        for instruction in self.agent.machine.handle(seen):
            guard(f"ha.{type(instruction).__name__}", functools.partial(self._execute, instruction))
        guard("ha.complete", self._complete)

    def failed(self, participant: str) -> bool:
        """Whether the registry, at the last observation, counted `participant` as failed (`bpm.ha.is_failed`)."""
        status = self._view["partners"].get(participant)
        return status is not None and is_failed(status)

    def _status(self) -> dict[str, str]:
        """Liveness by participant: mine (this loop runs) and that of the participants that
        concern me, as the registry says, except that the host of a task of mine that the
        registry counts failed but whose agent answers me directly is `reachable`: cut off
        from the registry only, it goes on processing, and a failover would stop that work
        for nothing. A host that does not answer within `PROBE_S` is failed over as before."""
        status = {**self._view["partners"], self.me: "alive"}
        hosts = {t["host"] for t in self._view["tasks"] if t["origin"] == self.me and t["host"] not in (None, self.me)}
        for participant in sorted(hosts):
            if is_failed(status.get(participant, "new")) and self._answers(participant):
                status[participant] = "reachable"
                if participant not in self.reachable:
                    self.agent.note("ha.reachable", f"{participant} is silent to the registry but answers {self.me} directly: "
                                    "its tasks of mine stay there", subject=participant)
        self.reachable = {p for p in hosts if status.get(p) == "reachable"}
        return status

    def _answers(self, participant: str) -> bool:
        """Whether `participant`'s agent answers its health check, asked directly."""
        try:
            endpoint = self.agent.endpoint(participant)
            return self.agent.peers.client(endpoint).get(endpoint.rstrip("/") + "/healthz", timeout=PROBE_S).status_code == 200
        except Exception:  # unreachable, refused, timed out, or its endpoint unknown: it does not answer
            return False

    def _partners(self) -> list[str]:
        """My contract partners in force, cheapest first: where repairs go after the origin."""
        active = [c for c in self._view["contracts"] if c["state"] == "active" and c.get("in_force", True)]
        active.sort(key=lambda c: (c["price_min"], c["id"]))
        return [c["counterparty"] if c["proposer"] == self.me else c["proposer"] for c in active]

    def _execute(self, instruction: Instruction) -> None:
        client, lost = self.agent.client, self.agent.races.lost
        match instruction:
            case FailOver(task_id, key, to, epoch, mode, _, reason):
                with lost(f"{key}: failover to {to} refused, the registry moved on", kind="failover.lost", reread=("task",)) as refused:
                    record = client.failover(task_id, to, epoch, reason=reason)
                if refused:
                    return
                self.note("failover.requested", f"{key}: {reason}; failed over to {to} ({mode}), epoch {record['from_epoch']} -> "
                          f"{record['to_epoch']} (failover #{record['id']})")
                if to == self.me:
                    self.resync = True  # take it over in this very tick
            case NoFailover(key, message):
                self.note("failover.impossible", message)
            case PlaceReplica(task_id, key, at, mode, repair_of):
                # The registry may have seen the task change meanwhile (it moved, or its movement ended).
                with lost(f"{key}: no replica at {at}", kind="replica.refused", reread=("task",), also=(422,)) as refused:
                    made = client.create_replica(task_id, at, repair_of=repair_of)
                if refused:
                    return
                with self._lock:
                    self._view["replicas"].append(made)
                if repair_of is None:
                    self.note("replica.created", f"{key}: {mode} replica #{made['id']} at {at}", report=False)
                else:
                    self.note("replica.repaired", f"{key}: replication restored at {at} (replica #{made['id']}, "
                              f"repair #{made.get('repair_id')} of failover #{repair_of})")
            case DropReplica(replica_id, key, at, why):
                with lost(f"{key}: replica #{replica_id} at {at} not dropped", kind="replica.drop_refused", reread=("task",)) as refused:
                    client.drop_replica(replica_id)
                if refused:
                    return
                self._mark(self._view["replicas"], replica_id, state="dropped")
                self.note("replica.dropped", f"dropped replica #{replica_id} of {key} at {at}: {why}")
            case Trim(key, _):
                self._trim(key)
            case StopDuties(key, release):
                self.host.ha_stop_duties(key, release=release)
                self.duties.pop(key, None)
            case StartDuties(key, duty, task):
                self._start_duties(key, duty, task)
            case StartStandby(key, replica_id, task):
                self.host.ha_start_replica(key, self.agent.task_input(task), self._replica_copy(task, replica_id), task.get("params") or {},
                                           query=task.get("query"))
                with self._lock:
                    self.standby[key] = replica_id
                self.note("replica.started", f"{key}: active-standby replica #{replica_id} runs here, its output held back")
            case StopStandby(key, why):
                self.stop_standby(key, why)
            case DropBackup(key):
                with self._lock:
                    self.backups.pop(key, None)
                shutil.rmtree(self.backup_dir(key), ignore_errors=True)
                self.note("backup.dropped", f"{key}: the passive copy here is no longer needed")
            case CompleteRepair(failover_id, key, recovery_s):
                client.complete_failover(failover_id, recovery_s=recovery_s, details={"copy_held": True})
                self._mark(self._view["failovers"], failover_id, completed_at="now")  # until the record is read again
                self.note("repair.completed", f"{key}: repair #{failover_id} complete, a copy is held here")
            case _:
                raise TypeError(f"not an HA instruction: {instruction!r}")

    def _mark(self, records: list[dict], record_id: int, **values: Any) -> None:
        with self._lock:
            for r in records:
                if r["id"] == record_id:
                    r.update(values)

    def _trim(self, key: str) -> None:
        """Drop the input below every consumer's acknowledgement from the task's stream."""
        task = next((t for t in self._view["tasks"] if task_key(t) == key), None)
        if task is None:
            return
        try:
            stream = self.agent.task_input(task)
            if stream is not None:
                stream.trim()
        except (OSError, RuntimeError, ValueError) as exc:  # a broker's error is a RuntimeError
            self.note("stream.trim_error", f"{key}: {exc}")

    def _start_duties(self, key: str, duty: Duty, task: Mapping) -> None:
        ship = None
        if duty.holder is not None:
            endpoint = self.agent.endpoint(duty.holder)
            grant = functools.partial(self.agent.credentials.token, task["id"], "delta", duty.holder, duty.epoch)
            ship = ship_over_http(functools.partial(self.agent.peers.client, endpoint), endpoint, key, duty.epoch, grant)
        self.host.ha_start_duties(key, duty.mode, self.agent.task_input(task), consumer_name(key, self.me),
                                  query=task.get("query"), params=dict(task.get("params") or {}), interval_s=self.interval_s, ship=ship)
        self.duties[key] = duty
        where = f", deltas to {duty.holder} every {self.interval_s:g} s" if duty.holder else ""
        self.note("ha.duties", f"{key}: host duties under {duty.mode} at epoch {duty.epoch}{where}")

    def _replica_copy(self, task: Mapping, replica_id: int) -> Path:
        """The folder an active-standby replica starts from: at the origin, a copy of the checkpoint it
        handed over (the replica then catches up from there); elsewhere an empty one (the replica reads
        the retained stream from the start, and the fence drops what the host wrote)."""
        key = task_key(task)
        folder = self.replica_dir(key, replica_id)
        shutil.rmtree(folder, ignore_errors=True)
        source = self.agent.checkpoint_dir(key)
        if task["origin"] == self.me and source.exists() and source != folder:
            handover.unpack(handover.pack(source), folder, task["epoch"])
        else:
            folder.mkdir(parents=True)
        return folder

    def stop_standby(self, key: str, why: str) -> None:
        with self._lock:
            replica_id = self.standby.pop(key, None)
            if replica_id is None:
                return
        self.host.ha_stop_replica(key)
        shutil.rmtree(self.replica_dir(key, replica_id), ignore_errors=True)
        self.note("replica.stopped", f"{key}: active-standby replica stopped: {why}")

    def receive_delta_from_caller(self, token: str | None, key: str, epoch: int, data: bytes) -> dict:
        """`receive_delta` from whoever the registry's token says sends it (TokenRefused if none)."""
        return self.receive_delta(key, epoch, self.agent.credentials.verify(token, "delta", key, epoch).caller, data)

    def receive_delta(self, key: str, epoch: int, sender: str, data: bytes) -> dict:
        """Apply a delta checkpoint from the host of `key` (the server's `POST /ha/{task}/delta`).

        Refused (`NotHolder`) unless I hold an active passive replica of the task and the
        sender hosts it at `epoch`; a fenced sender's sync is refused by the registry too.
        """
        replica, task = self._held(key)
        if replica is None or task["host"] != sender or task["epoch"] != epoch:
            self._refresh_replicas()
            replica, task = self._held(key)
        if replica is None or task is None:
            raise NotHolder(f"{self.me} holds no active passive replica of {key}")
        if task["host"] != sender or task["epoch"] != epoch:
            raise NotHolder(f"{key} is hosted by {task['host']} at epoch {task['epoch']}, not by {sender} at {epoch}")
        with self._lock:
            backup = self.backups.get(key)
            if backup is None:
                backup = self.backups[key] = PassiveBackup(self.backup_dir(key))
        applied = backup.apply(data)
        self.deltas_applied += 1
        try:
            self.agent.client.sync_replica(replica["id"], epoch, position=applied.ack_position, bytes_copied=len(data))
        except RegistryError as exc:
            if exc.status == 409:
                raise NotHolder(str(exc)) from exc
            raise
        return {"seq": applied.seq, "committed": applied.committed, "position": applied.ack_position}

    def _held(self, key: str) -> tuple[dict | None, dict | None]:
        with self._lock:
            tasks = {t["id"]: t for t in self._view["tasks"]}
            for r in self._view["replicas"]:
                task = tasks.get(r["task_id"])
                if task is not None and task_key(task) == key and r["participant"] == self.me and r["state"] == "active" and r["role"] == "passive_standby":
                    return r, task
            return None, next((t for t in tasks.values() if task_key(t) == key), None)

    def _refresh_replicas(self) -> None:
        view = self.agent.client.view(self.me)
        with self._lock:
            self._view = {**self._view, "tasks": view["tasks"], "replicas": view["replicas"]}

    # As the new host after a failover

    def take_over(self, task: Mapping, record: Mapping) -> None:
        """Start a task a failover gave me, per its mode; the failover completes at its first output."""
        key, epoch, mode = task_key(task), task["epoch"], record["mode"]
        stream = self.agent.task_input(task)
        failed = record.get("failed") or record["from_host"]
        checkpoint = self.agent.checkpoint_dir(key)
        how = recovery(mode, standby_here=key in self.standby_keys())
        # Rebuilding an active standby by replay reads the whole retained stream; the fence drops what was written.
        failed_consumer = None if how != mode else consumer_name(key, failed)
        backup = None
        if mode == "passive_standby":
            backup = self._promote_copy(key, checkpoint)
        elif mode == "active_standby" and how == mode:
            checkpoint = self.checkpoints[key] = self.replica_dir(key, self.standby[key])
        took = self.host.ha_take_over(key, how, epoch=epoch, stream=stream, consumer=consumer_name(key, self.me),
                                      failed_consumer=failed_consumer, query=task.get("query"), params=dict(task.get("params") or {}),
                                      checkpoint_dir=checkpoint, backup=backup)
        if failed_consumer is None and stream is not None:
            stream.release(consumer_name(key, failed))
        with self._lock:
            self.standby.pop(key, None)
        handover.mark_epoch(checkpoint, epoch)
        now = self.agent.clock()
        if record["id"] is not None:
            self.pending[record["id"]] = Pending(record["id"], key, mode, now, seconds(record["detected_at"]), {**took, "took_over_as": how})
        self.note("task.taken_over", f"took {key} over from {failed} ({mode}{'' if how == mode else f', as {how}'}) at epoch {epoch}: "
                  f"start position {took.get('start_position')}, {took.get('promoted_rows', 0)} held rows written",
                  report=True, subject=failed, data={"task_id": task["id"], "failover_id": record["id"], "mode": mode})
        if record["id"] is None:
            self.note("task.recovered", f"{key}: its movement ended while {failed} failed; restarted here from what {mode} kept", report=True, subject=failed)

    def recover_from_failed(self, task: Mapping, source: str) -> None:
        """A task whose movement ended while its host `source` failed: the checkpoint is gone with
        that host, so the task restarts here from what its mode under the ended movement kept
        (no failover record: the registry already moved the task home)."""
        mode = task_ha_mode(task, self._view.get("movements", []), self._view.get("contracts", []), ended_too=True)
        self.take_over(task, {"id": None, "mode": mode, "failed": source, "from_host": source, "detected_at": None})

    def _promote_copy(self, key: str, checkpoint: Path) -> PassiveBackup:
        """The passive copy becomes the task's checkpoint folder (an empty one when no copy arrived)."""
        with self._lock:
            held = self.backups.pop(key, None)
            if held is not None:
                held.promote()  # refuses any late delta
            source = self.backup_dir(key)
            shutil.rmtree(checkpoint, ignore_errors=True)
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            if source.exists():
                source.rename(checkpoint)
            else:
                checkpoint.mkdir()
            return PassiveBackup(checkpoint)

    def _complete(self) -> None:
        now = self.agent.clock()
        for failover_id, p in list(self.pending.items()):
            first = self.host.ha_first_output(p.key, p.took_at)
            if first is None and now - p.took_at < FIRST_OUTPUT_WAIT_S:
                continue
            details = {**p.details, "first_output": first is not None}
            recovery = None if first is None else round(max(0.0, first - p.detected_at), 3)
            with self.agent.races.lost(f"{p.key}: failover #{failover_id} not completed", kind="failover.moved_on", reread=("task",)):
                self.agent.client.complete_failover(failover_id, recovery_s=recovery, details=details)
            del self.pending[failover_id]
            self.note("failover.completed", f"{p.key}: failover #{failover_id} complete ({p.mode}), recovery "
                      + ("unmeasured: no output yet" if recovery is None else f"{recovery:.2f} s from detection to the first output"))

    # As a host that stops a task (it moved away, or a failover fenced it)

    def stopped(self, key: str) -> None:
        """`key` stopped here (a stop ends in the background of the loop, beside `act`)."""
        with self._lock:
            duty = self.duties.pop(key, None)
        if duty is not None:
            self.host.ha_stop_duties(key, release=True)

    def status(self) -> dict[str, Any]:
        return {
            "modes": {k: v for k, v in self.modes.items() if v != "none"},
            "duties": {k: {"mode": d.mode, "holder": d.holder, "epoch": d.epoch, **self.host.ha_duties_status(k)} for k, d in self.duties.items()},
            "backups": {k: (None if b.applied is None else {"seq": b.applied.seq, "committed": b.applied.committed}) for k, b in self.backups.items()},
            "standby": dict(self.standby),
            "pending_failovers": sorted(self.pending),
            "deltas_applied": self.deltas_applied,
        }

    def close(self) -> None:
        for key in list(self.duties):
            self.host.ha_stop_duties(key, release=False)
        self.duties.clear()
