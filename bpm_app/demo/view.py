"""The live terminal view of the demo (rich)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

# What happened to the participant's host, by the failover scenario's fault.
FAULT_WORDS = {"crash": "crashed", "cut": "was cut off", "registry": "was cut off from the registry"}


def _bar(load: float | None, threshold: float | None, width: int = 30) -> Text:
    if load is None:
        return Text("waiting for a measurement", style="dim")
    scale = max(1.0, load, threshold or 0)
    filled = int(round(width * load / scale))
    mark = int(round(width * (threshold or 0) / scale))
    text = Text()
    for i in range(width):
        ch = "█" if i < filled else " "
        style = "red" if threshold is not None and load > threshold else "green"
        text.append("|" if i == mark else ch, style="bold yellow" if i == mark else style)
    text.append(f" {load:.2f} / {threshold:.2f}" if threshold is not None else f" {load:.2f}")
    return text


def render(state: dict) -> Group:
    table = Table(title=f"phase: {state['phase']}   t = {state['t']:.0f} s", expand=False)
    for column in ("participant", "host", "status", "load against threshold (|)", "tasks"):
        table.add_column(column)
    hosts = state.get("hosts") or {}
    for p in state["participants"]:
        host = hosts.get(p["name"]) or {}
        where = " ".join(x for x in (host.get("address") or "", f"{host['cpus']:g} CPU" if host.get("cpus") else "") if x)
        table.add_row(p["name"], where, p["status"], _bar(p["load"], p["threshold"]), str(len(p["hosted_tasks"])))
    movements = state["movements"]
    active = [m for m in movements if m["state"] == "active"]
    recent = ", ".join(f"{m['task_name']} {m['from']}→{m['to']} @{m['price']:.2f}" for m in movements[-4:])
    balances = ", ".join(f"{b['participant']} {b['balance']:+.1f}" for b in state["ledger"]["balances"])
    lines = Text(
        f"movements: {len(movements)} ({len(active)} active)  {recent}\npayments: {balances or 'none yet'}\nadmin UI: {state['registry']}/"
    )
    parts = [table, lines]
    if state.get("regrains"):
        parts.append(_regrains(state["regrains"]))
    if state.get("killed") or state.get("failovers"):
        parts.append(_failovers(state))
    if state.get("correlation"):
        parts.append(_correlation(state["correlation"]))
    return Group(*parts)


def _regrains(made: list[dict]) -> Text:
    """Splits and merges of tasks over their key groups: how many, and the latest few."""
    splits = sum(1 for r in made if r["kind"] == "split")
    text = Text(f"splits: {splits}, merges: {len(made) - splits}  ")
    text.append(", ".join(f"{r['origin']} {r['kind']} {'+'.join(r['from'])} → {'+'.join(r['made'])}" for r in made[-3:]), style="magenta")
    return text


def _correlation(c: dict) -> Text:
    """The correlated result as its correlator tells it: versions, tentative ones, open windows, silent sources."""
    text = Text(f"correlated result ({', '.join(c.get('sources', []))}; bound {c.get('bound_s', 0):g} s): ")
    text.append(f"{c.get('published', 0)} versions, ")
    text.append(f"{c.get('tentative', 0)} tentative", style="bold red" if c.get("tentative") else "")
    text.append(f", {c.get('open_windows', 0)} windows open, {c.get('stable_windows', 0)} stable")
    return text


def _failovers(state: dict) -> Text:
    """The failover scenario's lines: the crash, each failover and repair, replicas kept."""
    text = Text()
    killed = state.get("killed")
    if killed:
        what = FAULT_WORDS.get(killed.get("fault"), "crashed")
        text.append(f"{killed['participant']}'s host {what} at t = {killed['t']:.0f} s\n", style="bold red")
    for f in state.get("failovers", []):
        done = f"recovered in {f['recovery_s']:.2f} s" if f["recovery_s"] is not None else ("complete" if f["completed_at"] else "taking over")
        if f["kind"] == "failover":
            text.append(f"failover #{f['id']} {f['task']} ({f['mode']}): {f['from_host']} → {f['to_host']}, epoch {f['from_epoch']}→{f['to_epoch']}, {done}\n",
                        style="yellow" if not f["completed_at"] else "green")
        else:
            text.append(f"repair #{f['id']} {f['task']}: a new replica at {f['to_host']}, {'holds a copy' if f['completed_at'] else 'copying'}\n", style="cyan")
    replicas = [r for r in state.get("replicas", []) if r["state"] == "active"]
    if replicas:
        text.append("replicas: " + ", ".join(f"{r['task']}@{r['participant']}" for r in replicas))
    return text
