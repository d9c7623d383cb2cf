"""A generator of realistic Zeek connection summaries for load and tests.

The traffic has the shapes the monitoring query looks for: source activity is heavy-tailed
(a few sources make most connections, some exceed the connection threshold), scanners touch
many ports on many hosts, and busy /24 networks hold several scanners at once. Records come
out in the order Zeek writes them, by connection end, so timestamps (connection starts) are
slightly out of order, and a few long connections arrive very late.
"""

from __future__ import annotations

import heapq
import ipaddress
import itertools
import random
import string
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from bpm.zeek.conn import Conn

_SERVICES = ((443, "tcp", "ssl"), (80, "tcp", "http"), (53, "udp", "dns"), (22, "tcp", "ssh"),
             (123, "udp", "ntp"), (25, "tcp", "smtp"), (3389, "tcp", "-"), (8080, "tcp", "http"))
_SERVICE_CUM_WEIGHTS = tuple(itertools.accumulate((50, 20, 20, 3, 3, 2, 1, 1)))


@dataclass(frozen=True)
class TrafficProfile:
    """The shape of generated traffic.

    Attributes:
        start_ts: timestamp of the first connection (epoch seconds).
        duration_s: length of the generated period.
        rate: mean connections per second over all ordinary sources.
        sources: number of ordinary sources (heavy-tailed activity, Pareto with `tail`).
        tail: Pareto shape of source activity; smaller means heavier tail.
        scanners: number of port scanners; each probes `scan_ports` ports per minute.
        scan_ports: ports a scanner touches per minute.
        busy_prefixes: /24 networks that hold the scanners (several scanners share a /24).
        late_fraction: share of connections that are long-lived and arrive minutes late.
        shared_scanners: further scanners whose addresses come from `shared_seed` alone, so
            that participants generating with the same `shared_seed` are probed by the same
            sources (one scanner sweeping several organisations' networks); each participant's
            own seed still decides when they probe and whom.
        shared_seed: the seed of the shared scanners' addresses.
    """

    start_ts: float = 1_717_200_000.0
    duration_s: float = 300.0
    rate: float = 200.0
    sources: int = 400
    tail: float = 1.1
    scanners: int = 6
    scan_ports: int = 40
    busy_prefixes: int = 2
    late_fraction: float = 0.002
    shared_scanners: int = 0
    shared_seed: int = 0


def _uid(rng: random.Random) -> str:
    return "C" + "".join(rng.choices(string.ascii_letters + string.digits, k=17))


def _extra(rng: random.Random, service: str, duration: float, scan: bool) -> tuple[tuple[str, str], ...]:
    if scan:
        state, history, ob, rb, op, rp = rng.choice((("S0", "S", 0, 0, 1, 0), ("REJ", "Sr", 0, 0, 1, 1)))
    else:
        ob, rb = int(rng.paretovariate(1.3) * 300), int(rng.paretovariate(1.2) * 1500)
        state, history, op, rp = "SF", "ShADadFf", 3 + ob // 1400, 3 + rb // 1400
    return (
        ("uid", _uid(rng)), ("service", service), ("duration", f"{duration:.6f}"), ("orig_bytes", str(ob)),
        ("resp_bytes", str(rb)), ("conn_state", state), ("local_orig", "T"), ("local_resp", "F"),
        ("missed_bytes", "0"), ("history", history), ("orig_pkts", str(op)), ("orig_ip_bytes", str(ob + 40 * op)),
        ("resp_pkts", str(rp)), ("resp_ip_bytes", str(rb + 40 * rp)), ("tunnel_parents", "-"),
    )


def _connections(profile: TrafficProfile, rng: random.Random) -> Iterator[tuple[float, Conn]]:
    """Connections with their end time (when Zeek logs them), in start order per generator stream."""
    ordinary = [f"10.{rng.randrange(1, 40)}.{rng.randrange(256)}.{rng.randrange(1, 255)}" for _ in range(profile.sources)]
    # Cumulative weights once: `choices` with plain weights would add them up at every connection.
    weights = list(itertools.accumulate(rng.paretovariate(profile.tail) for _ in ordinary))
    servers = [f"{rng.randrange(11, 223)}.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}" for _ in range(60)]
    busy = [f"172.16.{rng.randrange(256)}" for _ in range(max(1, profile.busy_prefixes))]
    scanners = [f"{busy[i % len(busy)]}.{rng.randrange(1, 255)}" for i in range(profile.scanners)]
    shared = random.Random(profile.shared_seed)
    scanners += [f"172.31.{shared.randrange(256)}.{shared.randrange(1, 255)}" for _ in range(profile.shared_scanners)]
    end = profile.start_ts + profile.duration_s
    ts = profile.start_ts
    while profile.rate > 0:
        ts += rng.expovariate(profile.rate)
        if ts >= end:
            break
        port, proto, service = rng.choices(_SERVICES, cum_weights=_SERVICE_CUM_WEIGHTS)[0]
        late = rng.random() < profile.late_fraction
        duration = rng.uniform(300, 900) if late else rng.expovariate(2.0)
        src = rng.choices(ordinary, cum_weights=weights)[0]
        conn = Conn(ts, src, rng.randrange(1024, 65536), rng.choice(servers), port, proto,
                    _extra(rng, service, duration, scan=False))
        yield ts + duration, conn
    scan_rate = profile.scan_ports / 60.0
    for scanner in scanners:
        ts = profile.start_ts + rng.uniform(0, 30)
        while scan_rate > 0:
            ts += rng.expovariate(scan_rate)
            if ts >= end:
                break
            target = f"10.{rng.randrange(1, 40)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
            conn = Conn(ts, scanner, rng.randrange(1024, 65536), target, rng.randrange(1, 10000), "tcp",
                        _extra(rng, "-", 0.0, scan=True))
            yield ts, conn


def generate(profile: TrafficProfile = TrafficProfile(), seed: int = 0) -> list[Conn]:
    """Connections in the order Zeek would log them (by connection end), deterministic for a seed."""
    rng = random.Random(seed)
    heap = [(end, i, conn) for i, (end, conn) in enumerate(_connections(profile, rng))]
    heapq.heapify(heap)
    return [heapq.heappop(heap)[2] for _ in range(len(heap))]


def amplified(conns: Iterable[Conn], copies: int) -> Iterator[Conn]:
    """Each connection `copies` times; copy i gets its source moved to another address space
    (IPv4: first octet + 17·i mod 256; IPv6: + i·2^80) so load multiplies while each copy keeps
    the per-source shape of the original."""
    if copies < 1:
        raise ValueError("copies must be at least 1")
    for conn in conns:
        yield conn
        ip = ipaddress.ip_address(conn.orig_h)
        for i in range(1, copies):
            if ip.version == 4:
                octets = ip.packed
                moved = ipaddress.IPv4Address(bytes([(octets[0] + 17 * i) % 256]) + octets[1:])
            else:
                moved = ipaddress.IPv6Address((int(ip) + (i << 80)) % (1 << 128))
            yield Conn(conn.ts, moved.compressed, conn.orig_p, conn.resp_h, conn.resp_p, conn.proto, conn.extra)
