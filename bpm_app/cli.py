"""The `bpm` command line.

Each module in `bpm_app.commands` registers its own commands on the shared apps of
`bpm_app.commands`, so the CLI grows without one file that everybody edits. Modules
import heavy dependencies (Spark, SciPy, the web stack) inside their commands,
which keeps `bpm --help` fast.
"""

from __future__ import annotations

import importlib
import pkgutil

from bpm_app import commands
from bpm_app.commands import app


def _load_commands() -> None:
    for module in sorted(m.name for m in pkgutil.iter_modules(commands.__path__)):
        importlib.import_module(f"{commands.__name__}.{module}")


_load_commands()

if __name__ == "__main__":  # pragma: no cover
    app()
