"""After a cut heals, B runs none of the tasks it lost, unless a movement has since given one back to it (no processes)."""

from __future__ import annotations

from bpm_app.demo.failover import FailoverDemo
from bpm_app.demo.run import DemoSettings


def test_a_lost_task_counts_as_moved_back_only_at_an_epoch_past_its_failover(tmp_path):
    demo = FailoverDemo(DemoSettings(workdir=tmp_path), say=lambda _: None, fault="cut")
    demo.fault.at = 1767268800.0  # 2026-01-01T12:00:00Z: the cut
    failover = {"kind": "failover", "from_host": "b", "to_host": "a", "detected_at": "2026-01-01T12:00:05Z"}
    demo.state = {
        "failovers": [{**failover, "task_id": 3, "to_epoch": 2}, {**failover, "task_id": 4, "to_epoch": 2},
                      {**failover, "task_id": 5, "to_epoch": 4, "from_host": "c"},
                      {**failover, "task_id": 6, "to_epoch": 1, "detected_at": "2026-01-01T11:50:00Z"}],  # an earlier fault's
        "tasks": [
            {"id": 3, "origin": "a", "name": "g001", "host": "a", "epoch": 2},  # failed over to a, still there
            {"id": 4, "origin": "a", "name": "g010", "host": "b", "epoch": 3},  # offered back to b after the heal
            {"id": 5, "origin": "a", "name": "g011", "host": "b", "epoch": 5},  # lost by c, not by b
            {"id": 6, "origin": "a", "name": "g000", "host": "b", "epoch": 2},  # not failed over in this fault
        ],
    }
    assert demo.fault.moved_back() == {"a.g010"}
    demo.state["tasks"][1]["epoch"] = 2  # at the failover's own epoch: no movement came after it
    assert demo.fault.moved_back() == set()
