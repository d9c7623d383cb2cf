import gzip
import io
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpm.zeek.conn import Conn, ParseStats, parse_lines, read_logs, write_json, write_tsv

FIXTURES = Path(__file__).parents[2] / "fixtures" / "zeek"


def test_tsv_and_json_forms_of_the_same_log_parse_to_the_same_connections():
    tsv_stats, json_stats = ParseStats(), ParseStats()
    tsv = list(read_logs([FIXTURES / "conn.log"], tsv_stats))
    js = list(read_logs([FIXTURES / "conn.json"], json_stats))
    assert len(tsv) == 24 and tsv == js
    assert tsv_stats.skipped == json_stats.skipped == 0
    first = tsv[0]
    assert (first.ts, first.orig_h, first.orig_p, first.resp_h, first.resp_p, first.proto) == (
        1600000020.5, "10.0.0.1", 40001, "192.168.1.1", 80, "tcp")


def test_corrupt_lines_are_counted_with_reasons_and_the_rest_parses():
    stats = ParseStats()
    conns = list(read_logs([FIXTURES / "conn-corrupt.log"], stats))
    assert conns == list(read_logs([FIXTURES / "conn.log"]))
    assert stats.skipped == 7 and stats.parsed == 24 and stats.lines == 31
    assert stats.reasons == {"wrong number of columns": 2, "bad port": 2, "bad timestamp": 1, "bad JSON": 1, "missing id.resp_h": 1}
    assert "skipped 7 of 31" in stats.summary()
    assert stats.examples[0][1] == 11


def test_tsv_line_before_header_is_skipped_not_fatal():
    stats = ParseStats()
    assert list(parse_lines(["1\tC\t10.0.0.1\t1\t10.0.0.2\t80\ttcp"], stats)) == []
    assert stats.reasons == {"TSV line before #fields header": 1}


def test_iso_timestamps_and_header_blocks_and_unset_origin_port():
    lines = [
        '{"ts":"2020-09-13T12:27:00.500000Z","id.orig_h":"10.0.0.1","id.resp_h":"10.0.0.2","id.resp_p":80,"proto":"tcp"}',
        "#separator \\x09", "#unset_field\t-", "#fields\tts\tid.orig_h\tid.orig_p\tid.resp_h\tid.resp_p\tproto",
        "1600000020.5\t10.0.0.1\t-\t10.0.0.2\t80\tTCP",
        "#fields\tproto\tid.resp_p\tid.resp_h\tid.orig_h\tts",
        "udp\t53\t10.0.0.2\t::FFFF:10.0.0.1\t1600000021",
    ]
    conns = list(parse_lines(lines))
    assert [c.ts for c in conns] == [1600000020.5, 1600000020.5, 1600000021.0]
    assert conns[1].orig_p == 0 and conns[1].proto == "tcp"
    assert conns[2].orig_h == "::ffff:a00:1" and conns[2].resp_p == 53


def test_gzip_logs_are_read(tmp_path):
    path = tmp_path / "conn.log.gz"
    path.write_bytes(gzip.compress((FIXTURES / "conn.log").read_bytes()))
    assert list(read_logs([path])) == list(read_logs([FIXTURES / "conn.log"]))


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        list(read_logs([tmp_path / "absent.log"]))


addresses = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)).map(lambda ip: ip.compressed)
conns = st.builds(
    Conn,
    ts=st.integers(0, 2**32).map(lambda us: us / 1e3),
    orig_h=addresses, orig_p=st.integers(0, 65535), resp_h=addresses, resp_p=st.integers(0, 65535),
    proto=st.sampled_from(["tcp", "udp", "icmp"]),
)


@given(st.lists(conns, max_size=20))
def test_writing_then_parsing_returns_the_connections_in_both_forms(records):
    for write in (write_tsv, write_json):
        out = io.StringIO()
        assert write(records, out) == len(records)
        assert list(parse_lines(out.getvalue().splitlines())) == records
