"""docker-compose.yml stays valid (there is no Docker engine here: `docker-compose config` checks it)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import missing

ROOT = Path(__file__).resolve().parent.parent


# The secrets the compose file asks for, none with a default.
SECRETS = {"BPM_ADMIN_KEY": "op-key", "BPM_DB_PASSWORD": "db-password", **{f"BPM_KEY_{n.upper()}": f"key-{n}" for n in "abcd"},
           **{f"BPM_NATS_PASSWORD_{n.upper()}": f"nats-{n}" for n in "abc"}}


def _compose_config(env: dict) -> subprocess.CompletedProcess:
    if shutil.which("docker-compose") is None:
        missing("docker-compose: scripts/install-system-deps.sh installs it")
    clean = {k: v for k, v in os.environ.items() if k not in SECRETS}
    return subprocess.run(["docker-compose", "config", "-q"], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=60)


def test_compose_file_is_valid():
    result = _compose_config(SECRETS)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("secret", sorted(SECRETS))
def test_compose_supplies_no_default_secret(secret):
    result = _compose_config({k: v for k, v in SECRETS.items() if k != secret})
    assert result.returncode != 0 and secret in result.stderr, result.stderr


def test_each_agent_gets_only_its_own_secrets_and_volume_and_nothing_runs_as_root():
    services = _services()
    for name in "abcd":
        env = services[name]["environment"]
        assert set(env) == {"BPM_KEY"} | ({"BPM_NATS_PASSWORD"} if name != "d" else set()), env
        assert env["BPM_KEY"].startswith(f"${{BPM_KEY_{name.upper()}:?"), env
        if name != "d":
            assert env["BPM_NATS_PASSWORD"].startswith(f"${{BPM_NATS_PASSWORD_{name.upper()}:?"), env
    # Every participant has a volume of its own, which only its replayer shares; the database
    # and Prometheus keep theirs (a file mounted from the repository is no volume).
    owners: dict[str, set[str]] = {}
    for service_name, service in services.items():
        for volume in service.get("volumes") or []:
            if not volume.startswith((".", "/")):
                owners.setdefault(volume.split(":")[0], set()).add(service_name.removeprefix("replay-"))
    assert owners == {"pgdata": {"postgres"}, "promdata": {"prometheus"}, **{f"{n}-data": {n} for n in "abcd"}}, owners
    for name, service in services.items():
        if service.get("image", "").startswith("bpm-federation"):
            user = str(service.get("user", "0"))
            assert user.split(":")[0] not in ("0", "root"), (name, user)
    dockerfile = (ROOT / "Dockerfile").read_text().splitlines()
    users = [line.split()[1] for line in dockerfile if line.startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("0", "root")


def _stages() -> dict[str, list[str]]:
    """The Dockerfile's build stages: name -> its lines (continuations joined)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    stages: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("FROM "):
            current = line.split()[-1]
            stages[current] = [line]
        elif line and not line.startswith("#") and current is not None:
            stages[current].append(line)
    return stages


def test_images_pin_a_base_with_java_17_run_unprivileged_and_the_registry_carries_no_spark():
    stages = _stages()
    assert set(stages) == {"base", "registry", "agent"}, stages
    assert re.fullmatch(r"FROM python:3\.11\.\d+-slim-bookworm AS base", stages["base"][0]), "a patch release on Debian 12, which has Java 17"
    for name in ("registry", "agent"):
        users = [line.split()[1] for line in stages[name] if line.startswith("USER ")]
        assert users and users[-1].split(":")[0] not in ("0", "root"), (name, users)
    registry, agent = " ".join(stages["registry"]), " ".join(stages["agent"])
    assert "pip install --no-cache-dir ." in registry and "[agent]" not in registry and "openjdk" not in registry
    assert "HEALTHCHECK" in registry and "/healthz" in registry
    assert all(package in agent for package in ("openjdk-17-jre-headless", "nats-server", '".[agent]"'))
    services = _services()
    assert services["registry"]["build"]["target"] == "registry"
    for name in ("a", "b", "c", "d", "replay-a", "replay-b", "replay-c"):
        assert services[name]["build"]["target"] == "agent", name
    for name in ("postgres", "registry", "a", "b", "c", "d", "prometheus"):
        assert services[name]["restart"] == "unless-stopped", name
        assert "healthcheck" in services[name], name


@pytest.mark.slow
def test_registry_service_runs_as_a_local_process(tmp_path):
    """The registry service's own command and environment, with PostgreSQL and the port on loopback."""
    import httpx
    import yaml

    from api.migrate import upgrade
    from tests.conftest import free_port, require_postgres
    from tests.registry_server import BPM, wait_healthy

    service = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["registry"]
    command = list(service["command"])
    assert command[:3] == ["bpm", "registry", "serve"]
    port = free_port()
    command[0] = BPM
    command[command.index("--host") + 1] = "127.0.0.1"
    command[command.index("--port") + 1] = str(port)
    env = {**os.environ, **{k: str(v) for k, v in service["environment"].items()}}
    env["BPM_DATABASE_URL"] = require_postgres()  # the compose file's postgres service, here the local server
    env["BPM_ADMIN_KEY"] = "compose-test-key"
    log = tmp_path / "registry.log"
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, process, log)
        listed = httpx.get(url + "/api/v1/participants", headers={"Authorization": "Bearer compose-test-key"}, timeout=10)
        assert listed.status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=30)
        upgrade(env["BPM_DATABASE_URL"])


def _services() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


# Where an agent's container finds its settings (the compose file mounts deploy/agents/NAME.toml there).
CONFIG_IN_CONTAINER = "/etc/bpm/agent.toml"
# Settings that place an agent in its container rather than in the federation.
PLACE = {"host", "port", "endpoint", "workdir", "registry", "broker_port", "broker_http_port", "broker_address"}


def agent_config(service: dict) -> Path:
    """The configuration file of an agent's service: its command reads it where the service mounts it."""
    command = service["command"]
    assert command == ["bpm", "agent", "run", "--config", CONFIG_IN_CONTAINER], command
    [mounted] = [v.split(":")[0] for v in service["volumes"] if v.split(":")[1] == CONFIG_IN_CONTAINER]
    assert all(v.endswith(":ro") for v in service["volumes"] if CONFIG_IN_CONTAINER in v), "mounted read-only"
    return ROOT / mounted


def test_participants_run_the_demos_agent_settings():
    """The compose participants are the demo's agents: the same settings and contracts."""
    from bpm_app.demo.run import MEMBERS, Demo, DemoSettings
    from spark_agents.settings import AgentSettings

    demo = Demo(DemoSettings(workdir=Path("/data")), say=lambda _: None)
    services = _services()
    for member in MEMBERS:
        settings = AgentSettings.load(agent_config(services[member.name]))
        inputs, _ = demo.inputs.agent(member.name, "127.0.0.2", member.shares)
        initial = {"partitions": f"0-{member.initial - 1}"} if member.initial else {}
        expected = AgentSettings(name=member.name, **inputs, **initial, **demo._agent_settings(member))
        assert settings.model_dump(exclude=PLACE) == expected.model_dump(exclude=PLACE), member.name
        assert settings.workdir == Path(f"/data/agents/{member.name}") and settings.endpoint == f"https://{member.name}:9000"
        assert not settings.insecure, "agents serve TLS"
        assert (settings.broker_port is None) == (member.shares == 0)
    assert services["d"].get("profiles") == ["join"], "d joins later"
    for member in MEMBERS:
        assert float(services[member.name]["cpus"]) == demo.s.cpus, f"{member.name} has the demo's CPU capacity"
    for member in MEMBERS:
        if member.shares:
            script = services[f"replay-{member.name}"]["command"][-1]
            assert f"--seed {member.seed}" in script and f"--stream nats://{member.name}:4222/{member.name} " in script


@pytest.mark.slow
@pytest.mark.full
@pytest.mark.serial
def test_the_federation_services_run_as_local_processes_and_move_load(tmp_path):
    """Registry (PostgreSQL), replayers and participants a, b, c with their compose commands
    and environment as local processes on 127.0.0.x, each participant under its service's CPU
    limit where cgroups can be made: load moves from the overloaded A."""
    import signal
    import time

    from bpm.keygroups import StreamLocation, parse_location, shares
    from bpm_app.demo.run import queries_to_add
    from bpm_http.client import RegistryClient
    from bpm_app.processes import wait_http
    from spark_agents.hosts import open_hosts
    from spark_agents.tls import Peers
    from tests.conftest import free_port, require_postgres
    from tests.registry_server import BPM

    database_url = require_postgres()
    services = _services()
    data = tmp_path / "data"
    data.mkdir()
    admin_key = "compose-federation-key"
    registry_port = free_port()
    registry_url = f"http://127.0.0.1:{registry_port}"
    addresses = {"a": "127.0.0.2", "b": "127.0.0.3", "c": "127.0.0.4"}
    ports = {name: free_port(address) for name, address in addresses.items()}
    brokers = {name: (free_port(address), free_port(address)) for name, address in addresses.items()}

    def local(argument: str, participant: str | None = None) -> str:
        """A compose argument on this machine: each participant's own folder, loopback addresses."""
        argument = argument.replace("/data", str(data / participant) if participant else str(data)).replace("http://registry:8000", registry_url)
        for name, address in addresses.items():
            argument = argument.replace(f"https://{name}:9000", f"https://{address}:{ports[name]}")
            argument = argument.replace(f"nats://{name}:4222", f"nats://{address}:{brokers[name][0]}")
        return argument

    secrets = {"BPM_ADMIN_KEY": admin_key, "BPM_DB_PASSWORD": "unused",  # the local server trusts loopback
               **{f"BPM_NATS_PASSWORD_{name.upper()}": f"nats-{name}-password" for name in addresses}}

    def environment(service: dict) -> dict:
        """The service's environment with the secrets the operator sets (`${VAR:?...}`) filled in."""
        env = {k: local(re.sub(r"\$\{(\w+):\?[^}]*\}", lambda m: secrets[m.group(1)], str(v))) for k, v in (service.get("environment") or {}).items()}
        if "BPM_DATABASE_URL" in env:
            env["BPM_DATABASE_URL"] = database_url  # the compose file's postgres service, here the local server
        clean = {k: v for k, v in os.environ.items() if k not in ("BPM_ADMIN_KEY", "BPM_KEY")}
        return {**clean, **env}

    processes: dict[str, subprocess.Popen] = {}
    hosts = open_hosts("compose")

    def start(name: str, command: list[str], service: dict) -> Path:
        log = tmp_path / f"{name}.log"
        inside = {}
        if hosts is not None and "cpus" in service:  # compose's CPU limit, as a cgroup quota
            hosts.add(name, float(service["cpus"]))
            inside = hosts.popen_kwargs(name)
        with log.open("w") as out:
            processes[name] = subprocess.Popen(command, cwd=tmp_path, env=environment(service), stdout=out,
                                               stderr=subprocess.STDOUT, start_new_session=True, **inside)
        return log

    try:
        registry = services["registry"]
        command = [BPM, *registry["command"][1:]]
        command[command.index("--host") + 1] = "127.0.0.1"
        command[command.index("--port") + 1] = str(registry_port)
        log = start("registry", command, registry)
        wait_http(registry_url + "/healthz", processes["registry"], log, 60)
        # The operator registers the participants; each agent gets only its own key.
        with RegistryClient(registry_url, admin_key) as operator:
            for name in addresses:
                secrets[f"BPM_KEY_{name.upper()}"] = operator.add_participant(name, local(f"https://{name}:9000"))["api_key"]
        for name, address in addresses.items():
            service = services[name]
            config = tmp_path / f"{name}.toml"  # the service's file with this machine's folders and URLs
            config.write_text(local(agent_config(service).read_text(), name))
            # Its command, with the options that override the file's container addresses.
            command = [BPM, *service["command"][1:-1], str(config), "--host", address, "--port", str(ports[name]),
                       "--broker-port", str(brokers[name][0]), "--broker-http-port", str(brokers[name][1]), "--broker-address", address]
            assert "BPM_ADMIN_KEY" not in environment(service), "an agent gets no operator key"
            start(name, command, service)
        bin_dir = str(Path(BPM).parent)
        # The agents' HTTPS, checked as a partner does: against the certificate each registered.
        def participant(name: str) -> dict:
            with RegistryClient(registry_url, admin_key) as operator:
                return operator.participant(name)

        peers = Peers(participant)
        for name, address in addresses.items():  # once its participant's broker is up, as compose's depends_on says
            wait_http(f"https://{address}:{ports[name]}/healthz", processes[name], tmp_path / f"{name}.log", 180,
                      get=lambda url, name=name: peers.client(peers.endpoint(name)).get(url, timeout=1.0))
            service = services[f"replay-{name}"]
            script = local(service["command"][-1], name).replace("bpm ", f"{bin_dir}/bpm ")
            start(f"replay-{name}", [*service["command"][:-1], script], service)
        moved = []
        deadline = time.monotonic() + 420
        added_at = time.monotonic()
        with RegistryClient(registry_url, admin_key) as operator:
            while time.monotonic() < deadline and not moved:
                for name, process in processes.items():
                    assert process.poll() is None, f"{name} exited: {(tmp_path / f'{name}.log').read_text()[-3000:]}"
                moved = operator.movements()
                a = operator.participant("a")
                # What a query costs depends on the machine: as an operator would, A starts more
                # queries through its agent's API (with its own key) while it is not overloaded:
                # as many at once as its load per task says it takes to pass 1.15 times its
                # threshold (as the demo does), then waits until its load window has seen them
                # (starting one every few seconds would keep the agent settling, its load unmeasured).
                if not moved and a["load"] and a["threshold"] and a["load"] < 1.15 * a["threshold"] and time.monotonic() - added_at > 60:
                    tasks = operator.tasks(origin="a")
                    k = len(tasks)
                    count = queries_to_add(1.15 * a["threshold"], [a["load"]], [a["load"] / k], 16 - k)
                    for prefix in shares(16)[k:k + count]:
                        uri = str(StreamLocation(parse_location(tasks[0]["input_uri"]).url, "a", prefix))
                        added = peers.client(peers.endpoint("a")).post(f"https://{addresses['a']}:{ports['a']}/tasks", json={"name": f"g{prefix}", "input_uri": uri, "params": tasks[0]["params"]},
                                           headers={"Authorization": f"Bearer {secrets['BPM_KEY_A']}"}, timeout=30)
                        assert added.status_code == 201, added.text
                    added_at = time.monotonic()
                time.sleep(3)
            contracts = operator.contracts(state="active")
        assert {(c["proposer"], c["counterparty"]) for c in contracts} == {("a", "b"), ("a", "c"), ("b", "c")}
        assert moved, "no load moved within the time limit"
        assert moved[0]["from"] == "a" and moved[0]["to"] in ("b", "c"), moved[0]
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        if hosts is not None:
            hosts.close()
        from api.migrate import upgrade

        upgrade(database_url)
