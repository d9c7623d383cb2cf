"""Start a real `bpm registry serve` process for end-to-end tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.conftest import free_port

BPM = str(Path(sys.executable).with_name("bpm"))


@dataclass
class RunningRegistry:
    url: str
    admin_key: str
    process: subprocess.Popen
    log: Path


def wait_healthy(url: str, process: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"registry exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url + "/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"registry at {url} not healthy after {timeout} s:\n{log.read_text()}")


@contextmanager
def running_registry(workdir: Path, database_url: str | None = None, *, admin_key: str = "e2e-operator-key", extra_env: dict | None = None) -> Iterator[RunningRegistry]:
    port = free_port()
    env = {**os.environ, "BPM_ADMIN_KEY": admin_key, **(extra_env or {})}
    args = [BPM, "registry", "serve", "--port", str(port), "--log-level", "warning"]
    if database_url:
        args += ["--database-url", database_url]
    log = workdir / f"registry-{port}.log"
    with open(log, "w") as out:
        process = subprocess.Popen(args, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process, log)
        yield RunningRegistry(url, admin_key, process, log)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
