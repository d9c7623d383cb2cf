"""The registry and the command line install and run without the `agent` extra (Spark, NATS,
SciPy, matplotlib), as the registry's image has them."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Distribution names whose module is named otherwise.
MODULES = {"nats-py": "nats"}

PROBE = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (not installed without the agent extra)")
sys.meta_path.insert(0, Missing())
from api.app import create_app
from api.settings import Settings
from fastapi.testclient import TestClient
with TestClient(create_app(Settings(database_url=sys.argv[2], admin_key="k"))) as client:
    assert client.get("/healthz").status_code == 200
    assert client.get("/api/v1/participants", headers={"Authorization": "Bearer k"}).status_code == 200
from typer.testing import CliRunner
from bpm_app.cli import app
for args in (["--help"], ["registry", "serve", "--help"], ["participants", "list", "--help"], ["contracts", "list", "--help"]):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (args, result.output)
print("ok")
"""


def agent_extra() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {requirement.split("==")[0].split("[")[0] for requirement in project["optional-dependencies"]["agent"]}


def test_the_agent_extra_holds_spark_nats_scipy_and_matplotlib_not_the_registry_s_needs():
    assert agent_extra() == {"pyspark", "pyarrow", "nats-py", "scipy", "matplotlib"}


def test_the_registry_and_the_command_line_run_without_the_agent_extra(tmp_path):
    blocked = ",".join(MODULES.get(name, name) for name in sorted(agent_extra()))
    result = subprocess.run([sys.executable, "-c", PROBE, blocked, f"sqlite:///{tmp_path / 'registry.db'}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
