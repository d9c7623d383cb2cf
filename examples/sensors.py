"""Sensor readings: the average, maximum and count of each device's readings per tumbling window.

    bpm query check examples.sensors:query
    bpm pipeline run --query examples.sensors:query --input readings.jsonl --param window_s=30
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from bpm.query import Param, Query


def compute(events, params):
    from pyspark.sql import functions as F

    window = F.window("ts", f"{params.window_s} seconds")
    # Summed as DECIMAL: a sum of doubles depends on the order Spark adds its parts in, and a
    # task moved or replayed adds them in another order than the plain computation does.
    exact = F.col("temperature").cast("decimal(20,6)")
    return events.groupBy(window, "device").agg(
        F.round(F.avg(exact), 6).cast("double").alias("average"), F.max("temperature").alias("maximum"), F.count(F.lit(1)).alias("readings"),
    ).select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), "device", "average", "maximum", "readings")


query = Query(
    name="sensors",
    description="average, maximum and count of readings per device per window",
    schema="ts TIMESTAMP, device STRING, temperature DOUBLE",
    key="device",
    event_time="ts",
    lateness="lateness_s",
    compute=compute,
    result_key=("device", "window_start"),
    result_time="window_end",
    align="window_s",
    params={
        "window_s": Param(int, 60, "length of the tumbling window, seconds", minimum=1),
        "lateness_s": Param(int, 30, "how late a reading may come, seconds", minimum=0),
    },
)


def generate(seconds: int = 600, devices: int = 50, rate: float = 20.0, start: float = 1_700_000_000.0, seed: int = 0) -> Iterator[dict]:
    """Readings of `devices` devices for `seconds`, `rate` a second in all, in time order, a few of them late."""
    rng = random.Random(seed)
    base = {f"sensor-{k:03d}": rng.uniform(15.0, 25.0) for k in range(devices)}
    for n in range(int(seconds * rate)):
        ts = start + n / rate
        if rng.random() < 0.02:
            ts -= rng.uniform(0.0, 20.0)  # a reading that comes late, within the lateness
        device = rng.choice(list(base))
        yield {"ts": round(ts, 3), "device": device, "temperature": round(base[device] + rng.gauss(0.0, 2.0), 2)}
