"""Offer-and-accept round trips against a running registry, with N concurrent clients.

Each client is one pair of participants with an active contract and its own tasks, so
clients never contend for the same offer; what they share is the server and its
database, which is what is measured. One round trip = POST /offers, then POST
/offers/{id}/accept by the partner; latency is the time for both. Given a probe of the
server's CPU seconds (a registry the command started itself), the run also reports the
server's CPU per round trip.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import httpx


@dataclass
class Pair:
    offerer_key: str
    partner_key: str
    contract_id: int
    task_ids: list[int]


def _headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _post(http: httpx.AsyncClient, path: str, key: str, body: dict | None = None) -> dict:
    response = await http.post("/api/v1" + path, json=body, headers=_headers(key))
    if response.status_code >= 300:
        raise RuntimeError(f"POST {path} -> {response.status_code}: {response.text}")
    return response.json()


async def _make_pair(http: httpx.AsyncClient, admin_key: str, run: str, index: int, rounds: int) -> Pair:
    a = await _post(http, "/participants", admin_key, {"name": f"bench-{run}-{index}-a", "endpoint": "http://127.0.0.1:1"})
    b = await _post(http, "/participants", admin_key, {"name": f"bench-{run}-{index}-b", "endpoint": "http://127.0.0.1:1"})
    contract = await _post(http, "/contracts", a["api_key"], {"counterparty": b["name"], "price_min": 1.0, "price_max": 2.0, "min_duration_s": 3600})
    await _post(http, f"/contracts/{contract['id']}/accept", b["api_key"])
    tasks = [await _post(http, "/tasks", a["api_key"], {"name": f"t{i}", "load": 0.01}) for i in range(rounds)]
    return Pair(a["api_key"], b["api_key"], contract["id"], [t["id"] for t in tasks])


async def _client_loop(http: httpx.AsyncClient, pair: Pair, latencies: list[float], errors: list[str]) -> None:
    for task_id in pair.task_ids:
        started = time.perf_counter()
        try:
            offer = await _post(http, "/offers", pair.offerer_key, {"contract_id": pair.contract_id, "task_ids": [task_id], "price": 1.5})
            await _post(http, f"/offers/{offer['id']}/accept", pair.partner_key)
        except (RuntimeError, httpx.HTTPError) as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
            continue
        latencies.append(time.perf_counter() - started)


async def _run(url: str, admin_key: str, clients: int, rounds: int, progress, server_cpu: Callable[[], float | None]) -> dict:
    limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=clients + 10)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0) as http:
        run = uuid.uuid4().hex[:8]
        setup_started = time.perf_counter()
        semaphore = asyncio.Semaphore(20)

        async def make(i: int) -> Pair:
            async with semaphore:
                pair = await _make_pair(http, admin_key, run, i, rounds)
                progress("setup", 1)
                return pair

        pairs = await asyncio.gather(*(make(i) for i in range(clients)))
        setup_s = time.perf_counter() - setup_started
        latencies: list[float] = []
        errors: list[str] = []
        cpu_before = server_cpu()
        started = time.perf_counter()
        await asyncio.gather(*(_client_loop(http, pair, latencies, errors) for pair in pairs))
        elapsed = time.perf_counter() - started
        cpu_after = server_cpu()
    latencies.sort()
    server_cpu_s = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return {
        "clients": clients,
        "rounds_per_client": rounds,
        "round_trips": len(latencies),
        "errors": len(errors),
        "first_errors": errors[:3],
        "elapsed_s": round(elapsed, 3),
        "setup_s": round(setup_s, 3),
        "round_trips_per_s": round(len(latencies) / elapsed, 1) if elapsed > 0 else None,
        "p50_ms": round(1000 * statistics.median(latencies), 2) if latencies else None,
        "p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 2) if latencies else None,
        "max_ms": round(1000 * latencies[-1], 2) if latencies else None,
        "server_cpu_s": None if server_cpu_s is None else round(server_cpu_s, 3),
        "server_cpu_ms_per_round_trip": round(1000 * server_cpu_s / len(latencies), 2) if server_cpu_s is not None and latencies else None,
    }


def bench_registry(url: str, admin_key: str, clients: int, rounds: int, progress=lambda phase, n: None,
                   server_cpu: Callable[[], float | None] = lambda: None) -> dict:
    return asyncio.run(_run(url, admin_key, clients, rounds, progress, server_cpu))
