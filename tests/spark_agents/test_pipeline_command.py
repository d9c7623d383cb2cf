"""`bpm pipeline run`: a query over finite input as the federation's tasks run it, compared with its plain computation."""

import json
from pathlib import Path

from typer.testing import CliRunner

from bpm.zeek.conn import read_logs
from bpm.zeek.definitions import QueryParams
from bpm_app.cli import app
from examples.network_monitoring import expected

FIXTURES = Path(__file__).parents[1] / "fixtures" / "zeek"
ARGS = ["--param", "min_connections=3", "--param", "min_ports=2", "--json"]


def run(*args):
    return CliRunner().invoke(app, ["pipeline", "run", *args])


def test_corrupt_lines_give_the_same_alerts_and_a_count_on_stderr(spark):
    clean = run(str(FIXTURES / "conn.log"), *ARGS)
    corrupt = run(str(FIXTURES / "conn-corrupt.log"), *ARGS)
    assert clean.exit_code == 0 and corrupt.exit_code == 0, corrupt.output
    rows = [json.loads(line) for line in clean.stdout.splitlines()]
    assert rows == [r.to_json() for r in expected(read_logs([FIXTURES / "conn.log"]), QueryParams(min_connections=3, min_ports=2))]
    assert corrupt.stdout == clean.stdout
    assert "skipped 7 of 31 lines" in " ".join(corrupt.stderr.split()) and "skipped" not in clean.stderr
    assert rows[0] == {"kind": "connections", "window_start": 1600000020, "window_end": 1600000080, "key": "10.0.0.1", "value": 4}
    said = " ".join(clean.stderr.split())
    assert "network-monitoring:" in said and "0 missing, 0 extra, 0 written twice" in said


def test_a_query_of_the_user_s_own_over_json_lines_equals_its_plain_computation(spark, tmp_path):
    """A query file outside the project, of a schema no code of the project knows."""
    (tmp_path / "my_queries.py").write_text('''
from bpm.query import Param, Query


def compute(events, params):
    from pyspark.sql import functions as F
    return events.where(F.col("bytes") > params.min_bytes).groupBy(F.window("at", "10 seconds"), "shop").agg(
        F.sum("bytes").alias("total")).select(F.col("window.end").cast("long").alias("end"), "shop", "total")


orders = Query(name="orders", schema="at TIMESTAMP, shop STRING, bytes BIGINT", key="shop", event_time="at", lateness=5,
               compute=compute, result_key=("end", "shop"), result_time="end", align=10,
               params={"min_bytes": Param(int, 0, "orders above this many bytes count")})
''')
    lines = [json.dumps({"at": 1_700_000_000 + i * 0.5, "shop": f"s{i % 7}", "bytes": (i * 37) % 500}) for i in range(400)]
    (tmp_path / "orders.jsonl").write_text("\n".join(lines[:200] + ["not json", '{"at": "later", "shop": "x", "bytes": 1}'] + lines[200:]) + "\n")
    done = run("--query", f"{tmp_path / 'my_queries.py'}:orders", "--input", str(tmp_path / "orders.jsonl"), "--param", "min_bytes=100",
               "--shares", "2", "--json")
    assert done.exit_code == 0, done.output
    said = " ".join(done.stderr.split())
    assert "orders: 400 records" in said and "0 missing, 0 extra, 0 written twice" in said, said
    assert "refused" in said, "the two bad lines are reported"
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    totals: dict = {}
    for i in range(400):
        if (i * 37) % 500 > 100:
            end = (1_700_000_000 + i * 0.5) // 10 * 10 + 10
            totals[(int(end), f"s{i % 7}")] = totals.get((int(end), f"s{i % 7}"), 0) + (i * 37) % 500
    assert {(r["end"], r["shop"]): r["total"] for r in rows} == totals


def test_missing_file_and_empty_input_are_clear_errors(tmp_path):
    assert run(str(tmp_path / "absent.log")).exit_code == 2
    (tmp_path / "empty.log").write_text("garbage\n")
    result = run(str(tmp_path / "empty.log"))
    assert result.exit_code == 1 and "no record of the input fits query 'network-monitoring'" in " ".join(result.stderr.split())
    uneven = run(str(FIXTURES / "conn.log"), "--shares", "3")
    assert uneven.exit_code == 2 and "power of two" in " ".join(uneven.stderr.split())
    assert run().exit_code == 2
    other = run("--query", "examples.sensors:query", str(FIXTURES / "conn.log"))
    assert other.exit_code == 2 and "takes ts TIMESTAMP, device STRING" in " ".join(other.stderr.split())
    unknown = run(str(FIXTURES / "conn.log"), "--param", "windows=3")
    assert unknown.exit_code == 2 and "has no parameter 'windows'" in " ".join(unknown.stderr.split())
