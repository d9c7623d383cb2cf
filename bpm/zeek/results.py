"""Task output files and the reader that merges them into one result set.

A task writes the rows of micro-batch `b` to `<output>/<task>/batch-<b>.jsonl` through a
temporary file and a rename, so a replayed batch replaces its file instead of adding
another. The reader merges every task's files: a row present in more than one batch file
is a duplicate; a row of the expected set that no file holds is lost.

A task under high availability writes through an output fence (`spark_agents.ha.fence`)
instead: `batch-<b>.e<epoch>.<run>.jsonl`, where `run` names the writer, because a task
restarted with a fresh checkpoint numbers its batches from 0 again and must never replace
an earlier file; the fence, not the name, keeps a replay from writing a window twice.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bpm.zeek.definitions import ResultRow

_BATCH_FILE = re.compile(r"^batch-(\d+)(?:\.e(\d+)\.([0-9a-z]+))?\.jsonl$")
_RUN = re.compile(r"^[0-9a-z]+$")


def batch_file(output_dir: str | Path, task_id: str, batch_id: int, epoch: int | None = None, run: str | None = None) -> Path:
    """The file of one batch's rows; with `epoch` and `run`, the fenced form (see the module text)."""
    if epoch is None:
        return Path(output_dir) / task_id / f"batch-{batch_id}.jsonl"
    if run is None or not _RUN.match(run):
        raise ValueError(f"bad writer name {run!r}: lower-case letters and digits")
    return Path(output_dir) / task_id / f"batch-{batch_id}.e{epoch}.{run}.jsonl"


def is_batch_file(path: Path) -> bool:
    return _BATCH_FILE.match(path.name) is not None


def batch_files(task_dir: str | Path) -> list[Path]:
    """The batch files of one task's output folder (temporary and other files left out)."""
    folder = Path(task_dir)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if is_batch_file(p))


def read_batch(path: str | Path) -> list[ResultRow]:
    """The rows of one batch file."""
    with Path(path).open(encoding="utf-8") as handle:
        return [ResultRow.from_json(json.loads(line)) for line in handle if line.strip()]


def write_batch(output_dir: str | Path, task_id: str, batch_id: int, rows: Iterable[ResultRow],
                epoch: int | None = None, run: str | None = None) -> Path:
    """Write one batch's rows atomically (temp file, then rename); a rerun of the batch overwrites it."""
    target = batch_file(output_dir, task_id, batch_id, epoch, run)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with temp.open("w", encoding="utf-8") as out:
        for row in sorted(rows):
            out.write(json.dumps(row.to_json()) + "\n")
    os.replace(temp, target)
    return target


@dataclass
class OutputSet:
    """Every task's output merged.

    Attributes:
        rows: each distinct row once.
        copies: how many batch files hold each row (more than one means duplicated output).
        files: the batch files read.
    """

    rows: set[ResultRow] = field(default_factory=set)
    copies: Counter = field(default_factory=Counter)
    files: list[Path] = field(default_factory=list)

    @property
    def duplicates(self) -> list[ResultRow]:
        """Rows present in more than one batch file."""
        return sorted(row for row, n in self.copies.items() if n > 1)

    def lost(self, expected: Iterable[ResultRow]) -> list[ResultRow]:
        """Expected rows that no batch file holds."""
        return sorted(set(expected) - self.rows)

    def extra(self, expected: Iterable[ResultRow]) -> list[ResultRow]:
        """Rows that no expected row matches."""
        return sorted(self.rows - set(expected))


def read_outputs(output_dir: str | Path, tasks: Iterable[str] | None = None) -> OutputSet:
    """Merge the batch files of all tasks (or of the given tasks) under `output_dir`."""
    root = Path(output_dir)
    result = OutputSet()
    if not root.exists():
        return result
    task_dirs = [root / t for t in tasks] if tasks is not None else sorted(p for p in root.iterdir() if p.is_dir())
    for task_dir in task_dirs:
        for path in batch_files(task_dir):
            result.files.append(path)
            for row in read_batch(path):
                result.rows.add(row)
                result.copies[row] += 1
    return result
