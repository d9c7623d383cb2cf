"""One participant's high-availability duties as a state machine: what it sees in, instructions out.

Every tick the agent sends `Observed`: what it last read of the registry (tasks, replicas,
failovers, contracts; its partners' liveness) and what runs here (`Here`). The machine
answers with what to do, per role, in this order:

- **As the origin** of a task that is away (or the host of a task whose origin is not
  alive): fail the task over at once when its host counts as failed (`FailOver`, target
  from `failover_target`; `NoFailover` records why none is possible); keep the replication
  level of the replicated modes (`DropReplica` of a replica at the task's own host,
  `PlaceReplica` at `repair_target`, naming the failover that lost it); drop the replicas
  of a task whose mode keeps none once it runs away or back here; under upstream backup
  trim the stream it owns (`Trim`, at most once per `interval_s`).
- **As the host** under an HA mode: run the host's duties (`StartDuties`/`StopDuties`):
  acknowledgements, and for passive standby deltas to the live holder of the newest backup.
- **As a replica holder**: run an active-standby replica (`StartStandby`/`StopStandby`),
  drop a passive copy no longer needed (`DropBackup`), and complete the repair that made
  it a holder once it holds a copy (`CompleteRepair`).

No I/O, no clock, no randomness: `spark_agents.ha_agent` executes the instructions, and
its replies come back in the next observation (the registry's records, read again). The
only memory is when the origin last asked for each task's failover (a refused request is
asked again after `retry_s`, not every tick) and when it last trimmed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bpm.clock import seconds
from bpm.ha.decisions import REPLICATED_MODES, failover_target, is_failed, repair_target
from bpm.names import task_key

# ---- events ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Duty:
    """What the host's duties for one task run with; a change restarts them."""

    mode: str
    holder: str | None
    epoch: int


@dataclass(frozen=True, slots=True)
class Here:
    """What runs at this participant, as its effects layer reports it.

    Attributes:
        running: keys of the tasks running here as the task itself (not as a replica).
        duties: the host's duties running, per task key.
        standby: active-standby replicas running here: task key -> replica id.
        backups: passive copies held here: task key -> whether a delta was applied yet.
    """

    running: frozenset[str] = frozenset()
    duties: Mapping[str, Duty] = field(default_factory=dict)
    standby: Mapping[str, int] = field(default_factory=dict)
    backups: Mapping[str, bool] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Observed:
    """What the participant saw at `now_s` (on the clock the registry's times are on).

    Records are the registry's (dicts as its API returns them); `modes` is each task's
    effective HA mode by key (`bpm.ha.task_mode`); `status` maps participant to liveness
    (the participant itself counts as alive: this loop runs); `partners` are its contract
    partners in force, cheapest first (where repairs go after the origin).
    """

    now_s: float
    tasks: Sequence[Mapping]
    replicas: Sequence[Mapping]
    failovers: Sequence[Mapping]
    modes: Mapping[str, str]
    status: Mapping[str, str]
    partners: Sequence[str]
    here: Here


# ---- instructions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FailOver:
    """Ask the registry to move task `task_id` from its failed host to `to`, from `epoch`."""

    task_id: int
    key: str
    to: str
    epoch: int
    mode: str
    failed: str
    reason: str


@dataclass(frozen=True, slots=True)
class NoFailover:
    """A failover not asked for: no live participant can take the task over."""

    key: str
    message: str


@dataclass(frozen=True, slots=True)
class PlaceReplica:
    task_id: int
    key: str
    at: str
    mode: str
    repair_of: int | None


@dataclass(frozen=True, slots=True)
class DropReplica:
    replica_id: int
    key: str
    at: str
    why: str


@dataclass(frozen=True, slots=True)
class Trim:
    """Delete the stream a task reads below every consumer's acknowledgement."""

    key: str
    input_uri: str


@dataclass(frozen=True, slots=True)
class StopDuties:
    key: str
    release: bool  # the task no longer runs here under a mode: release its consumer too


@dataclass(frozen=True, slots=True)
class StartDuties:
    key: str
    duty: Duty
    task: Mapping


@dataclass(frozen=True, slots=True)
class StartStandby:
    key: str
    replica_id: int
    task: Mapping


@dataclass(frozen=True, slots=True)
class StopStandby:
    key: str
    why: str


@dataclass(frozen=True, slots=True)
class DropBackup:
    key: str


@dataclass(frozen=True, slots=True)
class CompleteRepair:
    failover_id: int
    key: str
    recovery_s: float


Instruction = FailOver | NoFailover | PlaceReplica | DropReplica | Trim | StopDuties | StartDuties | StartStandby | StopStandby | DropBackup | CompleteRepair


# ---- the machine -------------------------------------------------------------------------------


@dataclass
class HAMachine:
    """One participant's HA state between observations.

    Attributes:
        name: the participant.
        interval_s: the host's delta interval, and the least time between two trims.
        retry_s: how long the origin waits before asking again for a failover the registry refused.
        asked: task id -> (epoch, when) of the last failover asked for it.
        trimmed_s: when the stream was last trimmed.
    """

    name: str
    interval_s: float = 2.0
    retry_s: float = 2.0
    asked: dict[int, tuple[int, float]] = field(default_factory=dict)
    trimmed_s: float = float("-inf")

    def handle(self, seen: Observed) -> list[Instruction]:
        out: list[Instruction] = []
        dropped: set[int] = set()
        for task in seen.tasks:
            out += self._as_origin(seen, task, dropped)
        replicas = [r for r in seen.replicas if r["id"] not in dropped]
        out += self._as_host(seen, replicas)
        out += self._as_holder(seen, replicas)
        return out

    # As the origin (or the host of a task whose origin is not alive)

    def _as_origin(self, seen: Observed, task: Mapping, dropped: set[int]) -> list[Instruction]:
        me, status = self.name, seen.status
        origin_acts = task["origin"] == me
        host_acts = task["host"] == me and status.get(task["origin"]) != "alive"
        if not (origin_acts or host_acts):
            return []
        key = task_key(task)
        mode = seen.modes.get(key, "none")
        replicas = [r for r in seen.replicas if r["task_id"] == task["id"]]
        if origin_acts and task["host"] != me and is_failed(status.get(task["host"], "new")):
            return self._fail_over(seen, task, key, mode, replicas)
        out: list[Instruction] = []
        if mode in REPLICATED_MODES:
            for r in replicas:
                if r["state"] == "active" and r["participant"] == task["host"]:
                    out.append(DropReplica(r["id"], key, r["participant"], f"{r['participant']} hosts {key} now; a replica must live elsewhere"))
                elif r["state"] == "promoted" and r["participant"] != task["host"]:
                    # Its holder took the task over and the task has moved on since: the record
                    # would keep that participant (often the origin, the first choice) from ever
                    # holding a copy of it again, and the task would run unreplicated.
                    out.append(DropReplica(r["id"], key, r["participant"], f"{r['participant']} took {key} over and it has moved on since"))
            gone = {i.replica_id for i in out if isinstance(i, DropReplica)}
            left = [r for r in replicas if r["id"] not in gone]
            target = repair_target(mode=mode, origin=task["origin"], host=task["host"], replicas=left, status=status, candidates=seen.partners)
            if target is not None:
                out.append(PlaceReplica(task["id"], key, target, mode, unrepaired_failover(task, seen.failovers)))
        elif task["host"] != me or key in seen.here.running:
            # A task back home keeps its copies until it runs here: should its last host
            # fail before releasing the checkpoint, the copy is what it restarts from.
            out += [DropReplica(r["id"], key, r["participant"], f"{key} keeps no replica under mode {mode}") for r in replicas if r["state"] == "active"]
        dropped.update(i.replica_id for i in out if isinstance(i, DropReplica))
        if origin_acts and mode == "upstream_backup" and task["host"] != me and seen.now_s - self.trimmed_s >= self.interval_s:
            self.trimmed_s = seen.now_s
            out.append(Trim(key, task.get("input_uri") or ""))
        return out

    def _fail_over(self, seen: Observed, task: Mapping, key: str, mode: str, replicas: list[Mapping]) -> list[Instruction]:
        asked = self.asked.get(task["id"])
        if asked is not None and asked[0] == task["epoch"] and seen.now_s - asked[1] < self.retry_s:
            return []
        self.asked[task["id"]] = (task["epoch"], seen.now_s)
        failed = task["host"]
        how = seen.status.get(failed)
        to = failover_target(mode=mode, origin=task["origin"], host=failed, replicas=replicas, status=seen.status)
        if to is None:
            return [NoFailover(key, f"{key}: its host {failed} is {how} and no live participant can take it over ({mode})")]
        return [FailOver(task["id"], key, to, task["epoch"], mode, failed, f"{failed} {how}: silent past the heartbeat timeout")]

    # As the host

    def _as_host(self, seen: Observed, replicas: list[Mapping]) -> list[Instruction]:
        here = seen.here
        wanted: dict[str, tuple[Duty, Mapping]] = {}
        for task in seen.tasks:
            key = task_key(task)
            mode = seen.modes.get(key, "none")
            if task["host"] != self.name or key not in here.running or mode == "none":
                continue
            holder = self._holder_of(task, replicas, seen.status) if mode == "passive_standby" else None
            if mode == "passive_standby" and holder is None:
                continue  # no backup yet: the origin places one, then deltas flow
            wanted[key] = (Duty(mode, holder, task["epoch"]), task)
        out: list[Instruction] = []
        for key, duty in here.duties.items():
            if key not in wanted or wanted[key][0] != duty:
                out.append(StopDuties(key, release=key not in wanted))
        for key, (duty, task) in wanted.items():
            if here.duties.get(key) != duty:
                out.append(StartDuties(key, duty, task))
        return out

    def _holder_of(self, task: Mapping, replicas: list[Mapping], status: Mapping[str, str]) -> str | None:
        """The live holder of the newest active passive-standby replica of the task (not me)."""
        held = [r for r in replicas if r["task_id"] == task["id"] and r["state"] == "active" and r["role"] == "passive_standby"
                and r["participant"] != self.name and status.get(r["participant"]) == "alive"]
        return max(held, key=lambda r: r["id"])["participant"] if held else None

    # As a replica holder

    def _as_holder(self, seen: Observed, replicas: list[Mapping]) -> list[Instruction]:
        here = seen.here
        tasks = {t["id"]: t for t in seen.tasks}
        mine = {task_key(tasks[r["task_id"]]): r for r in replicas
                if r["participant"] == self.name and r["state"] == "active" and r["task_id"] in tasks}
        # A promoted replica or copy waits for its takeover, which makes it the task's checkpoint.
        promoted = {task_key(tasks[r["task_id"]]) for r in replicas
                    if r["participant"] == self.name and r["state"] == "promoted" and r["task_id"] in tasks}
        out: list[Instruction] = []
        for key, r in mine.items():
            task = tasks[r["task_id"]]
            if r["role"] == "active_standby" and key not in here.standby and task["host"] != self.name:
                out.append(StartStandby(key, r["id"], task))
        for key in here.standby:
            if key not in promoted and (key not in mine or mine[key]["role"] != "active_standby"):
                out.append(StopStandby(key, "its replica is no longer active here"))
        for key in here.backups:
            if key not in promoted and (key not in mine or mine[key]["role"] != "passive_standby"):
                out.append(DropBackup(key))
        # Complete the repairs that made me a holder once I hold a copy (passive) or run the replica (active).
        by_replica = {r["id"]: key for key, r in mine.items()}
        for f in seen.failovers:
            if f["kind"] != "repair" or f["to_host"] != self.name or f["completed_at"] is not None:
                continue
            key = by_replica.get((f.get("details") or {}).get("replica_id"))
            if key is None:
                continue
            ready = key in here.standby if mine[key]["role"] == "active_standby" else here.backups.get(key, False)
            if ready:
                out.append(CompleteRepair(f["id"], key, round(max(0.0, seen.now_s - seconds(f["detected_at"])), 3)))
        return out


def unrepaired_failover(task: Mapping, failovers: Sequence[Mapping]) -> int | None:
    """The task's newest failover whose lost replication no repair has restored yet."""
    records = [f for f in failovers if f["task_id"] == task["id"]]
    lost = [f for f in records if f["kind"] == "failover"]
    if not lost:
        return None
    newest = max(lost, key=lambda f: f["id"])
    repaired = any(f["kind"] == "repair" and (f.get("details") or {}).get("repair_of") == newest["id"] for f in records)
    return None if repaired else newest["id"]
