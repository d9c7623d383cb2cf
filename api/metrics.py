"""The registry's Prometheus metrics at `GET /metrics` (see docs/registry.md, "Metrics").

What the registry records is counted in the database at scrape time (`api.services.metrics`),
the connection pool read from the engine; both are gauges of current totals. Request
durations are a histogram kept in the process. Every app has its own `CollectorRegistry`,
so several apps in one process (tests) do not share or collide.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any, get_args

from fastapi import FastAPI, Response
from fastapi.routing import iter_route_contexts
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, SummaryMetricFamily
from sqlalchemy.exc import SQLAlchemyError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.schemas import FailoverKind, Liveness, ReplicaRole, ReplicaState
from api.services import metrics as service
from bpm.contracts import ContractState
from bpm.negotiation import MovementState, OfferState

log = logging.getLogger("bpm.registry.metrics")

# The route label of a request no route took: an unknown path, or a body refused before routing.
UNMATCHED = "unmatched"
# A client may send any word as its method: those outside HTTP's usual ones are labelled "other".
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
DB_UP = ("bpm_registry_db_up", "1 when the database answered this scrape's queries, else 0 (and no counts).")


# Every value a gauge's labels can take: an empty registry exports 0 for each, so that a
# dashboard or an alert sees a series from the first scrape, not "no data" until a first record.
KNOWN = {
    "participants": get_args(Liveness),
    "contracts": tuple(s.value for s in ContractState),
    "tasks": ("true", "false"),
    "offers": tuple(s.value for s in OfferState),
    "movements": tuple(s.value for s in MovementState),
    "replicas": tuple(itertools.product(get_args(ReplicaRole), get_args(ReplicaState))),
    "failovers": tuple(itertools.product(get_args(FailoverKind), ("in_progress", "completed"))),
}


def _gauge(name: str, documentation: str, labels: list[str], values: dict, known: Iterable = ()) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for key, value in sorted({**dict.fromkeys(known, 0), **values}.items()):
        family.add_metric(list(key) if isinstance(key, tuple) else [key], value)
    return family


class RegistryCollector:
    """Reads the database and the engine's pool at scrape time."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def collect(self) -> Iterator[Any]:
        state = self.app.state
        engine = getattr(state, "engine", None)
        if engine is None:  # the lifespan has not started yet
            return
        yield from _pool(engine.pool)
        try:
            with state.read_session() as session:
                totals = service.totals(session, state.clock(), state.settings.heartbeat_timeout_s)
        except SQLAlchemyError:
            log.warning("metrics: the database does not answer", exc_info=True)
            yield GaugeMetricFamily(*DB_UP, value=0)
            return
        yield GaugeMetricFamily(*DB_UP, value=1)
        yield _gauge("bpm_registry_participants", "Participants by liveness status.", ["status"], totals.participants, KNOWN["participants"])
        yield _gauge("bpm_registry_contracts", "Contracts by state.", ["state"], totals.contracts, KNOWN["contracts"])
        yield _gauge("bpm_registry_tasks", "Tasks, by whether they run away from their origin.", ["away"], totals.tasks, KNOWN["tasks"])
        yield _gauge("bpm_registry_offers", "Offers by state (a pending offer past its expiry is expired).", ["state"], totals.offers, KNOWN["offers"])
        yield _gauge("bpm_registry_movements", "Movements by state.", ["state"], totals.movements, KNOWN["movements"])
        yield _gauge("bpm_registry_payments_accrued", "What movements have accrued (price x load x seconds), by movement state, as the ledger counts it.",
                     ["state"], totals.accrued, KNOWN["movements"])
        yield _gauge("bpm_registry_replicas", "Replicas by role and state.", ["role", "state"], totals.replicas, KNOWN["replicas"])
        yield _gauge("bpm_registry_failovers", "Failover and repair records by kind and state (in_progress, completed).", ["kind", "state"], totals.failovers, KNOWN["failovers"])
        recovery = SummaryMetricFamily("bpm_registry_failover_recovery_seconds", "Recorded recovery times of completed failovers and repairs.",
                                       labels=["kind"])
        for kind, (count, total) in sorted(totals.recovery.items()):
            recovery.add_metric([kind], count_value=count, sum_value=total)
        yield recovery


def _pool(pool: Any) -> Iterator[GaugeMetricFamily]:
    """The readings the pool's class offers: all four for a QueuePool (the registry's, on
    SQLite and PostgreSQL), none for a StaticPool or a NullPool."""
    readings = {
        "size": ("size", "Connections the pool keeps open at most when not overflowing."),
        "checked_out": ("checkedout", "Connections in use now."),
        "checked_in": ("checkedin", "Connections open and idle in the pool now."),
        "overflow": ("overflow", "Connections open beyond the pool's size now."),
    }
    for name, (method, documentation) in readings.items():
        read = getattr(pool, method, None)
        if callable(read):
            # max: a QueuePool's overflow counts up from minus its size as it opens connections
            yield GaugeMetricFamily(f"bpm_registry_db_pool_{name}", documentation, value=max(0, read()))


class RouteTemplates:
    """The full template of the route that took a request (`/api/v1/tasks/{task_id}`).

    The router leaves the route it chose in the scope, as declared in its own router (an
    included router's prefix is not part of it); FastAPI's route contexts give the path
    it is served at. Indexed at the first request, again when a route is not found.
    """

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        # By id of the route object; the contexts kept here keep the routes, so no id is reused.
        self._templates: dict[int, list[tuple[Any, str]]] = {}

    def _index(self) -> None:
        templates: dict[int, list[tuple[Any, str]]] = {}
        for context in iter_route_contexts(self.app.routes):
            if context.path is not None:
                templates.setdefault(id(context.original_route), []).append((context, context.path))
        self._templates = templates

    def of(self, scope: Scope) -> str:
        route = scope.get("route")
        if route is None:
            return UNMATCHED
        if id(route) not in self._templates:
            self._index()
        served = self._templates.get(id(route))
        if not served:
            return getattr(route, "path", None) or UNMATCHED
        if len(served) == 1:
            return served[0][1]
        # One router included under several prefixes: the one whose pattern the path matches.
        path = scope.get("path", "")
        return next((template for context, template in served if context.path_regex.match(path)), served[0][1])


class RequestTimer:
    """ASGI middleware: the duration of each HTTP request, labelled by method, route
    template (never the raw path) and status code, observed when the app has answered
    (except streams of events, which last as long as their client stays)."""

    def __init__(self, app: ASGIApp, histogram: Histogram, routes: RouteTemplates) -> None:
        self.app = app
        self.histogram = histogram
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the outermost error handler answers when the app raises before answering
        streamed = False  # a stream of events (the change feed) lasts as long as the client stays: not timed

        async def sending(message: Message) -> None:
            nonlocal status, streamed
            if message["type"] == "http.response.start":
                status = message["status"]
                streamed = any(k == b"content-type" and v.startswith(b"text/event-stream") for k, v in message.get("headers", []))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            if not streamed:
                method = scope["method"] if scope["method"] in METHODS else "other"
                self.histogram.labels(method, self.routes.of(scope), str(status)).observe(time.perf_counter() - started)


def install(app: FastAPI) -> None:
    """Serve `GET /metrics` and time every request. Call it last among the middleware, so
    requests refused by the others (a body over the cap) are timed too."""
    registry = CollectorRegistry()
    registry.register(RegistryCollector(app))  # type: ignore[arg-type]
    durations = Histogram(
        "bpm_registry_request_duration_seconds",
        "Time to answer an HTTP request, by method, route template and status code.",
        ["method", "route", "status"],
        registry=registry,
    )
    app.add_middleware(RequestTimer, histogram=durations, routes=RouteTemplates(app))

    @app.get(
        "/metrics",
        tags=["health"],
        response_class=Response,
        responses={200: {"description": "Prometheus text format", "content": {CONTENT_TYPE_LATEST: {}}}},
    )
    def metrics() -> Response:
        """Prometheus metrics: what the registry records, counted in the database; request durations; the connection pool. Open, like `/healthz`: no key, no name."""
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
