"""The timeline's phase labels: short phases do not make their labels run into each other."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bpm_app.demo.report import phase_labels  # noqa: E402


def _phase(name: str, start: float, end: float) -> dict:
    return {"name": name, "started_s": start, "ended_s": end, "acceptable": True, "overloaded": False}


def test_labels_of_short_phases_go_up_a_row_and_none_overlap():
    fig, ax = plt.subplots(figsize=(11, 2))
    ax.set_xlim(0, 620)
    # phase 2 takes 12 s and phase 3 another 15: the first three labels would share one place
    phases = [_phase("1", 120, 150), _phase("2", 150, 162), _phase("3", 162, 177), _phase("4", 400, 560)]
    texts = phase_labels(ax, phases)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in texts]
    assert boxes[0].x1 > boxes[2].x0, "the first and third labels span the same stretch of time"
    rows = [t.get_position()[1] for t in texts]
    assert len({rows[0], rows[1], rows[2]}) == 3, "so each of the first three has a row of its own"
    assert rows[3] == rows[0], "a label with room in the first row stays there"
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)
    plt.close(fig)


def test_a_label_says_whether_its_phase_kept_its_promise_a_broken_one_in_red():
    fig, ax = plt.subplots(figsize=(11, 2))
    ax.set_xlim(0, 400)
    loads = {"a": 0.3, "b": 0.3}
    phases = [{**_phase("1", 0, 100), "loads": loads, "thresholds": dict.fromkeys(loads, 0.6)},
              {**_phase("3", 100, 300), "loads": loads, "thresholds": dict.fromkeys(loads, 0.6)}]
    kept, broken = phase_labels(ax, phases, ["acceptable", "overloaded"])
    assert kept.get_text() == "phase 1: acceptable, as promised" and broken.get_text() == "phase 3: acceptable, not overloaded as promised"
    assert matplotlib.colors.same_color(broken.get_color(), "tab:red") and not matplotlib.colors.same_color(kept.get_color(), "tab:red")
    assert [t.get_text() for t in phase_labels(ax, phases[:1])] == ["phase 1: acceptable"], "a phase that promised nothing says how it ended"
    plt.close(fig)
