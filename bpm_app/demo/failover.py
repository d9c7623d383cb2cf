"""`bpm demo --scenario failover`: a participant hosting moved tasks dies, and the federation recovers them.

1. A carries every task; B and C have none of their own. Their contracts ask for an HA mode
   (passive standby by default: A, the tasks' origin, keeps a copy of each moved task's
   checkpoint, updated with a delta every 2 s).
2. A sheds load to B and C until the allocation is acceptable.
3. While B hosts moved tasks whose copies are up to date, B's host crashes: every process
   in it (its agent, its Spark JVM) is killed at once. A sees B silent past the registry's
   heartbeat timeout and fails B's tasks over at once; the new host (A, the backup) restarts each
   from its copy and replays its stream since, on A's own broker; the replication level is
   repaired at C.
4. The federation runs on without B; then the input closes, every task drains, and the
   alerts are compared with the plain computation (`bpm.zeek.reference`) over exactly what was fed.

With `fault="cut"` (`bpm demo --scenario partition`) B's host is not killed but cut off
from every other host (the registry's included) by a network partition: its processes
run on, unheard. A fails B's tasks over exactly as after a crash (silence cannot tell the
two apart); then the link heals, B is heard from again (the registry records it as
`participant.healed`), learns from the registry's answer that it lost the tasks and stops
them, and whatever B's tasks still try to write at their old epoch is refused by the
fence. Phase 4 then runs with B back (A, loaded with what it took over, may move one of
them back to B at once: B then runs it again at the movement's epoch, `healed`'s `moved_back`).

With `fault="registry"` (`bpm demo --scenario registry-cut`) only the link between B's host
and the registry's is cut: B still reaches A and C, and they reach it. The registry hears
no heartbeat and counts B failed; A, the origin of the tasks B hosts, asks B's agent
itself before failing them over, finds it answering, and leaves them where they are
(`ha.reachable` in A's record). B goes on processing them, writing their results to A's
broker, through the cut; once the link heals B is heard from again, still running every
one of them, and nothing was failed over. The report's `registry_cut` says so.

The partition scenario also plays Delay, Process and Correct: B and C watch networks of
their own too (one share and one task each), and two scanners probe all three networks
(`DemoSettings.shared_scanners`). Every agent shares its alerts and correlates them with
its partners' (`--correlate`); A's correlated result waits up to the availability bound for
B's alerts while B is cut off, is published tentative, and is corrected to stable once the
link heals. The report adds `correlation` (A's result read back from its broker: windows,
versions, tentative windows and rows, the first result's delay, the stabilisation after the
heal, and whether every window's stable rows equal the plain correlation of the alerts
each participant shared) and the folder a plot of it (`correlation.png`).

The report adds `failovers` (each with `task`, `mode`, `detected_s`: from the kill or cut
to the registry's detection, `recovery_s`: from the detection to the task's first output
after it), `repairs` and `killed` (with a cut: `cut`, and `healed` with when B was heard
from again and when it stopped running the tasks it lost). It reuses the phases scenario's federation and settings
(`bpm_app.demo.run`), with a 5 s trigger: A's six tasks then take it over its threshold.
Each participant is a host with a network and storage of its own (`spark_agents.hosts`), but
without a CPU quota: each measures its load against one core, with the cost curve and price
ranges the phases scenario had before it gave participants quotas (a threshold of 0.4;
ranges [0.7 q, q]).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from bpm_app.demo.run import Demo, DemoSettings, Member, Phase
from bpm.federation.views import AgreedTerms, seconds

# A owns every task; B and C only take load, so killing B loses no input of its own.
FAILOVER_MEMBERS = (
    Member("a", 8, 6, 11),
    Member("b", 0, 0, 12),
    Member("c", 0, 0, 13),
)
FAILOVER_TRIGGER_S = 5.0
FAILOVER_MM1_SCALE = 0.36  # a threshold of 0.4 at the reference price
FAILOVER_SPREAD = 0.3
VICTIM = "b"
# The partition scenario's: B and C also have a network of their own to watch (one share,
# one task each), so that there are alerts to correlate; A correlates them.
PARTITION_MEMBERS = (
    Member("a", 8, 6, 11),
    Member("b", 1, 1, 12),
    Member("c", 1, 1, 13),
)
CORRELATOR = "a"
SHARED_SCANNERS = 2
# crash: B's host killed; cut: cut off from every host; registry: cut off from the registry's host only.
FAULTS = ("crash", "cut", "registry")


class FailoverDemo(Demo):
    """The failover scenario on the phases scenario's federation (see the module text)."""

    def __init__(self, settings: DemoSettings, view: Callable[[dict], None] | None = None, say: Callable[[str], None] = print,
                 ha_mode: str = "passive_standby", recover_timeout_s: float = 120.0, fault: str = "crash",
                 cut_s: float = 30.0) -> None:
        if fault not in FAULTS:
            raise ValueError(f"fault is one of {', '.join(FAULTS)}")
        cut = fault == "cut"
        super().__init__(dataclasses.replace(settings, trigger_s=FAILOVER_TRIGGER_S, mm1_scale=FAILOVER_MM1_SCALE,
                                             spread=FAILOVER_SPREAD, cpus=None, correlate=cut,
                                             shared_scanners=SHARED_SCANNERS if cut else 0), view, say)
        self.members = PARTITION_MEMBERS if cut else FAILOVER_MEMBERS
        self._members = {m.name: m for m in self.members}
        self.ha_mode = ha_mode
        self.recover_timeout_s = recover_timeout_s
        self.killed_at: float | None = None
        self.lost_tasks: list[str] = []
        self.recovered: list[dict] = []  # tasks whose movement ended as their host died: restarted from their copy
        self.fault = fault
        self.cut_s = cut_s  # how long B stays cut off (from the cut; at least until its tasks recovered elsewhere)
        self.healed: dict | None = None
        self.registry_cut: dict | None = None

    def _contracts(self, member: Member) -> list[AgreedTerms]:
        """The phases scenario's contracts, each with the HA mode."""
        return [dataclasses.replace(terms, ha_mode=self.ha_mode) for terms in super()._contracts(member)]

    def poll(self) -> dict:
        view, self.view = self.view, None
        try:
            state = super().poll()
        finally:
            self.view = view
        with self.fed.operator() as operator:
            state["failovers"] = operator.failovers()
            state["replicas"] = operator.replicas()
        state["killed"] = None if self.killed_at is None else {"participant": VICTIM, "t": round(self.killed_at - self.t0, 1), "fault": self.fault}
        if self.s.correlate:
            state["correlation"] = self._correlation_status()
        if self.view:
            self.view(state)
        return state

    # The run

    def run(self) -> dict:
        s = self.s
        names = [m.name for m in self.members]
        try:
            self._open_hosts()
            if self.fault != "crash" and self.fed.hosts.net is None:
                raise RuntimeError("a partition needs hosts with networks of their own (run as root on Linux, with iproute2)")
            self.fed.start_registry()
            self.say(f"registry on {self.fed.registry_url} (admin UI at {self.fed.registry_url}/, operator key {self.fed.admin_key})")
            self.say(f"contracts under {self.ha_mode}")
            self._setup_first(list(self.members), measured=["a"])
            self._phase("1 A carries every task", names, until=None, hold_s=0, warm=names)
            self._phase("2 A sheds load to B and C", names, hold_s=s.settle_s)
            self._kill_when_copied()
            if self.fault == "registry":
                self._ride_out()
                self._heal()
                self._phase("4 B is heard from again", names, hold_s=s.settle_s)
            elif self.fault == "cut":
                self._recover()
                self._heal()
                self._phase("4 B is back", names, hold_s=s.settle_s)
            else:
                self._recover()
                self._phase("4 the federation runs on without B", ["a", "c"], hold_s=s.settle_s)
            return self._finish_failover()
        finally:
            self.fed.close()

    def _kill_when_copied(self, timeout_s: float = 120.0) -> None:
        """Wait until B hosts moved tasks whose replicas hold a copy (or, without replicas, just hosts), then crash B's host."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.poll()
            hosted = [t for t in state["tasks"] if t["host"] == VICTIM and t["origin"] != VICTIM]
            synced = {r["task_id"] for r in state["replicas"] if r["state"] == "active" and r["synced_at"]}
            copied = hosted and (self.ha_mode not in ("passive_standby",) or all(t["id"] in synced for t in hosted))
            if copied or (hosted and time.monotonic() > deadline):
                break
            if time.monotonic() > deadline + timeout_s:
                raise TimeoutError(f"{VICTIM} hosted no moved task within {2 * timeout_s:.0f} s; see {self.s.workdir / 'logs'}")
            time.sleep(self.s.poll_s)
        self.lost_tasks = [f"{t['origin']}.{t['name']}" for t in hosted]
        self.killed_at = time.time()
        if self.fault == "cut":
            self.say(f"{VICTIM}'s host is cut off from every other host (a network partition) while it hosts {', '.join(self.lost_tasks)}")
            self.fed.hosts.cut(VICTIM)
        elif self.fault == "registry":
            self.say(f"{VICTIM}'s host is cut off from the registry only (it still reaches A and C) while it hosts {', '.join(self.lost_tasks)}")
            self.fed.hosts.cut_link(self.fed.REGISTRY, VICTIM)
        else:
            self.say(f"{VICTIM}'s host crashes (every process in it killed at once) while it hosts {', '.join(self.lost_tasks)}")
            self.fed.hosts.crash(VICTIM)

    def _heal(self, timeout_s: float = 120.0) -> None:
        """Heal B's link once it has been cut off `cut_s`; wait until B is heard from again and
        runs none of the tasks it lost (with `fault="registry"`: still runs every task it hosted)."""
        time.sleep(max(0.0, self.killed_at + self.cut_s - time.time()))
        if self.fault == "registry":
            self.fed.hosts.heal_link(self.fed.REGISTRY, VICTIM)
        else:
            self.fed.hosts.heal(VICTIM)
        healed_at = time.time()
        self.say(f"{VICTIM}'s link heals after {healed_at - self.killed_at:.0f} s")
        heard = stopped = None
        events: list[dict] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (heard is None or stopped is None):
            self.poll()
            with self.fed.operator() as operator:
                events = operator.events(kind="participant.healed", limit=10)
            if heard is None and any(e["subject"] == VICTIM for e in events):
                heard = time.time()
                self.say(f"  {VICTIM} is heard from again {heard - healed_at:.1f} s after the heal")
            running = self._running().get(VICTIM)
            if self.fault == "registry":
                if heard is not None and running is not None and set(self.lost_tasks) <= set(running):
                    stopped = time.time()  # nothing to stop: it kept them
                    self.say(f"  {VICTIM} still runs every task it hosted ({stopped - healed_at:.1f} s after the heal)")
            elif heard is not None and running is not None and not set(running) & (set(self.lost_tasks) - self._moved_back()):
                stopped = time.time()
                back = sorted(set(running) & set(self.lost_tasks))  # here only tasks moved back to it
                self.say(f"  {VICTIM} runs none of the tasks it lost ({stopped - healed_at:.1f} s after the heal)"
                         + (f"; {', '.join(back)} moved back to it since, at a later epoch" if back else ""))
            time.sleep(self.s.poll_s)
        after = "ran_its_tasks_after_s" if self.fault == "registry" else "stopped_lost_tasks_after_s"
        self.healed = {
            "at_s": round(healed_at - self.t0, 1),
            "heard_after_s": None if heard is None else round(heard - healed_at, 1),
            after: None if stopped is None else round(stopped - healed_at, 1),
            "events": [e["message"] for e in events if e["subject"] == VICTIM],
        }
        if self.fault == "cut":
            self.healed["moved_back"] = sorted(self._moved_back())

    def _moved_back(self) -> set[str]:
        """The tasks B lost that the registry has since given back to it by a movement (at an
        epoch past the failover's): B runs those again, under the new epoch, legitimately (A,
        loaded with what it took over, may offer one back to B as soon as B is heard from)."""
        failed_over = {}
        for f in self.state.get("failovers", []):
            if f.get("kind", "failover") == "failover" and f["from_host"] == VICTIM:
                failed_over[f["task_id"]] = max(failed_over.get(f["task_id"], 0), f["to_epoch"])
        return {f"{t['origin']}.{t['name']}" for t in self.state.get("tasks", [])
                if t["id"] in failed_over and t["host"] == VICTIM and t["epoch"] > failed_over[t["id"]]}

    def _ride_out(self) -> None:
        """Phase 3 under a cut of B's link to the registry only: for `cut_s`, watch that nothing
        of B's is failed over and that B goes on running what it hosts; A's agent notes that B
        answers it directly."""
        phase = Phase(f"3 {VICTIM}'s link to the registry is cut: {VICTIM} goes on processing", time.time() - self.t0)
        self.phases.append(phase)
        self.say(f"phase: {phase.name}")
        polls = kept = 0
        silent = False
        while time.time() < self.killed_at + self.cut_s:
            state = self.poll()
            polls += 1
            running = self._running().get(VICTIM) or {}
            kept += set(self.lost_tasks) <= set(running)
            silent = silent or any(p["name"] == VICTIM and p["status"] == "failed" for p in state["participants"])
            phase.loads, phase.thresholds = self._measured(state, ["a", "b", "c"])
            time.sleep(self.s.poll_s)
        phase.ended_s = time.time() - self.t0
        failovers = [f for f in self.failover_rows(self.state.get("failovers", [])) if f["from"] == VICTIM]
        records = (self._agent_status("a") or {}).get("records", [])
        reachable = [r["message"] for r in records if r.get("kind") == "ha.reachable"]
        self.registry_cut = {"polls": polls, "polls_running_every_task": kept, "registry_counted_it_failed": silent,
                             "failovers": failovers, "origin_noted": reachable}
        self.say(f"  {VICTIM} ran every task it hosted at {kept} of {polls} polls; {len(failovers)} failed over; "
                 f"the registry counted it failed: {silent}; A noted: {reachable[-1] if reachable else 'nothing'}")

    def _recover(self) -> None:
        """Phase 3: poll until every task B hosted was failed over and produces output again."""
        what = "is cut off" if self.fault == "cut" else "crashed"
        phase = Phase(f"3 {VICTIM}'s host {what}: detection and failover", time.time() - self.t0)
        self.phases.append(phase)
        self.say(f"phase: {phase.name}")
        deadline = time.monotonic() + self.recover_timeout_s
        while time.monotonic() < deadline:
            state = self.poll()
            with self.fed.operator() as operator:
                away = {f"{t['origin']}.{t['name']}" for t in operator.tasks(host=VICTIM)}
                self.recovered = [e for e in operator.events(kind="task.recovered", limit=100)]
            pending = [f for f in state["failovers"] if f["kind"] == "failover" and not f["completed_at"]]
            loads, thresholds = self._measured(state, ["a", "c"])
            phase.loads, phase.thresholds = loads, thresholds
            # Recovered: no task left at the dead host, every failover producing output again.
            if not away & set(self.lost_tasks) and not pending and state["failovers"]:
                break
            time.sleep(self.s.poll_s)
        else:
            self.say(f"not every task of {VICTIM} recovered within {self.recover_timeout_s:.0f} s")
        phase.ended_s = time.time() - self.t0
        for f in self.failover_rows(self.state.get("failovers", [])):
            self.say(f"  {f['task']}: {f['mode']} {f['from']} -> {f['to']}, detected {f['detected_s']} s after the {'kill' if self.fault == 'crash' else 'cut'}, recovered {f['recovery_s']} s after detection")

    # The correlated result (partition scenario)

    def _correlation_status(self) -> dict | None:
        """The correlator's own account (its agent's `/status`), for the live view; None while it cannot say."""
        return (self._agent_status(CORRELATOR, timeout_s=1.0) or {}).get("correlation")

    def _before_close(self) -> dict:
        return {"correlation": self._read_correlation()} if self.s.correlate else {}

    def _read_correlation(self, timeout_s: float = 90.0) -> dict:
        """A's correlated result read back from its broker once every window any participant
        shared is stable there (or `timeout_s` passed), against the plain correlation of the alerts each shared."""
        from spark_agents.correlation import ALERTS, parse_alerts, read_correlated, read_stream

        names = [m.name for m in self.members]
        deadline = time.monotonic() + timeout_s
        while True:
            shared: dict[str, dict] = {}
            for name in names:
                with self.inputs.broker(name) as broker:
                    shared[name] = {e.window: e.sources for e in (parse_alerts(m, name, 0.0) for m in read_stream(broker, ALERTS))}
            with self.inputs.broker(CORRELATOR) as broker:
                publishes = read_correlated(broker)
            figures = correlation_figures(publishes, shared, self.s.availability_bound_s, self.t0,
                                          None if self.healed is None else self.t0 + self.healed["at_s"])
            if not figures["windows_not_stable"] or time.monotonic() > deadline:
                return figures
            time.sleep(self.s.poll_s)

    def failover_rows(self, records: list[dict]) -> list[dict]:
        """The failovers as the report shows them: times relative to the kill and the demo's start."""
        rows = []
        for f in records:
            if f["kind"] != "failover":
                continue
            detected = seconds(f["detected_at"])
            rows.append({
                "task": f["task"], "mode": f["mode"], "from": f["from_host"], "to": f["to_host"],
                "epoch": f["to_epoch"], "requested_by": (f.get("details") or {}).get("requested_by"),
                "detected_s": None if self.killed_at is None else round(detected - self.killed_at, 2),
                "recovery_s": None if f["recovery_s"] is None else round(f["recovery_s"], 2),
                "completed": f["completed_at"] is not None, "at_s": round(detected - self.t0, 1),
            })
        return rows

    def _finish_failover(self) -> dict:
        report = self._finish()
        records = self.state.get("failovers", [])
        report["scenario"] = {"cut": "partition", "registry": "registry-cut"}.get(self.fault, "failover")
        report["ha_mode"] = self.ha_mode
        report["killed"] = {"participant": VICTIM, "at_s": round(self.killed_at - self.t0, 1) if self.killed_at else None,
                            "hosted": self.lost_tasks, "fault": self.fault}
        if self.fault != "crash":
            report["healed"] = self.healed
        if self.fault == "registry":
            report["registry_cut"] = self.registry_cut
        if report.get("correlation"):
            self.say(describe_correlation(report["correlation"]))
        report["failovers"] = self.failover_rows(records)
        report["recovered_without_failover"] = [{"message": e["message"], "at": e["at"]} for e in self.recovered]
        report["repairs"] = [
            {"task": f["task"], "at": f["to_host"], "completed": f["completed_at"] is not None,
             "repair_of": (f.get("details") or {}).get("repair_of")}
            for f in records if f["kind"] == "repair"
        ]
        return report


def correlation_figures(publishes: list, shared: dict[str, dict], bound_s: float, t0: float, healed_at: float | None) -> dict:
    """The report's account of the correlated result: `publishes`, the versions in the order
    published; `shared`, each participant's alerts per window as it shared them (a window
    any participant shared and no stable version covers is not stable yet). A window's plain
    correlation is over the participants that shared it."""
    from bpm.dpc import CorrelatedView, correlate

    view = CorrelatedView()
    first: dict = {}
    series = []
    for p in publishes:
        view.apply(p)
        first.setdefault(p.window, p)
        tentative = sum(len(rows) for w, rows in view.rows.items() if w not in view.stable)
        stable = sum(len(view.rows[w]) for w in view.stable)
        series.append({"t": round(p.at - t0, 2), "window_end": p.window[1], "version": p.version, "stable": p.stable,
                       "delay_s": round(p.at - p.due_at, 2) if p.version == 1 else None,
                       "tentative_rows": tentative, "stable_rows": stable})
    pending = sorted({w for alerts in shared.values() for w in alerts} - view.stable)
    plain = {w: correlate(w, {name: alerts[w] for name, alerts in shared.items() if w in alerts}) for w in view.stable}
    mismatched = [list(w) for w in sorted(view.stable) if frozenset(view.rows[w]) != plain[w]]
    tentative = {p.window for p in publishes if not p.stable}
    stabilised = [p.at for p in publishes if p.stable and p.window in tentative]
    return {
        "correlator": CORRELATOR,
        "availability_bound_s": bound_s,
        "windows": len(view.versions),
        "stable_windows": len(view.stable),
        "windows_not_stable": [list(w) for w in pending],
        "versions": len(publishes),
        "tentative_windows": len(tentative),
        "tentative_rows": sum(len(p.added) for p in publishes if not p.stable),
        "stable_rows": len(view.stable_rows()),
        "max_first_result_delay_s": round(max((p.at - p.due_at for p in first.values()), default=0.0), 2),
        "stabilisation_s": round(max(stabilised) - healed_at, 2) if stabilised and healed_at is not None else None,
        "stable_equals_plain": not mismatched and not pending,
        "mismatched_windows": mismatched[:10],
        "series": series,
    }


def describe_correlation(c: dict) -> str:
    """One line on the correlated result, for the terminal."""
    tentative = (f"{c['tentative_windows']} windows were tentative ({c['tentative_rows']} rows), stable {c['stabilisation_s']} s after the heal"
                 if c["tentative_windows"] else "no window was tentative")
    return (f"correlated result at {c['correlator']}: {c['stable_windows']} windows stable, {c['stable_rows']} rows; {tentative}; "
            f"first results at most {c['max_first_result_delay_s']} s after due (bound {c['availability_bound_s']:g} s); "
            f"stable rows {'equal' if c['stable_equals_plain'] else 'DIFFER FROM'} the plain correlation")
