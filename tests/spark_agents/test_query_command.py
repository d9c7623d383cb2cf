"""`bpm query show` and `bpm query check` as a user runs them, with a query written outside the project."""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

from bpm_app.cli import app

METERS = textwrap.dedent('''
    """A query no part of the project knows: energy meters, kWh per building per 20 s."""
    from bpm.query import Param, Query


    def compute(events, params):
        from pyspark.sql import functions as F

        return (events.where(F.col("kwh") >= params.floor)
                .groupBy(F.window("read_at", f"{params.window_s} seconds"), "building")
                .agg(F.sum("kwh").alias("kwh"), F.count(F.lit(1)).alias("readings"))
                .selectExpr("building", "window.start AS start", "window.end AS until", "kwh", "readings"))


    meters = Query(name="meters", schema="read_at TIMESTAMP, building STRING, meter INT, kwh DOUBLE", key="building",
                   event_time="read_at", lateness=10, compute=compute, result_key=("building", "start"), result_time="until",
                   align="window_s", params={"window_s": Param(int, 20, minimum=1), "floor": Param(float, 0.0)})
''')


def run(*args: str):
    return CliRunner().invoke(app, ["query", *args])


@pytest.fixture
def meters(tmp_path):
    (tmp_path / "meters.py").write_text(METERS)
    sample = tmp_path / "readings.jsonl"
    lines = [json.dumps({"read_at": 1_700_000_000 + 2 * k, "building": f"b{k % 5}", "meter": k % 7, "kwh": round(0.1 * (k % 9), 1)})
             for k in range(150)]
    lines[10] = '{"read_at": "soon", "building": "b1"}'
    lines[20] = "{broken"
    sample.write_text("\n".join(lines) + "\n")
    return f"{tmp_path / 'meters.py'}:meters", sample


def test_show_prints_the_declaration_with_the_parameters_given(meters):
    reference, _ = meters
    shown = run("show", reference, "--param", "window_s=30", "--json")
    assert shown.exit_code == 0, shown.output
    declared = json.loads(shown.stdout)
    assert declared["name"] == "meters" and declared["params"]["window_s"]["value"] == 30 and declared["splits_at_s"] == 30
    assert len(declared["digest"]) == 16 and declared["result_key"] == ["building", "start"]
    assert "tasks split at multiples of 20 s" in " ".join(run("show", reference).stdout.split())


@pytest.mark.parametrize("args, says", [
    (["show", "examples.sensors:query", "--param", "windows=3"], "query 'sensors' has no parameter 'windows'"),
    (["show", "examples.sensors:query", "--param", "window_s=soon"], "parameter 'window_s' must be int, not 'soon'"),
    (["show", "examples.sensors:query", "--param", "window_s"], "give name=value"),
    (["show", "no_such_module:query"], "cannot import 'no_such_module'"),
    (["check", "examples.sensors:query", "--sample", "/nonexistent/sample.jsonl"], "no such file"),
    (["check", "examples.sensors:query", "--format", "xml"], "--format 'xml'"),
])
def test_bad_input_is_a_clear_error(args, says):
    result = run(*args)
    assert result.exit_code == 2 and says in " ".join(result.stderr.split()), result.output


@pytest.mark.slow
def test_check_runs_a_query_written_outside_the_project_and_reports_refused_records(spark, meters):
    reference, sample = meters
    checked = run("check", reference, "--sample", str(sample), "--param", "floor=0.2", "--json")
    assert checked.exit_code == 0, checked.output
    outcome = json.loads(checked.stdout)
    assert outcome["ok"] and outcome["problems"] == []
    assert outcome["records"] == 148 and outcome["refused"] == 2 and outcome["results"] == outcome["expected"] > 20
    said = " ".join(run("check", reference, "--sample", str(sample)).stderr.split())
    assert "line 11: read_at: 'soon' is neither epoch seconds nor an ISO 8601 time" in said and "ok: the federation can run it" in said


@pytest.mark.slow
def test_check_fails_a_query_that_is_not_movable_and_a_sample_that_does_not_fit(spark, tmp_path, meters):
    reference, sample = meters
    (tmp_path / "wrong.csv").write_text("read_at,building\nnot a time,b1\n")
    unfit = run("check", reference, "--sample", str(tmp_path / "wrong.csv"))
    assert unfit.exit_code == 1 and "no record of" in " ".join(unfit.stderr.split())
    eager = METERS + textwrap.dedent('''
        first_seen = Query(name="first-seen", schema="read_at TIMESTAMP, building STRING, meter INT, kwh DOUBLE", key="building",
                           event_time="read_at", lateness=10, result_key=("building", "meter"), result_time="read_at",
                           compute=lambda events, params: events.dropDuplicatesWithinWatermark(["building", "meter"]))
    ''')
    (tmp_path / "eager.py").write_text(eager)
    checked = run("check", f"{tmp_path / 'eager.py'}:first_seen", "--sample", str(sample), "--json")
    assert checked.exit_code == 1
    assert "came out before they were final" in json.loads(checked.stdout)["problems"][0]


def test_list_shows_what_an_agent_runs_with_its_parameters_and_digests(meters, tmp_path):
    from examples.sensors import query as sensors

    config = tmp_path / "agent.toml"
    config.write_text(f'name = "north"\nquery = "{meters[0]}"\nparam = ["window_s=30"]\n'
                      'can-run = ["examples.sensors:query"]\n\n[[queries]]\ninput = "clicks"\nquery = "examples.sessions:query"\n'
                      'param = {gap_s = 60}\n')
    listed = run("list", "--config", str(config), "--json")
    assert listed.exit_code == 0, listed.output
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [(r["name"], r["own"], r["input"], r["params"]) for r in rows] == [
        ("meters", True, "main", {"window_s": 30, "floor": 0.0}), ("sessions", True, "clicks", {"gap_s": 60, "lateness_s": 10}),
        ("sensors", False, None, {"window_s": 60, "lateness_s": 30})]
    assert rows[2]["digest"] == sensors.digest
    shown = CliRunner().invoke(app, ["query", "list", "--config", str(config)], env={"COLUMNS": "200"})
    assert "sessions (own tasks, input clicks)" in shown.stdout, shown.stdout
    assert {r["name"] for r in map(json.loads, run("list", "--json").stdout.splitlines())} == {"network-monitoring", "sensors", "sessions"}
    config.write_text('name = "north"\nparam = ["windows=3"]\n')
    wrong = run("list", "--config", str(config))
    assert wrong.exit_code == 2 and "has no parameter 'windows'" in " ".join(wrong.stderr.split())


def test_an_agent_does_not_start_with_a_query_it_cannot_load_or_a_parameter_it_does_not_take(tmp_path):
    def agent(*args: str):
        return CliRunner().invoke(app, ["agent", "run", "--name", "x", "--workdir", str(tmp_path), *args], env={"COLUMNS": "1000"})

    for args, says in ((["--param", "window_s=soon"], "parameter 'window_s' must be int, not 'soon'"),
                       (["--query", "examples.nothing:query"], "cannot import 'examples.nothing'"),
                       (["--can-run", "examples.sensors:compute"], "is a function, not a bpm.query.Query"),
                       (["--param", "window_s"], "give name=value")):
        done = agent(*args)
        assert done.exit_code == 2 and says in " ".join(done.output.split()), done.output
