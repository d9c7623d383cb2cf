"""Start a real `bpm registry serve` process for end-to-end tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bpm_app.processes import wait_http
from tests.conftest import free_port

BPM = str(Path(sys.executable).with_name("bpm"))


@dataclass
class RunningRegistry:
    url: str
    admin_key: str
    process: subprocess.Popen
    log: Path


def wait_healthy(url: str, process: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    wait_http(url + "/healthz", process, log, timeout)


@contextmanager
def running_registry(workdir: Path, database_url: str | None = None, *, admin_key: str = "e2e-operator-key", extra_env: dict | None = None) -> Iterator[RunningRegistry]:
    with running_registries(workdir, database_url, 1, admin_key=admin_key, extra_env=extra_env) as (registry,):
        yield registry


@contextmanager
def running_registries(workdir: Path, database_url: str | None, count: int, *, admin_key: str = "e2e-operator-key",
                       extra_env: dict | None = None) -> Iterator[list[RunningRegistry]]:
    """`count` registry processes on one database, started at once (as machines behind a load
    balancer would be), each yielded once it answers."""
    env = {**os.environ, "BPM_ADMIN_KEY": admin_key, **(extra_env or {})}
    started: list[RunningRegistry] = []
    try:
        for _ in range(count):
            port = free_port()
            args = [BPM, "registry", "serve", "--port", str(port), "--log-level", "warning"]
            if database_url:
                args += ["--database-url", database_url]
            log = workdir / f"registry-{port}.log"
            with open(log, "w") as out:
                process = subprocess.Popen(args, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT)
            started.append(RunningRegistry(f"http://127.0.0.1:{port}", admin_key, process, log))
        for registry in started:
            wait_healthy(registry.url, registry.process, registry.log)
        yield started
    finally:
        for registry in started:
            registry.process.terminate()
        for registry in started:
            try:
                registry.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                registry.process.kill()
                registry.process.wait()
