"""The cross-participant result: per window, the subjects that raise alerts at two or more participants.

One scanner sweeping several organisations' networks raises an alert at each of them, and
no single participant can see that it is one scanner. Each participant that opts in
shares its alerts with its contract partners; a participant's *alerts* for a window (a
grain of its query, `bpm.query.Query.align`) are the subjects its query's `alert` finds in
the results final at that window's end (for the network-monitoring query, the sources of
its connection and port alerts). A correlated row names a subject (`source`), its window,
and the participants that saw it alert, when they are at least `min_participants`.

`correlate` is the definition for one window; `plain_correlation` applies it to every
window of every participant's complete results: what the stable output must equal.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bpm.records import iso_utc, parse_iso_utc
from bpm.results import Result

MIN_PARTICIPANTS = 2
# A query's `alert`: the subject a result row raises an alert on, or None.
Alert = Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True, order=True, slots=True)
class CorrelatedRow:
    """A subject (`source`) that raised alerts at `participants` (sorted, at least two) in one window."""

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


def alert_of(result: Result, alert: Alert, window_s: int) -> tuple[tuple[int, int], str] | None:
    """The window (start, end: the grain that ends when `result` is final) and the subject of
    the alert `result` raises, or None when it raises none."""
    subject = alert(dict(result.row))
    if subject is None:
        return None
    end = result.time_us // 1_000_000
    return (end - window_s, end), str(subject)


def alerting_sources(results: Iterable[Result], alert: Alert, window_s: int) -> dict[tuple[int, int], frozenset[str]]:
    """One participant's alerts: per window (start, end), the subjects its results alert on."""
    found: dict[tuple[int, int], set[str]] = defaultdict(set)
    for result in results:
        raised = alert_of(result, alert, window_s)
        if raised is not None:
            found[raised[0]].add(raised[1])
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


def plain_correlation(results: Mapping[str, Iterable[Result]], alert: Alert, window_s: int,
                      min_participants: int = MIN_PARTICIPANTS) -> frozenset[CorrelatedRow]:
    """Every window's correlated rows from every participant's complete results."""
    per_window: dict[tuple[int, int], dict[str, frozenset[str]]] = defaultdict(dict)
    for participant, rows in results.items():
        for window, sources in alerting_sources(rows, alert, window_s).items():
            per_window[window][participant] = sources
    out: set[CorrelatedRow] = set()
    for window, alerts in per_window.items():
        out |= correlate(window, alerts, min_participants)
    return frozenset(out)
