"""The host's measurements over HTTP: Prometheus `/metrics` and a JSON `/status`.

`status_router(host)` can be mounted in the agent's own FastAPI app; `StatusServer` serves
it alone on a background thread (loopback by default).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

if TYPE_CHECKING:
    from spark_agents.host import TaskHost


class HostCollector:
    """Reads the host at scrape time, so the numbers are never older than the scrape."""

    def __init__(self, host: TaskHost) -> None:
        self.host = host

    def collect(self) -> Iterator[Any]:
        status = self.host.status()
        yield GaugeMetricFamily("bpm_participant_cpus", "CPUs of the participant: its capacity, the denominator of load.", value=status["cpus"])
        yield GaugeMetricFamily("bpm_utilisation", "Sum of the task loads over the last interval.", value=status["utilisation"])
        if status["cpu_utilisation"] is not None:
            yield GaugeMetricFamily("bpm_cpu_utilisation", "Spark driver process CPU over the last interval / the participant's CPUs.",
                                    value=status["cpu_utilisation"])
        yield GaugeMetricFamily("bpm_marginal_cost", "Marginal cost dD/dL at the current load.",
                                value=status["marginal_costs"]["marginal"])
        yield GaugeMetricFamily("bpm_cost_fallback", "1 when the analytic cost model stands in for a fit.",
                                value=1.0 if status["fallback_used"] else 0.0)
        load = GaugeMetricFamily("bpm_task_load", "Task load: busy seconds per second / the participant's CPUs.", labels=["task"])
        running = GaugeMetricFamily("bpm_task_running", "1 while the task runs here.", labels=["task"])
        duration = GaugeMetricFamily("bpm_task_last_batch_seconds", "Wall time of the task's last batch.", labels=["task"])
        backlog = GaugeMetricFamily("bpm_task_backlog", "Broker messages the task has not taken yet (any key group's: an upper bound).", labels=["task"])
        batches = CounterMetricFamily("bpm_task_batches", "Micro-batches finished here.", labels=["task"])
        rows = CounterMetricFamily("bpm_task_input_rows", "Input rows processed here.", labels=["task"])
        for task in status["tasks"]:
            label = [task["task_id"]]
            load.add_metric(label, task["load"])
            running.add_metric(label, 1.0 if task["state"] == "running" else 0.0)
            if task["last_batch_duration_s"] is not None:
                duration.add_metric(label, task["last_batch_duration_s"])
            if task["backlog"]["pending"] is not None:
                backlog.add_metric(label, task["backlog"]["pending"])
            batches.add_metric(label, task["batches"])
            rows.add_metric(label, task["rows"])
        yield from (load, running, duration, backlog, batches, rows)


def status_router(host: TaskHost) -> APIRouter:
    """GET /metrics and GET /status for one host."""
    registry = CollectorRegistry()
    registry.register(HostCollector(host))  # type: ignore[arg-type]
    router = APIRouter()

    @router.get("/metrics")
    def metrics() -> Response:
        """Prometheus metrics of the host and its tasks."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @router.get("/status")
    def status() -> dict[str, Any]:
        """Tasks, loads, utilisation, backlog, batch latency, cost model and marginal costs as JSON."""
        return host.status()

    return router


def status_app(host: TaskHost) -> FastAPI:
    app = FastAPI(title="bpm task host")
    app.include_router(status_router(host))
    return app


class StatusServer:
    """Serves `status_app(host)` with uvicorn on a daemon thread.

    Attributes:
        url: base URL once started (port 0 picks a free port).
    """

    def __init__(self, host: TaskHost, address: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self._server = uvicorn.Server(uvicorn.Config(status_app(host), host=address, port=port, log_level="warning"))
        self._thread = threading.Thread(target=self._server.run, name="bpm-status-http", daemon=True)
        self.address = address
        self.url: str | None = None

    def start(self, timeout_s: float = 10.0) -> str:
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the status server did not start")
            time.sleep(0.02)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{self.address}:{port}"
        return self.url

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)
