import json
from pathlib import Path

from typer.testing import CliRunner

from bpm_app.cli import app
from bpm.zeek.conn import read_logs
from bpm.zeek.definitions import QueryParams, ResultRow
from bpm.zeek.reference import compute

FIXTURES = Path(__file__).parents[1] / "fixtures" / "zeek"
ARGS = ["--min-connections", "3", "--min-ports", "2", "--json"]


def run(*args):
    return CliRunner().invoke(app, ["pipeline", "run", *args])


def test_corrupt_lines_give_the_same_alerts_and_a_count_on_stderr(spark):
    clean = run(str(FIXTURES / "conn.log"), *ARGS)
    corrupt = run(str(FIXTURES / "conn-corrupt.log"), *ARGS)
    assert clean.exit_code == 0 and corrupt.exit_code == 0, corrupt.output
    rows = [ResultRow.from_json(json.loads(line)) for line in clean.stdout.splitlines()]
    assert rows == compute(read_logs([FIXTURES / "conn.log"]), QueryParams(min_connections=3, min_ports=2))
    assert corrupt.stdout == clean.stdout
    assert "skipped 7 of 31 lines" in " ".join(corrupt.stderr.split()) and "skipped" not in clean.stderr
    assert json.loads(clean.stdout.splitlines()[0]) == {
        "kind": "connections", "window_start": "2020-09-13T12:27:00Z", "window_end": "2020-09-13T12:28:00Z",
        "key": "10.0.0.1", "value": 4,
    }


def test_missing_file_and_empty_input_are_clear_errors(tmp_path):
    assert run(str(tmp_path / "absent.log")).exit_code == 2
    (tmp_path / "empty.log").write_text("garbage\n")
    result = run(str(tmp_path / "empty.log"))
    assert result.exit_code == 1 and "no connection records" in " ".join(result.stderr.split())
    uneven = run(str(FIXTURES / "conn.log"), "--shares", "3")
    assert uneven.exit_code == 2 and "power of two" in " ".join(uneven.stderr.split())
