"""Running one participant as a process: its Spark host, its agent loop and its HTTP endpoint."""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import fields
from pathlib import Path
from typing import Any

from bpm.client import RegistryClient, RegistryError
from bpm.costs import CostFunction
from bpm.zeek.definitions import QueryParams
from spark_agents.agent import Agent, AgentConfig

log = logging.getLogger("bpm.agent")

KEY_FILE = "participant.key"
_QUERY_FIELDS = {f.name for f in fields(QueryParams)}


class SparkTasks:
    """The agent's view of a `TaskHost`: query parameters travel as the registry's JSON."""

    def __init__(self, host, trigger_s: float, cost_model: CostFunction | None = None, load_window_s: float = 15.0) -> None:
        self.host = host
        self.trigger_s = trigger_s
        self.cost_model = cost_model
        # Loads average over several batches: one batch may last longer than a measuring interval.
        self.load_window_s = load_window_s

    def start_task(self, task_id: str, input_path: str, checkpoint_dir: Path, params: dict[str, Any]) -> None:
        query = QueryParams(**{k: v for k, v in params.items() if k in _QUERY_FIELDS})
        self.host.start_task(task_id, input_path, checkpoint_dir, query, trigger_s=params.get("trigger_s", self.trigger_s))

    def stop_task(self, task_id: str) -> Path:
        return self.host.stop_task(task_id)

    def running(self) -> set[str]:
        return set(self.host.running())

    def loads(self) -> dict[str, float]:
        return self.host.loads(window_s=self.load_window_s)

    def cost_function(self) -> CostFunction:
        # A fixed model stands in for the fitted one when the operator chose it (--cost-model mm1).
        return self.cost_model or self.host.cost_function()

    def status(self) -> dict[str, Any]:
        status = self.host.status()
        # The fitted curve and per-task details are long; the registry keeps a summary.
        summary = {k: status[k] for k in ("master", "cores", "utilisation", "cpu_utilisation", "mean_batch_s", "fallback_used", "intervals")}
        summary["tasks"] = [
            {"task_id": t["task_id"], "state": t["state"], "batches": t["batches"], "backlog_files": t["backlog"]["files"]}
            for t in status["tasks"]
        ]
        return summary


def participant_key(registry_url: str, name: str, endpoint: str, workdir: Path, key: str | None, admin_key: str | None) -> str:
    """This participant's key: given, else kept from an earlier run, else obtained by registering."""
    key_file = workdir / KEY_FILE
    if key:
        return key
    if key_file.exists():
        return key_file.read_text().strip()
    if not admin_key:
        raise SystemExit(f"{name} has no key: pass --key, or the operator key (--admin-key / BPM_ADMIN_KEY) to register it")
    with RegistryClient(registry_url, admin_key) as operator:
        try:
            created = operator.add_participant(name, endpoint)
        except RegistryError as exc:
            raise SystemExit(f"cannot register {name}: {exc}; if it exists, pass its --key") from exc
    workdir.mkdir(parents=True, exist_ok=True)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(created["api_key"] + "\n")
    log.info("registered %s at %s", name, endpoint)
    return created["api_key"]


def run_agent(
    config: AgentConfig,
    *,
    registry_url: str,
    key: str,
    bind_host: str,
    port: int,
    spark_master: str,
    cores: int | None,
    trigger_s: float,
    sample_s: float,
    cost_model: CostFunction | None = None,
) -> None:
    """Run until SIGTERM or SIGINT; then stop every task at a batch boundary and exit."""
    import uvicorn

    from spark_agents.host import TaskHost
    from spark_agents.server import create_agent_app
    from spark_agents.session import make_session

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    spark = make_session(spark_master, app_name=f"bpm-{config.name}")
    host = TaskHost(spark, config.workdir, config.output_dir, cores=cores, interval_s=sample_s)
    host.start_sampling()
    client = RegistryClient(registry_url, key)
    agent = Agent(config, client, SparkTasks(host, trigger_s, cost_model))
    server = uvicorn.Server(uvicorn.Config(create_agent_app(agent), host=bind_host, port=port, log_level="warning"))
    server_thread = threading.Thread(target=server.run, name="bpm-agent-http", daemon=True)
    server_thread.start()
    log.info("%s: agent on %s, Spark %s, registry %s", config.name, config.endpoint, spark_master, registry_url)
    try:
        agent.run(stop)
    finally:
        log.info("%s: stopping tasks at batch boundaries", config.name)
        server.should_exit = True
        host.close(stop_tasks=True)
        client.close()
        spark.stop()
