"""deploy/systemd's units are valid for systemd, and their commands run: each unit's
`ExecStart`, with this checkout's `bpm` for /opt/bpm's and the instance, ports and folders
of a test, as a local process (there is no systemd to start them here)."""

from __future__ import annotations

import configparser
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

from bpm_app.processes import wait_http
from tests.conftest import free_port, missing
from tests.registry_server import BPM

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "deploy" / "systemd"
INSTALLED = "/opt/bpm/.venv/bin/bpm"


def _unit(name: str) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # systemd's keys are case-sensitive
    unit.read(UNITS / name)
    return unit


def _command(name: str, instance: str = "north", **replace: str) -> list[str]:
    """The unit's ExecStart for `instance`, with this checkout's bpm and `replace`'s substitutions."""
    line = _unit(name)["Service"]["ExecStart"].replace("%i", instance)
    for old, new in replace.items():
        line = line.replace(old, new)
    args = shlex.split(line)
    assert args[0] == INSTALLED, args
    return [BPM, *args[1:]]


def _env_example(name: str, **values: str) -> dict[str, str]:
    """An example environment file's settings, with `values` for its placeholders."""
    pairs = (line.split("=", 1) for line in (UNITS / name).read_text().splitlines() if line and not line.startswith("#"))
    return {key: values.get(key, value) for key, value in pairs}


def _serves_and_stops(args: list[str], env: dict[str, str], cwd: Path, health: str, unit: str, said: str) -> str:
    """Run a unit's command until `health` answers, then SIGTERM it, as systemd stops the unit:
    the command ends within the unit's TimeoutStopSec with a status systemd counts clean (0,
    or the signal itself: uvicorn raises it again once it has shut down), having said `said`
    on its way out. Its log."""
    log = cwd / "unit.log"
    with open(log, "w") as out:
        process = subprocess.Popen(args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_http(health, process, log, 60)
        process.send_signal(signal.SIGTERM)
        seconds = float(_unit(unit)["Service"]["TimeoutStopSec"])
        assert process.wait(timeout=seconds) in (0, -signal.SIGTERM), f"{unit}'s command failed on SIGTERM: {log.read_text()[-2000:]}"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = log.read_text()
    assert said in text, f"{unit}'s command did not stop cleanly: {text[-2000:]}"
    return text


def test_systemd_verifies_every_unit(tmp_path):
    if shutil.which("systemd-analyze") is None:
        missing("systemd-analyze: scripts/install-system-deps.sh installs it")
    names = []
    for path in sorted(UNITS.glob("*.service")):
        text = path.read_text().replace(INSTALLED, BPM)  # verify checks that the program exists
        name = path.name.replace("@.", "@north.")
        (tmp_path / name).write_text(text)
        names.append(str(tmp_path / name))
    assert len(names) == 3, names
    result = subprocess.run(["systemd-analyze", "verify", *names], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


def test_the_registry_unit_s_command_serves_and_stops_on_sigterm(tmp_path):
    port = free_port()
    env = _env_example("registry.env.example", BPM_ADMIN_KEY="unit-operator-key", BPM_DATABASE_URL=f"sqlite:///{tmp_path / 'registry.db'}")
    assert env["BPM_MODE"] == "production"
    args = _command("bpm-registry.service", **{"--port 8000": f"--port {port}"})
    log = _serves_and_stops(args, {"PATH": "/usr/bin:/bin", **env}, tmp_path, f"http://127.0.0.1:{port}/healthz", "bpm-registry.service",
                            "Application shutdown complete")
    assert '"level"' in log, "the unit asks for JSON logs"


def test_the_broker_unit_s_command_serves_and_stops_on_sigterm(tmp_path):
    if shutil.which("nats-server") is None:
        missing("nats-server: scripts/install-system-deps.sh installs it")
    port, http_port = free_port(), free_port()
    args = _command("bpm-broker@.service", **{
        "/var/lib/bpm/brokers/north": str(tmp_path / "store"), "--host 0.0.0.0": "--host 127.0.0.1",
        "--port 4222": f"--port {port}", "--http-port 8222": f"--http-port {http_port}"})
    env = {"PATH": "/usr/bin:/bin:/usr/sbin", "BPM_NATS_PASSWORD": "unit-broker-password"}
    _serves_and_stops(args, env, tmp_path, f"http://127.0.0.1:{http_port}/healthz", "bpm-broker@.service", "north's broker stopped")
    assert (tmp_path / "store").is_dir()


def test_the_agent_unit_s_command_reads_the_example_configuration(tmp_path):
    """The agent's command with the example configuration: its options parse and resolve
    (`--print-config`); running it needs a registry and the participant's key."""
    args = _command("bpm-agent@.service", **{"/etc/bpm/agents/north.toml": str(UNITS / "agent.example.toml"),
                                              "/var/lib/bpm/agents/north": str(tmp_path / "north")})
    result = subprocess.run([*args, "--print-config"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert 'name = "north"' in result.stdout and f'workdir = "{tmp_path / "north"}"' in result.stdout, result.stdout
    assert set(_env_example("agent.env.example")) == {"BPM_KEY", "BPM_NATS_PASSWORD"}

