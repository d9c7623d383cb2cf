"""The HA benchmark's pure parts: settings, the sliced overhead measurement, the goals."""

import pytest

from bpm_app.bench.ha import HASettings, goals, overhead_ratios, sliced_cpu_per_row


def mark(cpu_a, cpu_b, rows):
    return {"a": {"cpu_s": cpu_a, "rows": rows}, "b": {"cpu_s": cpu_b, "rows": 0.0}}


def test_slices_alternate_duties_off_and_on_and_count_both_processes():
    marks = [mark(0, 0, 0), mark(10, 1, 1000), mark(21, 2, 2000), mark(31, 3, 3000), mark(43, 4, 4000)]
    per_row = sliced_cpu_per_row(marks)
    assert per_row == {"off": pytest.approx(1000 * 22 / 2000), "on": pytest.approx(1000 * 25 / 2000)}
    assert sliced_cpu_per_row([mark(0, 0, 0), mark(1, 0, 0)]) == {"off": None, "on": None}


def test_ratios_are_against_mode_none():
    assert overhead_ratios({"none": 2.0, "upstream_backup": 2.1, "active_standby": None}) == {
        "none": 1.0, "upstream_backup": 1.05, "active_standby": None}
    assert overhead_ratios({"passive_standby": 1.0}) == {"passive_standby": None}


def test_goals_apply_to_the_modes_they_name():
    base = {"detection_s": 2.9, "lost_results": 0, "duplicate_results": 0}
    assert goals({**base, "mode": "active_standby", "recovery_after_detection_s": 0.5, "overhead_ratio": 2.0}) == {
        "detection_within_3s": True, "recovery_after_detection": True, "overhead": None, "precise": True,
        "partition_safe": None}
    assert goals({**base, "mode": "passive_standby", "recovery_after_detection_s": 5.5, "overhead_ratio": 1.1}) == {
        "detection_within_3s": True, "recovery_after_detection": False, "overhead": True, "precise": True,
        "partition_safe": None}
    gap = goals({**base, "mode": "none", "lost_results": 40, "recovery_after_detection_s": 3.0, "overhead_ratio": 1.0})
    assert gap == {"detection_within_3s": True, "recovery_after_detection": None, "overhead": None, "precise": None,
                   "partition_safe": None}
    cut = {"cut_s": 8.0, "old_host_state": "failed", "old_epoch_batches_after_takeover": 0}
    assert goals({**base, "mode": "none", "partition": cut})["partition_safe"] is True
    assert goals({**base, "mode": "none", "partition": {**cut, "old_epoch_batches_after_takeover": 1}})["partition_safe"] is False
    assert goals({**base, "mode": "none", "partition": {**cut, "old_host_state": "running"}})["partition_safe"] is False
    link = {"cut_s": 8.0, "failed_over": False}
    assert goals({**base, "detection_s": None, "mode": "passive_standby", "partition": link})["partition_safe"] is True
    assert goals({**base, "mode": "passive_standby", "partition": {**link, "failed_over": True}})["partition_safe"] is False


def test_settings_refuse_what_cannot_be_measured():
    with pytest.raises(ValueError, match="fault must be one of"):
        HASettings(fault="flood")
    with pytest.raises(ValueError, match="needs hosts"):
        HASettings(fault="cut", hosts=False)
    with pytest.raises(ValueError, match="modes"):
        HASettings(modes=("mirror",))
    with pytest.raises(ValueError, match="even"):
        HASettings(slices=3)
    with pytest.raises(ValueError, match="heartbeat"):
        HASettings(heartbeat_s=3.0, detect_timeout_s=3.0)
