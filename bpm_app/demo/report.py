"""The demo's report folder: `report.json`, the timeline plot and, where the run correlated alerts, a plot of the correlated result."""

from __future__ import annotations

import json
from pathlib import Path

from bpm_app.demo.faults import WHAT
from bpm_app.demo.outcomes import kept, phase_ending, promised_ends

COLOURS = {"a": "tab:red", "b": "tab:blue", "c": "tab:green", "d": "tab:purple", "e": "tab:orange"}
REGRAIN_MARKS = {"split": "D", "merge": "s"}  # on the origin's panel of the timeline
# A host is held by its quota while a micro-batch runs and not between (a 10 s trigger, a
# poll every 2 s): the machine's panel shows the share over a few triggers.
HELD_SPAN_S = 30.0


def write_report(report: dict, folder: Path, t0_epoch: float | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    plot_timeline(report, folder / "timeline.png", t0_epoch)
    if report.get("correlation"):
        plot_correlation(report, folder / "correlation.png")
    return folder


def plot_correlation(report: dict, path: Path) -> None:
    """The correlated result over the run: each window's first result and its delay against
    the availability bound (red: published tentative), and the rows held tentative and stable
    as the versions came; the cut and the heal marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = report["correlation"]
    series = c["series"]
    fig, (delay, rows) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    firsts = [p for p in series if p["delay_s"] is not None]
    for stable, colour, label in ((True, "tab:blue", "first result stable"), (False, "tab:red", "first result tentative")):
        pts = [p for p in firsts if p["stable"] == stable]
        delay.plot([p["t"] for p in pts], [p["delay_s"] for p in pts], "o", ms=3, color=colour, label=label)
    delay.axhline(c["availability_bound_s"], color="gray", ls="--", lw=1, label="availability bound")
    delay.set_ylabel("first result, s after due")
    delay.legend(loc="upper left", fontsize=8)
    rows.step([p["t"] for p in series], [p["stable_rows"] for p in series], where="post", color="tab:blue", label="stable rows")
    rows.step([p["t"] for p in series], [p["tentative_rows"] for p in series], where="post", color="tab:red", label="tentative rows")
    rows.set_ylabel("rows held")
    rows.legend(loc="upper left", fontsize=8)
    killed, healed = report.get("killed") or {}, report.get("healed") or {}
    for ax in (delay, rows):
        if killed.get("at_s") is not None:
            ax.axvline(killed["at_s"], color="black", lw=1.2)
        if healed.get("at_s") is not None:
            ax.axvline(healed["at_s"], color="black", lw=1.2, ls="--")
        ax.grid(alpha=0.3)
    rows.set_xlabel("seconds since the demo started (solid: the host is cut off; dashed: its link heals)", fontsize=8)
    fig.suptitle(f"Correlated result at {c['correlator']}: {c['stable_windows']} windows, {c['tentative_windows']} tentative "
                 f"({c['tentative_rows']} rows), stable {c['stabilisation_s']} s after the heal; stable rows "
                 f"{'equal' if c['stable_equals_plain'] else 'differ from'} the plain correlation", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_timeline(report: dict, path: Path, t0_epoch: float | None = None) -> None:
    """One panel per participant: its load (solid) against its threshold (dashed), both as a
    share of its own capacity (its host's CPUs), phases shaded and named with how they ended,
    movements marked (a triangle up where a task arrives, down where it leaves), and splits
    and merges of its own tasks (a diamond, a square); below them, where the report measured
    it (`cpu`), the machine's panel (`plot_cpu`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bpm.clock import seconds

    names = sorted({row["participant"] for row in report["timeline"]})
    cpu = report.get("cpu") or []
    panels = max(1, len(names)) + (1 if cpu else 0)
    fig, axes = plt.subplots(panels, 1, figsize=(11, 1.9 * panels + 1.2), dpi=110, sharex=True, squeeze=False)
    hosts = report.get("hosts") or {}
    top = _top(report["timeline"])
    # With mixed queries (`bpm demo --queries`), each participant's panel names its own tasks' query.
    queries = report.get("queries") or {}
    query_of = {p: query for query, q in queries.items() for p in q["participants"]} if len(queries) > 1 else {}
    for ax, name in zip(axes[:, 0], names):
        rows = [r for r in report["timeline"] if r["participant"] == name]
        colour = COLOURS.get(name)
        ax.plot([r["t"] for r in rows], [min(r["load"], top) for r in rows], color=colour, lw=2, label="load")
        ax.plot([r["t"] for r in rows], [r["threshold"] for r in rows], color=colour, lw=1, ls="--", label="threshold")
        peak = max(rows, key=lambda r: r["load"], default=None)
        if peak is not None and peak["load"] > top:
            ax.annotate(f"up to {peak['load']:.1f}", xy=(peak["t"], top), xytext=(0, -10), textcoords="offset points", ha="center",
                        fontsize=7, color=colour)
        host = hosts.get(name) or {}
        where = ", ".join(x for x in (f"{host['cpus']:g} CPU" if host.get("cpus") else "", host.get("address") or "") if x)
        ax.set_ylabel(name + (f": {query_of[name]}" if name in query_of else "") + (f"\n{where}" if where else ""), fontsize=8)
        ax.set_ylim(-0.02 * top, top)
        ax.grid(alpha=0.3)
        _shade_phases(ax, report["phases"])
        if t0_epoch is not None:
            for m in report["movements"]:
                t = seconds(m["started_at"]) - t0_epoch
                if m["to"] == name:
                    ax.plot([t], [0.9 * top], marker="^", color=COLOURS.get(m["from"], "k"), ms=5)
                if m["from"] == name:
                    ax.plot([t], [0.9 * top], marker="v", color=COLOURS.get(m["to"], "k"), ms=5)
        for r in report.get("regrains") or []:
            if r["origin"] == name:
                ax.plot([r["t"]], [0.78 * top], marker=REGRAIN_MARKS[r["kind"]], color="tab:pink", mec="black", mew=0.5, ms=6)
        killed = report.get("killed")
        if killed and killed.get("at_s") is not None:
            ax.axvline(killed["at_s"], color="black", lw=1.5)
            for f in report.get("failovers", []):
                ax.axvline(f["at_s"], color=COLOURS.get(f["to"], "k"), lw=0.8, ls=":")
    if cpu:
        plot_cpu(axes[-1, 0], report)
    first = axes[0, 0]
    killed = report.get("killed")
    if killed and killed.get("at_s") is not None:
        what = WHAT[killed.get("fault") or "crash"]
        first.text(killed["at_s"] + 1, 0.8, f"{killed['participant']}'s host {what}", transform=first.get_xaxis_transform(), fontsize=8)
    healed = report.get("healed")
    if healed and healed.get("at_s") is not None:
        for ax in axes.flat:
            ax.axvline(healed["at_s"], color="black", lw=1.5, ls="--")
        first.text(healed["at_s"] + 1, 0.7, f"{killed['participant']}'s link heals", transform=first.get_xaxis_transform(), fontsize=8)
    _mark_faults(axes, report.get("faults") or [])
    axes[-1, 0].set_xlabel("seconds since the demo started (load and threshold: share of the participant's own capacity; "
                           "triangles: a task arrives / leaves, in the partner's colour"
                           + (";\ndiamonds: a task of the participant's own splits, squares: halves of one merge" if report.get("regrains") else "")
                           + (";\nblack lines: a fault strikes (solid) and heals (dashed); dotted: a failover, in the new host's colour"
                              if report.get("faults") else "") + ")",
                           fontsize=8)
    title = (
        f"Each participant's load against its threshold: {len(report['movements'])} movements, "
        f"lost {report['lost_results']}, duplicated {report['duplicate_results']}"
    )
    if report.get("failovers"):
        recoveries = [f["recovery_s"] for f in report["failovers"] if f["recovery_s"] is not None]
        title += (f"\n{len(report['failovers'])} failovers ({report.get('ha_mode')}; dotted: detection)"
                  + (f", recovery after detection {min(recoveries):.1f}-{max(recoveries):.1f} s" if recoveries else ""))
    fig.suptitle(title, fontsize=9)
    first.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8)
    fig.tight_layout()
    phase_labels(first, report["phases"], promised_ends(report))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _mark_faults(axes, faults: list[dict]) -> list:
    """Each fault of a scenario that strikes several (the tour's `faults`) on every panel: a
    solid line where it strikes, dashed where a cut heals, dotted where a task failed over
    from it (in its new host's colour); named above the first panel, a row lower for each
    fault so that close ones do not run into each other. The names' matplotlib texts."""
    first = axes[0, 0]
    texts = []
    for i, fault in enumerate(f for f in faults if f.get("at_s") is not None):
        healed = (fault.get("healed") or {}).get("at_s")
        for ax in axes.flat:
            ax.axvline(fault["at_s"], color="black", lw=1.2)
            if healed is not None:
                ax.axvline(healed, color="black", lw=1.2, ls="--")
            for f in fault.get("failovers") or []:
                if f.get("at_s") is not None:
                    ax.axvline(f["at_s"], color=COLOURS.get(f["to"], "k"), lw=0.8, ls=":")
        texts.append(first.text(fault["at_s"] + 1, 0.85 - 0.15 * (i % 4), f"{fault['participant']}'s host {WHAT[fault['fault']]}",
                                transform=first.get_xaxis_transform(), fontsize=7, bbox={"facecolor": "white", "alpha": 0.8, "lw": 0, "pad": 1}))
    return texts


def plot_cpu(ax, report: dict) -> None:
    """The machine's panel: the share of its CPUs busy and stolen, and per host the share of
    the time its quota held it back (a mean over `HELD_SPAN_S`), in the host's colour."""
    cpu = report["cpu"]
    t = [r["t"] for r in cpu]
    ax.plot(t, [r["busy"] for r in cpu], color="black", lw=1.5, label="machine busy")
    if any(r["steal"] for r in cpu):
        ax.plot(t, [r["steal"] for r in cpu], color="0.5", lw=1, label="stolen")
    for name in sorted({n for r in cpu for n in r["throttled"]}):
        rows = [(r["t"], r["throttled"][name]) for r in cpu if name in r["throttled"]]
        ax.plot([t for t, _ in rows], _smoothed(rows, HELD_SPAN_S), color=COLOURS.get(name, "k"), lw=1, alpha=0.8,
                label=f"{name} held by its quota\n({HELD_SPAN_S:g} s mean)")
    _shade_phases(ax, report["phases"])
    ax.set_ylim(0, 1.02)
    ax.set_ylabel("machine\nshare of CPUs /\nof the time", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7)


def _shade_phases(ax, phases: list[dict]) -> None:
    """Each phase's span, shaded a little darker every other phase."""
    for i, phase in enumerate(phases):
        ax.axvspan(phase["started_s"], phase["ended_s"], color="0.9" if i % 2 else "0.96", zorder=0)


def _smoothed(points: list[tuple[float, float]], span_s: float) -> list[float]:
    """Each point's value as the mean of the points within `span_s` around it."""
    return [sum(vs) / len(vs) for vs in ([v for u, v in points if abs(u - t) <= span_s / 2] for t, _ in points)]


def phase_labels(ax, phases: list[dict], promises: list[str | None] | None = None) -> list:
    """Each phase's number and how it ended above `ax`, from where the phase starts, with
    whether it kept its promise (`promises`, `outcomes.promised_ends`; a broken one in red); a
    label that would run into one before it goes a row higher (a short phase's label and the
    next one's). The matplotlib texts, in order."""
    renderer = ax.figure.canvas.get_renderer()
    ends: list[float] = []  # per row, where its last label ends (display units)
    texts = []
    for phase, promise in zip(phases, promises or [None] * len(phases)):
        text = ax.text(phase["started_s"] + 1, 1.02, f"phase {phase['name'].split(' ')[0]}: {phase_ending(phase, promise)}",
                       transform=ax.get_xaxis_transform(), fontsize=8, va="bottom",
                       color="tab:red" if kept(phase, promise) is False else "black")
        box = text.get_window_extent(renderer)
        row = next((r for r, end in enumerate(ends) if box.x0 > end + 4), len(ends))
        ends[row:row + 1] = [box.x1]
        text.set_y(1.02 + 0.14 * row)
        texts.append(text)
    return texts


def _top(timeline: list[dict]) -> float:
    """The top of every panel: loads around the thresholds stay readable; a load far above
    every threshold (a participant catching up on a backlog measures what it needs to keep
    up, several times its capacity) is cut there, its peak written."""
    thresholds = [r["threshold"] for r in timeline if r["threshold"] is not None]
    return max(1.0, 1.6 * max(thresholds, default=0.0))
