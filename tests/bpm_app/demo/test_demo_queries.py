"""A demo of mixed queries (`bpm demo --queries NAME=REFERENCE`): each participant's query, its
parameters and what its agent is told (no federation; its input and plain computation:
tests/spark_agents/test_demo_reference.py)."""

from __future__ import annotations

import pytest

from bpm.query import QueryError
from bpm_app.demo.queries import MONITORING, DemoQuery, parse_queries
from bpm_app.demo.run import MEMBERS, Demo, DemoSettings
from typer.testing import CliRunner

from bpm_app.cli import app

SENSORS = "examples.sensors:query"


def test_each_query_runs_with_its_short_run_parameters_or_a_ten_second_window_and_five_seconds_of_lateness():
    assert dict(DemoQuery.load(MONITORING).params) == {"window_s": 10, "min_connections": 20, "min_ports": 5, "lateness_s": 5}
    sensors = DemoQuery.load(SENSORS)
    assert dict(sensors.params) == {"window_s": 10, "lateness_s": 5} and not sensors.zeek
    sessions = DemoQuery.load("examples.sessions:query")
    assert sessions.lateness_s == 5 and sessions.align_s is None, "a query without a grain keeps its own parameters"


def test_a_query_the_demo_cannot_feed_or_name_is_refused_with_the_reason(tmp_path):
    bare = tmp_path / "bare.py"
    bare.write_text("from bpm.query import Query\n"
                    "def compute(events, params):\n    return events\n"
                    "query = Query(name='bare', schema='ts TIMESTAMP, k STRING', key='k', event_time='ts', lateness=0,\n"
                    "              compute=compute, result_key=('k',), result_time='ts')\n")
    with pytest.raises(QueryError, match="no generate"):
        DemoQuery.load(f"{bare}:query")
    names = [m.name for m in MEMBERS]
    assert parse_queries([f"b={SENSORS}"], names) == {"b": SENSORS}
    with pytest.raises(ValueError, match="no participant 'x'"):
        parse_queries([f"x={SENSORS}"], names)
    with pytest.raises(ValueError, match="PARTICIPANT=module:attribute"):
        parse_queries(["b"], names)
    done = CliRunner().invoke(app, ["demo", "--headless", "--workdir", str(tmp_path / "run"), "--queries", "b=examples.nope:query"])
    assert done.exit_code == 2 and "cannot import 'examples.nope'" in done.output
    assert not (tmp_path / "run").exists(), "nothing is started, nor its folder made"


def test_every_agent_runs_its_own_query_and_can_host_the_others(tmp_path):
    demo = Demo(DemoSettings(workdir=tmp_path, queries={"b": SENSORS}), say=lambda _: None)
    members = {m.name: m for m in MEMBERS}
    b = demo._agent_settings(members["b"])
    assert (b["query"], b["param"], b["can_run"]) == (SENSORS, ["window_s=10", "lateness_s=5"], [MONITORING])
    a = demo._agent_settings(members["a"])
    assert (a["query"], a["can_run"]) == (MONITORING, [SENSORS])
    assert a["param"] == ["window_s=10", "min_connections=20", "min_ports=5", "lateness_s=5"]
    alone = Demo(DemoSettings(workdir=tmp_path), say=lambda _: None)._agent_settings(members["a"])
    assert alone["query"] == MONITORING and "can_run" not in alone


def test_what_network_monitoring_shares_were_fed_is_what_the_lateness_rule_kept_in_the_chosen_key_groups(tmp_path):
    """The queried connections, whether the tasks cover every key group (each line kept as
    the replayer wrote it, read only for its time) or part of them (each line parsed for its
    key): the connections the lateness rule admits, in the chosen key groups, and the end mark after them."""
    from bpm.keygroups import KEY_GROUPS
    from bpm.records import Records, end_mark_us
    from bpm.zeek.conn import Conn, read_logs, write_tsv
    from bpm.zeek.definitions import stream_values

    monitoring = DemoQuery.load(MONITORING)
    times = [1_000.0 + i * 0.5 for i in range(200)]
    times[120] = times[119] - monitoring.lateness_s - 1  # late past the lateness: the feeder refused it
    conns = [Conn(t, f"10.{i % 7}.{i % 5}.{i % 11}", 40_000 + i, "192.0.2.1", 80 + i % 9, "tcp") for i, t in enumerate(times)]
    fed = tmp_path / "a.fed.log"
    with fed.open("w", encoding="utf-8") as handle:
        write_tsv(conns, handle)
    admitted = [c for i, c in enumerate(conns) if i != 120]
    wire = Records(monitoring.query)
    for chosen in (set(range(KEY_GROUPS)), set(range(0, KEY_GROUPS, 2))):
        out, end_us = monitoring.queried("a", fed, chosen)
        want = [c for c in admitted if wire.key_group(stream_values(c)[1]) in chosen]
        assert [(c.ts, c.orig_h, c.resp_p) for c in read_logs([out])] == [(c.ts, c.orig_h, c.resp_p) for c in want], len(chosen)
        assert end_us == end_mark_us(int(times[-1] * 1_000_000), monitoring.lateness_s, monitoring.align_s)
    assert 0 < len(want) < len(admitted)
