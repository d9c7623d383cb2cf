"""Offer-and-accept round trips against a running registry, with N concurrent clients.

Each client is one pair of participants with an active contract and its own tasks, so
clients never contend for the same offer; what they share is the server and its
database, which is what is measured. One round trip = POST /offers, then POST
/offers/{id}/accept by the partner; latency is the time for both. Given a probe of the
server's CPU seconds (a registry the command started itself), the run also reports the
server's CPU per round trip. The clients run as coroutines in one process, or, with
`processes`, split over that many processes started together, so that what the clients
spend (reported as `client_cpu_ms_per_round_trip`) is not one interpreter's.

With `contend`, the clients share a crowd of participants instead (one per five clients,
at least four), all with contracts to each other and each with its own tasks. A client's
round acts as a participant picked at random: it ends one of the movements of tasks that
participant moved away, or offers a task it hosts to another, which accepts. Several
clients act as one participant at once, so the registry refuses offers (one pending
offer per participant, a task that moved meanwhile), loses races (an accept after the task
left, an end after the chain unwound) and waits on its row locks; the run counts each kind
of refusal, and afterwards reads back what the registry holds and checks its invariants
(`crowd_violations`): every task's active movements form one chain from its origin to its
host, every accepted offer has one movement per task it took and no other offer has any,
every acknowledged accept is there once, and the ledger balances.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import multiprocessing
import random
import statistics
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from bpm_app.bench.blocks import collect, stop


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


async def _request_durations(http: httpx.AsyncClient, admin_key: str) -> collections.Counter | None:
    """The registry's request durations so far (`bpm_registry_request_duration_seconds` of the
    process that answers `/metrics`): requests at most each bucket's bound, seconds, summed
    over routes; None when it serves none."""
    from prometheus_client.parser import text_string_to_metric_families

    response = await http.get("/metrics", headers=_headers(admin_key))
    if response.status_code != 200:
        return None
    buckets: collections.Counter = collections.Counter()
    for family in text_string_to_metric_families(response.text):
        if family.name == "bpm_registry_request_duration_seconds":
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    buckets[float(sample.labels["le"])] += sample.value
    return buckets or None


def request_p99_bound_ms(before: collections.Counter | None, after: collections.Counter | None) -> float | None:
    """The bound, milliseconds, of the registry's histogram bucket that holds the 99th
    percentile of the requests it answered between two readings (None: unknown, or past
    the largest bound)."""
    if before is None or after is None:
        return None
    counts = sorted((bound, after[bound] - before.get(bound, 0)) for bound in after)  # at most each bound
    total = counts[-1][1]
    bound = next((bound for bound, n in counts if n >= 0.99 * total), None) if total > 0 else None
    return None if bound is None or bound == float("inf") else 1000 * bound


@dataclass
class Played:
    """What one process of clients saw in the timed phase: its round trips' latencies,
    errors, refusals by kind (contention), accepts acknowledged, and its own CPU seconds."""

    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    refused: collections.Counter = field(default_factory=collections.Counter)
    accepted: int = 0
    cpu_s: float = 0.0


async def _play(url: str, mode: str, made: list[Pair] | Crowd, clients: list[int], rounds: int, connections: int) -> Played:
    """Clients `clients` of a run, each its own coroutine over one connection pool: in
    "pairs", `made[i]` is client i's pair; in "contend", every client acts in the crowd `made`
    (this process's copy of it) with its own random stream."""
    played = Played()
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0) as http:
        cpu = time.process_time()
        if mode == "pairs":
            await asyncio.gather(*(_client_loop(http, made[i], played.latencies, played.errors) for i in clients))
        else:
            await asyncio.gather(*(_contend(http, made, random.Random(i), rounds, played) for i in clients))
        played.cpu_s = time.process_time() - cpu
    return played


def _play_block(k: int, url: str, mode: str, made: list[Pair] | Crowd, clients: list[int], rounds: int, messages, go) -> None:
    """Block `k` of the clients, in a process of its own: says it is ready, plays once `go`
    is set, sends what it saw (`bpm_app.bench.blocks`)."""
    try:
        messages.put((k, "ready", None))
        go.wait()
        messages.put((k, "played", asyncio.run(_play(url, mode, made, clients, rounds, len(clients) + 10))))
    except BaseException:
        messages.put((k, "error", traceback.format_exc()))


def _play_in_processes(url: str, mode: str, made: list[Pair] | Crowd, clients: int, rounds: int, processes: int,
                       around: Callable[[], None]) -> tuple[list[Played], float]:
    """The run's clients split over `processes` processes of their own (so that the clients'
    CPU is not one interpreter's), started together once all are up; `around()` is called
    just before the start. What each process saw, and the seconds from the start to the last
    one's end."""
    context = multiprocessing.get_context("spawn")  # the caller holds an event loop and sockets: no fork
    messages, go = context.Queue(), context.Event()
    blocks = [list(range(k * clients // processes, (k + 1) * clients // processes)) for k in range(processes)]
    workers = [context.Process(target=_play_block, args=(k, url, mode, made, block, rounds, messages, go), daemon=True,
                               name=f"bpm-bench-clients-{k}") for k, block in enumerate(blocks)]
    for worker in workers:
        worker.start()
    try:
        collect(messages, workers, "ready", "the clients")
        around()
        started = time.perf_counter()
        go.set()
        played = collect(messages, workers, "played", "the clients")
        return played, time.perf_counter() - started
    finally:
        stop(workers, go)


async def _measured(url: str, admin_key: str, clients: int, rounds: int, server_cpu: Callable[[], float | None], setup, mode: str,
                    processes: int, after=None) -> dict:
    """One run: `setup(http)` makes what the clients need (timed apart), then the clients play
    (`_play`: in this process, or split over `processes` processes), timed with the server's
    CPU and its own request timer; `after(http, made, played)` adds its figures once they are done."""
    limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=clients + 10)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60.0) as http:
        setup_started = time.perf_counter()
        made = await setup(http)
        setup_s = time.perf_counter() - setup_started
        durations_before = await _request_durations(http, admin_key)
        cpu: list[float | None] = []
        if processes > 1:
            parts, elapsed = await asyncio.to_thread(_play_in_processes, url, mode, made, clients, rounds, processes,
                                                     lambda: cpu.append(server_cpu()))
        else:
            cpu.append(server_cpu())
            started = time.perf_counter()
            parts = [await _play(url, mode, made, list(range(clients)), rounds, clients + 10)]
            elapsed = time.perf_counter() - started
        cpu.append(server_cpu())
        durations_after = await _request_durations(http, admin_key)
        latencies = [x for part in parts for x in part.latencies]
        errors = [e for part in parts for e in part.errors]
        extra = {} if after is None else await after(http, made, parts)
    # The registry's own timer, from the request reaching its app to its answer: what the
    # clients wait beyond it is spent before the app or in the clients.
    # The clients' own CPU: they share the machine with the registry and its database, so what
    # they spend is taken from the server, and a client loop that is busy reads its answers late.
    client_cpu = sum(part.cpu_s for part in parts)
    served = {"client_processes": len(parts),
              "registry_request_p99_ms_at_most": request_p99_bound_ms(durations_before, durations_after),
              "client_cpu_ms_per_round_trip": round(1000 * client_cpu / len(latencies), 2) if latencies else None}
    return {**_figures(clients, rounds, latencies, errors, elapsed, setup_s, cpu[0], cpu[1]), **served, **extra}


async def _run(url: str, admin_key: str, clients: int, rounds: int, progress, server_cpu: Callable[[], float | None], processes: int) -> dict:
    """Each client offers to a partner of its own, which accepts, `rounds` times: nothing contends."""
    run = uuid.uuid4().hex[:8]
    semaphore = asyncio.Semaphore(20)

    async def setup(http: httpx.AsyncClient) -> list[Pair]:
        async def make(i: int) -> Pair:
            async with semaphore:
                pair = await _make_pair(http, admin_key, run, i, rounds)
                progress("setup", 1)
                return pair

        return await asyncio.gather(*(make(i) for i in range(clients)))

    return {**await _measured(url, admin_key, clients, rounds, server_cpu, setup, "pairs", processes), "mode": "pairs"}


def _figures(clients: int, rounds: int, latencies: list[float], errors: list[str], elapsed: float, setup_s: float,
             cpu_before: float | None, cpu_after: float | None) -> dict:
    """A run's figures: round trips and their rate, latency, errors, the server's CPU."""
    latencies = sorted(latencies)
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


def crowd_size(clients: int) -> int:
    """The participants a contention run's clients share: one per five clients, at least four."""
    return max(4, clients // 5)


@dataclass
class Crowd:
    """The participants that the clients of a contention run share, and what the clients
    saw of them (stale under races: the registry refuses what no longer holds)."""

    keys: dict[str, str]  # participant -> its key
    contracts: dict[frozenset, int]  # a pair of participants -> their contract
    host: dict[int, str]  # task id -> where the clients last saw it run
    away: dict[int, tuple[int, str]]  # active movement id -> (task id, the participant that moved it away)
    accepted: int = 0  # accepts the registry acknowledged


async def _make_crowd(http: httpx.AsyncClient, admin_key: str, run: str, size: int, tasks_each: int, progress) -> Crowd:
    names = [f"bench-{run}-p{i}" for i in range(size)]
    keys = {}
    for name in names:
        keys[name] = (await _post(http, "/participants", admin_key, {"name": name, "endpoint": "http://127.0.0.1:1"}))["api_key"]
    contracts = {}
    for a, b in itertools.combinations(names, 2):
        contract = await _post(http, "/contracts", keys[a], {"counterparty": b, "price_min": 1.0, "price_max": 2.0, "min_duration_s": 0.01})
        await _post(http, f"/contracts/{contract['id']}/accept", keys[b])
        contracts[frozenset((a, b))] = contract["id"]
    host = {}
    for name in names:
        for i in range(tasks_each):
            host[(await _post(http, "/tasks", keys[name], {"name": f"t{i}", "load": 0.01}))["id"]] = name
        progress("setup", 1)
    return Crowd(keys, contracts, host, {})


async def _contend(http: httpx.AsyncClient, crowd: Crowd, rng: random.Random, rounds: int, played: Played) -> None:
    names = sorted(crowd.keys)
    latencies, refused, errors = played.latencies, played.refused, played.errors

    async def call(path: str, as_: str, body: dict | None = None) -> httpx.Response | None:
        try:
            response = await http.post("/api/v1" + path, json=body, headers=_headers(crowd.keys[as_]))
        except httpx.HTTPError as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
            return None
        if response.status_code >= 300 and response.status_code not in (404, 409):
            errors.append(f"POST {path} -> {response.status_code}: {response.text}"[:200])
            return None
        return response

    for _ in range(rounds):
        me = rng.choice(names)
        mine_away = [m for m, (_, mover) in crowd.away.items() if mover == me]
        if mine_away and rng.random() < 0.5:
            movement = rng.choice(mine_away)
            response = await call(f"/movements/{movement}/end", me)
            if response is not None and response.status_code == 200:
                crowd.host[response.json()["task_id"]] = me
            elif response is not None:
                refused["end"] += 1
            crowd.away.pop(movement, None)  # ended now, or earlier with its chain
            continue
        task = rng.choice([t for t, h in crowd.host.items() if h == me] or list(crowd.host))
        partner = rng.choice([n for n in names if n != me])
        started = time.perf_counter()
        offer = await call("/offers", me, {"contract_id": crowd.contracts[frozenset((me, partner))], "task_ids": [task], "price": 1.5})
        if offer is None or offer.status_code != 201:
            refused["offer"] += offer is not None
            continue
        accept = await call(f"/offers/{offer.json()['id']}/accept", partner)
        if accept is not None and accept.status_code == 200:
            played.accepted += 1
            latencies.append(time.perf_counter() - started)
            crowd.host[task] = partner
            crowd.away.update({m: (task, me) for m in accept.json()["movements"]})
            continue
        refused["accept"] += accept is not None
        withdrawn = await call(f"/offers/{offer.json()['id']}/withdraw", me)  # so that its maker may offer again at once
        refused["withdraw"] += withdrawn is not None and withdrawn.status_code != 200


async def crowd_violations(http: httpx.AsyncClient, admin_key: str, crowd: Crowd) -> list[str]:
    """What the registry holds that breaks an invariant, read back after a contention run."""
    async def get(path: str):
        response = await http.get("/api/v1" + path, headers=_headers(admin_key))
        response.raise_for_status()
        return response.json()

    names = set(crowd.keys)
    tasks = {t["id"]: t for t in await get("/tasks") if t["origin"] in names}
    movements = [m for m in await get("/movements") if m["task_id"] in tasks]
    violations = []
    for task_id, task in sorted(tasks.items()):
        chain = sorted((m for m in movements if m["task_id"] == task_id and m["state"] == "active"), key=lambda m: m["id"])
        at = task["origin"]
        for m in chain:
            if m["from"] != at:
                violations.append(f"task #{task_id}: active movement #{m['id']} leaves {m['from']}, but the chain is at {at}")
            at = m["to"]
        if at != task["host"]:
            violations.append(f"task #{task_id} runs at {task['host']}, but its active movements lead to {at}")
    by_offer = collections.Counter(m["offer_id"] for m in movements)
    for offer in await get("/offers"):
        if offer["from"] not in names:
            continue
        want = len(offer["accepted_task_ids"] or []) if offer["state"] == "accepted" else 0
        if by_offer[offer["id"]] != want:
            violations.append(f"offer #{offer['id']} ({offer['state']}) has {by_offer[offer['id']]} movements, not {want}")
    if len(movements) != crowd.accepted:
        violations.append(f"{crowd.accepted} accepts were acknowledged, the registry holds {len(movements)} movements")
    ledger = await get("/ledger")
    balances = [b for b in ledger["balances"] if b["participant"] in names]
    paid, earned = sum(b["paid"] for b in balances), sum(b["earned"] for b in balances)
    if abs(paid - earned) > 1e-6 * max(1.0, paid) or any(e["amount"] < 0 for e in ledger["entries"]):
        violations.append(f"the ledger does not balance: paid {paid}, earned {earned}")
    return violations


async def _run_crowd(url: str, admin_key: str, clients: int, rounds: int, progress, server_cpu: Callable[[], float | None],
                     processes: int) -> dict:
    """The clients offer among a crowd of participants they share (`_contend`); the registry's
    invariants are checked after (`crowd_violations`). Clients in several processes each see
    their own process's copy of where tasks run: staler, so they race more."""
    run = uuid.uuid4().hex[:8]

    async def setup(http: httpx.AsyncClient) -> Crowd:
        return await _make_crowd(http, admin_key, run, crowd_size(clients), 5, progress)

    async def after(http: httpx.AsyncClient, crowd: Crowd, parts: list[Played]) -> dict:
        crowd.accepted = sum(part.accepted for part in parts)
        refused = sum((part.refused for part in parts), collections.Counter())
        return {"mode": "contend", "participants": len(crowd.keys), "refused": dict(sorted(refused.items())),
                "crowd_violations": await crowd_violations(http, admin_key, crowd)}

    return await _measured(url, admin_key, clients, rounds, server_cpu, setup, "contend", processes, after)


def bench_registry(url: str, admin_key: str, clients: int, rounds: int, progress=lambda phase, n: None,
                   server_cpu: Callable[[], float | None] = lambda: None, *, contend: bool = False, processes: int = 1) -> dict:
    """Run the benchmark (see the module text) with its clients in `processes` processes."""
    processes = max(1, min(processes, clients))
    return asyncio.run((_run_crowd if contend else _run)(url, admin_key, clients, rounds, progress, server_cpu, processes))
