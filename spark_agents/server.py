"""The agent's own HTTP endpoint: JSON status, Prometheus metrics, checkpoint handover, the
credentials of its broker for the hosts of its tasks, and the passive-standby deltas a host
ships to this participant as the backup of its task."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from typing import Annotated

from fastapi import FastAPI, Header, HTTPException, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from bpm.names import KEY_MAX, NAME_PATTERN, TASK_MAX
from bpm.tokens import TokenRefused
from spark_agents.credentials import bearer
from spark_agents.exporter import AgentCollector
from bpm_http.web import harden
from spark_agents.ha.delta import DeltaRefused
from spark_agents.ha_agent import NotHolder
from spark_agents.handover import MAX_ARCHIVE_BYTES, HandoverNotReady
from spark_agents.races import Refused

if TYPE_CHECKING:
    from spark_agents.agent import Agent
    from spark_agents.host import SparkHost


TaskKey = Annotated[str, Path(min_length=1, max_length=KEY_MAX, pattern=NAME_PATTERN)]
_REFUSED = {401: {"description": "No credential, or one the registry did not issue"}, 403: {"description": "A credential for another caller or call"}}


class NewTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=TASK_MAX, pattern=NAME_PATTERN)
    input_uri: str = Field(min_length=1, max_length=1024)
    params: dict = Field(default_factory=dict)
    query: str | None = Field(default=None, max_length=TASK_MAX, description="The query it runs, one this participant has (`--query`, "
                              "`--can-run`); by default the one its own tasks run")


@contextmanager
def _refusals(*statuses: tuple[type[Exception], int]) -> Iterator[None]:
    """A call between agents refused: a credential the registry did not issue for it (the
    token's own 401 or 403), or one of `statuses`' exceptions (as its status), with the reason."""
    try:
        yield
    except TokenRefused as exc:
        raise HTTPException(exc.status, str(exc)) from exc
    except tuple(kind for kind, _ in statuses) as exc:
        raise HTTPException(next(status for kind, status in statuses if isinstance(exc, kind)), str(exc)) from exc


def create_agent_app(agent: Agent, host: SparkHost | None = None) -> FastAPI:
    """The agent's endpoint; `host` is the Spark task host its tasks run on, whose
    measurements its `/metrics` exports beside the agent's (`spark_agents.exporter`)."""
    app = FastAPI(title=f"BPM agent {agent.config.name}")
    harden(app, paths={"/ha/": MAX_ARCHIVE_BYTES})
    metrics = CollectorRegistry()
    metrics.register(AgentCollector(host, agent))  # type: ignore[arg-type]

    @app.get("/status")
    def status():
        """The agent's state: running tasks, last load report, recent records, Spark host details."""
        return agent.status()

    @app.get("/metrics")
    def prometheus():
        """Prometheus metrics of this participant."""
        return Response(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    def healthz():
        """Alive while the control loop runs."""
        return {"status": "ok", "participant": agent.config.name, "steps": agent.steps}

    @app.post("/tasks", status_code=201, responses=_REFUSED)
    def add_task(body: NewTask, authorization: Annotated[str | None, Header()] = None):
        """Take on a new task of this participant's own (a new query over one input partition):
        only with this participant's own registry key."""
        from bpm.query import QueryError
        from spark_agents.agent import OwnTask

        _require_own_key(authorization, "adds tasks here")
        try:
            return agent.add_task(OwnTask(body.name, body.input_uri, body.params, body.query))
        except QueryError as exc:
            raise HTTPException(422, str(exc)) from exc

    @app.post("/key/rotate", status_code=201, responses=_REFUSED)
    def rotate_key(authorization: Annotated[str | None, Header()] = None):
        """Rotate this participant's registry key (with the current one): the agent goes on with
        the new key, keeps it in its key file and returns it, shown this once."""
        _require_own_key(authorization, "rotates it")
        return {"name": agent.config.name, "api_key": agent.rotate_key()}

    def _require_own_key(authorization: str | None, what: str) -> None:
        given = bearer(authorization)
        if given is None:
            raise HTTPException(401, "send this participant's registry key: 'Authorization: Bearer <key>'", headers={"WWW-Authenticate": "Bearer"})
        if not agent.client.key or not hmac.compare_digest(given.encode(), agent.client.key.encode()):
            raise HTTPException(403, f"only {agent.config.name}'s own key {what}")

    @app.get("/handover/{task_key}", responses=_REFUSED)
    def handover(task_key: TaskKey, epoch: int = Query(ge=0, le=2**63 - 1), authorization: Annotated[str | None, Header()] = None):
        """Stop the task here at a batch boundary and return its checkpoint (tar.gz) to its new
        host: the caller shows the registry's token for this handover (task, epoch, both parties)."""
        with _refusals((Refused, 409), (HandoverNotReady, 503)):
            data = agent.release_to_caller(bearer(authorization), task_key, epoch)
        return Response(data, media_type="application/gzip")

    @app.get("/broker/{task_key}", responses=_REFUSED)
    def broker_credentials(task_key: TaskKey, epoch: int = Query(ge=0, le=2**63 - 1), authorization: Annotated[str | None, Header()] = None):
        """The credentials with which the host of this participant's task reads the task's key
        groups of its broker stream and writes its results there: the caller shows the
        registry's token for this call (purpose `stream`, the task and its epoch)."""
        with _refusals((Refused, 409), (LookupError, 404)):
            return agent.stream_credentials_to_caller(bearer(authorization), task_key, epoch)

    @app.get("/alerts/credentials", responses=_REFUSED)
    def alerts_credentials(authorization: Annotated[str | None, Header()] = None):
        """The credentials with which a contract partner reads the alerts this participant
        shares (`bpm agent run --correlate`): the caller shows the registry's token for this
        call (purpose `alerts`, issued only between the parties of a contract in force)."""
        with _refusals((Refused, 403), (LookupError, 404)):
            return agent.alerts_credentials_to_caller(bearer(authorization))

    @app.post("/broker/{task_key}/ack", status_code=204, responses=_REFUSED)
    def broker_ack(task_key: TaskKey, epoch: int = Query(ge=0, le=2**63 - 1), seq: int = Query(ge=0, le=2**63 - 1),
                   authorization: Annotated[str | None, Header()] = None):
        """The task's host acknowledges this participant's stream up to sequence `seq` for the
        task (its input before that is no longer needed for the task's HA mode): the caller
        shows the registry's token for the task's stream (purpose `stream`, the task and its epoch)."""
        with _refusals((Refused, 409), (LookupError, 404), (ValueError, 422)):
            agent.ack_from_caller(bearer(authorization), task_key, epoch, seq)
        return Response(status_code=204)

    @app.post("/ha/{task_key}/delta", responses=_REFUSED)
    async def delta(task_key: TaskKey, request: Request, epoch: int = Query(ge=0, le=2**63 - 1), authorization: Annotated[str | None, Header()] = None):
        """Apply a delta checkpoint from the task's host (this participant holds its
        passive-standby copy): the host shows the registry's token for this delta."""
        if agent.ha is None:
            raise HTTPException(404, "this agent keeps no HA copies")
        # The token before the body: a caller the registry does not vouch for sends nothing big.
        with _refusals():
            sender = (await run_in_threadpool(agent.credentials.verify, bearer(authorization), "delta", task_key, epoch)).caller
        data = await request.body()
        with _refusals((NotHolder, 409), (DeltaRefused, 409)):
            return await run_in_threadpool(agent.ha.receive_delta, task_key, epoch, sender, data)

    return app
