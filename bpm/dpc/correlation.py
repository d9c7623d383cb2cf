"""The cross-participant result: per window, the sources that raise alerts at two or more participants.

One scanner sweeping several organisations' networks raises an alert at each of them, and
no single participant can see that it is one scanner. Each participant that opts in
shares its alerts with its contract partners; a participant's *alerts* for a window are
the source IPs of its `connections` and `ports` rows for that window
(`bpm.zeek.definitions`). A correlated row names a source, its window, and the
participants that saw it alert, when they are at least `min_participants`.

`correlate` is the definition for one window; `plain_correlation` applies it to every
window of every participant's complete results: what the stable output must equal.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from bpm.zeek.definitions import ResultRow, iso_utc, parse_iso_utc

ALERT_KINDS = ("connections", "ports")
MIN_PARTICIPANTS = 2


@dataclass(frozen=True, order=True, slots=True)
class CorrelatedRow:
    """A source that raised alerts at `participants` (sorted, at least two) in one window."""

    window_start: int
    window_end: int
    source: str
    participants: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "window_start": iso_utc(self.window_start),
            "window_end": iso_utc(self.window_end),
            "source": self.source,
            "participants": list(self.participants),
        }

    @classmethod
    def from_json(cls, record: Mapping[str, object]) -> CorrelatedRow:
        participants = record["participants"]
        if not isinstance(participants, list) or not all(isinstance(p, str) for p in participants):
            raise ValueError("participants must be a list of names")
        return cls(
            window_start=parse_iso_utc(str(record["window_start"])),
            window_end=parse_iso_utc(str(record["window_end"])),
            source=str(record["source"]),
            participants=tuple(sorted(participants)),
        )


def alerting_sources(rows: Iterable[ResultRow]) -> dict[tuple[int, int], frozenset[str]]:
    """One participant's alerts: per window (start, end), the sources with an alert row."""
    found: dict[tuple[int, int], set[str]] = defaultdict(set)
    for row in rows:
        if row.kind in ALERT_KINDS:
            found[(row.window_start, row.window_end)].add(row.key)
    return {window: frozenset(sources) for window, sources in found.items()}


def correlate(window: tuple[int, int], alerts: Mapping[str, Iterable[str]], min_participants: int = MIN_PARTICIPANTS) -> frozenset[CorrelatedRow]:
    """The correlated rows of one window from each participant's alerting sources in it."""
    seen: dict[str, list[str]] = defaultdict(list)
    for participant, sources in alerts.items():
        for source in set(sources):
            seen[source].append(participant)
    start, end = window
    return frozenset(
        CorrelatedRow(start, end, source, tuple(sorted(participants)))
        for source, participants in seen.items()
        if len(participants) >= min_participants
    )


def plain_correlation(results: Mapping[str, Iterable[ResultRow]], min_participants: int = MIN_PARTICIPANTS) -> frozenset[CorrelatedRow]:
    """Every window's correlated rows from every participant's complete results."""
    per_window: dict[tuple[int, int], dict[str, frozenset[str]]] = defaultdict(dict)
    for participant, rows in results.items():
        for window, sources in alerting_sources(rows).items():
            per_window[window][participant] = sources
    out: set[CorrelatedRow] = set()
    for window, alerts in per_window.items():
        out |= correlate(window, alerts, min_participants)
    return frozenset(out)
