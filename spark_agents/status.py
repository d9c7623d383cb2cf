"""A task host's measurements over HTTP, for a host without an agent (benchmarks):
Prometheus `/metrics`, the metrics an agent exports (`spark_agents.exporter.AgentCollector`)
with the host's own measurements for what an agent reports, and a JSON `/status`.

`status_router(host)` serves both; `StatusServer` serves it alone on a background thread
(loopback by default). An agent's own endpoint serves its metrics (`spark_agents.server`).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from spark_agents.exporter import AgentCollector

if TYPE_CHECKING:
    from spark_agents.host import SparkHost


def status_router(host: SparkHost) -> APIRouter:
    """GET /metrics and GET /status for one host."""
    registry = CollectorRegistry()
    registry.register(AgentCollector(host))  # type: ignore[arg-type]
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


def status_app(host: SparkHost) -> FastAPI:
    app = FastAPI(title="bpm task host")
    app.include_router(status_router(host))
    return app


class StatusServer:
    """Serves `status_app(host)` with uvicorn on a daemon thread.

    Attributes:
        url: base URL once started (port 0 picks a free port).
    """

    def __init__(self, host: SparkHost, address: str = "127.0.0.1", port: int = 0) -> None:
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
