"""The demo's drain waits for every task over the queried shares, and says where each one it
gave up on stood (no processes)."""

from __future__ import annotations

from bpm_app.demo.run import Demo, DemoSettings
from bpm.records import end_watermark_ms


def test_the_drain_names_each_task_that_had_not_drained_and_where_it_stood(tmp_path):
    said: list[str] = []
    demo = Demo(DemoSettings(workdir=tmp_path, poll_s=0.01), say=said.append)
    end_us = 1_717_200_600_000_000
    want = end_watermark_ms(end_us, demo._query("a").lateness_s)
    demo._end_us = {"a": end_us}
    demo.state = {"tasks": [
        {"id": 1, "origin": "a", "name": "g", "input_uri": "nats://10.0.0.3:4222/a", "until_s": 1717200040},  # split, not retired
        {"id": 2, "origin": "a", "name": "g0-1", "input_uri": "nats://10.0.0.3:4222/a/0"},  # 95 s behind
        {"id": 3, "origin": "a", "name": "g1-1", "input_uri": "nats://10.0.0.3:4222/a/1"},  # drained
        {"id": 4, "origin": "a", "name": "g10-3", "input_uri": "nats://10.0.0.3:4222/a/10"},  # no batch yet
        {"id": 5, "origin": "a", "name": "g11-3", "input_uri": "nats://10.0.0.3:4222/a/11", "until_s": 1717200500, "retired": True},
    ]}
    running = {"a": {"a.g0-1": {"watermark_ms": want - 95_000}, "a.g1-1": {"watermark_ms": want}}, "b": {"a.g1-1": {"watermark_ms": 5}}}
    demo.poll = lambda: demo.state
    demo._running = lambda: running
    demo._drain({"a": ["g"]}, timeout_s=0.05)
    assert said == ["tasks had not drained after 0 s: a.g (not retired, its windows until 1717200040), a.g0-1 (95 s of input short), "
                    "a.g10-3 (no batch seen); results compared as they are"]

    said.clear()
    running["a"].update({"a.g0-1": {"watermark_ms": want}, "a.g10-3": {"watermark_ms": want + 1}})
    demo.state["tasks"][0]["retired"] = True
    demo._drain({"a": ["g"]}, timeout_s=5)
    assert said == [], "every task drained: nothing to say, and no wait for the limit"
