"""Typer apps shared by the command modules in this package.

A module here adds its commands to `app` (top level), `bench_app` (`bpm bench ...`)
or a group of its own that it attaches with `app.add_typer`.
"""

from __future__ import annotations

from enum import Enum
from typing import NoReturn

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
