"""A mixed-queries demo's participant of another query than network monitoring: its input, what
its queried shares were fed, and the plain computation its results are compared with
(`bpm_app.demo.queries.DemoQuery`)."""

from __future__ import annotations

import json
from collections import defaultdict

from bpm.keygroups import groups
from bpm.records import Records, end_mark_us, iso_utc
from bpm_app.demo.queries import DemoQuery

SENSORS = "examples.sensors:query"


def test_the_queried_input_is_what_the_chosen_shares_were_fed_and_its_plain_computation_is_the_query_s(tmp_path, spark):
    sensors = DemoQuery.load(SENSORS)
    fed = sensors.generate(tmp_path / "b.fed.jsonl", seconds=60, rate=20.0, seed=3)
    wire = Records(sensors.query)
    chosen = set(groups("1"))  # half the key groups
    out, end_us = sensors.queried("b", fed, chosen)
    kept = [json.loads(line) for line in out.open()]
    every = [json.loads(line) for line in fed.open()]
    assert 0 < len(kept) < len(every)
    assert all(wire.key_group(wire.parse(r)[1]) in chosen for r in kept)
    newest = max(wire.parse(r)[0] for r in every)
    assert end_us == end_mark_us(newest, 5, 10), "the end mark follows everything fed, as the feeder wrote it"

    got = sensors.reference_results(out, lambda: spark, tmp_path / "reference")
    want: dict[tuple, list[float]] = defaultdict(list)
    for r in kept:  # generated readings come late by less than the lateness: every one counts
        ts_us, (device, temperature) = wire.parse(r)
        want[(device, ts_us // 10_000_000 * 10)].append(temperature)
    assert {(r["device"], r.key[1], r["readings"], r["maximum"]) for r in got} == \
        {(device, iso_utc(start), len(t), max(t)) for (device, start), t in want.items()}
