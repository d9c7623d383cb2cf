"""Typer apps shared by the command modules in this package.

A module here adds its commands to `app` (top level), `bench_app` (`bpm bench ...`)
or a group of its own that it attaches with `app.add_typer`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from bpm.ha import HA_MODES
from bpm_app.logs import FORMATS

def choice(name: str, values) -> type[Enum]:
    """`values` as a command-line choice: help and completion list them, a typo is refused."""
    return Enum(name, {value: value for value in values}, type=str)  # type: ignore[return-value]


# A task's HA mode as a command-line choice.
HAMode = choice("HAMode", HA_MODES)
# How a long-running command writes its logs (`bpm_app.logs`).
LogFormat = choice("LogFormat", FORMATS)

# A participant's broker's TLS, as the commands that connect to it from outside its agent take it (`broker_tls`).
BrokerCert = Annotated[Path | None, typer.Option(
    "--broker-cert", envvar="BPM_BROKER_CERT",
    help="The certificate (PEM) the participant's broker serves TLS with: its agent's (WORKDIR/tls/cert.pem, unless its operator gave one with --tls-cert). The connection trusts that certificate and no other.")]
InsecureBroker = Annotated[bool, typer.Option(
    "--insecure", help="The broker speaks plain text (its agent runs --insecure): whoever is on the path reads the password and the rows.")]

app = typer.Typer(
    name="bpm",
    help="Federated load manager for Spark streaming (Bounded-Price Mechanism).",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"bpm {version('bpm-federation')}")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Federated load manager for Spark streaming (Bounded-Price Mechanism)."""


bench_app = typer.Typer(help="Benchmarks; each prints one JSON object with --json.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


def fail(message: object, code: int = 2) -> NoReturn:
    """Print `message` as an error on stderr (as text: brackets in it are not markup; one line, which
    the terminal may wrap but which is never cut in two) and exit with `code`."""
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True).print(f"[red]error:[/] {escape(str(message))}", soft_wrap=True)
    raise typer.Exit(code)


def broker_tls(cert: Path | None, insecure: bool, say: Callable[..., None] | None = None) -> str | None:
    """The certificate a participant's broker shows (`BrokerCert`), which the connection pins
    (`spark_agents.broker.stream.Broker`); None with `--insecure` (plain text, which `say`
    warns of: the command's `bpm_app.logs.teller`, else stderr). ValueError for both,
    neither, or a file that holds no usable certificate."""
    from bpm.certificates import CertificateError, parse

    if insecure:
        if cert is not None:
            raise ValueError("--broker-cert and --insecure exclude each other")
        if say is None:
            from bpm_app.logs import teller

            say = teller("text", "bpm")
        say("[yellow]warning:[/] --insecure: plain text to the broker; whoever is on the path reads the password and the rows",
            logging.WARNING)
        return None
    if cert is None:
        raise ValueError("a participant's broker serves TLS: give the certificate it shows, --broker-cert "
                         "WORKDIR/tls/cert.pem (its agent's), or --insecure for a broker in plain text")
    try:
        return parse(cert.read_text()).pem
    except (OSError, UnicodeDecodeError, CertificateError) as exc:
        raise ValueError(f"--broker-cert {cert}: {exc}") from None
