"""Results as the federation compares them: plain values, identity, the time a result is final."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bpm.query import QueryError, load
from bpm.results import OutputSet, Result, plain, result, time_us

SENSORS = load("examples.sensors:query")


def _row(device: str, start: datetime, average: float) -> dict:
    return {"window_start": start, "window_end": start.replace(minute=start.minute + 1), "device": device,
            "average": average, "maximum": 30.5, "readings": 3}


def test_a_spark_row_and_its_json_form_are_one_result():
    row = _row("d1", datetime(2024, 6, 1, 0, 0, tzinfo=UTC), 21.25)
    spark, json = result(row, SENSORS), result(result(row, SENSORS).to_json(), SENSORS)
    assert spark == json and hash(spark) == hash(json)
    assert spark.key == ("d1", "2024-06-01T00:00:00Z")
    assert spark.time_us == time_us("2024-06-01T00:01:00Z") == 1_717_200_060 * 1_000_000
    assert spark.to_json()["window_end"] == "2024-06-01T00:01:00Z"


def test_values_become_plain_and_hashable():
    assert plain(datetime(2024, 6, 1, 0, 0, 0, 250_000, tzinfo=UTC)) == "2024-06-01T00:00:00.25Z"
    assert plain([1, [2, 3]]) == (1, (2, 3)) and plain({"a": [1]}) == (("a", (1,)),)
    assert time_us(1.5) == 1_500_000 and time_us(datetime(1970, 1, 1, 0, 0, 2, tzinfo=UTC)) == 2_000_000
    with pytest.raises(ValueError, match="not a time"):
        time_us("soon")


def test_a_result_without_its_key_or_time_is_an_error_naming_the_column():
    with pytest.raises(QueryError, match="its result has no column 'device'"):
        result({"window_start": 0, "window_end": 60}, SENSORS)
    with pytest.raises(QueryError, match="result_time 'window_end' holds 'later' is not a time"):
        result({"window_start": 0, "window_end": "later", "device": "d"}, SENSORS)


def test_merged_batches_tell_duplicated_lost_and_extra_results_in_time_order():
    a, b, c = (result(_row(d, datetime(2024, 6, 1, 0, m), 20.0), SENSORS) for d, m in (("d1", 2), ("d2", 0), ("d3", 1)))
    out = OutputSet()
    out.add([a])
    out.add([a, b])
    assert out.rows == {a, b} and out.duplicates == [a]
    assert out.lost([a, b, c]) == [c] and out.extra([a]) == [b]
    assert sorted([a, b, c]) == [b, c, a]
    assert isinstance(a, Result) and OutputSet().duplicates == []
