from collections import Counter

from bpm.zeek.definitions import QueryParams
from bpm.zeek.generator import TrafficProfile, generate
from bpm.zeek.reference import compute

PROFILE = TrafficProfile(duration_s=180, rate=100, sources=200)


def test_generation_is_deterministic_per_seed():
    assert generate(PROFILE, seed=5) == generate(PROFILE, seed=5)
    assert generate(PROFILE, seed=5) != generate(PROFILE, seed=6)


def test_traffic_has_heavy_tailed_sources_scanners_and_busy_prefixes():
    conns = generate(PROFILE, seed=1)
    per_source = Counter(c.orig_h for c in conns)
    top = sum(n for _, n in per_source.most_common(len(per_source) // 20))
    assert top > 0.3 * len(conns), "the busiest 5% of sources should carry a large share"
    rows = compute(conns, QueryParams())
    kinds = Counter(r.kind for r in rows)
    assert kinds["connections"] > 0 and kinds["ports"] >= PROFILE.scanners
    assert max(r.value for r in rows if r.kind == "prefix") >= 2, "several scanners share a /24"


def test_records_come_in_log_order_so_some_timestamps_go_backwards():
    conns = generate(PROFILE, seed=2)
    assert all(PROFILE.start_ts <= c.ts < PROFILE.start_ts + PROFILE.duration_s for c in conns)
    backwards = sum(1 for a, b in zip(conns, conns[1:]) if b.ts < a.ts)
    assert 0 < backwards < len(conns) / 2


def test_shared_scanners_probe_every_participant_that_shares_their_seed_and_no_other():
    profile = TrafficProfile(duration_s=120, rate=20, sources=50, scanners=1, shared_scanners=2, shared_seed=7)
    params = QueryParams(window_s=10, min_connections=1000, min_ports=5, lateness_s=5)

    def scanners(p, seed):
        return {r.key for r in compute(generate(p, seed), params) if r.kind == "ports"}

    a, b = scanners(profile, 1), scanners(profile, 2)
    shared = a & b
    assert len(shared) == 2 and all(s.startswith("172.31.") for s in shared), (a, b)
    other = scanners(TrafficProfile(duration_s=120, rate=20, sources=50, scanners=1, shared_scanners=2, shared_seed=8), 2)
    assert not other & shared, "another shared seed: other sources"
    plain = generate(TrafficProfile(duration_s=120, rate=20, sources=50, scanners=1), 1)
    assert plain == generate(TrafficProfile(duration_s=120, rate=20, sources=50, scanners=1, shared_seed=7), 1), "no shared scanners: as before"
