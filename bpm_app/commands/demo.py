"""`bpm demo`: the README's main command."""

from __future__ import annotations

import json
import shutil
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from bpm_app.commands import HAMode, LogFormat, app, fail
from bpm_app.logs import teller

# What marks a folder as a run folder `bpm demo` made: only such a folder is emptied for a new run.
RUN_MARK = ".bpm-demo-run"


class Scenario(str, Enum):
    phases = "phases"
    failover = "failover"
    partition = "partition"
    registry_cut = "registry-cut"
    split = "split"
    tour = "tour"


def prepare_workdir(workdir: Path) -> None:
    """Make `workdir` an empty run folder: remove an earlier run's (it holds `RUN_MARK`), never
    a folder the demo did not make (the command fails instead, and nothing is deleted)."""
    if workdir.exists():
        if not workdir.is_dir():
            fail(f"--workdir {workdir} is a file, not a folder")
        if any(workdir.iterdir()):
            if not (workdir / RUN_MARK).exists():
                fail(f"--workdir {workdir} holds files that no earlier `bpm demo` run made: choose another folder, or empty it yourself")
            shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / RUN_MARK).write_text("made by bpm demo: removed with its contents when the next run uses this folder\n")


@app.command("demo")
def demo(
    headless: Annotated[bool, typer.Option("--headless", help="No live terminal view.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object on stdout.")] = False,
    workdir: Annotated[Path, typer.Option(help="Where the run keeps its registry, streams, checkpoints, output and logs (an earlier run's folder is emptied first; any other folder that is not empty is refused).")] = Path("demo-run"),
    report_dir: Annotated[Path, typer.Option("--report", help="Report folder: report.json and timeline.png.")] = Path("demo-report"),
    port: Annotated[int, typer.Option(help="Registry port (the admin UI is served there too).")] = 8700,
    phase_timeout: Annotated[float, typer.Option(help="Longest wait of a phase for an acceptable allocation, seconds.")] = 240.0,
    scenario: Annotated[Scenario, typer.Option(help="phases: the four phases of load management; failover: kill -9 of a participant hosting moved tasks, and the recovery; partition: the same participant cut off from every other host, then healed; registry-cut: cut off from the registry only, it goes on processing; split: a task too large to move is split over its key groups and a half moves; tour: every one of them on one federation (the phases on A, B and C while E splits its task and D, hosting a piece of it, is cut off from the registry, partitioned and crashed; then D joins).")] = Scenario.phases,
    ha_mode: Annotated[HAMode, typer.Option(help="The contracts' HA mode in the failover and partition scenarios.")] = HAMode.passive_standby,
    cut_for: Annotated[float, typer.Option(min=1.0, help="How long the partition and registry-cut scenarios keep the participant cut off, seconds from the cut.")] = 30.0,
    cpus: Annotated[float, typer.Option(min=0.0, help="Each participant's capacity: a CPU quota of its own (a cgroup; needs root). 0: the participants share the machine's CPUs.")] = 0.4,
    boot_cpus: Annotated[float, typer.Option(min=0.0, help="Each participant's CPU quota while its JVM and its tasks start, before phase 1, and while they drain after phase 4; its capacity (--cpus) in every phase. 0: its capacity throughout.")] = 0.8,
    hosts: Annotated[bool, typer.Option("--hosts/--no-hosts", help="Each participant and the registry in a network namespace of its own, on a private bridge (needs root); else loopback addresses 127.0.0.2 on.")] = True,
    log_format: Annotated[LogFormat, typer.Option(help="text, or json: what the demo tells as one JSON object per line on stderr (no live view).")] = LogFormat.text,
    queries: Annotated[list[str] | None, typer.Option("--queries", help="PARTICIPANT=module:attribute (repeatable): that participant's own tasks run this query (bpm.query; its module's generate() makes its input) instead of the network-monitoring query; every agent can host every query of the run, and the report compares each query's results with its plain computation.")] = None,
) -> None:
    """Run the four phases of the Borealis poster on a local federation, each participant a host of its own
    (SQLite, Spark local), or, with --scenario failover, crash a participant's host while it hosts moved tasks
    and show the federation recover (--scenario partition: cut it off from every other host, then heal it), or
    with --scenario split split a task too large to move and shed a half."""
    from bpm_app.demo.outcomes import misses, phase_ending, promised_ends
    from bpm_app.demo.report import write_report
    from bpm_app.demo.run import Demo, DemoSettings

    if scenario in (Scenario.partition, Scenario.registry_cut, Scenario.tour) and not hosts:
        raise typer.BadParameter(f"--scenario {scenario.value} cuts a host's links: it needs --hosts")

    def make(**kw):
        if scenario == Scenario.tour:
            from bpm_app.demo.tour import Tour

            return Tour(settings, **kw)
        if scenario == Scenario.split:
            from bpm_app.demo.split import SplitDemo

            return SplitDemo(settings, **kw)
        if scenario != Scenario.phases:
            from bpm_app.demo.failover import FailoverDemo

            fault = {Scenario.partition: "cut", Scenario.registry_cut: "registry"}.get(scenario, "crash")
            return FailoverDemo(settings, ha_mode=ha_mode.value, fault=fault, cut_s=cut_for, **kw)
        return Demo(settings, **kw)

    chosen = _queries(queries, scenario)
    prepare_workdir(workdir)
    settings = DemoSettings(workdir=workdir.resolve(), port=port, phase_timeout_s=phase_timeout, cpus=cpus or None, boot_cpus=boot_cpus or None,
                            network=hosts, queries=chosen)
    started = time.monotonic()

    def stamped(msg: str) -> str:
        """A line of the run's story, after the seconds since the run began (the report's
        clock): where a run's time went can be read from its log."""
        return f"{time.monotonic() - started:4.0f} s  {msg}"

    say = teller(log_format.value, "bpm.demo", markup=False) if log_format == LogFormat.json else (lambda msg: print(stamped(msg), file=sys.stderr, flush=True))
    if headless or log_format == LogFormat.json:
        runner = make(say=say)
        report = _run(runner)
    else:
        from rich.console import Console
        from rich.live import Live

        from bpm_app.demo.view import render

        console = Console(stderr=as_json)
        with Live(console=console, refresh_per_second=2, transient=False) as live:
            runner = make(view=lambda state: live.update(render(state)), say=lambda msg: live.console.print(stamped(msg), markup=False, highlight=False))
            report = _run(runner)
        if not console.is_terminal:
            console.line()  # to a file or pipe the view's last state ends without one
    folder = write_report(report, report_dir, runner.t0)
    missed = misses(report)
    if as_json:
        typer.echo(json.dumps({**{k: v for k, v in report.items() if k not in ("timeline", "cpu")}, "misses": missed}))
    else:
        typer.echo(f"report: {folder / 'report.json'} and {folder / 'timeline.png'}")
        for phase, promise in zip(report["phases"], promised_ends(report)):
            typer.echo(f"  {phase['name']}: {phase_ending(phase, promise)}")
        typer.echo(f"  movements {len(report['movements'])}, lost results {report['lost_results']}, duplicate results {report['duplicate_results']}")
        for name, q in report.get("queries", {}).items() if len(report.get("queries", {})) > 1 else ():
            typer.echo(f"  query {name} ({', '.join(q['participants'])}): {q['output_results']} results of {q['expected_results']} expected, "
                       f"lost {q['lost_results']}, duplicated {q['duplicate_results']}, extra {q['extra_results']}")
        for r in report.get("regrains", []):
            typer.echo(f"  {r['kind']} of {r['origin']}'s {', '.join(r['from'])} into {', '.join(r['made'])} at {r['t']:.0f} s")
        for f in report.get("failovers", []):
            typer.echo(f"  failover of {f['task']} ({f['mode']}) {f['from']} -> {f['to']}: detected {f['detected_s']} s after the fault, recovery {f['recovery_s']} s")
        for f in report.get("faults", []):
            typer.echo(f"  {f['participant']}'s host: {f['fault']} at {f['at_s']} s while it hosted {', '.join(f['hosted']) or 'nothing'}; "
                       f"{len(f['failovers'])} failed over")
        if report.get("healed"):
            h = report["healed"]
            then = (f"still ran every task it hosted after {h['ran_its_tasks_after_s']} s" if "ran_its_tasks_after_s" in h
                    else f"stopped the tasks it lost after {h['stopped_lost_tasks_after_s']} s")
            typer.echo(f"  healed at {h['at_s']} s: heard from again after {h['heard_after_s']} s, {then}")
        for miss in missed:
            typer.echo(f"  missed: {miss}", err=True)
    if missed:
        raise typer.Exit(1)  # a run that broke a promise fails, for scripts and CI


def _queries(given: list[str] | None, scenario: Scenario) -> dict[str, str]:
    """`--queries` by participant, each query loaded once to check it; exits 2 with the reason."""
    from bpm.query import QueryError
    from bpm_app.demo.queries import DemoQuery, parse_queries

    if not given:
        return {}
    if scenario != Scenario.phases:
        fail(f"--queries: the {scenario.value} scenario runs the network-monitoring query; mixed queries run in the phases scenario")
    from bpm_app.demo.run import MEMBERS

    try:
        chosen = parse_queries(given, [m.name for m in MEMBERS])
        for reference in set(chosen.values()):
            DemoQuery.load(reference)
    except (QueryError, ValueError) as exc:
        fail(str(exc))
    return chosen


def _run(runner) -> dict:
    import signal

    def _stop(*_):
        # The first Ctrl-C or SIGTERM stops the demo; one that follows at once must not cut the
        # clean-up short before it starts (the federation shields its own close the same way).
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    # SIGTERM (a supervisor, `kill`) cleans up like Ctrl-C: every process of the demo stops.
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return runner.run()
    except KeyboardInterrupt:
        print("interrupted: every process of the demo has been stopped", file=sys.stderr)
        raise typer.Exit(130) from None
    finally:  # a caller in the same process (a test) gets its own handlers back
        for sig, handler in previous.items():
            signal.signal(sig, handler)


