"""The packages keep their layers (the contracts are in pyproject.toml, `[tool.importlinter]`):
the domain `bpm` imports no service package and no I/O library, so its decisions run in a
unit test and in the simulator exactly as in the live agent."""

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
