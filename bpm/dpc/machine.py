"""Delay, Process and Correct for the correlated result, as a state machine: events in, instructions out.

After Borealis' DPC (Balazinska et al., SIGMOD 2005): a window's result waits for every
participant's alerts at most `bound_s` after the first of them arrived (the availability
bound); when some are still missing then, it is computed from what arrived and published
as *tentative*. Every later arrival that changes the rows publishes a new tentative
version; once every participant's final alerts are there, the window is published
*stable*, and never again. Each version says what it adds and what it retracts against
the version before, so a consumer that applies them in order holds the window's current
rows (`CorrelatedView`), and once stable exactly what `bpm.dpc.correlation.correlate`
gives over every participant's alerts.

A correlator that restarts resumes from what it published (`Correlator.resume`, the
versions read back from its output stream): stable windows stay stable, tentative ones go on
from their last version and rows, so the alerts it reads again publish only what changed.

Corrections are checkpoint/redo at the granularity of one window: a window's state is the
alerts received for it (its checkpoint is the empty window), and a correction recomputes
the window from them and publishes the difference with what was published. Windows are
independent, so nothing outside the window needs undoing, and what is kept per open
window is one set of sources per participant.

No I/O, no clock: times come in with the events (`spark_agents.correlation` drives it
live, tests and `bpm bench partition` step it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from bpm.dpc.correlation import MIN_PARTICIPANTS, CorrelatedRow, correlate

Window = tuple[int, int]

# ---- events ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Alerts:
    """`participant`'s alerting sources in `window`, as of `at`; `final` once its window is closed."""

    participant: str
    window: Window
    sources: frozenset[str]
    at: float
    final: bool = True


@dataclass(frozen=True, slots=True)
class Tick:
    at: float


@dataclass(frozen=True, slots=True)
class Members:
    """The participants whose alerts the result needs from `at` on (this one and its sharing partners)."""

    participants: frozenset[str]
    at: float


Event = Alerts | Tick | Members

# ---- instructions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Publish:
    """Version `version` of `window`'s rows: what it adds and retracts against the version before.

    Attributes:
        stable: every participant's final alerts are in; no version follows.
        missing: participants whose final alerts were not in (empty when stable).
        due_at: when the window's first alerts arrived (the availability bound counts from here).
        at: when this version was decided.
    """

    window: Window
    version: int
    stable: bool
    added: tuple[CorrelatedRow, ...]
    retracted: tuple[CorrelatedRow, ...]
    missing: tuple[str, ...]
    due_at: float
    at: float


@dataclass(frozen=True, slots=True)
class Ignored:
    """Alerts that change nothing, and why (recorded, not published)."""

    participant: str
    window: Window
    why: str


Instruction = Publish | Ignored

# ---- the machine -------------------------------------------------------------------------------


@dataclass
class OpenWindow:
    """A window not stable yet.

    Attributes:
        due_at: when its first alerts arrived.
        needs: the participants whose final alerts make it stable.
        inputs: each participant's alerting sources received so far.
        final: participants whose alerts for it are final.
        rows: the rows published so far (None: nothing published yet).
        version: the last version published (0: none).
        hold_until: a resumed window publishes no tentative correction before this (its alerts
            are read again first); None: not resumed, or past it.
    """

    due_at: float
    needs: frozenset[str]
    inputs: dict[str, frozenset[str]] = field(default_factory=dict)
    final: set[str] = field(default_factory=set)
    rows: frozenset[CorrelatedRow] | None = None
    version: int = 0
    hold_until: float | None = None

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(sorted(self.needs - self.final))


@dataclass
class Correlator:
    """One participant's correlated result between events.

    Attributes:
        participants: whose alerts a window needs (this participant and its partners that share).
        bound_s: the availability bound: how long a window waits for missing alerts before
            it is published tentative.
        min_participants: how many participants must see a source alert for a row.
        keep_stable: how many stable windows are remembered, so that alerts arriving again
            for one (a partner's replay) are ignored rather than opening it anew.
        max_open: how many windows may be open at once; alerts that would open one more are
            ignored (a partner cannot fill the memory with windows nobody else closes).
        open: windows not stable yet.
        stable: windows published stable, with their last version.
        started: the first window each participant shared (its alerts arrive in order):
            earlier windows do not wait for it.
        forgotten: the newest stable window no longer remembered (`keep_stable`): alerts for
            it or an older one are ignored, as for a stable window.
    """

    participants: frozenset[str]
    bound_s: float = 10.0
    min_participants: int = MIN_PARTICIPANTS
    keep_stable: int = 10_000
    max_open: int = 10_000
    open: dict[Window, OpenWindow] = field(default_factory=dict)
    stable: dict[Window, int] = field(default_factory=dict)
    started: dict[str, Window] = field(default_factory=dict)
    forgotten: Window | None = None

    def __post_init__(self) -> None:
        if self.bound_s < 0:
            raise ValueError("the availability bound must not be negative")

    def handle(self, event: Event) -> list[Instruction]:
        match event:
            case Alerts():
                return self._alerts(event)
            case Tick(at):
                return self._tick(at)
            case Members(participants, at):
                return self._members(participants, at)
        raise TypeError(f"not an event: {event!r}")

    def next_due(self) -> float | None:
        """When the next unpublished window reaches its bound (None: none waits)."""
        waiting = [w.due_at + self.bound_s for w in self.open.values() if w.rows is None]
        waiting += [w.hold_until for w in self.open.values() if w.hold_until is not None]
        return min(waiting, default=None)

    def resume(self, published: Iterable[Publish], at: float) -> None:
        """Go on from the versions published before a restart, in the order published:
        stable windows stay stable (their alerts are ignored if they come again); a tentative
        window is open again at its last version and rows, needing every participant, and
        publishes a tentative correction only from `bound_s` after `at` (time for its alerts
        to be read again), its stable version as soon as they are all in."""
        view = CorrelatedView()
        due: dict[Window, float] = {}
        for publish in published:
            if view.apply(publish):
                due.setdefault(publish.window, publish.due_at)
        for window in sorted(view.versions):
            if window in view.stable:
                self.open.pop(window, None)
                self._remember_stable(window, view.versions[window])
            else:
                self.open[window] = OpenWindow(due_at=due[window], needs=self.participants, rows=frozenset(view.rows[window]),
                                               version=view.versions[window], hold_until=at + self.bound_s)

    def _alerts(self, event: Alerts) -> list[Instruction]:
        window = event.window
        if window in self.stable or (self.forgotten is not None and window <= self.forgotten):
            return [Ignored(event.participant, window, "the window is stable")]
        out: list[Instruction] = []
        if event.participant in self.participants and event.participant not in self.started:
            out = self._starts(event.participant, window, event.at)
        w = self.open.get(window)
        if w is None:
            if event.participant not in self.participants:
                return [Ignored(event.participant, window, "not a participant of the result")]
            if len(self.open) >= self.max_open:
                return out + [Ignored(event.participant, window, f"{self.max_open} windows are open already")]
            needs = frozenset(p for p in self.participants if p not in self.started or self.started[p] <= window)
            w = self.open[window] = OpenWindow(due_at=event.at, needs=needs)
        if event.participant not in w.needs:
            return [Ignored(event.participant, window, "not a participant of the result")]
        if event.participant in w.final:
            return [Ignored(event.participant, window, "its alerts for the window are final")]
        w.inputs[event.participant] = frozenset(event.sources)
        if event.final:
            w.final.add(event.participant)
        if w.final >= w.needs:
            return out + [self._publish(window, event.at)]
        if w.rows is not None and w.hold_until is None and self._rows(window, w) != w.rows:
            return out + [self._publish(window, event.at)]  # a tentative window corrected while still tentative
        return out

    def _tick(self, at: float) -> list[Instruction]:
        """Windows at their bound with alerts still missing: published tentative (once: later
        versions follow arrivals). A participant whose stream holds nothing yet is waited
        for as one cut off: it may yet share the window (its tasks slow to close it), and a
        stable version is never corrected."""
        out = []
        for window, w in sorted(self.open.items()):
            if w.hold_until is not None and at >= w.hold_until:
                w.hold_until = None  # resumed: what was read again by now corrects it
                if self._rows(window, w) != w.rows:
                    out.append(self._publish(window, at))
                continue
            if at < w.due_at + self.bound_s:
                continue
            if w.rows is None:
                out.append(self._publish(window, at))
        return out

    def _starts(self, participant: str, first: Window, at: float) -> list[Instruction]:
        """`participant` shares from window `first` on: open windows before it stop waiting for it."""
        self.started[participant] = first
        out = []
        for window, w in sorted(self.open.items()):
            if window < first and participant in w.needs and participant not in w.inputs:
                w.needs = w.needs - {participant}
                if w.final >= w.needs:
                    out.append(self._publish(window, at))
        return out

    def _members(self, participants: frozenset[str], at: float) -> list[Instruction]:
        """New windows need `participants`; open ones stop waiting for those who left."""
        self.participants = frozenset(participants)
        out: list[Instruction] = []
        for window, w in sorted(self.open.items()):
            w.needs = w.needs & self.participants
            for gone in set(w.inputs) - w.needs:
                del w.inputs[gone]
            w.final &= w.needs
            if w.final >= w.needs:
                out.append(self._publish(window, at))
        return out

    def _rows(self, window: Window, w: OpenWindow) -> frozenset[CorrelatedRow]:
        return correlate(window, w.inputs, self.min_participants)

    def _publish(self, window: Window, at: float) -> Publish:
        w = self.open[window]
        rows = self._rows(window, w)
        before = w.rows or frozenset()
        stable = w.final >= w.needs
        w.version += 1
        w.rows = rows
        out = Publish(window, w.version, stable, tuple(sorted(rows - before)), tuple(sorted(before - rows)),
                      () if stable else w.missing, w.due_at, at)
        if stable:
            del self.open[window]
            self._remember_stable(window, w.version)
        return out

    def _remember_stable(self, window: Window, version: int) -> None:
        self.stable[window] = version
        while len(self.stable) > self.keep_stable:
            oldest = min(self.stable)
            del self.stable[oldest]
            self.forgotten = max(oldest, self.forgotten) if self.forgotten is not None else oldest


@dataclass
class CorrelatedView:
    """A consumer's view of the correlated result: versions applied in order, per window.

    Attributes:
        rows: each window's current rows.
        versions: each window's last version applied.
        stable: windows whose stable version was applied.
    """

    rows: dict[Window, set[CorrelatedRow]] = field(default_factory=dict)
    versions: dict[Window, int] = field(default_factory=dict)
    stable: set[Window] = field(default_factory=set)

    def apply(self, publish: Publish) -> bool:
        """Apply one version; False when it was applied before (a redelivery). Raises on a gap."""
        last = self.versions.get(publish.window, 0)
        if publish.version <= last:
            return False
        if publish.version != last + 1:
            raise ValueError(f"window {publish.window}: version {publish.version} after {last}")
        rows = self.rows.setdefault(publish.window, set())
        missing = set(publish.retracted) - rows
        if missing:
            raise ValueError(f"window {publish.window}: version {publish.version} retracts rows it does not hold")
        rows -= set(publish.retracted)
        rows |= set(publish.added)
        self.versions[publish.window] = publish.version
        if publish.stable:
            self.stable.add(publish.window)
        return True

    def stable_rows(self) -> frozenset[CorrelatedRow]:
        return frozenset(row for window in self.stable for row in self.rows[window])

    def tentative_windows(self) -> set[Window]:
        return set(self.versions) - self.stable
