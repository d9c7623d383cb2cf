"""A registry app in-process and agents stepped against it, for the agent loop's tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from api.app import create_app
from api.migrate import upgrade
from bpm_http.client import RegistryClient
from api.settings import Settings
from bpm.keygroups import shares
from examples.network_monitoring import query as MONITORING
from spark_agents.agent import Agent, AgentConfig, OwnTask
from spark_agents.broker.access import OwnBroker
from spark_agents.correlation import Endpoint
from tests.api.conftest import Clock


@contextmanager
def stepped_federation(
    tmp_path: Path, make_host: Callable[[Callable[[], float]], object], task_params: dict | None = None,
    brokers: Mapping[str, OwnBroker] | None = None, correlate: bool = False, fixed_cost: Mapping[str, float] | None = None,
    settings: Mapping[str, Mapping[str, Any]] | None = None,
) -> Iterator[tuple[RegistryClient, dict[str, Agent], Callable[[str, int], Agent], Clock]]:
    """(operator, agents, add(name, tasks), clock): `add` registers a participant and connects
    its agent, whose host is `make_host(now)`; agents fetch checkpoints from each other directly.
    A participant with a broker in `brokers` runs it and has its tasks over shares of its
    stream; the others' tasks name no input. With `correlate` the agents share their alerts
    and correlate them (`AgentConfig.correlate`, an availability bound of 2 s). A participant
    in `fixed_cost` splits and merges its tasks with that fixed cost per task (`AgentConfig.fixed_cost`).
    `settings` sets other fields of a participant's `AgentConfig` (by default every agent
    trades at every tick: no period, warm-up or settling time)."""
    brokers = brokers or {}
    database_url = f"sqlite:///{tmp_path / 'registry.db'}"
    upgrade(database_url)
    clock = Clock()
    app = create_app(Settings(database_url=database_url), admin_key="op", migrate=False, clock=clock)

    def now() -> float:
        return clock.now.timestamp()

    with TestClient(app) as http:
        transport = http._transport
        operator = RegistryClient("http://testserver", "op", transport=transport)
        agents: dict[str, Agent] = {}

        def fetch(endpoint, key, epoch, token):
            return agents[endpoint.rsplit("/", 1)[-1]].release_to_caller(token, key, epoch)

        def ask_stream(endpoint, key, epoch, token):
            granted = agents[endpoint.rsplit("/", 1)[-1]].stream_credentials_to_caller(token, key, epoch)
            return granted["user"], granted["password"]

        def send_ack(endpoint, key, epoch, seq, token):
            agents[endpoint.rsplit("/", 1)[-1]].ack_from_caller(token, key, epoch, seq)

        def ask_alerts(endpoint, token):
            granted = agents[endpoint.rsplit("/", 1)[-1]].alerts_credentials_to_caller(token)
            return Endpoint(granted["url"], granted["user"], granted["password"])

        keys: dict[str, str] = {}

        def add(name: str, tasks: int) -> Agent:
            """A new participant's agent; for a name added before, that agent restarted (a new
            process: nothing in memory, a new host, the same key and work folder)."""
            if name not in keys:
                keys[name] = operator.add_participant(name, f"http://127.0.0.1:9000/{name}")["api_key"]
            key = keys[name]
            client = RegistryClient("http://testserver", key, transport=transport)
            config = AgentConfig(
                name=name,
                workdir=tmp_path / name,
                endpoint=f"http://127.0.0.1:9000/{name}",
                tasks=[OwnTask(f"g{prefix}", brokers[name].location(prefix), dict(task_params or {}), MONITORING.name, MONITORING.digest)
                       for prefix in shares(tasks)]
                if name in brokers else [OwnTask(f"p{i}", "", dict(task_params or {})) for i in range(tasks)],  # no input: the hosts run no query
                period_s=0.0,
                warmup_s=0.0,
                settle_s=0.0,
                reference_price=1.0,
                correlate=correlate,
                availability_bound_s=2.0,
                fixed_cost=(fixed_cost or {}).get(name),
                queries={MONITORING.name: MONITORING},
                insecure=True,  # the agents call each other in process (`fetch`, `ask_stream`, ...), never over a network
            )
            config = replace(config, **(settings or {}).get(name, {}))
            agent = Agent(config, client, make_host(now), clock=now, fetch=fetch, ask_stream=ask_stream, send_ack=send_ack,
                          ask_alerts=ask_alerts, broker=brokers.get(name))
            agents[name] = agent
            agent.connect()
            return agent

        try:
            yield operator, agents, add, clock
        finally:
            for agent in agents.values():
                if agent.correlation is not None:
                    agent.correlation.close()
