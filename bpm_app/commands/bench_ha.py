"""`bpm bench ha`: the same task under each HA mode, with a crash of its host mid-stream or a partition."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from bpm_app.commands import bench_app, choice

from bpm_app.bench.ha import FAULTS

Fault = choice("Fault", FAULTS)


@bench_app.command("ha")
def bench_ha_command(
    modes: Annotated[str, typer.Option(help="HA modes to run, in order, comma-separated (none is the overhead baseline).")] = "none,upstream_backup,passive_standby,active_standby",
    spark_master: Annotated[str, typer.Option(help="Spark master of each process's session.")] = "local[1]",
    trigger: Annotated[float, typer.Option(min=0.05, help="The task's micro-batch trigger interval, seconds.")] = 1.0,
    query: Annotated[str | None, typer.Option(help="The task's query, module:attribute or path/to/file.py:attribute; its module's generate(seconds=, rate=, seed=) makes the input (default: the network-monitoring query).")] = None,
    param: Annotated[list[str] | None, typer.Option("--param", help="A parameter of the query, name=value (repeatable).")] = None,
    rate: Annotated[float, typer.Option(min=1.0, help="Generated records per second of event time.")] = 100.0,
    speedup: Annotated[float, typer.Option(min=0.1, help="Event time per second of wall time.")] = 10.0,
    copy_interval: Annotated[float, typer.Option(min=0.1, help="Seconds between delta checkpoints (passive standby).")] = 2.0,
    ack_interval: Annotated[float, typer.Option(min=0.1, help="Seconds between stream acknowledgements (other modes).")] = 1.0,
    heartbeat: Annotated[float, typer.Option(min=0.01, help="Seconds between the host's heartbeats.")] = 0.25,
    detect_timeout: Annotated[float, typer.Option(min=0.1, help="Heartbeat silence after which the host counts as failed, seconds.")] = 3.0,
    warmup: Annotated[float, typer.Option(min=0.0, help="Seconds the task runs before measuring.")] = 10.0,
    measure: Annotated[float, typer.Option(min=1.0, help="Seconds of the overhead measurement before the kill.")] = 40.0,
    slices: Annotated[int, typer.Option(min=2, help="Slices of the measurement, alternating the host's HA duties off and on (even).")] = 8,
    after: Annotated[float, typer.Option(min=0.0, help="Seconds of feeding after the kill, before the stream closes.")] = 10.0,
    seed: Annotated[int, typer.Option(help="Seed of the generated input.")] = 0,
    lean: Annotated[bool, typer.Option(help="Run local drivers with the C1 compiler and the serial collector, as agents do.")] = True,
    conf: Annotated[list[str] | None, typer.Option("--conf", help="A further Spark setting of both sessions, KEY=VALUE (repeatable).")] = None,
    timeout: Annotated[float, typer.Option(min=10.0, help="Limit of the whole run, seconds.")] = 1800.0,
    fault: Annotated[Fault, typer.Option(help="crash: kill -9 of the task's host; cut: its host cut off from all, then healed; link: the link between the host and the backup cut, then healed.")] = Fault.crash,
    cut_for: Annotated[float, typer.Option(min=0.5, help="How long a partition lasts, seconds.")] = 10.0,
    hosts: Annotated[bool, typer.Option("--hosts/--no-hosts", help="Run the task's host and the backup each in a network namespace of its own (needs root; else loopback addresses).")] = True,
    insecure: Annotated[bool, typer.Option("--insecure", help="The origin's broker in plain text (by default TLS, pinned, as an agent's broker serves it).")] = False,
    workdir: Annotated[Path | None, typer.Option(help="Keep the run's files here (default: a temporary folder, removed).")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a PNG of the output delay across the failure, per mode.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Overhead, detection, recovery, lost and duplicated results of each HA mode across a crash of the task's host (or a partition)."""
    from rich.console import Console
    from bpm_app.progress import progress

    from bpm_app.bench.ha import BENCH_WORKLOAD, HABenchError, HASettings, plot_delays, run_ha_bench, without_delays
    from bpm_app.bench.move import MoveBenchError
    from bpm_app.commands.bench_move import conf_setting, workload

    try:
        settings = HASettings(
            modes=tuple(m.strip() for m in modes.split(",") if m.strip()), master=spark_master, trigger_s=trigger, rate=rate,
            speedup=speedup, seed=seed, copy_interval_s=copy_interval, ack_interval_s=ack_interval, heartbeat_s=heartbeat,
            detect_timeout_s=detect_timeout, warmup_s=warmup, measure_s=measure, slices=slices, after_s=after, timeout_s=timeout,
            lean=lean, extra_conf=tuple(conf_setting(item) for item in conf or ()), hosts=hosts,
            fault=fault.value, cut_s=cut_for, workload=workload(query, param, BENCH_WORKLOAD), tls=not insecure,
        )
    except ValueError as exc:
        typer.secho(str(exc), fg="red", err=True)
        raise typer.Exit(2) from None
    err = Console(stderr=True)
    try:
        with tempfile.TemporaryDirectory(prefix="bpm-bench-ha-") as tmp, progress("modes", console=err) as steps:
            done = steps.add("starting", len(settings.modes))
            root = workdir or Path(tmp)
            root.mkdir(parents=True, exist_ok=True)
            result = run_ha_bench(settings, root, lambda what, n: steps.update(done, description=what, completed=n))
    except (HABenchError, MoveBenchError) as exc:
        typer.secho(f"bench ha failed: {exc}", fg="red", err=True)
        raise typer.Exit(1) from None
    if plot is not None:
        result["plot"] = str(plot_delays(result, plot))
    if as_json:
        typer.echo(json.dumps(result))
        return
    Console().print(_modes_table(without_delays(result)))
    if plot is not None:
        Console().print(f"plot: {result['plot']}")


def _modes_table(result: dict):
    from rich import box
    from rich.table import Table

    from bpm_app.bench.ha import FAULT_WORDS

    table = Table(title=f"HA modes across {FAULT_WORDS[result['settings']['fault']]}", box=box.SIMPLE_HEAD)
    for column in ("mode", "overhead", "detection s", "recovery s", "after detection s", "lost", "duplicated", "goals"):
        table.add_column(column, justify="left" if column in ("mode", "goals") else "right")
    for m in result["modes"]:
        goals = ", ".join(f"{k} {'met' if v else 'NOT met'}" for k, v in m["goals"].items() if v is not None)
        cells = [m["overhead_ratio"], m["detection_s"], m["recovery_s"], m["recovery_after_detection_s"], m["lost_results"], m["duplicate_results"]]
        table.add_row(m["mode"], *("-" if c is None else str(c) for c in cells), goals)
    return table
