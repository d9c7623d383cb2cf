"""Worker processes of a benchmark, each a block of its clients or agents, started together.

Each worker sends `(k, what, payload)` messages on one queue: `k` its block's index, `what`
a kind of its own choosing (`"error"` with a traceback when it fails). The parent collects
one message of a kind from every block (`collect`) and, at the end, stops the blocks
(`stop`): at once those that never got the signal to run.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence
from typing import Any


def collect(messages: Any, workers: Sequence[Any], kind: str, who: str, other: Callable[[int, str, Any], None] = lambda k, what, payload: None) -> list:
    """One payload of `kind` from each of `workers`, in the order of their blocks; messages
    of other kinds go to `other`. A block's error, or a worker that exits before it sent
    one, raises RuntimeError (`who`: what a block is, for the message)."""
    got: dict[int, Any] = {}
    while len(got) < len(workers):
        try:
            k, what, payload = messages.get(timeout=1.0)
        except queue.Empty:
            dead = [w for w in workers if w.exitcode is not None]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited ({dead[0].exitcode}) before it sent its {kind}") from None
            continue
        if what == "error":
            raise RuntimeError(f"block {k} of {who} failed:\n{payload}")
        if what == kind:
            got[k] = payload
        else:
            other(k, what, payload)
    return [got[k] for k in sorted(got)]


def stop(workers: Sequence[Any], go: Any) -> None:
    """Wait for the blocks to end; kill those that were never told to run (`go` not set: a
    block failed, or the run was interrupted) and those that do not end within 30 s."""
    for worker in workers:
        if not go.is_set():
            worker.kill()
        worker.join(timeout=30)
        if worker.is_alive():
            worker.kill()
