"""`bpm broker serve`: run a participant's own NATS server (JetStream) in the foreground."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import typer

from bpm_app.commands import LogFormat, app, fail
from bpm_app.logs import teller

broker_app = typer.Typer(help="A participant's broker: its NATS server with JetStream.", no_args_is_help=True)
app.add_typer(broker_app, name="broker")


@broker_app.command("serve")
def serve_command(
    name: str = typer.Option(..., "--name", help="The participant whose broker this is (its owner user has the same name)."),
    store: Path = typer.Option(..., "--store", help="The participant's own storage folder for JetStream (created if absent)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    port: int = typer.Option(4222, "--port", min=1, max=65535, help="Client port."),
    http_port: int = typer.Option(8222, "--http-port", min=1, max=65535, help="Health-check port (GET /healthz)."),
    tls_cert: Path | None = typer.Option(None, "--tls-cert", help="Serve TLS with this certificate (PEM), with --tls-key; clients pin it (bpm replay --broker-cert). Without: plain text."),
    tls_key: Path | None = typer.Option(None, "--tls-key", help="The private key of --tls-cert (PEM)."),
    seconds: float | None = typer.Option(None, "--seconds", min=0.1, help="Stop after this long (default: until Ctrl-C or SIGTERM)."),
    log_format: LogFormat = typer.Option(LogFormat.text, "--log-format", help="text, or json: one JSON object per line on stderr (time, level, logger, message, participant)."),
) -> None:
    """Start NAME's NATS server with JetStream, its storage in STORE, and its owner user
    (password from BPM_NATS_PASSWORD); serve until Ctrl-C, then stop it."""
    from bpm.names import UnsafeName, check_name
    from spark_agents.broker.server import BrokerError, NatsServer, User
    from bpm.keygroups import PASSWORD_ENV

    say = teller(log_format.value, "bpm.broker", participant=name)
    password = os.environ.get(PASSWORD_ENV, "")
    # Before the server starts: a SIGTERM while it starts (a supervisor's stop) must stop it
    # too, not kill this process and leave nats-server behind.
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        check_name(name, "participant name")
        if not password:
            raise ValueError(f"set {PASSWORD_ENV} to the owner user's password")
        tls = None
        if tls_cert is not None or tls_key is not None:
            from spark_agents.tls import own_certificate

            tls = own_certificate(store, name, [host], cert_file=tls_cert, key_file=tls_key)
        server = NatsServer(name, store, port=port, http_port=http_port, users=[User(name, password)], host=host, tls=tls).start()
    except (ValueError, UnsafeName, BrokerError) as exc:
        fail(exc)
    say(f"{name}'s broker: {server.url} (stream location {server.url}/{name}, {'TLS' if tls else 'plain text'}); storage {store}; "
        f"log {server.log_path}; Ctrl-C stops it")
    try:
        stop.wait(seconds)
    finally:
        server.stop()
        say(f"{name}'s broker stopped")
