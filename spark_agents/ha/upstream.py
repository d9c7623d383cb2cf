"""Where a task's host acknowledges its input stream, per mode.

Upstream backup keeps no replica: if the host fails, a new host rebuilds the task's state
by replaying the input from the acknowledged position with a fresh checkpoint. So the
host may acknowledge a position only when no window still open needs the input before it.
After committed batch C, whose watermark was w, every window ending at or before w is
closed and its rows are in the output; a window still open ends after w, so it starts after
w minus one window length, at the oldest at `oldest_open_window_us(w)`. The checkpoint's
own offset log bounds the rows each batch read (`replay_seq`): batch B+1 runs under the
watermark of everything batches up to B read, minus the watermark delay, so none of their
rows is newer than that watermark plus the delay. The sequence batch B read up to is
acknowledged once that bound is before the oldest open window.

The other modes acknowledge what their own restart needs: a task that keeps its checkpoint
(none, and each copy of an active standby) needs the stream after its committed batches;
passive standby needs it after the batch its backup's copy is cut at
(`spark_agents.ha.delta.Cut.position`).
"""

from __future__ import annotations

from pathlib import Path

from bpm.records import MICROS
from spark_agents.checkpoint import processed_seq
from spark_agents.ha.logs import batch_offsets, committed_batch


def oldest_open_window_us(watermark_ms: int, window_s: int) -> int:
    """The start (microseconds) of the oldest window that may still be open under watermark `watermark_ms`.

    Windows are aligned to the epoch. A window ending at or before the watermark is closed;
    one ending exactly at it is kept as open too, so the bound holds whichever side of the
    boundary Spark evicts on.
    """
    window_us = window_s * MICROS
    lower = watermark_ms * 1000 - window_us
    return -(-lower // window_us) * window_us  # the first window start at or after `lower`


def processed_ack_seq(checkpoint_dir: str | Path) -> int | None:
    """The sequence the task's committed batches have read up to (None: nothing committed)."""
    batch = committed_batch(checkpoint_dir)
    return None if batch is None else processed_seq(checkpoint_dir, batch)


def replay_seq(checkpoint_dir: str | Path, window_s: int, delay_s: float) -> int | None:
    """The sequence after which a replay with a fresh checkpoint rebuilds
    every open window (None: no committed batch shows one yet; see the module text)."""
    batch = committed_batch(checkpoint_dir)
    if batch is None:
        return None
    oldest_ms = oldest_open_window_us(batch_offsets(checkpoint_dir, batch).watermark_ms, window_s) // 1000
    for b in range(batch - 1, -1, -1):  # the watermark never moves back: the first that qualifies is the newest
        try:
            newest_row_ms = batch_offsets(checkpoint_dir, b + 1).watermark_ms + delay_s * 1000
        except FileNotFoundError:  # removed by Spark's log maintenance: older batches qualify no better
            return None
        if newest_row_ms < oldest_ms:
            return processed_seq(checkpoint_dir, b)
    return None
