"""`bpm tasks list`, `bpm offers list`, `bpm movements list`, `bpm ledger` and `bpm events`:
what the registry records, read from the terminal with the same key, URL and output
conventions as `bpm participants list` and `bpm contracts list`."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Annotated

import typer

from bpm.negotiation import MovementState, OfferState
from bpm_app.commands import app, choice
from bpm_app.commands.registry import DEFAULT_URL, AsJson, Key, RegistryUrl, registry_client, read_registry, run_call, show_rows, print_table, operator_key

tasks_app = typer.Typer(help="Read the tasks the registry knows (any key).", no_args_is_help=True)
offers_app = typer.Typer(help="Read offers (a participant's key: those it made or received; the operator's: all).", no_args_is_help=True)
movements_app = typer.Typer(
    help="Read movements (a participant's key: those it is party to or whose task it originates; the operator's: all).", no_args_is_help=True
)
app.add_typer(tasks_app, name="tasks")
app.add_typer(offers_app, name="offers")
app.add_typer(movements_app, name="movements")


# Offer and movement states as the registry reports them (`bpm.negotiation`).
OfferStateChoice = choice("OfferStateChoice", [state.value for state in OfferState])
MovementStateChoice = choice("MovementStateChoice", [state.value for state in MovementState])


def _when(value: str | None) -> str:
    """A registry time as ISO 8601 in UTC, to the second."""
    if not value:
        return ""
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _ago(value: str | None) -> str:
    """A registry time relative to now, short: `42s ago`, `3m ago`, `in 20s`."""
    if not value:
        return ""
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    seconds = (datetime.now(UTC) - moment).total_seconds()
    size = abs(seconds)
    for unit, length in (("d", 86400), ("h", 3600), ("m", 60)):
        if size >= length:
            text = f"{size // length:.0f}{unit}"
            break
    else:
        text = f"{size:.0f}s"
    return f"{text} ago" if seconds >= 0 else f"in {text}"


def _num(value: float | None, spec: str = "g") -> str:
    return "" if value is None else format(value, spec)


def _ids(ids: list[int] | None) -> str:
    return ",".join(str(i) for i in ids or [])


@tasks_app.command("list")
def tasks_list(
    host: Annotated[str | None, typer.Option(help="Only tasks running at this participant.")] = None,
    origin: Annotated[str | None, typer.Option(help="Only tasks originating at this participant.")] = None,
    involving: Annotated[str | None, typer.Option(help="Only tasks this participant originates, hosts or keeps a replica of.")] = None,
    registry: RegistryUrl = DEFAULT_URL,
    key: Key = None,
    as_json: AsJson = False,
) -> None:
    """List tasks with their origin, current host, load, HA mode, epoch, the tasks a split or merge made them from and their span of event time."""
    rows = read_registry(registry, key, lambda c: c.tasks(host=host, origin=origin, involving=involving))
    show_rows(rows, as_json, ["id", "name", "origin", "host", "load", "ha_mode", "epoch", "from", "span"], "tasks",
          lambda t: {**t, "load": _num(t["load"]), "from": ", ".join(f"#{i}" for i in t.get("from_tasks", [])), "span": _span(t)})


def _span(task: dict) -> str:
    """A task's span of event time as a split or merge left it: "since..until", "retired" once it is."""
    since, until = task.get("since_s"), task.get("until_s")
    span = "" if since is None and until is None else f"{'' if since is None else since}..{'' if until is None else until}"
    return f"{span} retired" if task.get("retired") else span


def _offer_cells(offer: dict) -> dict:
    tasks, taken = offer["task_ids"], offer.get("accepted_task_ids")
    return {
        "id": offer["id"],
        "contract": offer["contract_id"],
        "from": offer["from"],
        "to": offer["to"],
        "tasks": _ids(tasks) if not taken or taken == tasks else f"{_ids(taken)} of {_ids(tasks)}",
        "cap": _num(offer["price"]),
        "settled": _num(offer.get("settled_price")),
        "state": offer["state"],
        "made": _ago(offer["created_at"]),
        "movements": _ids(offer.get("movements")),
    }


@offers_app.command("list")
def offers_list(
    state: Annotated[OfferStateChoice | None, typer.Option(help="Only offers in this state.")] = None,
    registry: RegistryUrl = DEFAULT_URL,
    key: Key = None,
    as_json: AsJson = False,
) -> None:
    """List offers: who offered which tasks to whom, the offerer's cap, the settled price, the state, how long ago it was made."""
    rows = read_registry(registry, key, lambda c: c.offers(state.value if state else None))
    columns = ["id", "contract", "from", "to", "tasks", "cap", "settled", "state", "made", "movements"]
    show_rows(rows, as_json, columns, "offers", _offer_cells)


def _movement_cells(movement: dict) -> dict:
    return {
        "id": movement["id"],
        "task": f"#{movement['task_id']} {movement['origin']}.{movement['task_name']}",
        "from": movement["from"],
        "to": movement["to"],
        "price": _num(movement["price"]),
        "load": _num(movement["load"]),
        "state": movement["state"],
        "started": _ago(movement["started_at"]),
        "ended": _ago(movement.get("ended_at")),
        "accrued": _num(movement["accrued"], ".4f"),
    }


@movements_app.command("list")
def movements_list(
    participant: Annotated[str | None, typer.Option(help="Only movements this participant is party to or whose task it originates.")] = None,
    state: Annotated[MovementStateChoice | None, typer.Option(help="Only movements in this state.")] = None,
    registry: RegistryUrl = DEFAULT_URL,
    key: Key = None,
    as_json: AsJson = False,
) -> None:
    """List movements: which task went from whom to whom, at what price and load, since when, and what it has accrued."""
    rows = read_registry(registry, key, lambda c: c.movements(participant, state.value if state else None))
    columns = ["id", "task", "from", "to", "price", "load", "state", "started", "ended", "accrued"]
    show_rows(rows, as_json, columns, "movements", _movement_cells)


@app.command("ledger")
def ledger(
    participant: Annotated[
        str | None, typer.Option(help="Only this participant's movements and balance (a participant's key reads only its own).")
    ] = None,
    registry: RegistryUrl = DEFAULT_URL,
    key: Key = None,
    as_json: AsJson = False,
) -> None:
    """Show what each movement has accrued (price x load x seconds away) and every participant's paid, earned and balance."""
    book = read_registry(registry, key, lambda c: c.ledger(participant))
    if as_json:
        typer.echo(json.dumps(book))
        return
    money = lambda value: _num(value, ".4f")  # noqa: E731
    balances = [{**b, "paid": money(b["paid"]), "earned": money(b["earned"]), "balance": money(b["balance"])} for b in book["balances"]]
    print_table(balances, ["participant", "paid", "earned", "balance"], f"balances as of {_when(book['as_of'])}")
    entries = [
        {**e, "movement": e["movement_id"], "task": e["task_id"], "price": _num(e["price"]), "load": _num(e["load"]),
         "seconds": _num(e["seconds"], ".1f"), "amount": money(e["amount"])}
        for e in book["entries"]
    ]
    print_table(entries, ["movement", "task", "from", "to", "price", "load", "seconds", "amount", "state"], "ledger entries")


EVENT_COLUMNS = ["id", "at", "kind", "actor", "subject", "message"]


def _event_line(event: dict) -> str:
    who = event.get("actor") or ""
    if event.get("subject"):
        who += f" -> {event['subject']}"
    return f"{event['id']:>6}  {_when(event['at'])}  {event['kind']:<22}  {who:<20}  {event['message']}"


@app.command("events")
def events(
    participant: Annotated[
        str | None, typer.Option(help="Operator: only events this participant caused or that concern it (a participant's key reads only its own).")
    ] = None,
    kind: Annotated[str | None, typer.Option(help="Only events whose kind starts with this: offer, movement.ended, task.failover...")] = None,
    after_id: Annotated[int | None, typer.Option("--after-id", min=0, help="Only events after this id, oldest first (default: the newest).")] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many events: the newest, or the first after --after-id; with --follow, per read (the registry's default: 200, at most 2000).")] = None,
    follow: Annotated[bool, typer.Option("--follow", help="Keep printing new events as they are recorded, one per line, until Ctrl-C (or --seconds).")] = False,
    seconds: Annotated[float | None, typer.Option("--seconds", min=0.1, help="With --follow: stop after this long.")] = None,
    poll: Annotated[float, typer.Option("--poll", min=0.1, help="With --follow: seconds between reads.")] = 1.0,
    registry: RegistryUrl = DEFAULT_URL,
    key: Key = None,
    as_json: AsJson = False,
) -> None:
    """Show the registry's record of offers, refusals, movements, failovers and errors, oldest first (times in UTC).

    With --follow each event is printed once, in the order recorded; --json then prints one JSON object per line."""
    with registry_client(registry, key or operator_key(None)) as client:
        read = lambda after: run_call(lambda: client.events(participant, after, kind, limit))  # noqa: E731
        if not follow:
            show_rows(read(after_id), as_json, EVENT_COLUMNS, "events", lambda e: {**e, "at": _when(e["at"])})
            return
        show = (lambda e: typer.echo(json.dumps(e))) if as_json else (lambda e: typer.echo(_event_line(e)))
        deadline = None if seconds is None else time.monotonic() + seconds
        try:  # Ctrl-C ends a follow as a normal stop (exit 0), like `bpm results --follow`
            rows = read(after_id)
            for event in rows:
                show(event)
            # Nothing matched the first read: every matching event from now on is new (after id 0).
            last = rows[-1]["id"] if rows else (after_id or 0)
            while deadline is None or time.monotonic() < deadline:
                time.sleep(poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic())))
                # Read until a read brings nothing new, so a burst larger than one page is printed at once.
                while rows := read(last):
                    for event in rows:
                        show(event)
                    last = rows[-1]["id"]
        except KeyboardInterrupt:
            pass
