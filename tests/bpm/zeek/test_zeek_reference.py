from pathlib import Path

import pytest

from bpm.zeek.conn import Conn, read_logs
from bpm.zeek.definitions import Admission, QueryParams, ResultRow, partition_of, source_prefix, window_start
from bpm.zeek.reference import compute

FIXTURES = Path(__file__).parents[2] / "fixtures" / "zeek"
FIXTURE_PARAMS = QueryParams(window_s=60, min_connections=3, min_ports=2, lateness_s=60)
W0, W1, W2 = 1600000020, 1600000080, 1600000140

# Worked out by hand from tests/fixtures/zeek/conn.log: 10.0.0.2 has 3 connections (not over 3),
# 10.0.0.3 has 2 TCP/UDP ports plus ICMP (not over 2) and one late row that would make 3.
FIXTURE_EXPECTED = sorted([
    ResultRow("connections", W0, W1, "10.0.0.1", 4),
    ResultRow("ports", W0, W1, "10.0.0.2", 3),
    ResultRow("ports", W0, W1, "10.0.0.9", 3),
    ResultRow("ports", W0, W1, "2001:db8::1", 3),
    ResultRow("prefix", W0, W1, "10.0.0.0/24", 2),
    ResultRow("prefix", W0, W1, "2001:db8::/64", 1),
    ResultRow("connections", W1, W2, "10.0.0.1", 5),
])


def test_hand_written_fixture_gives_the_hand_computed_rows():
    admission = Admission(FIXTURE_PARAMS.lateness_s)
    assert compute(read_logs([FIXTURES / "conn.log"]), FIXTURE_PARAMS, admission) == FIXTURE_EXPECTED
    assert admission.late == 1


def test_lateness_bound_keeps_the_late_row_when_wide_enough():
    rows = compute(read_logs([FIXTURES / "conn.log"]), QueryParams(min_connections=3, min_ports=2, lateness_s=100))
    assert ResultRow("ports", W0, W1, "10.0.0.3", 3) in rows


def test_thresholds_are_strict():
    conns = [Conn(60.0 + i, "10.1.1.1", 1, "10.2.2.2", 1000 + i, "tcp") for i in range(5)]
    assert compute(conns, QueryParams(min_connections=5, min_ports=5)) == []
    assert compute(conns, QueryParams(min_connections=4, min_ports=5)) == [ResultRow("connections", 60, 120, "10.1.1.1", 5)]


def test_admission_refuses_rows_at_or_behind_the_bound_in_input_order():
    admission = Admission(10)
    assert [admission.admit(t * 1_000_000) for t in (100, 95, 90, 89, 120, 110, 111)] == [True, True, False, False, True, False, True]
    assert admission.late == 3 and admission.newest_us == 120_000_000


@pytest.mark.parametrize(("ip", "prefix"), [("10.1.2.3", "10.1.2.0/24"), ("2001:db8:a:b:1::9", "2001:db8:a:b::/64")])
def test_source_prefix(ip, prefix):
    assert source_prefix(ip) == prefix


def test_partition_is_stable_and_in_range():
    # CRC-32 of "10.1.2.0/24" is 1325105504 in every process (unlike Python's salted hash()).
    assert [partition_of("10.1.2.0/24", k) for k in (1, 4, 7)] == [0, 0, 2]
    assert {partition_of(f"10.0.{i}.0/24", 4) for i in range(100)} == {0, 1, 2, 3}


def test_windows_are_aligned_to_the_epoch():
    assert window_start(59_999_999, 60) == 0 and window_start(60_000_000, 60) == 60
    with pytest.raises(ValueError):
        QueryParams(window_s=0)
