"""How many queries the demo starts to bring the load to a target (`bpm_app.demo.run.queries_to_add`), and when a phase is overloaded."""

from __future__ import annotations

from bpm_app.demo.run import queries_to_add


def test_rounds_up_so_the_target_is_passed_by_less_than_one_query():
    # 0.07 missing at 0.03 a query: two fall short, three pass it by 0.02.
    assert queries_to_add(0.46, [0.13, 0.13, 0.13], [0.03, 0.03], most=5) == 3


def test_takes_the_median_query_so_one_slow_start_does_not_set_the_step():
    assert queries_to_add(0.5, [0.2], [0.05, 0.05, 0.4], most=9) == 6


def test_at_most_the_step():
    assert queries_to_add(1.0, [0.1], [0.02], most=3) == 3


def test_none_once_the_target_is_reached():
    assert queries_to_add(0.4, [0.25, 0.15], [0.02], most=3) == 0
    assert queries_to_add(0.4, [0.3, 0.2], [0.02], most=3) == 0


def test_one_while_no_query_is_measured_yet():
    assert queries_to_add(0.4, [0.0, 0.0], [], most=3) == 1


def test_one_while_the_thresholds_are_not_measured_yet():
    assert queries_to_add(None, [0.2], [0.02], most=3) == 1


def test_a_phase_is_overloaded_when_its_total_load_passes_the_total_of_its_thresholds():
    from bpm_app.demo.run import Phase

    thresholds = {"a": 0.63, "b": 0.63, "c": 0.63}
    assert Phase("3", 0.0, loads={"a": 0.41, "b": 1.0, "c": 0.61}, thresholds=thresholds).overloaded
    assert not Phase("3", 0.0, loads={"a": 0.62, "b": 0.63, "c": 0.61}, thresholds=thresholds).overloaded, "each under: not overloaded"
    assert not Phase("3", 0.0, loads={"a": 0.2, "b": 1.4, "c": 0.2}, thresholds=thresholds).overloaded, "unacceptable, yet room for all"
    assert not Phase("1", 0.0).overloaded and Phase("3", 0.0, loads={"a": 2.0}, thresholds={"a": 0.63}).to_json()["overloaded"]
