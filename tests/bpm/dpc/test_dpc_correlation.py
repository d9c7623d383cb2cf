from bpm.dpc import CorrelatedRow, alerting_sources, correlate, plain_correlation
from bpm.results import Result
from bpm.zeek.definitions import ResultRow
from examples.network_monitoring import alert as monitoring_alert

W = (0, 60_000_000)


def test_a_source_alerting_at_two_participants_is_one_row_naming_both():
    rows = correlate(W, {"a": {"10.0.0.1", "10.0.0.2"}, "b": {"10.0.0.1"}, "c": {"10.0.0.3"}})
    assert rows == {CorrelatedRow(0, 60_000_000, "10.0.0.1", ("a", "b"))}


def test_a_higher_minimum_needs_more_participants():
    alerts = {"a": {"s"}, "b": {"s"}, "c": {"s", "t"}, "d": {"t"}}
    assert {r.source for r in correlate(W, alerts, min_participants=3)} == {"s"}


def reading(device: str, end_s: int, maximum: float) -> Result:
    """A result of a per-device query, final at its window's end."""
    return Result(end_s * 1_000_000, (device, end_s - 60), (("device", device), ("window_end", end_s), ("maximum", maximum)))


def too_hot(row):
    return row["device"] if row["maximum"] > 30 else None


def test_a_participant_s_alerts_are_what_its_query_s_alert_finds_in_the_window_its_results_end():
    results = [reading("d1", 60, 31.0), reading("d2", 60, 35.5), reading("d3", 60, 20.0), reading("d1", 120, 40.0)]
    assert alerting_sources(results, too_hot, 60) == {(0, 60): {"d1", "d2"}, (60, 120): {"d1"}}


def test_the_network_monitoring_query_alerts_on_its_connections_and_ports_rows_not_its_prefix_counts():
    rows = [
        ResultRow("connections", 0, 60, "10.0.0.1", 150),
        ResultRow("ports", 0, 60, "10.0.0.2", 12),
        ResultRow("prefix", 0, 60, "10.0.0.0/24", 1),
        ResultRow("ports", 60, 120, "10.0.0.1", 11),
    ]
    assert alerting_sources([r.as_result() for r in rows], monitoring_alert, 60) == {(0, 60): {"10.0.0.1", "10.0.0.2"}, (60, 120): {"10.0.0.1"}}


def test_the_plain_correlation_takes_each_window_on_its_own():
    a = [reading("s", 60, 31.0), reading("t", 120, 31.0)]
    b = [reading("s", 60, 32.0), reading("t", 60, 33.0)]
    assert plain_correlation({"a": a, "b": b}, too_hot, 60) == {CorrelatedRow(0, 60, "s", ("a", "b"))}


def test_rows_round_trip_through_json():
    row = CorrelatedRow(0, 60_000_000, "2001:db8::1", ("a", "b"))
    assert CorrelatedRow.from_json(row.to_json()) == row
