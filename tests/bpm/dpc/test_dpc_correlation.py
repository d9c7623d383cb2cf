from bpm.dpc import CorrelatedRow, alerting_sources, correlate, plain_correlation
from bpm.zeek.definitions import ResultRow

W = (0, 60_000_000)


def test_a_source_alerting_at_two_participants_is_one_row_naming_both():
    rows = correlate(W, {"a": {"10.0.0.1", "10.0.0.2"}, "b": {"10.0.0.1"}, "c": {"10.0.0.3"}})
    assert rows == {CorrelatedRow(0, 60_000_000, "10.0.0.1", ("a", "b"))}


def test_a_higher_minimum_needs_more_participants():
    alerts = {"a": {"s"}, "b": {"s"}, "c": {"s", "t"}, "d": {"t"}}
    assert {r.source for r in correlate(W, alerts, min_participants=3)} == {"s"}


def test_alerts_are_connections_and_ports_rows_not_prefix_counts():
    rows = [
        ResultRow("connections", 0, 60, "10.0.0.1", 150),
        ResultRow("ports", 0, 60, "10.0.0.2", 12),
        ResultRow("prefix", 0, 60, "10.0.0.0/24", 1),
        ResultRow("ports", 60, 120, "10.0.0.1", 11),
    ]
    assert alerting_sources(rows) == {(0, 60): {"10.0.0.1", "10.0.0.2"}, (60, 120): {"10.0.0.1"}}


def test_the_plain_correlation_takes_each_window_on_its_own():
    a = [ResultRow("connections", 0, 60, "s", 150), ResultRow("connections", 60, 120, "t", 150)]
    b = [ResultRow("ports", 0, 60, "s", 11), ResultRow("ports", 0, 60, "t", 11)]
    assert plain_correlation({"a": a, "b": b}) == {CorrelatedRow(0, 60, "s", ("a", "b"))}


def test_rows_round_trip_through_json():
    row = CorrelatedRow(0, 60_000_000, "2001:db8::1", ("a", "b"))
    assert CorrelatedRow.from_json(row.to_json()) == row
