"""`bpm bench control-plane`: N live agents over simulated Spark hosts against one registry."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from bpm_app.commands import HAMode, bench_app
from bpm_app.commands.bench_registry import database_backend, server_cpu_probe, start_registry


@bench_app.command("control-plane")
def bench_control_plane_command(
    agents: Annotated[int, typer.Option(min=1, help="Agents (participants) to run.")] = 20,
    seconds: Annotated[float, typer.Option(min=1.0, help="How long the agents run, once set up.")] = 60.0,
    tasks: Annotated[int, typer.Option(min=1, help="Tasks per participant.")] = 5,
    tick: Annotated[float, typer.Option(min=0.05, help="Each agent's tick, seconds.")] = 0.5,
    heartbeat: Annotated[float, typer.Option(min=0.1, help="Each agent's heartbeat, seconds: how often it hears of changes.")] = 1.0,
    warmup: Annotated[float, typer.Option(min=0.0, help="Seconds the agents run before anything is counted.")] = 10.0,
    period: Annotated[float, typer.Option(min=0.1, help="Each agent's mechanism period, seconds.")] = 7.0,
    threads: Annotated[int, typer.Option(min=1, help="Threads that tick the agents, in each process.")] = 32,
    processes: Annotated[int | None, typer.Option(min=1, help="Processes the agents run in, each a block of them with contracts "
                                                  "among themselves (default: one per CPU).")] = None,
    database_url: Annotated[str | None, typer.Option(help="Database of the registry started for the run (default: a temporary SQLite file).")] = None,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes of the registry.")] = 1,
    port: Annotated[int, typer.Option(help="Port of the registry started for the run.")] = 8798,
    load_factor: Annotated[float, typer.Option(min=0.01, help="Each participant's mean load over its threshold.")] = 0.8,
    skew: Annotated[float, typer.Option(min=0.0, max=0.95, help="Even participants carry the load factor times 1 + skew, odd ones times 1 - skew.")] = 0.0,
    amplitude: Annotated[float, typer.Option(min=0.0, max=0.95, help="How far the loads' wave swings around the mean (a share of it).")] = 0.5,
    seed: Annotated[int, typer.Option(help="Seed of the tasks' loads and waves.")] = 0,
    ha_mode: Annotated[HAMode, typer.Option(help="The contracts' HA mode: with any but none the agents run their HA duties.")] = HAMode.none,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Run N agents (the real agent and state machine, a simulated Spark host, no JVM) against
    one registry with loads that rise and fall, and report tick lateness, requests and
    registry CPU per agent-second, offers and movements per second, and errors."""
    from rich.progress import TaskID

    from bpm_app.bench.control_plane import Settings, run
    from bpm_app.progress import progress

    settings = Settings(agents=agents, seconds=seconds, tasks=tasks, tick_s=tick, heartbeat_s=heartbeat, warmup_s=warmup, period_s=period, threads=threads,
                        processes=processes or os.cpu_count() or 1,
                        load_factor=load_factor, skew=skew, amplitude=amplitude, seed=seed, ha_mode=ha_mode.value)
    with tempfile.TemporaryDirectory(prefix="bpm-bench-") as tmp:
        database_url = database_url or f"sqlite:///{Path(tmp) / 'bench.db'}"
        process = start_registry(database_url, port, workers, Path(tmp))
        try:
            with progress() as steps:
                shown: dict[str, TaskID] = {}

                def report(phase: str, done: int, total: int) -> None:
                    if phase not in shown:
                        shown[phase] = steps.add(phase, total)
                    steps.update(shown[phase], completed=done)

                server_cpu, counted = server_cpu_probe(process, database_url)
                result = run(f"http://127.0.0.1:{port}", "bench-operator-key", settings, Path(tmp), report, server_cpu)
        finally:
            process.terminate()
            process.wait(timeout=30)
            log = Path(tmp) / "registry.log"
            if log.exists() and "Traceback" in (text := log.read_text(errors="replace")):
                typer.echo("the registry failed requests; the end of its log:\n" + text[-4000:], err=True)
    result = {"benchmark": "control-plane", "database": database_backend(database_url), "workers": workers, **result,
              "registry_cpu_counts": counted}
    if as_json:
        typer.echo(json.dumps(result))
    else:
        for key, value in result.items():
            typer.echo(f"{key:>28}: {value}")
