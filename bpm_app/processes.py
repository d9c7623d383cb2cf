"""Waiting for a server process of the project to answer."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx


def wait_http(
    url: str, process: subprocess.Popen, log: Path, timeout_s: float, *, on_wait: Callable[[], None] | None = None, every_s: float = 1.0,
    get: Callable[[str], httpx.Response] | None = None,
) -> None:
    """Wait until `url` answers 200 (to `get(url)`: by default a plain GET); `on_wait` runs
    every `every_s` meanwhile (a live view goes on)."""
    get = get or (lambda where: httpx.get(where, timeout=1.0))
    deadline = time.monotonic() + timeout_s
    next_call = time.monotonic() + every_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args[1:3]} exited with {process.returncode}; see {log}:\n{log.read_text()[-2000:]}")
        try:
            if get(url).status_code == 200:
                return
        except (httpx.HTTPError, RuntimeError):  # not answering, or (a TLS peer) not registered yet
            pass
        if on_wait is not None and time.monotonic() >= next_call:
            on_wait()
            next_call = time.monotonic() + every_s
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s; see {log}")
