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
