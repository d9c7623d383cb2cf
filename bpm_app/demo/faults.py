"""A fault of one participant's host while it hosts moved tasks, and what the federation does about it.

`Fault` strikes a host with one of three faults and watches the federation's answer:

- `crash`: every process in the host is killed at once. The origins of the tasks it hosted
  see it silent past the registry's heartbeat timeout and fail the tasks over; the new host
  restarts each from its copy (or replays its input) and the replication level is repaired.
- `cut`: the host is cut off from every other host (a network partition), its processes
  run on unheard. The origins fail its tasks over exactly as after a crash; once the link
  heals the host is heard from again, learns from the registry that it lost the tasks and
  stops them, and what it still writes at the old epoch is refused by the fence.
- `registry`: only the link between the host and the registry's host is cut. The registry
  counts the host failed; the origins ask its agent directly, find it answering, and leave
  the tasks where they are; the host processes them through the cut.

Its steps are generators that a demo advances one poll at a time (`Demo.drive`, or a
scenario that plays faults while its phases run): each looks at the demo's last poll
(`Demo.state`) and yields when it needs another.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from bpm.clock import seconds
from bpm.names import task_key

if TYPE_CHECKING:
    from bpm_app.demo.run import Demo

# crash: the host killed; cut: cut off from every host; registry: cut off from the registry's host only.
KINDS = ("crash", "cut", "registry")
# What a host does, told in a sentence: "d's host crashes".
WHAT = {"crash": "crashes", "cut": "is cut off", "registry": "is cut off from the registry"}


class Fault:
    """One fault of `victim`'s host (`kind`, one of `KINDS`), struck once it hosts moved tasks
    whose copies are up to date under `ha_mode`; a cut lasts `cut_s` from the fault.

    Attributes:
        at: when the fault struck (epoch seconds; None before).
        hosted: the tasks the victim hosted then, by key.
        healed: for a cut, when it healed and what the federation did then (`heal`).
        registry_cut: for a registry cut, what the federation did meanwhile (`ride_out`).
        recovered: `task.recovered` events: tasks whose movement ended as their host died,
            restarted from their copy without a failover.
        until: when the next fault of a scenario that strikes several struck (epoch seconds;
            None: none did): what happened from then on is that fault's.
    """

    def __init__(self, demo: Demo, victim: str, kind: str, *, ha_mode: str = "passive_standby", cut_s: float = 30.0) -> None:
        if kind not in KINDS:
            raise ValueError(f"a fault is one of {', '.join(KINDS)}")
        self.demo, self.victim, self.kind, self.ha_mode, self.cut_s = demo, victim, kind, ha_mode, cut_s
        self.at: float | None = None
        self.hosted: list[str] = []
        self.healed: dict | None = None
        self.registry_cut: dict | None = None
        self.recovered: list[dict] = []
        self.until: float | None = None

    @property
    def what(self) -> str:
        return WHAT[self.kind]

    def hosting(self) -> list[dict]:
        """The moved tasks the victim hosts, as the last poll read the registry."""
        return [t for t in self.demo.state["tasks"] if t["host"] == self.victim and t["origin"] != self.victim and not t.get("retired")]

    def strike_when_copied(self, timeout_s: float = 120.0) -> Iterator[None]:
        """Wait until the victim hosts moved tasks whose replicas hold a copy (under passive
        standby; otherwise until it hosts any), then strike. After `timeout_s` it strikes once
        the victim hosts anything; TimeoutError after twice that with nothing hosted."""
        deadline = time.monotonic() + timeout_s
        while True:
            hosted = self.hosting()
            synced = {r["task_id"] for r in self.demo.state.get("replicas", []) if r["state"] == "active" and r["synced_at"]}
            copied = hosted and (self.ha_mode != "passive_standby" or all(t["id"] in synced for t in hosted))
            if copied or (hosted and time.monotonic() > deadline):
                break
            if time.monotonic() > deadline + timeout_s:
                raise TimeoutError(f"{self.victim} hosted no moved task within {2 * timeout_s:.0f} s; see {self.demo.s.workdir / 'logs'}")
            yield
        self.strike([task_key(t) for t in hosted])

    def strike(self, hosted: list[str]) -> None:
        self.hosted, self.at = hosted, time.time()
        hosts, victim = self.demo.fed.hosts, self.victim
        if self.kind == "cut":
            self.demo.say(f"{victim}'s host is cut off from every other host (a network partition) while it hosts {', '.join(hosted)}")
            self.demo.unreachable.add(victim)
            hosts.cut(victim)
        elif self.kind == "registry":
            self.demo.say(f"{victim}'s host is cut off from the registry only (it still reaches the others) while it hosts {', '.join(hosted)}")
            hosts.cut_link(self.demo.fed.REGISTRY, victim)
        else:
            self.demo.say(f"{victim}'s host crashes (every process in it killed at once) while it hosts {', '.join(hosted)}")
            self.demo.unreachable.add(victim)
            hosts.crash(victim)

    def recover(self, timeout_s: float = 120.0) -> Iterator[None]:
        """Wait until every task the victim hosted was failed over and produces output again."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.demo.state
            away = {task_key(t) for t in state["tasks"] if t["host"] == self.victim}
            mine = self._failovers(state.get("failovers", []))
            pending = [f for f in mine if f["kind"] == "failover" and not f["completed_at"]]
            # Recovered: no task left at the victim, every failover producing output again.
            if not away & set(self.hosted) and not pending and mine:
                break
            yield
        else:
            self.demo.say(f"not every task of {self.victim} recovered within {timeout_s:.0f} s")
        with self.demo.fed.operator() as operator:
            self.recovered = [e for e in operator.events(kind="task.recovered", limit=100) if self._within(seconds(e["at"]))]
        for f in self.failover_rows(self.demo.state.get("failovers", [])):
            self.demo.say(f"  {f['task']}: {f['mode']} {f['from']} -> {f['to']}, detected {f['detected_s']} s after the "
                          f"{'kill' if self.kind == 'crash' else 'cut'}, recovered {f['recovery_s']} s after detection")

    def ride_out(self) -> Iterator[None]:
        """Under a cut of the victim's link to the registry only, for `cut_s`: watch that
        nothing of the victim's is failed over and that it goes on running what it hosts."""
        polls = kept = 0
        silent = False
        while True:
            state = self.demo.state
            # Every poll taken while the cut lasted counts, however late this step resumes: an
            # agent under its quota can take its 10 s to answer `_running`'s question, so the
            # step may resume after the cut ended with a poll taken during it still unread.
            if self.demo.t0 + state["t"] >= self.at + self.cut_s:
                break
            polls += 1
            running = self.demo._running().get(self.victim) or {}
            kept += set(self.hosted) <= set(running)
            silent = silent or any(p["name"] == self.victim and p["status"] == "failed" for p in state["participants"])
            yield
        failovers = self.failover_rows(self.demo.state.get("failovers", []))
        noted = []
        for origin in sorted({key.partition(".")[0] for key in self.hosted}):
            records = (self.demo._agent_status(origin) or {}).get("records", [])
            noted += [r["message"] for r in records if r.get("kind") == "ha.reachable"]
        self.registry_cut = {"polls": polls, "polls_running_every_task": kept, "registry_counted_it_failed": silent,
                             "failovers": failovers, "origin_noted": noted}
        self.demo.say(f"  {self.victim} ran every task it hosted at {kept} of {polls} polls; {len(failovers)} failed over; "
                      f"the registry counted it failed: {silent}; its origins noted: {noted[-1] if noted else 'nothing'}")

    def heal(self, timeout_s: float = 120.0) -> Iterator[None]:
        """Heal the victim's link once it has been cut `cut_s`; wait until it is heard from
        again and runs none of the tasks it lost (after a registry cut: still runs every task it hosted)."""
        while time.time() < self.at + self.cut_s:
            yield
        hosts = self.demo.fed.hosts
        if self.kind == "registry":
            hosts.heal_link(self.demo.fed.REGISTRY, self.victim)
        else:
            hosts.heal(self.victim)
        self.demo.unreachable.discard(self.victim)
        healed_at = time.time()
        self.demo.say(f"{self.victim}'s link heals after {healed_at - self.at:.0f} s")
        heard = stopped = None
        events: list[dict] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (heard is None or stopped is None):
            yield
            with self.demo.fed.operator() as operator:
                events = [e for e in operator.events(kind="participant.healed", limit=10) if self._within(seconds(e["at"]))]
            if heard is None and any(e["subject"] == self.victim for e in events):
                heard = time.time()
                self.demo.say(f"  {self.victim} is heard from again {heard - healed_at:.1f} s after the heal")
            running = self.demo._running().get(self.victim)
            if self.kind == "registry":
                if heard is not None and running is not None and set(self.hosted) <= set(running):
                    stopped = time.time()  # nothing to stop: it kept them
                    self.demo.say(f"  {self.victim} still runs every task it hosted ({stopped - healed_at:.1f} s after the heal)")
            elif heard is not None and running is not None and not set(running) & (set(self.hosted) - self.moved_back()):
                stopped = time.time()
                back = sorted(set(running) & set(self.hosted))  # here only tasks moved back to it
                self.demo.say(f"  {self.victim} runs none of the tasks it lost ({stopped - healed_at:.1f} s after the heal)"
                              + (f"; {', '.join(back)} moved back to it since, at a later epoch" if back else ""))
        after = "ran_its_tasks_after_s" if self.kind == "registry" else "stopped_lost_tasks_after_s"
        self.healed = {
            "at_s": round(healed_at - self.demo.t0, 1),
            "heard_after_s": None if heard is None else round(heard - healed_at, 1),
            after: None if stopped is None else round(stopped - healed_at, 1),
            "events": [e["message"] for e in events if e["subject"] == self.victim],
        }
        if self.kind == "cut":
            self.healed["moved_back"] = sorted(self.moved_back())

    def moved_back(self) -> set[str]:
        """The tasks the victim lost that the registry has since given back to it by a movement
        (at an epoch past the failover's): it runs those again, under the new epoch, legitimately
        (an origin loaded with what it took over may offer one back as soon as the victim is heard from)."""
        failed_over = {}
        for f in self._failovers(self.demo.state.get("failovers", [])):
            if f.get("kind", "failover") == "failover":
                failed_over[f["task_id"]] = max(failed_over.get(f["task_id"], 0), f["to_epoch"])
        return {task_key(t) for t in self.demo.state.get("tasks", [])
                if t["id"] in failed_over and t["host"] == self.victim and t["epoch"] > failed_over[t["id"]]}

    def _failovers(self, records: list[dict]) -> list[dict]:
        """The failovers (and repairs) of tasks this fault took from the victim: detected since it struck."""
        return [f for f in records if f["from_host"] == self.victim and self._within(seconds(f["detected_at"]))]

    def _within(self, at: float) -> bool:
        """Whether something at `at` followed this fault (and came before the next)."""
        return self.at is not None and self.at - 1.0 <= at and (self.until is None or at < self.until)

    def failover_rows(self, records: list[dict]) -> list[dict]:
        """The failovers of this fault as a report shows them: times relative to the fault and the demo's start."""
        rows = []
        for f in self._failovers(records):
            if f["kind"] != "failover":
                continue
            detected = seconds(f["detected_at"])
            rows.append({
                "task": f["task"], "mode": f["mode"], "from": f["from_host"], "to": f["to_host"],
                "epoch": f["to_epoch"], "requested_by": (f.get("details") or {}).get("requested_by"),
                "detected_s": round(detected - self.at, 2),
                "recovery_s": None if f["recovery_s"] is None else round(f["recovery_s"], 2),
                "completed": f["completed_at"] is not None, "at_s": round(detected - self.demo.t0, 1),
            })
        return rows

    def repairs(self, records: list[dict]) -> list[dict]:
        return [{"task": f["task"], "at": f["to_host"], "completed": f["completed_at"] is not None,
                 "repair_of": (f.get("details") or {}).get("repair_of")}
                for f in records if f["kind"] == "repair" and self._within(seconds(f["detected_at"]))]

    def report(self, records: list[dict]) -> dict:
        """What this fault did, for a report: when, what the victim hosted, the failovers, the heal."""
        out = {"participant": self.victim, "fault": self.kind, "at_s": None if self.at is None else round(self.at - self.demo.t0, 1),
               "hosted": self.hosted, "failovers": self.failover_rows(records), "repairs": self.repairs(records),
               "recovered_without_failover": [{"message": e["message"], "at": e["at"]} for e in self.recovered]}
        if self.kind != "crash":
            out["healed"] = self.healed
        if self.kind == "registry":
            out["registry_cut"] = self.registry_cut
        return out
