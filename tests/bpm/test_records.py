"""A query's records: parsing a user's JSON or CSV values, the stream's lines, key groups."""

from __future__ import annotations

import csv
import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpm.keygroups import KEY_GROUPS
from bpm.query import Query
from bpm.records import MARK_DATA, MARK_END, Admission, BadRecords, RecordError, Records, event_time_us, mark_and_time, parse_lines

QUERY = Query(name="q", schema="ts TIMESTAMP, device STRING, value DOUBLE, n INT, ok BOOLEAN, seen TIMESTAMP", key="device",
              event_time="ts", lateness=5, compute=lambda events, params: events, result_key=("device",), result_time="ts")
RECORDS = Records(QUERY)


def test_a_record_parses_to_its_event_time_and_typed_values():
    assert RECORDS.parse({"ts": "2024-06-01T00:00:01.5Z", "device": "d1", "value": "2.5", "n": "3", "ok": "true",
                          "seen": 1717200000}) == (1_717_200_001_500_000, ("d1", 2.5, 3, True, 1_717_200_000_000_000))
    assert RECORDS.parse({"ts": 1717200001.25, "device": 7}) == (1_717_200_001_250_000, ("7", None, None, None, None))
    assert event_time_us("1717200001") == 1_717_200_001_000_000


@pytest.mark.parametrize("record, says", [
    ({"device": "d"}, "ts: the event time is missing"),
    ({"ts": "yesterday", "device": "d"}, "ts: 'yesterday' is neither epoch seconds nor an ISO 8601 time"),
    ({"ts": 1, "device": None}, "device: the key is missing"),
    ({"ts": 1, "device": "d", "value": "warm"}, "value: 'warm' is not a number"),
    ({"ts": 1, "device": "d", "value": float("nan")}, "value: nan is not a finite number"),
    ({"ts": 1, "device": "d", "n": 2.5}, "n: 2.5 is not a whole number"),
    ({"ts": 1, "device": "d", "n": 2**40}, "n: 1099511627776 is out of range for INT"),
    ({"ts": 1, "device": "d", "ok": "maybe"}, "ok: 'maybe' is not true or false"),
    ({"ts": 1, "device": "d", "colour": "red"}, "colour: not a column of query 'q'"),
    (["ts", 1], "a record is an object of columns"),
])
def test_a_record_that_does_not_fit_is_refused_naming_the_column(record, says):
    with pytest.raises(RecordError, match=says):
        RECORDS.parse(record)


def test_a_line_puts_the_federation_s_columns_first_and_quotes_what_needs_it():
    ts_us, values = RECORDS.parse({"ts": 1, "device": 'a,"b"', "value": 1.0, "ok": False})
    line = RECORDS.line(ts_us, values)
    assert line == '1000000,0,"a,""b""",1.0,,false,\n'
    assert next(csv.reader(io.StringIO(line))) == ["1000000", "0", 'a,"b"', "1.0", "", "false", ""]
    assert mark_and_time(line) == (MARK_DATA, 1_000_000)
    assert mark_and_time(RECORDS.line(5, mark=MARK_END).encode()) == (MARK_END, 5)
    assert RECORDS.wire_ddl == "__ts_us BIGINT, __mark INT, `device` STRING, `value` DOUBLE, `n` INT, `ok` BOOLEAN, `seen` BIGINT"


@given(st.text(min_size=1))
def test_every_key_lands_in_one_key_group_and_a_line_reads_back(key):
    ts_us, values = RECORDS.parse({"ts": 1, "device": key})
    assert 0 <= RECORDS.key_group(values) < KEY_GROUPS
    assert RECORDS.key_group(values) == RECORDS.key_group(RECORDS.parse({"ts": 2, "device": key})[1])
    row = next(csv.reader(io.StringIO(RECORDS.line(ts_us, values), newline="")))
    assert row[2] == key


def test_a_users_input_parses_from_json_lines_or_csv_and_bad_records_are_counted_with_reasons():
    bad = BadRecords()
    jsonl = ['{"ts": 1, "device": "a", "value": 2}', "", "not json", '{"ts": 2, "device": "b", "value": "hot"}', '{"ts": 3, "device": "c"}']
    assert [ts for ts, _ in parse_lines(RECORDS, jsonl, "jsonl", bad)] == [1_000_000, 3_000_000]
    assert bad.count == 2 and bad.first == ["line 3: not JSON: Expecting value", "line 4: value: 'hot' is not a number"]
    bad = BadRecords()
    rows = list(parse_lines(RECORDS, ["ts,device,value", "1,a,2.5", "2,,1", "3,c,1,extra"], "csv", bad))
    assert rows == [(1_000_000, ("a", 2.5, None, None, None))]
    assert bad.count == 2 and bad.reasons == {"device": 1, "more values than the header names": 1}
    with pytest.raises(ValueError, match="unknown input format"):
        list(parse_lines(RECORDS, [], "xml", BadRecords()))


def test_admission_keeps_records_within_the_lateness_of_the_newest():
    admission = Admission(lateness_s=10)
    assert [admission.admit(s * 1_000_000) for s in (100, 95, 90, 91, 120, 110)] == [True, True, False, True, True, False]
    assert admission.late == 2 and admission.newest_us == 120_000_000


@given(st.integers(min_value=0, max_value=2**52), st.integers(min_value=-(2**40), max_value=2**40))
def test_a_record_s_json_form_reads_back_exactly(ts_us, seen_us):
    values = ("d", 1.5, 3, True, seen_us)
    assert RECORDS.parse(RECORDS.as_json(ts_us, values)) == (ts_us, values)
