"""The demo's report folder: `report.json` and the timeline plot."""

from __future__ import annotations

import json
from pathlib import Path

COLOURS = {"a": "tab:red", "b": "tab:blue", "c": "tab:green", "d": "tab:purple"}


def write_report(report: dict, folder: Path, t0_epoch: float | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report, indent=2))
    plot_timeline(report, folder / "timeline.png", t0_epoch)
    return folder


def plot_timeline(report: dict, path: Path, t0_epoch: float | None = None) -> None:
    """Each participant's load (solid) and threshold (dashed) over time, phases shaded, movements marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bpm.federation.views import seconds

    fig, ax = plt.subplots(figsize=(11, 5.5), dpi=110)
    names = sorted({row["participant"] for row in report["timeline"]})
    for name in names:
        rows = [r for r in report["timeline"] if r["participant"] == name]
        colour = COLOURS.get(name)
        ax.plot([r["t"] for r in rows], [r["load"] for r in rows], color=colour, lw=2, label=f"{name} load")
        ax.plot([r["t"] for r in rows], [r["threshold"] for r in rows], color=colour, lw=1, ls="--", label=f"{name} threshold")
    _clip_peaks(ax, report["timeline"])
    for i, phase in enumerate(report["phases"]):
        ax.axvspan(phase["started_s"], phase["ended_s"], color="0.9" if i % 2 else "0.96", zorder=0)
        ax.text(phase["started_s"] + 1, 0.985, f"phase {phase['name'].split(' ')[0]}", transform=ax.get_xaxis_transform(), fontsize=8, va="top")
    if t0_epoch is not None:
        ymax = ax.get_ylim()[1]
        for m in report["movements"]:
            t = seconds(m["started_at"]) - t0_epoch
            ax.annotate("", xy=(t, ymax * 0.97), xytext=(t, ymax * 0.9), arrowprops={"arrowstyle": "->", "color": COLOURS.get(m["to"], "k")})
            if m.get("ended_at"):
                ax.plot([seconds(m["ended_at"]) - t0_epoch], [ymax * 0.93], marker="x", color=COLOURS.get(m["from"], "k"), ms=5)
    killed = report.get("killed")
    if killed and killed.get("at_s") is not None:
        ax.axvline(killed["at_s"], color="black", lw=1.5)
        ax.text(killed["at_s"] + 1, 0.95, f"kill -9 {killed['participant']}", transform=ax.get_xaxis_transform(), fontsize=8)
        for f in report.get("failovers", []):
            ax.axvline(f["at_s"], color=COLOURS.get(f["to"], "k"), lw=0.8, ls=":")
    ax.set_xlabel("seconds since the demo started")
    ax.set_ylabel("load (fraction of the participant's capacity)")
    title = (
        f"Federation timeline: {len(report['movements'])} movements (arrows at the start, in the taker's colour; x = ended), "
        f"lost {report['lost_results']}, duplicated {report['duplicate_results']}"
    )
    if report.get("failovers"):
        recoveries = [f["recovery_s"] for f in report["failovers"] if f["recovery_s"] is not None]
        title += (f"\n{len(report['failovers'])} failovers ({report.get('ha_mode')}; dotted: detection)"
                  + (f", recovery after detection {min(recoveries):.1f}-{max(recoveries):.1f} s" if recoveries else ""))
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _clip_peaks(ax, timeline: list[dict]) -> None:
    """Keep the loads around the thresholds readable: a load far above every threshold (a
    participant catching up on a backlog measures what it needs to keep up, several times
    its capacity) is cut at the top of the plot, its peak written there."""
    thresholds = [r["threshold"] for r in timeline if r["threshold"] is not None]
    top = max(1.0, 2.5 * max(thresholds, default=0.0))
    peaks: dict[str, dict] = {}
    for r in timeline:
        if r["load"] > top and r["load"] > peaks.get(r["participant"], {"load": 0.0})["load"]:
            peaks[r["participant"]] = r
    if not peaks:
        return
    ax.set_ylim(-0.02 * top, top)
    for name, r in peaks.items():
        ax.annotate(f"{name} up to {r['load']:.1f}", xy=(r["t"], top), xytext=(0, -12), textcoords="offset points",
                    ha="center", fontsize=8, color=COLOURS.get(name, "k"))
