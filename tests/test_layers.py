"""The packages keep their layers (the contracts are in pyproject.toml, `[tool.importlinter]`):
the domain `bpm` imports no service package and no I/O library, so its decisions run in a
unit test and in the simulator exactly as in the live agent; inside a package no modules
import each other around a loop; no module imports another's private names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout, result.stdout


PRODUCT = ("bpm", "bpm_app", "bpm_http", "api", "spark_agents", "migrations", "examples")


def test_no_private_name_is_imported_from_another_module():
    """A leading underscore says a name is its module's own: one that another module needs is
    public under a name that says so."""
    import ast

    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PRODUCT:
                    found += [f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, "\n".join(found)
