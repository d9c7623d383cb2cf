"""`bpm bench registry`: offer-and-accept round trips per second and latency against a registry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from bpm_app.commands import bench_app


def start_registry(database_url: str, port: int, workers: int, workdir: Path) -> subprocess.Popen:
    """A registry for a benchmark (operator key `bench-operator-key`), answering on `port`."""
    from bpm_app.processes import wait_http

    env = {**os.environ, "BPM_ADMIN_KEY": "bench-operator-key"}
    bpm = str(Path(sys.executable).with_name("bpm"))
    args = [bpm, "registry", "serve", "--database-url", database_url, "--port", str(port), "--workers", str(workers), "--log-level", "warning"]
    log = workdir / "registry.log"
    with log.open("w") as out:
        process = subprocess.Popen(args, cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=out)
    try:
        wait_http(f"http://127.0.0.1:{port}/healthz", process, log, 60)
    except (RuntimeError, TimeoutError):
        process.kill()
        raise
    return process


def local_database_pid(database_url: str) -> int | None:
    """The PID of the PostgreSQL server behind `database_url` when it runs on this machine and
    its processes can be read (the parent of the backend that answers); None otherwise, and
    for SQLite, whose work the registry's own process does."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    url = make_url(database_url)
    if url.get_backend_name() != "postgresql" or url.host not in (None, "", "127.0.0.1", "localhost", "::1"):
        return None
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        return int(Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
    finally:
        engine.dispose()


def server_cpu_probe(process: subprocess.Popen | None, database_url: str | None) -> tuple[Callable[[], float | None], list[str]]:
    """What a benchmark counts as the server's CPU: a reading of the CPU seconds used so far by
    the registry it started (its process tree) and, when the registry's database is a
    PostgreSQL server on this machine, by that server's process tree too; and the names of
    what it counts. Without a registry of its own, nothing is counted."""
    from spark_agents.metrics import process_tree_cpu_seconds

    if process is None:
        return (lambda: None), []
    database = None if database_url is None else local_database_pid(database_url)
    if database is None:
        return (lambda: process_tree_cpu_seconds(process.pid)), ["registry"]

    def both() -> float | None:
        registry, postgres = process_tree_cpu_seconds(process.pid), process_tree_cpu_seconds(database)
        return None if registry is None or postgres is None else registry + postgres

    return both, ["registry", "postgresql"]


@bench_app.command("registry")
def bench_registry_command(
    registry: Annotated[str | None, typer.Option(envvar="BPM_REGISTRY_URL", help="A running registry's base URL; by default one is started for the run.")] = None,
    key: Annotated[str | None, typer.Option(envvar="BPM_ADMIN_KEY", help="The operator key of the running registry.")] = None,
    database_url: Annotated[str | None, typer.Option(help="Database of the registry started for the run (default: a temporary SQLite file).")] = None,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes of the registry started for the run.")] = 1,
    clients: Annotated[int, typer.Option(min=1, help="Concurrent clients.")] = 100,
    rounds: Annotated[int, typer.Option(min=1, help="Round trips per client.")] = 20,
    port: Annotated[int, typer.Option(help="Port of the registry started for the run.")] = 8799,
    contend: Annotated[bool, typer.Option("--contend", help="Clients share a crowd of participants (one per five clients) and race: "
                                          "refusals counted by kind, the registry's invariants checked after the run.")] = False,
    processes: Annotated[int, typer.Option(min=1, help="Processes the clients run in (each a share of them): the clients' own CPU "
                                           "is then not one interpreter's.")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Offer-and-accept round trips per second, p50 and p99 latency, with N concurrent clients;
    for a registry it starts itself, the server's CPU per round trip. With --contend, the
    clients race for the same participants and tasks; exits 1 if an invariant broke."""
    from bpm_app.progress import progress

    from bpm_app.bench.registry import bench_registry, crowd_size

    process = None
    with tempfile.TemporaryDirectory(prefix="bpm-bench-") as tmp:
        url = registry
        if url is None:
            database_url = database_url or f"sqlite:///{Path(tmp) / 'bench.db'}"
            process = start_registry(database_url, port, workers, Path(tmp))
            url, key = f"http://127.0.0.1:{port}", "bench-operator-key"
        if not key:
            typer.secho("--key (or BPM_ADMIN_KEY), the operator key, is needed for a running registry", fg="red", err=True)
            raise typer.Exit(2)
        try:
            with progress("participants") as steps:
                setup = steps.add("registering participants, contracts and tasks", crowd_size(clients) if contend else clients)
                server_cpu, counted = server_cpu_probe(process, database_url)
                result = bench_registry(url, key, clients, rounds, lambda phase, n: steps.update(setup, advance=n), server_cpu, contend=contend,
                                        processes=processes)
        finally:
            if process is not None:
                process.terminate()
                process.wait(timeout=30)
    result = {"benchmark": "registry", "url": url, "database": database_backend(database_url), "workers": workers if process else None, **result,
              "server_cpu_counts": counted}
    result["goals"] = registry_goals(result)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        for key, value in result.items():
            typer.echo(f"{key:>20}: {value}")
    if result.get("crowd_violations"):
        typer.secho(f"the registry broke {len(result['crowd_violations'])} invariant(s) under contention", fg="red", err=True)
        raise typer.Exit(1)


def registry_goals(result: dict) -> dict[str, bool | None]:
    """Issue 64's goals, met or not, in a run's JSON (`scripts/check-goals.py` reads them): at
    100 clients or more on PostgreSQL with its CPU counted, 1,000 round trips/s, p99 under
    50 ms and at most 2 ms of registry and database CPU a round trip (null elsewhere: the
    goal is set for that setting); under contention, no invariant broken."""
    if result.get("mode") == "contend":
        return {"invariants_kept": not result["crowd_violations"]}
    at_goal = result["clients"] >= 100 and result["database"] == "postgresql" and "postgresql" in result.get("server_cpu_counts", [])
    cpu = result["server_cpu_ms_per_round_trip"]
    return {
        "round_trips_per_s_at_least_1000": (result["round_trips_per_s"] or 0) >= 1000 if at_goal else None,
        "p99_under_50_ms": (result["p99_ms"] is not None and result["p99_ms"] < 50) if at_goal else None,
        "server_cpu_at_most_2_ms_per_round_trip": (cpu is not None and cpu <= 2) if at_goal else None,
    }


def database_backend(database_url: str | None) -> str | None:
    """`sqlite` or `postgresql` from a database URL."""
    if database_url is None:
        return None
    return database_url.split(":", 1)[0].split("+", 1)[0]
