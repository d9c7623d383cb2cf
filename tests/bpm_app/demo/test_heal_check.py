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


def test_a_registry_cut_counts_every_poll_taken_while_it_lasted_however_late_its_step_resumes(tmp_path, monkeypatch):
    demo = FailoverDemo(DemoSettings(workdir=tmp_path), say=lambda _: None, fault="registry")
    fault = demo.fault
    fault.victim, fault.hosted, fault.cut_s = "b", ["a.g001"], 27.0
    demo.t0 = 1767268800.0
    fault.at = demo.t0 + 100.0  # the cut, at 100 s
    monkeypatch.setattr(demo, "_running", lambda: {"b": {"a.g001": {}}})
    monkeypatch.setattr(demo, "_agent_status", lambda name, timeout_s=10.0: {"records": []})

    def polled(t: float, status: str) -> dict:
        return {"t": t, "participants": [{"name": "b", "status": status}], "failovers": []}

    steps = fault.ride_out()
    now = {"at": fault.at}
    monkeypatch.setattr("time.time", lambda: now["at"])
    demo.state = polled(99.0, "alive")  # the last poll before the cut
    next(steps)
    demo.state = polled(105.0, "suspected")
    next(steps)
    # The step resumes 30 s into the cut, past its end: the poll it reads was taken at 126 s.
    now["at"] = fault.at + 30.0
    demo.state = polled(126.0, "failed")
    next(steps)
    demo.state = polled(131.0, "alive")  # healed meanwhile: a poll after the cut is not the cut's
    for _ in steps:
        raise AssertionError("a poll taken after the cut ended counts for it")
    assert fault.registry_cut["registry_counted_it_failed"] is True
    assert fault.registry_cut["polls"] == 3 and fault.registry_cut["polls_running_every_task"] == 3
