"""Click sessions: per user, the sessions of clicks no more than a gap apart, with their clicks and pages.

A session ends `gap_s` after its last click, so sessions have no common grain of event time:
the query's tasks move and fail over, but do not split (it declares no `align`).

    bpm query check examples.sessions:query
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from bpm.query import Param, Query


def compute(events, params):
    from pyspark.sql import functions as F

    session = F.session_window("ts", f"{params.gap_s} seconds")
    return events.groupBy(session, "user").agg(F.count(F.lit(1)).alias("clicks"), F.size(F.collect_set("page")).alias("pages")).select(
        "user", F.col("session_window.start").alias("session_start"), F.col("session_window.end").alias("session_end"), "clicks", "pages")


query = Query(
    name="sessions",
    description="click sessions per user: start, end, clicks and pages",
    schema="ts TIMESTAMP, user STRING, page STRING",
    key="user",
    event_time="ts",
    lateness="lateness_s",
    compute=compute,
    result_key=("user", "session_start"),
    result_time="session_end",
    params={
        "gap_s": Param(int, 30, "a session ends after this many seconds without a click", minimum=1),
        "lateness_s": Param(int, 10, "how late a click may come, seconds", minimum=0),
    },
)


def generate(seconds: int = 600, users: int = 40, rate: float = 10.0, start: float = 1_700_000_000.0, seed: int = 0) -> Iterator[dict]:
    """Clicks of `users` users for `seconds`, `rate` a second in all, in bursts (each user is active now and then)."""
    rng = random.Random(seed)
    names = [f"user{k:03d}" for k in range(users)]
    pages = [f"/page/{k}" for k in range(25)]
    active = set(rng.sample(names, max(1, users // 4)))
    for n in range(int(seconds * rate)):
        if rng.random() < 0.01:  # now and then a user leaves and another comes
            active.discard(rng.choice(sorted(active)))
            active.add(rng.choice(names))
        yield {"ts": round(start + n / rate, 3), "user": rng.choice(sorted(active)), "page": rng.choice(pages)}
