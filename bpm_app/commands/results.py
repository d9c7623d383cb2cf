"""`bpm results`: read a task's results from its origin's broker."""

from __future__ import annotations

import json
import os
import time

import typer

from bpm_app.commands import BrokerCert, InsecureBroker, app, broker_tls, fail


@app.command("results")
def results_command(
    task: str = typer.Argument(..., help="The task's key, ORIGIN.NAME."),
    broker: str = typer.Option(..., "--broker", help="The origin's broker: nats://HOST:PORT/ORIGIN (password in BPM_NATS_PASSWORD)."),
    user: str | None = typer.Option(None, "--user", help="The broker's user (default: the origin)."),
    follow: bool = typer.Option(False, "--follow", help="Keep reading new results until Ctrl-C (or --seconds)."),
    seconds: float | None = typer.Option(None, "--seconds", min=0.1, help="With --follow: stop after this long."),
    poll: float = typer.Option(1.0, "--poll", min=0.1, help="With --follow: seconds between reads."),
    broker_cert: BrokerCert = None,
    insecure: InsecureBroker = False,
) -> None:
    """Print a task's result rows, one JSON object per line, each with the epoch and batch that wrote it."""
    from bpm.names import UnsafeName, check_name
    from spark_agents.broker.results import read_results
    from spark_agents.broker.server import BrokerError
    from bpm.keygroups import PASSWORD_ENV, parse_location
    from spark_agents.broker.stream import Broker

    try:
        check_name(task, "task key")
        located = parse_location(broker)
        url, origin = located.url, located.participant
        if not task.startswith(origin + "."):
            raise ValueError(f"task {task} is not {origin}'s: its key starts with its origin")
        password = os.environ.get(PASSWORD_ENV)
        if not password:
            raise ValueError(f"set {PASSWORD_ENV} to the broker user's password")
        connection = Broker(url, user or origin, password, tls=broker_tls(broker_cert, insecure))
    except (ValueError, UnsafeName, BrokerError) as exc:
        fail(exc)
    deadline = None if seconds is None else time.monotonic() + seconds
    after = 0
    try:
        while True:
            for batch in read_results(connection, task, after):
                for row in batch.rows:
                    print(json.dumps({**row.to_json(), "epoch": batch.epoch, "batch": batch.batch_id}), flush=True)
                after = batch.seq
            if not follow or (deadline is not None and time.monotonic() >= deadline):
                break
            time.sleep(poll)
    except KeyboardInterrupt:
        pass
    finally:
        connection.close()
