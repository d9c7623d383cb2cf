"""`bpm registry serve`, `bpm participants ...` and `bpm contracts ...`: the registry for people."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from bpm.contracts import ContractState
from bpm_app.commands import HAMode, LogFormat, app, choice, fail

ContractStateChoice = choice("ContractStateChoice", [state.value for state in ContractState])

registry_app = typer.Typer(help="Run the contract registry.", no_args_is_help=True)
participants_app = typer.Typer(help="Register and list participants (adding needs the operator key).", no_args_is_help=True)
contracts_app = typer.Typer(help="Negotiate bilateral bounded-price contracts.", no_args_is_help=True)
app.add_typer(registry_app, name="registry")
app.add_typer(participants_app, name="participants")
app.add_typer(contracts_app, name="contracts")

RegistryUrl = Annotated[str, typer.Option("--registry", envvar="BPM_REGISTRY_URL", help="Registry base URL.")]
Key = Annotated[
    str | None,
    typer.Option("--key", envvar="BPM_KEY", help="API key to act with (a participant's, or the operator's)."),
]
# The same option where only the operator may act: its key, never a participant's from BPM_KEY.
OperatorKey = Annotated[
    str | None,
    typer.Option("--key", help="The operator key (default: BPM_ADMIN_KEY, else ./.bpm-admin-key)."),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
DEFAULT_URL = "http://127.0.0.1:8000"
# Seconds `bpm registry serve` gives requests under way when it is told to stop.
SHUTDOWN_GRACE_S = 5.0


@registry_app.command("serve")
def serve(
    database_url: Annotated[str | None, typer.Option("--database-url", envvar="BPM_DATABASE_URL", help="SQLAlchemy URL (default: SQLite file ./bpm-registry.db).")] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (default: BPM_HOST, else loopback, 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on (default: BPM_PORT, else 8000).")] = None,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes (more than one needs a non-SQLite database to pay off).")] = 1,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    log_format: Annotated[LogFormat, typer.Option(help="text, or json: one JSON object per line (time, level, logger, message).")] = LogFormat.text,
) -> None:
    """Serve the registry's JSON API, docs (/docs) and admin UI; migrates the database first."""
    import uvicorn

    from api.app import ProductionKeyMissing, create_app, resolve_admin_key
    from bpm_app.logs import configure, uvicorn_config
    from bpm_http.web import KEEP_ALIVE_S
    from api.migrate import upgrade
    from api.settings import Settings

    overrides = {"database_url": database_url} if database_url else {}
    settings = Settings(**overrides)
    host, port = host or settings.host, port or settings.port
    try:
        admin_key, generated = resolve_admin_key(settings)
    except ProductionKeyMissing as exc:
        typer.secho(f"refusing to start: {exc}", fg="red", err=True)
        raise typer.Exit(2) from exc
    if generated:
        typer.secho(f"operator key (shown once, kept in ./.bpm-admin-key): {admin_key}", fg="yellow", err=True)
    try:
        upgrade(settings.database_url)
    except Exception as exc:
        typer.secho(f"cannot migrate {settings.database_url}: {exc}", fg="red", err=True)
        raise typer.Exit(2) from exc
    configure(log_format.value)
    logging.getLogger("bpm.registry").info("registry on http://%s:%s (database %s)", host, port, _safe_url(settings.database_url))
    # On SIGTERM requests under way get this long to finish; then what still runs, such as the
    # change feed's streams (which would last minutes), is cut and the registry exits.
    served = {"host": host, "port": port, "log_level": log_level, "log_config": uvicorn_config(log_format.value, log_level),
              "timeout_graceful_shutdown": SHUTDOWN_GRACE_S, "timeout_keep_alive": KEEP_ALIVE_S}
    if workers > 1:
        # Each worker builds its app from the environment, so pass the resolved values down.
        os.environ["BPM_DATABASE_URL"] = settings.database_url
        os.environ["BPM_ADMIN_KEY"] = admin_key
        uvicorn.run("api.app:create_app_from_env", factory=True, workers=workers, **served)
    else:
        uvicorn.run(create_app(settings, admin_key=admin_key, migrate=False), **served)


@registry_app.command("rotate-signing-key")
def rotate_signing_key(
    registry: RegistryUrl = DEFAULT_URL,
    key: OperatorKey = None,
    revoke: Annotated[bool, typer.Option("--revoke", help="The old key is thought stolen: tokens it signed stop verifying at once, not when they lapse.")] = False,
    as_json: AsJson = False,
) -> None:
    """Operator: the registry signs new call tokens with a new key; tokens signed with the old one verify until they lapse (or, with --revoke, no longer). Agents read the keys again at their next heartbeat."""
    with registry_client(registry, operator_key(key)) as client:
        rotated = run_call(lambda: client.rotate_signing_key(revoke))
    after = "tokens signed before no longer verify" if revoke else "tokens signed before verify until they lapse"
    typer.echo(json.dumps(rotated) if as_json else f"the registry now signs with key {rotated['kid']}; {after}")


@registry_app.command("migrate")
def migrate(
    database_url: Annotated[str | None, typer.Option("--database-url", envvar="BPM_DATABASE_URL", help="SQLAlchemy URL (default: SQLite file ./bpm-registry.db).")] = None,
    revision: Annotated[str, typer.Option(help="Alembic revision to migrate to: head (the newest), or an earlier one to go back to.")] = "head",
) -> None:
    """Migrate the registry's database without starting the registry (`serve` migrates to head itself)."""
    from api.migrate import downgrade, upgrade
    from api.settings import Settings

    url = database_url or Settings().database_url
    try:
        if revision == "head":
            upgrade(url)
        else:
            downgrade(url, revision)
    except Exception as exc:
        fail(f"cannot migrate {_safe_url(url)} to {revision}: {exc}", 1)
    typer.echo(f"{_safe_url(url)} is at {revision}", err=True)


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def operator_key(explicit: str | None) -> str | None:
    """The operator key: given, else BPM_ADMIN_KEY, else the local key file next to the registry."""
    if explicit:
        return explicit
    if os.environ.get("BPM_ADMIN_KEY"):
        return os.environ["BPM_ADMIN_KEY"]
    path = Path(".bpm-admin-key")
    return path.read_text().strip() if path.exists() else None


def registry_client(url: str, key: str | None):
    import httpx

    from bpm_http.client import RegistryClient

    if not key:
        fail("no key: pass --key or set BPM_KEY")
    try:
        return RegistryClient(url, key)
    except httpx.InvalidURL as exc:
        fail(f"--registry {url!r} is not a URL: {exc}")


def _refusal(exc) -> str:
    """The registry's refusal on one line; a 422's list of invalid fields as `field: why`."""
    if exc.status == 422 and isinstance(exc.detail, list):
        fields = [f"{'.'.join(str(p) for p in e.get('loc', [])[1:]) or 'request'}: {e.get('msg', e)}" for e in exc.detail if isinstance(e, dict)]
        if fields:
            return f"422: {'; '.join(fields)}"
    if isinstance(exc.detail, str) and exc.detail.lstrip().startswith("<"):
        return f"{exc.status} with a web page, not the registry's answer: does --registry (or BPM_REGISTRY_URL) name the registry?"
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:299] + "…"


def run_call(call):
    """Run a client call; print the registry's refusal clearly and exit 1 instead of a traceback."""
    import httpx

    from bpm_http.client import RegistryError

    try:
        return call()
    except RegistryError as exc:
        fail(f"refused: {_refusal(exc)}", 1)
    except httpx.HTTPError as exc:
        try:
            where = f" ({exc.request.method} {exc.request.url})"
        except RuntimeError:  # an error raised before any request was made
            where = ""
        fail(f"cannot reach the registry{where}: {str(exc) or type(exc).__name__}", 1)
    except json.JSONDecodeError:
        fail("the answer is not the registry's JSON: does --registry (or BPM_REGISTRY_URL) name the registry?", 1)


def read_registry(registry: str, key: str | None, call):
    """One read with the caller's key, or else the operator's."""
    with registry_client(registry, key or operator_key(None)) as client:
        return run_call(lambda: call(client))


def show_rows(rows, as_json: bool, columns: list[str], title: str, cells=lambda row: row) -> None:
    """The API's objects as JSON, or a table of `cells(row)` (a dict of formatted columns)."""
    if as_json:
        typer.echo(json.dumps(rows))
    else:
        print_table([cells(row) for row in rows], columns, title)


def print_table(rows: list[dict], columns: list[str], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    Console().print(table)


@participants_app.command("add")
def participants_add(
    name: str,
    endpoint: Annotated[str, typer.Option(help="URL where the participant's agent listens.")],
    registry: RegistryUrl = DEFAULT_URL,
    key: OperatorKey = None,
    as_json: AsJson = False,
) -> None:
    """Operator: register a participant and print its API key (shown once)."""
    with registry_client(registry, operator_key(key)) as client:
        created = run_call(lambda: client.add_participant(name, endpoint))
    if as_json:
        typer.echo(json.dumps(created))
    else:
        typer.echo(f"registered {created['name']}; its key (shown once): {created['api_key']}")


@participants_app.command("list")
def participants_list(registry: RegistryUrl = DEFAULT_URL, key: Key = None, as_json: AsJson = False) -> None:
    """List participants with liveness and load."""
    rows = read_registry(registry, key, lambda c: c.participants())
    show_rows(rows, as_json, ["name", "endpoint", "status", "load", "threshold", "heartbeat_age_s"], "participants")


@participants_app.command("rotate-key")
def participants_rotate_key(name: str, registry: RegistryUrl = DEFAULT_URL, key: Key = None, as_json: AsJson = False) -> None:
    """Give NAME a new key (acting with NAME's current key, or the operator's) and print it, shown once;
    the old key stops working. A running agent rotates its own with `POST /key/rotate` instead."""
    with registry_client(registry, key or operator_key(None)) as client:
        rotated = run_call(lambda: client.rotate_key(name))
    typer.echo(json.dumps(rotated) if as_json else f"{name}'s new key (shown once; the old one no longer works): {rotated['api_key']}")


@participants_app.command("revoke-key")
def participants_revoke_key(
    name: str,
    registry: RegistryUrl = DEFAULT_URL,
    key: OperatorKey = None,
) -> None:
    """Operator: withdraw NAME's key (lost or stolen); NAME can do nothing until `rotate-key` gives it a new one."""
    with registry_client(registry, operator_key(key)) as client:
        run_call(lambda: client.revoke_key(name))
    typer.echo(f"revoked {name}'s key; `bpm participants rotate-key {name}` (as the operator) hands out a new one")


CONTRACT_COLUMNS = ["id", "proposer", "counterparty", "state", "awaiting", "price_min", "price_max", "min_duration_s"]


def _show_contract(contract: dict, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(contract))
    else:
        print_table([contract], CONTRACT_COLUMNS, f"contract #{contract['id']}")


@contracts_app.command("propose")
def contracts_propose(
    counterparty: str,
    price_min: Annotated[float, typer.Option(help="Lowest price per unit of load per second.")],
    price_max: Annotated[float, typer.Option(help="Highest price per unit of load per second.")],
    min_duration: Annotated[float, typer.Option("--min-duration", help="Minimum movement duration, seconds.")],
    valid_until: Annotated[str | None, typer.Option(help="ISO-8601 end of validity.")] = None,
    ha_mode: Annotated[HAMode, typer.Option(help="How tasks moved under the contract are replicated.")] = HAMode.none,
    registry: RegistryUrl = DEFAULT_URL,
    key: Key = None,
    as_json: AsJson = False,
) -> None:
    """Propose a contract to COUNTERPARTY, acting with your key."""
    with registry_client(registry, key) as client:
        contract = run_call(lambda: client.propose(counterparty, price_min, price_max, min_duration, valid_until=valid_until, ha_mode=ha_mode.value))
    _show_contract(contract, as_json)


@contracts_app.command("counter")
def contracts_counter(
    contract_id: int,
    price_min: Annotated[float, typer.Option()],
    price_max: Annotated[float, typer.Option()],
    min_duration: Annotated[float, typer.Option("--min-duration")],
    registry: RegistryUrl = DEFAULT_URL,
    key: Key = None,
    as_json: AsJson = False,
) -> None:
    """Answer the last proposal of CONTRACT_ID with other terms."""
    with registry_client(registry, key) as client:
        contract = run_call(lambda: client.counter(contract_id, price_min, price_max, min_duration))
    _show_contract(contract, as_json)


def _action_command(action: str, doc: str) -> None:
    def command(contract_id: int, registry: RegistryUrl = DEFAULT_URL, key: Key = None, as_json: AsJson = False) -> None:
        with registry_client(registry, key) as client:
            contract = run_call(lambda: client.contract_action(contract_id, action))
        _show_contract(contract, as_json)

    command.__doc__ = doc
    contracts_app.command(action)(command)


_action_command("accept", "Accept the last proposal of CONTRACT_ID: it becomes active.")
_action_command("reject", "Reject the last proposal of CONTRACT_ID.")
_action_command("terminate", "Terminate CONTRACT_ID (either party).")


@contracts_app.command("list")
def contracts_list(
    participant: Annotated[str | None, typer.Option(help="Only this participant's contracts.")] = None,
    state: Annotated[ContractStateChoice | None, typer.Option(help="Only contracts in this state.")] = None,
    registry: RegistryUrl = DEFAULT_URL,
    key: Key = None,
    as_json: AsJson = False,
) -> None:
    """List the contracts your key may read."""
    rows = read_registry(registry, key, lambda c: c.contracts(participant, state.value if state else None))
    show_rows(rows, as_json, CONTRACT_COLUMNS, "contracts")
