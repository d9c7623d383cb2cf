"""The movement benchmark: its pure parts, and one short real run across two processes."""

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bpm_app.bench.move import (
    Batch,
    MoveSettings,
    first_new_batch,
    measured_round,
    summarize,
)
from bpm_app.bench.workload import Workload


def test_the_first_new_batch_is_the_earliest_later_one_that_read_input():
    batches = [Batch(3, 0.0, 1.0, 50), Batch(4, 1.0, 1.5, 0), Batch(6, 3.0, 4.0, 9), Batch(5, 2.0, 2.5, 7)]
    assert first_new_batch(batches, 3) == Batch(5, 2.0, 2.5, 7)
    assert first_new_batch(batches, 6) is None
    assert first_new_batch([Batch(4, 1.0, 1.5, 0)], 3) is None


def test_a_round_is_measured_end_to_end_and_its_steps_add_up_to_the_pause():
    last, first = Batch(10, 100.0, 100.5, 40), Batch(11, 102.0, 102.75, 90)
    steps = {"stop_s": 0.1, "pack_s": 0.2, "unpack_s": 0.3, "start_s": 0.4, "started_at": 101.75, "checkpoint_bytes": 5e5}
    measured = measured_round("move", "a", "b", last, first, steps)
    assert measured.pause_s == pytest.approx(2.25)
    assert measured.phases["idle_s"] == pytest.approx(0.25)
    assert measured.phases["first_batch_s"] == pytest.approx(0.75)
    assert measured.phases["other_s"] == pytest.approx(2.25 - (0.1 + 0.2 + 0.3 + 0.4 + 0.25 + 0.75))
    assert "started_at" not in measured.phases and "started_at" in steps


def _round(kind, pause, start=0.0):
    last, first = Batch(1, start, start + 1.0, 5), Batch(2, start + 1.0 + pause - 0.5, start + 1.0 + pause, 5)
    return measured_round(kind, "a", "b" if kind == "move" else "a", last, first, {"stop_s": 0.0, "start_s": 0.0, "started_at": first.start_s})


def test_the_summary_compares_median_pause_with_the_median_floor():
    rounds = [_round("floor", 1.0), _round("move", 1.2), _round("floor", 0.8), _round("move", 2.0), _round("floor", 1.2), _round("move", 1.4)]
    result = summarize(rounds, lost=0, duplicates=0, extra=0, expected=12)
    assert result["benchmark"] == "move" and result["moves"] == 3
    assert result["pauses"] == [1.2, 2.0, 1.4] and result["floors"] == [1.0, 0.8, 1.2]
    assert (result["pause_median_s"], result["pause_max_s"]) == (1.4, 2.0)
    assert (result["floor_median_s"], result["floor_max_s"]) == (1.0, 1.2)
    assert result["ratio_median"] == 1.4
    assert result["goal"] == {"pause_median_under_3s": True, "within_1_2x_floor": False}
    assert result["phases"]["move"]["first_batch_s"] == 0.5


def test_the_summary_counts_the_packs_that_had_to_be_taken_again():
    last, first = Batch(1, 0.0, 1.0, 5), Batch(2, 2.0, 2.5, 5)
    raced = measured_round("move", "a", "b", last, first, {"pack_retries": 2.0, "started_at": 2.0})
    result = summarize([_round("floor", 1.0), raced, _round("move", 1.0)], 0, 0, 0, 1)
    assert result["pack_retries"] == 2 and "pack_retries" not in result["phases"]["move"]


def test_the_goal_fails_when_the_pause_is_long_or_far_above_the_floor():
    slow = summarize([_round("floor", 3.0), _round("move", 3.5)], 0, 0, 0, 1)
    assert slow["goal"] == {"pause_median_under_3s": False, "within_1_2x_floor": True}
    far = summarize([_round("floor", 0.5), _round("move", 1.0)], 0, 0, 0, 1)
    assert far["ratio_median"] == 2.0 and far["goal"] == {"pause_median_under_3s": True, "within_1_2x_floor": False}


def test_a_workload_s_records_are_endless_and_the_same_again_for_a_seed():
    workload = Workload("examples.sensors:query", (("window_s", "10"),))
    # Stretches of 120 s at 5 records/s: 1,500 records span several stretches, each after the one before.
    first = list(itertools.islice(workload.records(rate=5.0, seed=3), 1500))
    assert first == list(itertools.islice(workload.records(rate=5.0, seed=3), 1500)) and len(first) == 1500
    assert max(ts for ts, _ in first) - min(ts for ts, _ in first) > 240 * 1_000_000
    assert first != list(itertools.islice(workload.records(rate=5.0, seed=4), 1500))
    with pytest.raises(ValueError, match="has no parameter 'windows'"):
        MoveSettings(workload=Workload("examples.sensors:query", (("windows", "10"),)))
    with pytest.raises(ValueError, match="defines no generate"):
        MoveSettings(workload=Workload("tests.bpm_app.bench.no_generator:query"))


def test_a_workload_names_a_query_file_by_its_whole_path_for_workers_elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Workload("queries/mine.py:q").reference == f"{tmp_path / 'queries' / 'mine.py'}:q"
    assert Workload("examples.sensors:query").reference == "examples.sensors:query"
    assert Workload("examples.sensors:query").folder == str(tmp_path)


@pytest.mark.parametrize("bad", [{"moves": 0}, {"warmup": -1}, {"age_batches": -1}, {"retain_batches": 0}, {"trigger_s": 0.0}, {"speedup": -1.0}, {"timeout_s": 0.0}])
def test_settings_refuse_what_cannot_run(bad):
    with pytest.raises(ValueError):
        MoveSettings(**bad)


def test_both_sessions_get_the_retention_asked_for():
    assert "spark.sql.streaming.minBatchesToRetain" not in MoveSettings().spark_conf()
    assert MoveSettings(retain_batches=10).spark_conf()["spark.sql.streaming.minBatchesToRetain"] == "10"
    conf = MoveSettings(extra_conf=(("spark.sql.streaming.stateStore.maintenanceInterval", "5s"),)).spark_conf()
    assert conf["spark.sql.streaming.stateStore.maintenanceInterval"] == "5s" and conf["spark.ui.enabled"] == "false"


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.full
def test_tasks_move_back_and_forth_between_two_processes_without_losing_or_duplicating_results(tmp_path):
    bpm = str(Path(sys.executable).with_name("bpm"))
    args = [bpm, "bench", "move", "--json", "--moves", "3", "--warmup", "1", "--age", "0", "--timeout", "480",
            "--workdir", str(tmp_path / "run"), "--plot", str(tmp_path / "move.png")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["benchmark"] == "move" and result["moves"] == 3
    assert len(result["pauses"]) == 3 and len(result["floors"]) == 3
    assert all(p > 0 for p in result["pauses"] + result["floors"])
    assert result["pause_max_s"] == max(result["pauses"]) and result["floor_max_s"] == max(result["floors"])
    assert [r["kind"] for r in result["rounds"]] == ["floor", "move"] * 3
    # The task alternates between the two processes, each movement starting where the last one landed.
    moves = [r for r in result["rounds"] if r["kind"] == "move"]
    assert all(m["from"] != m["to"] for m in moves)
    assert all(a["to"] == b["from"] for a, b in zip(moves, moves[1:]))
    assert all(r["first_batch"] > r["last_batch"] for r in result["rounds"])
    assert result["expected_results"] > 0
    assert (result["lost_results"], result["duplicate_results"], result["unexpected_results"]) == (0, 0, 0)
    assert (tmp_path / "move.png").stat().st_size > 0
