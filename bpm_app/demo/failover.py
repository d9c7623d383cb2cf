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

from bpm.federation.views import AgreedTerms
from bpm_app.demo.faults import KINDS as FAULTS
from bpm_app.demo.faults import Fault
from bpm_app.demo.run import Demo, DemoSettings, Member, Phase

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


class FailoverDemo(Demo):
    """The failover scenario on the phases scenario's federation (see the module text).

    Attributes:
        fault: B's fault (`bpm_app.demo.faults.Fault`).
    """

    def __init__(self, settings: DemoSettings, view: Callable[[dict], None] | None = None, say: Callable[[str], None] = print,
                 ha_mode: str = "passive_standby", recover_timeout_s: float = 120.0, fault: str = "crash",
                 cut_s: float = 30.0) -> None:
        if fault not in FAULTS:
            raise ValueError(f"fault is one of {', '.join(FAULTS)}")
        cut = fault == "cut"
        self.members = PARTITION_MEMBERS if cut else FAILOVER_MEMBERS
        super().__init__(dataclasses.replace(settings, trigger_s=FAILOVER_TRIGGER_S, mm1_scale=FAILOVER_MM1_SCALE,
                                             spread=FAILOVER_SPREAD, cpus=None, correlate=cut,
                                             shared_scanners=SHARED_SCANNERS if cut else 0), view, say)
        self.ha_mode = ha_mode
        self.recover_timeout_s = recover_timeout_s
        self.fault = Fault(self, VICTIM, fault, ha_mode=ha_mode, cut_s=cut_s)

    def _contracts(self, member: Member) -> list[AgreedTerms]:
        """The phases scenario's contracts, each with the HA mode."""
        return [dataclasses.replace(terms, ha_mode=self.ha_mode) for terms in super()._contracts(member)]

    def poll(self) -> dict:
        view, self.view = self.view, None
        try:
            state = super().poll()
        finally:
            self.view = view
        at = self.fault.at
        state["killed"] = None if at is None else {"participant": VICTIM, "t": round(at - self.t0, 1), "fault": self.fault.kind}
        if self.s.correlate:
            state["correlation"] = self._correlation_status()
        if self.view:
            self.view(state)
        return state

    # The run

    def run(self) -> dict:
        s = self.s
        names = [m.name for m in self.members]
        fault = self.fault
        try:
            self._open_hosts()
            if fault.kind != "crash" and self.fed.hosts.net is None:
                raise RuntimeError("a partition needs hosts with networks of their own (run as root on Linux, with iproute2)")
            self.fed.start_registry()
            self.say(f"registry on {self.fed.registry_url} (admin UI at {self.fed.registry_url}/, operator key {self.fed.admin_key})")
            self.say(f"contracts under {self.ha_mode}")
            self._setup_first(list(self.members), measured=["a"])
            self._phase("1 A carries every task", names, until=None, hold_s=0, warm=names)
            self._phase("2 A sheds load to B and C", names, hold_s=s.settle_s)
            self.drive(fault.strike_when_copied())
            if fault.kind == "registry":
                self._stepped_phase(f"3 {VICTIM}'s link to the registry is cut: {VICTIM} goes on processing", ["a", "b", "c"], fault.ride_out())
                self.drive(fault.heal())
                self._phase("4 B is heard from again", names, hold_s=s.settle_s)
            elif fault.kind == "cut":
                self._stepped_phase(f"3 {VICTIM}'s host is cut off: detection and failover", ["a", "c"], fault.recover(self.recover_timeout_s))
                self.drive(fault.heal())
                self._phase("4 B is back", names, hold_s=s.settle_s)
            else:
                self._stepped_phase(f"3 {VICTIM}'s host crashed: detection and failover", ["a", "c"], fault.recover(self.recover_timeout_s))
                self._phase("4 the federation runs on without B", ["a", "c"], hold_s=s.settle_s)
            return self._finish_failover()
        finally:
            self.fed.close()

    def _stepped_phase(self, name: str, names: list[str], steps) -> Phase:
        """A phase that lasts as long as `steps` (the fault's), its loads those of `names` at its end."""
        phase = Phase(name, time.time() - self.t0)
        self.phases.append(phase)
        self.say(f"phase: {name}")

        def measure(state: dict) -> None:
            phase.loads, phase.thresholds = self._measured(state, names)

        self.drive(steps, each=measure)
        phase.ended_s = time.time() - self.t0
        return phase

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
        healed = self.fault.healed
        while True:
            shared: dict[str, dict] = {}
            for name in names:
                with self.inputs.broker(name) as broker:
                    shared[name] = {e.window: e.sources for e in (parse_alerts(m, name, 0.0) for m in read_stream(broker, ALERTS))}
            with self.inputs.broker(CORRELATOR) as broker:
                publishes = read_correlated(broker)
            figures = correlation_figures(publishes, shared, self.s.availability_bound_s, self.t0,
                                          None if healed is None else self.t0 + healed["at_s"])
            if not figures["windows_not_stable"] or time.monotonic() > deadline:
                return figures
            time.sleep(self.s.poll_s)

    def _finish_failover(self) -> dict:
        report = self._finish()
        records = self.state.get("failovers", [])
        fault = self.fault.report(records)
        report["scenario"] = {"cut": "partition", "registry": "registry-cut"}.get(self.fault.kind, "failover")
        report["ha_mode"] = self.ha_mode
        report["killed"] = {k: fault[k] for k in ("participant", "at_s", "hosted", "fault")}
        for key in ("healed", "registry_cut", "failovers", "repairs", "recovered_without_failover"):
            if key in fault:
                report[key] = fault[key]
        if report.get("correlation"):
            self.say(describe_correlation(report["correlation"]))
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
