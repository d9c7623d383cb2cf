"""Which tasks' results and drains a demo counts for the shares it fed (`Demo._over`): the
fed tasks, and the tasks splits and merges made of them, never another share's."""

from __future__ import annotations

from bpm.keygroups import StreamLocation
from bpm_app.demo.run import Demo


def _task(origin: str, name: str, prefix: str, **more) -> dict:
    return {"origin": origin, "name": name, "input_uri": str(StreamLocation("nats://10.0.0.2:4222", origin, prefix)), **more}


class _Demo:
    _over = Demo._over

    def __init__(self, tasks: list[dict]) -> None:
        self.state = {"tasks": tasks}


def test_the_results_of_a_fed_share_follow_its_splits_and_merges():
    demo = _Demo([
        _task("a", "g", "", until_s=100, retired=True),
        _task("a", "g0-1", "0", until_s=200), _task("a", "g1-1", "1"),  # g split; g0-1 split again
        _task("a", "g00-2", "00"), _task("a", "g01-2", "01"),
        _task("b", "g", ""),  # another origin's
        {"origin": "a", "name": "file", "input_uri": "file:///tmp/a"},  # no broker stream
    ])
    assert [t["name"] for t in demo._over("a", ["g"])] == ["g", "g0-1", "g1-1", "g00-2", "g01-2"]
    assert [t["name"] for t in demo._over("a", ["g0"])] == ["g0-1", "g00-2", "g01-2"], "a share's own key groups only"
    assert [t["name"] for t in demo._over("a", ["g1", "g01"])] == ["g1-1", "g01-2"]
    assert demo._over("c", ["g"]) == []
