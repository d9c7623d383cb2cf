"""The agent's Prometheus metrics (`spark_agents.exporter`): every name with its type on its
`GET /metrics`, read from the agent and from its task host; the same collector on a
`StatusServer`'s app. No Spark: the agents are stepped against the registry app over hosts
that run nothing (`SteppedHost`), and the task host is the real `SparkHost` over a stand-in
session whose queries are stand-ins, its batches fed through its own listener."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from bpm.costs import MM1Cost
from spark_agents.broker.source import JetStreamInput
from spark_agents.exporter import AGENT_COUNTS, BATCH_BUCKETS
from spark_agents.host import SparkHost
from spark_agents.server import create_agent_app
from spark_agents.status import status_app
from examples.network_monitoring import query as MONITORING
from tests.spark_agents.stepped import stepped_federation
from tests.spark_agents.test_agent import SteppedHost, _contract, _round

ROOT = Path(__file__).resolve().parents[2]

# Every metric an agent exports, by the name Prometheus stores (a counter's with `_total`), with its type.
AGENT_METRICS = {
    "bpm_load": "gauge",
    "bpm_threshold": "gauge",
    "bpm_marginal_cost": "gauge",
    "bpm_cost_fallback": "gauge",
    "bpm_capacity_cpus": "gauge",
    "bpm_cpu_utilisation": "gauge",
    "bpm_task_load": "gauge",
    "bpm_task_running": "gauge",
    "bpm_task_backlog_messages": "gauge",
    "bpm_task_input_rows_total": "counter",
    "bpm_task_batches_total": "counter",
    "bpm_task_batch_duration_seconds": "histogram",
    "bpm_agent_steps_total": "counter",
    "bpm_agent_errors_total": "counter",
    "bpm_agent_races_total": "counter",
    **{f"bpm_agent_{key}_total": "counter" for key in AGENT_COUNTS},
}
LAST_SEQ = 50  # the end of the stand-in broker stream


def _pending(source, after: int) -> int:
    """The stand-in broker stream's messages after `after` in any task's key groups."""
    return max(0, LAST_SEQ - after)


def families(text: str) -> dict[str, object]:
    """Scraped families by the name Prometheus stores: a counter's with its `_total`."""
    return {family.name + ("_total" if family.type == "counter" else ""): family for family in text_string_to_metric_families(text)}


def by_task(family, sample: str | None = None) -> dict[str, float]:
    sample = sample or (family.name + ("_total" if family.type == "counter" else ""))
    return {s.labels["task"]: s.value for s in family.samples if s.name == sample}


def value(family) -> float:
    (sample,) = [s for s in family.samples if not s.name.endswith("_created")]
    return sample.value


@pytest.fixture
def task_host(tmp_path):
    spark = mock.MagicMock()
    spark.sparkContext._gateway = None  # no driver process of its own to measure
    host = SparkHost(spark, tmp_path / "host", cpus=2)
    host.recorder.cpu = None  # no JVM to ask a batch's CPU of
    return host


def start(host: SparkHost, key: str) -> SimpleNamespace:
    """Start `key` on `host` as a stand-in query over its share of a's stream."""
    query = SimpleNamespace(isActive=True, status={"message": "Waiting for data"}, runId=f"run-{key}-{time.monotonic_ns()}",
                            exception=lambda: None)
    source = JetStreamInput("nats://127.0.0.2:4222", "a", "password", "a", prefix=key.rpartition(".")[2])
    with mock.patch("spark_agents.host.start_query", return_value=query):
        host.start_task(key, source, query=MONITORING, sink=lambda *_: None)
    return query


def batch(host: SparkHost, query: SimpleNamespace, key: str, batch_id: int, seconds: float, rows: int, seq: int) -> None:
    """A batch of `key` finished just now, as Spark's listener reports it."""
    began = datetime.fromtimestamp(time.time() - seconds, timezone.utc).isoformat().replace("+00:00", "Z")
    host.recorder.record({"name": key, "runId": query.runId, "batchId": batch_id, "timestamp": began,
                          "durationMs": {"triggerExecution": seconds * 1000}, "numInputRows": rows,
                          "sources": [{"endOffset": json.dumps({"seq": seq})}]})


def test_an_agent_s_metrics_name_every_quantity_with_its_type(tmp_path, task_host):
    with stepped_federation(tmp_path, lambda now: SteppedHost(MM1Cost(a=0.25, c=1.0))) as (operator, agents, add, clock):
        a, b = add("a", 6), add("b", 0)
        _contract(agents, "a", "b", duration=5.0)
        for _ in range(4):
            _round(agents, clock)
        assert operator.movements(state="active"), "a shed load to b"
        for key in a.host.running():
            a.host.task_load[key] = 0.01  # ending the movement now pays for a
        for _ in range(8):
            _round(agents, clock)
        assert operator.movements(state="ended"), "a took its tasks back"
        # a's tasks, as its Spark host runs them: two batches of each, one a batch behind its stream.
        keys = sorted(a.host.running())
        for n, key in enumerate(keys):
            query = start(task_host, key)
            batch(task_host, query, key, 0, 0.3, 10, 20)
            batch(task_host, query, key, 1, 4.0 if n == 0 else 0.2, 15, LAST_SEQ - 10 * (n == 0))
        with mock.patch.object(JetStreamInput, "pending", new=_pending):
            with TestClient(create_agent_app(a, task_host)) as http:
                response = http.get("/metrics")
        with TestClient(create_agent_app(b)) as http:
            of_b = families(http.get("/metrics").text)

    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    scraped = families(response.text)
    assert {name: scraped[name].type for name in AGENT_METRICS if name in scraped} == AGENT_METRICS
    assert not [name for name in scraped if name not in AGENT_METRICS and not name.endswith("_created")], "no name beside those listed"
    labels = {label for family in scraped.values() for sample in family.samples for label in sample.labels}
    assert labels == {"task", "le"}, "no participant label: the target's names it"
    # The participant: what a reported to the registry at its last heartbeat.
    reported = operator.participant("a")
    assert value(scraped["bpm_load"]) == pytest.approx(reported["load"])
    assert value(scraped["bpm_threshold"]) == pytest.approx(0.5)  # a*u/(1-u) = 1 at a = 0.25
    assert value(scraped["bpm_marginal_cost"]) == pytest.approx(a.last_report["marginal_cost"]["at_load"])
    assert value(scraped["bpm_cost_fallback"]) == 0.0  # the agent's model, not the host's
    assert value(scraped["bpm_capacity_cpus"]) == 2.0
    assert scraped["bpm_cpu_utilisation"].samples == [], "not measured without a driver process"
    # Its tasks: the loads it reported, summing to its load; the host's counts and histogram.
    loads = by_task(scraped["bpm_task_load"])
    assert set(loads) == set(keys) and sum(loads.values()) == pytest.approx(reported["load"])
    assert by_task(scraped["bpm_task_running"]) == dict.fromkeys(keys, 1.0)
    assert by_task(scraped["bpm_task_backlog_messages"]) == {key: 10.0 if n == 0 else 0.0 for n, key in enumerate(keys)}
    assert by_task(scraped["bpm_task_input_rows_total"]) == dict.fromkeys(keys, 25.0)
    assert by_task(scraped["bpm_task_batches_total"]) == dict.fromkeys(keys, 2.0)
    durations = scraped["bpm_task_batch_duration_seconds"]
    assert by_task(durations, "bpm_task_batch_duration_seconds_count") == dict.fromkeys(keys, 2.0)
    assert by_task(durations, "bpm_task_batch_duration_seconds_sum") == pytest.approx({key: 4.3 if n == 0 else 0.5 for n, key in enumerate(keys)})
    buckets = [(float(s.labels["le"]), s.value) for s in durations.samples
               if s.name.endswith("_bucket") and s.labels["task"] == keys[0]]
    assert [le for le, _ in buckets] == [*BATCH_BUCKETS, float("inf")]
    assert [count for _, count in buckets] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2], "cumulative: 0.3 s, then 4 s"
    # What a did: its offers and the movement it ended; b accepted them.
    assert value(scraped["bpm_agent_steps_total"]) == a.steps > 0
    assert value(scraped["bpm_agent_errors_total"]) == a.errors == 0
    assert value(scraped["bpm_agent_offers_made_total"]) >= 1 and value(scraped["bpm_agent_movements_ended_total"]) >= 1
    moved = len(operator.movements())
    assert value(of_b["bpm_agent_offers_accepted_total"]) >= 1 and value(of_b["bpm_agent_movements_started_total"]) == moved
    assert value(of_b["bpm_agent_offers_made_total"]) == 0
    # An agent over a host that is not Spark's: its own figures only.
    assert value(of_b["bpm_load"]) == pytest.approx(operator.participant("b")["load"])
    assert of_b["bpm_capacity_cpus"].samples == [] and "bpm_task_batch_duration_seconds" not in of_b


def test_batch_durations_count_from_a_task_s_start_here_as_its_batches_do(task_host):
    query = start(task_host, "a.p0")
    batch(task_host, query, "a.p0", 0, 0.3, 10, 10)
    batch(task_host, query, "a.p0", 1, 0.7, 10, 20)
    count = "bpm_task_batch_duration_seconds_count"
    with mock.patch.object(JetStreamInput, "pending", new=_pending), TestClient(status_app(task_host)) as http:
        before = families(http.get("/metrics").text)
        query.isActive = False  # it stopped (it left, say); it comes back and starts again
        after_stop = families(http.get("/metrics").text)
        query = start(task_host, "a.p0")
        batch(task_host, query, "a.p0", 2, 0.2, 5, 25)
        again = families(http.get("/metrics").text)
        status = http.get("/status").json()
    assert by_task(before["bpm_task_batch_duration_seconds"], count) == {"a.p0": 2.0} == by_task(before["bpm_task_batches_total"])
    assert by_task(after_stop["bpm_task_running"]) == {"a.p0": 0.0} and by_task(after_stop["bpm_task_backlog_messages"]) == {}
    assert by_task(again["bpm_task_batch_duration_seconds"], count) == {"a.p0": 1.0} == by_task(again["bpm_task_batches_total"])
    # Without an agent (a StatusServer): the host's own measurements, no threshold, no agent counters.
    assert value(again["bpm_load"]) == pytest.approx(status["utilisation"])
    assert value(again["bpm_marginal_cost"]) == pytest.approx(status["marginal_costs"]["marginal"])
    assert value(again["bpm_cost_fallback"]) == 1.0 and again["bpm_threshold"].samples == []
    assert by_task(again["bpm_task_load"]) == {"a.p0": pytest.approx(status["tasks"][0]["load"])}
    assert not [name for name in again if name.startswith("bpm_agent_")]
    assert status["tasks"][0]["last_batch_duration_s"] == pytest.approx(0.2), "the JSON status as it was"


def test_the_docs_list_every_metric_an_agent_exports():
    text = (ROOT / "docs" / "pipeline.md").read_text()
    section = text[text.index("\n## Metrics\n"):]
    listed = set(re.findall(r"^\| `(bpm_\w+)`(?:, `(bpm_\w+)`)?", section, re.MULTILINE))
    assert {name for pair in listed for name in pair if name} == set(AGENT_METRICS)
