"""The participant's Prometheus metrics: what its agent's `GET /metrics` exports, and a
`StatusServer`'s (`spark_agents.status`) for a task host without an agent (benchmarks).

Everything is read at scrape time from the agent and its task host, so no figure is older
than the scrape; only batch durations are observed as batches finish, into a histogram the
host keeps (`batch_durations`). One process serves one participant: no metric carries a
`participant` label, Prometheus adds it as a target label (deploy/prometheus.yml). Names,
types and meanings: docs/pipeline.md, "Metrics".
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    from spark_agents.agent import Agent
    from spark_agents.host import SparkHost

# From a batch of a lightly loaded task (tenths of a second) to one far behind its trigger.
BATCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)

# What the agent counts of what it does (`Agent.counts`), exported as bpm_agent_<key>_total.
AGENT_COUNTS = {
    "offers_made": "Offers the agent made to its partners.",
    "offers_accepted": "Offers made to the agent that it accepted.",
    "offers_refused": "Offers made to the agent that it refused.",
    "movements_started": "Movements the agent's acceptances started (one per task taken on).",
    "movements_ended": "Movements the agent ended.",
    "splits": "Own tasks the agent split over their key groups.",
    "merges": "Pairs of own tasks the agent merged back into one.",
    "tasks_retired": "Own tasks the agent retired once the tasks a split or merge made had taken their key groups over.",
}


def batch_durations() -> Histogram:
    """The histogram of a task host's batch durations by task, observed as each batch
    finishes (`SparkHost`): in no registry of its own, exported by `AgentCollector`."""
    return Histogram("bpm_task_batch_duration_seconds", "Wall time of the task's micro-batches here (Spark's triggerExecution).",
                     ["task"], buckets=BATCH_BUCKETS, registry=None)


class AgentCollector:
    """The participant's metrics, from `agent` and from `host`, the Spark task host it runs
    its tasks on (None for an agent over a host that is not Spark's: then only the agent's
    own figures). Without an agent (`StatusServer`), the host's own measurements stand in
    for what the agent reports: its load and marginal cost, its tasks' loads; there is no
    threshold, which needs the agent's reference price."""

    def __init__(self, host: SparkHost | None = None, agent: Agent | None = None) -> None:
        self.host = host
        self.agent = agent

    def collect(self) -> Iterator[Any]:
        agent, host = self.agent, self.host
        status = host.status() if host is not None else None
        load = GaugeMetricFamily("bpm_load", "The participant's load: the sum of its tasks' loads, a fraction of its capacity.")
        threshold = GaugeMetricFamily("bpm_threshold", "The load at which the marginal cost reaches the reference price.")
        marginal = GaugeMetricFamily("bpm_marginal_cost", "Marginal cost dD/dL at the current load.")
        fallback = GaugeMetricFamily("bpm_cost_fallback", "1 when the analytic cost model stands in for a fitted one.")
        task_loads: dict[str, float] = {}
        if agent is not None:
            report = agent.last_report  # what the agent last reported to the registry: nothing before its first heartbeat
            if report:
                load.add_metric([], report["load"])
                if report["threshold"] is not None:
                    threshold.add_metric([], report["threshold"])
                marginal.add_metric([], report["marginal_cost"]["at_load"])
                fallback.add_metric([], 1.0 if report["details"]["fallback"] else 0.0)
            task_loads = agent.last_loads
        elif status is not None:
            load.add_metric([], status["utilisation"])
            marginal.add_metric([], status["marginal_costs"]["marginal"])
            fallback.add_metric([], 1.0 if status["fallback_used"] else 0.0)
            task_loads = {t["task_id"]: t["load"] for t in status["tasks"]}
        cpus = GaugeMetricFamily("bpm_capacity_cpus", "The participant's capacity in CPUs, the denominator of load.")
        cpu = GaugeMetricFamily("bpm_cpu_utilisation", "CPU of the Spark processes over the last measuring interval / the capacity.")
        if status is not None:
            cpus.add_metric([], status["cpus"])
            if status["cpu_utilisation"] is not None:
                cpu.add_metric([], status["cpu_utilisation"])
        yield from (load, threshold, marginal, fallback, cpus, cpu)

        task_load = GaugeMetricFamily("bpm_task_load", "The task's load: the CPU it needs / the participant's capacity.", labels=["task"])
        for task, value in sorted(task_loads.items()):
            task_load.add_metric([task], value)
        running = GaugeMetricFamily("bpm_task_running", "1 while the task runs here, 0 once it stopped or failed.", labels=["task"])
        backlog = GaugeMetricFamily("bpm_task_backlog_messages", "Broker messages the task has not taken yet (of any key group: an upper bound).",
                                    labels=["task"])
        rows = CounterMetricFamily("bpm_task_input_rows", "Input rows the task read here.", labels=["task"])
        batches = CounterMetricFamily("bpm_task_batches", "Micro-batches the task finished here.", labels=["task"])
        if status is not None:
            for task in status["tasks"]:
                label = [task["task_id"]]
                running.add_metric(label, 1.0 if task["state"] == "running" else 0.0)
                if task["backlog"]["pending"] is not None:
                    backlog.add_metric(label, task["backlog"]["pending"])
                rows.add_metric(label, task["rows"])
                batches.add_metric(label, task["batches"])
        elif agent is not None:
            for task in sorted(agent.host.running()):
                running.add_metric([task], 1.0)
        yield from (task_load, running, backlog, rows, batches)
        if host is not None:
            yield from host.batch_durations.collect()

        if agent is not None:
            yield CounterMetricFamily("bpm_agent_steps", "Ticks of the agent's control loop.", value=agent.steps)
            yield CounterMetricFamily("bpm_agent_errors", "Steps of the control loop that failed.", value=agent.errors)
            yield CounterMetricFamily("bpm_agent_races", "Steps that lost a race with a change not read yet, and read again.", value=agent.races.count)
            for key, documentation in AGENT_COUNTS.items():
                yield CounterMetricFamily(f"bpm_agent_{key}", documentation, value=agent.counts[key])
