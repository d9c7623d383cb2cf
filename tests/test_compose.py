"""docker-compose.yml stays valid (there is no Docker engine here: `docker-compose config` checks it)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_compose_file_is_valid():
    if shutil.which("docker-compose") is None:
        if os.environ.get("CI"):
            pytest.fail("docker-compose is missing; scripts/install-system-deps.sh installs it")
        pytest.skip("docker-compose not installed")
    result = subprocess.run(["docker-compose", "config", "-q"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


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
