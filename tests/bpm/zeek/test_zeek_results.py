from bpm.zeek.definitions import ResultRow
from bpm.results import OutputSet

A = ResultRow("connections", 0, 60, "10.0.0.1", 101)
B = ResultRow("ports", 0, 60, "10.0.0.2", 11)
C = ResultRow("prefix", 0, 60, "10.0.0.0/24", 1)


def test_rows_in_two_batches_are_duplicates_and_missing_rows_are_lost():
    out = OutputSet()
    out.add([C, A])
    out.add([A, B])
    assert out.rows == {A, B, C} and out.duplicates == [A]
    assert out.lost([A, B]) == [] and out.extra([A]) == [B, C]


def test_json_form_round_trips_and_is_iso_utc():
    assert A.to_json()["window_start"] == "1970-01-01T00:00:00Z"
    assert ResultRow.from_json(A.to_json()) == A
