"""The JetStream input: the feeder publishes key groups, Spark's Python data source reads a
task's share of them with its offsets in Spark's checkpoint."""

from __future__ import annotations

import pytest

from bpm.keygroups import groups, key_group
from bpm.zeek.definitions import QueryParams
from spark_agents.broker.source import JetStreamInput
from spark_agents.broker.server import BrokerError
from spark_agents.broker.stream import Broker, BrokerStream
from tests.spark_agents.conns import Feeder
from bpm.zeek.stream import MARK_DATA, STREAM_SCHEMA_DDL, StreamRecord

pytestmark = pytest.mark.slow


def _conns(n: int, start_ts: float = 1_700_000_000.0):
    from bpm.zeek.conn import Conn

    return [Conn(ts=start_ts + i * 0.01, orig_h=f"10.{i % 7}.{i % 5}.{i % 11}", orig_p=40000 + i % 1000,
                 resp_h=f"192.168.1.{i % 13}", resp_p=20 + i % 50, proto="tcp" if i % 3 else "udp") for i in range(n)]


def _read(spark, server, user, prefix: str, checkpoint, batches: list | None = None, **options) -> list[tuple]:
    """Run the source once over what is available; the data rows it read (and each batch's size in `batches`)."""
    rows: list[tuple] = []
    sizes = [] if batches is None else batches

    def collect(batch, _) -> None:
        got = [tuple(r) for r in batch.collect()]
        sizes.append(len(got))
        rows.extend(got)

    source = JetStreamInput(server.url, user.name, user.password, "a", prefix, **options)
    query = source.read(spark, STREAM_SCHEMA_DDL).writeStream.option("checkpointLocation", str(checkpoint)).foreachBatch(collect).start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    return [r for r in rows if r[1] == MARK_DATA]


def test_a_task_reads_its_key_groups_and_resumes_from_its_checkpoint(spark, nats_server, tmp_path):
    server, owner = nats_server
    params = QueryParams()
    with Broker(server.url, owner.name, owner.password) as broker:
        stream = BrokerStream(broker, "a")
        feeder = Feeder(stream, params)
        first = _conns(400)
        feeder.feed(first)
        half = _read(spark, server, owner, "0", tmp_path / "half")
        batches: list[int] = []
        whole = _read(spark, server, owner, "", tmp_path / "whole", batches, max_messages=5)
        assert len(whole) == 400, "every row once, in bounded micro-batches too"
        assert len(batches) >= 64 // 5, "a flush is 64 messages, one per key group: at most 5 per micro-batch"
        assert {r[3] for r in half} and all(key_group(r[3]) in groups("0") for r in half)
        assert len(half) == sum(1 for r in whole if key_group(r[3]) in groups("0"))
        assert sorted(whole) == sorted((r.ts_us, r.mark, r.src, r.prefix, r.dst, r.dport, r.proto) for r in _records(first)), "the rows as published"

        later = _conns(100, start_ts=1_700_000_100.0)
        feeder.feed(later)
        again = _read(spark, server, owner, "", tmp_path / "whole")
        assert sorted(again) == sorted((r.ts_us, r.mark, r.src, r.prefix, r.dst, r.dport, r.proto) for r in _records(later)), \
            "restarted from its checkpoint: only what came since"
        newest = broker.last_seq()
    assert _read(spark, server, owner, "", tmp_path / "newest", start_seq=newest) == [], "from the newest input: nothing old"


def test_a_session_made_from_another_reads_the_stream_too(spark, nats_server, tmp_path):
    """A second session of the same Spark (as a host's replica runs in) inherits the source
    its first registered and refuses it again: reading there registers nothing twice."""
    server, owner = nats_server
    with Broker(server.url, owner.name, owner.password) as broker:
        Feeder(BrokerStream(broker, "a"), QueryParams()).feed(_conns(50))
    assert len(_read(spark, server, owner, "", tmp_path / "first")) == 50
    assert len(_read(spark.newSession(), server, owner, "", tmp_path / "second")) == 50


def test_a_task_whose_key_groups_get_nothing_runs_no_micro_batch(spark, nats_server, tmp_path):
    """The other key groups' input does not make it run (each batch has a fixed cost), past the
    query's first batch; its own does."""
    server, owner = nats_server
    with Broker(server.url, owner.name, owner.password) as broker:
        feeder = Feeder(BrokerStream(broker, "a"), QueryParams(), key_groups=groups("0"))
        feeder.feed(_conns(300))
        source = JetStreamInput(server.url, owner.name, owner.password, "a", "1")
        assert source.pending(0) == 0 and JetStreamInput(server.url, owner.name, owner.password, "a", "0").pending(0) > 0
        first: list[int] = []
        assert _read(spark, server, owner, "1", tmp_path / "idle", first) == [] and first in ([], [0]), "at most the query's first, empty"
        again: list[int] = []
        feeder.feed(_conns(300, start_ts=1_700_000_050.0))
        assert _read(spark, server, owner, "1", tmp_path / "idle", again) == [] and again == [], "then no micro-batch at all"
        feeder.feed_key_groups(groups("1"))
        feeder.feed(_conns(300, start_ts=1_700_000_100.0))
        fed: list[int] = []
        rows = _read(spark, server, owner, "1", tmp_path / "idle", fed)
        assert rows and all(key_group(r[3]) in groups("1") for r in rows) and len(fed) >= 1


def _records(conns) -> list[StreamRecord]:
    from bpm.zeek.definitions import source_prefix, ts_micros

    return [StreamRecord(ts_micros(c.ts), c.orig_h, source_prefix(c.orig_h), c.resp_h, c.resp_p, c.proto) for c in conns]


def test_the_broker_refuses_a_wrong_password(nats_server):
    server, owner = nats_server
    with pytest.raises(BrokerError, match="cannot connect .* as a"):
        Broker(server.url, owner.name, "not-the-password", timeout_s=2)


def test_bpm_bench_source_reads_the_same_rows_from_both_sources(spark):
    import json

    from typer.testing import CliRunner

    from bpm_app.cli import app

    out = CliRunner().invoke(app, ["bench", "source", "--rounds", "1", "--flushes", "4", "--rows-per-flush", "500", "--json",
                                   "--query", "examples.sensors:query", "--param", "window_s=10"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == "source" and result["query"] == "sensors" and result["rows_per_run"] >= 4 * 500
    assert result["jetstream_rows_per_s"] > 0 and result["file_rows_per_s"] > 0
    assert result["ratio"] == pytest.approx(result["jetstream_rows_per_s"] / result["file_rows_per_s"], rel=1e-3)
    assert result["goal_met"] == (result["ratio"] >= 1.0)
    assert 0 < result["jetstream_batch_rows_per_s"] and result["jetstream_rows_per_s"] < result["jetstream_batch_rows_per_s"], "a run is its start and its batches"
    assert result["batch_ratio"] == pytest.approx(result["jetstream_batch_rows_per_s"] / result["file_batch_rows_per_s"], rel=1e-3)


@pytest.mark.serial
@pytest.mark.full
def test_bpm_bench_overhead_runs_both_variants_over_the_broker_stream(spark):
    import json

    from typer.testing import CliRunner

    from bpm_app.cli import app

    out = CliRunner().invoke(app, ["bench", "overhead", "--rounds", "1", "--files", "4", "--rows-per-file", "500", "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == "overhead" and result["query"] == "network-monitoring" and result["input"] == "broker"
    assert result["rows_per_run"] >= 4 * 500
    assert len(result["bare_run_s"]) == len(result["instrumented_run_s"]) == 1
    assert result["ratio"] == pytest.approx(result["instrumented_rows_per_s"] / result["bare_rows_per_s"], rel=1e-3)


@pytest.mark.serial
@pytest.mark.full
def test_bpm_bench_load_model_runs_its_levels_over_shares_of_one_broker_stream(spark):
    import json

    from typer.testing import CliRunner

    from bpm_app.cli import app

    refused = CliRunner().invoke(app, ["bench", "load-model", "--tasks", "6"])
    assert refused.exit_code == 2 and "power of two" in " ".join(refused.output.split()), refused.output
    # A warm-up past the four queries' first batches: with none, on a busy machine a level
    # read no utilisation (the queries just started can complete no batch within the first).
    out = CliRunner().invoke(app, ["bench", "load-model", "--tasks", "4", "--level-seconds", "5", "--warmup", "10", "--interval", "2",
                                   "--trigger", "0.5", "--rows-per-batch", "200", "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == "load-model" and [lv["tasks"] for lv in result["levels"]] == [1, 2, 3, 4]
    assert len(result["loads_alone"]) == 4 and all(x > 0 for x in result["loads_alone"]), "each task alone read its share"
    assert all(lv["utilisation"] > 0 and lv["intervals"] >= 1 for lv in result["levels"])
    assert result["goal_met"] in (True, False) and "prediction_interpolated" in result


@pytest.mark.serial
@pytest.mark.full
def test_bpm_bench_fixed_cost_runs_levels_of_tasks_over_the_same_rows_and_fits_a_line(spark, tmp_path):
    import json

    from typer.testing import CliRunner

    from bpm_app.cli import app

    plot = tmp_path / "fixed.png"
    out = CliRunner().invoke(app, ["bench", "fixed-cost", "--depth", "1", "--level-seconds", "2", "--warmup", "2", "--interval", "1",
                                   "--trigger", "0.5", "--rows-per-batch", "200", "--capacity", "0.5", "--plot", str(plot), "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["benchmark"] == "fixed-cost" and [lv["tasks"] for lv in result["levels"]] == [1, 2]
    assert all(lv["intervals"] == 4 and lv["batches"] > 0 and lv["rows_per_s"] > 0 for lv in result["levels"]), result["levels"]
    assert result["fixed_cost_load"] == pytest.approx(result["fixed_cost_cpu_s_per_s"] / 0.5, abs=1e-4)
    assert plot.stat().st_size > 5_000


def test_the_end_of_any_query_s_input_is_found_from_its_lines_alone_and_garbage_is_passed_over():
    from spark_agents.broker.source import _is_end, _marks_and_times

    assert _marks_and_times(b'5,0,"a,b",1\n7,1,,\n\xff\xfe\nnot,a,line\n9') == [(0, 5), (1, 7)]
    assert _is_end(b"9,2,,,\n9,2,,,\n") and not _is_end(b"9,2,,,\n8,1,,,\n") and not _is_end(b"garbage\n")
