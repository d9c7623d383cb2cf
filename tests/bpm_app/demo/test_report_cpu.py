"""The timeline's machine panel: how busy the machine's CPUs and the hosts' quotas were (no processes)."""

from __future__ import annotations

import struct

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bpm_app.demo.report import plot_cpu, plot_timeline

PHASES = [{"name": "1", "started_s": 0.0, "ended_s": 100.0, "acceptable": True, "overloaded": False}]
CPU = [{"t": t, "busy": busy, "steal": steal, "throttled": {"a": 0.1, "b": held}}
       for t, busy, steal, held in ((2.0, 0.5, 0.0, 0.0), (50.0, 0.9, 0.05, 0.4), (100.0, 0.7, 0.0, 0.2))]


def test_the_panel_draws_the_machine_and_each_quota():
    fig, ax = plt.subplots()
    plot_cpu(ax, {"cpu": CPU, "phases": PHASES})
    assert [t.get_text().split("\n")[0] for t in ax.get_legend().get_texts()] == ["machine busy", "stolen", "a held by its quota", "b held by its quota"]
    assert list(ax.get_lines()[3].get_ydata()) == [0.0, 0.4, 0.2], "points farther apart than the span: each its own"
    plt.close(fig)


def _height(png) -> int:
    return struct.unpack(">I", png.read_bytes()[20:24])[0]


def test_the_timeline_has_the_panel_below_the_participants_where_the_report_measured_the_machine(tmp_path):
    report = {"timeline": [{"t": t, "participant": n, "load": 0.5, "threshold": 0.6} for t in (0.0, 100.0) for n in "ab"],
              "phases": PHASES, "movements": [], "lost_results": 0, "duplicate_results": 0}
    plot_timeline(report, tmp_path / "without.png")
    plot_timeline({**report, "cpu": CPU}, tmp_path / "with.png")
    assert _height(tmp_path / "with.png") > _height(tmp_path / "without.png")


def test_a_quota_held_during_batches_only_reads_as_its_share_over_the_span():
    from bpm_app.demo.report import _smoothed

    points = [(float(t), 1.0 if t % 10 < 4 else 0.0) for t in range(0, 60, 2)]  # held 2 polls of 5
    assert all(0.3 <= v <= 0.5 for v in _smoothed(points, 30.0)[8:-8])
