"""One participant's decisions behind one front door: events in, instructions out.

`ParticipantMachine.handle` takes every event a participant's decisions follow from and
routes it to the machine that decides on it:

- the mechanism's events (`bpm.agent.machine`: `Tick`, `Period`, `OfferReceived`,
  `Answered`, `TasksChanged`, `InputEnded`, ...) to its `Mechanism`: offers, answers,
  ends, splits and merges;
- what it observed of its tasks' replicas and hosts (`bpm.ha.machine.Observed`) to its
  `HAMachine`: failovers, replicas placed and dropped, the host's duties;
- what it read of its own tasks at a sync (`bpm.agent.regrain.OwnTasksRead`) to the rules
  that follow a split or merge (`bpm.agent.regrain.regrain`): the missing halves
  registered, the old tasks restarted over their ended input and retired.

The live agent (`spark_agents.agent`) and the simulator (`bpm.sim`) both drive a
participant through it, and it keeps one bounded journal of what it was given and what it
answered (`Journal`), with itself as it was before the first event, so that a test replays
a live agent's decisions of all three kinds (`replay`). (The correlation of alerts,
`bpm.dpc.machine`, runs on a thread of its own and keeps no journal.)
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from bpm.agent.machine import Event as MechanismEvent
from bpm.agent.machine import Instruction as MechanismInstruction
from bpm.agent.machine import Mechanism
from bpm.agent.regrain import Instruction as RegrainInstruction
from bpm.agent.regrain import OwnTasksRead, regrain
from bpm.ha.machine import HAMachine, Observed
from bpm.ha.machine import Instruction as HAInstruction

Event = MechanismEvent | Observed | OwnTasksRead
Instruction = MechanismInstruction | HAInstruction | RegrainInstruction


@dataclass
class ParticipantMachine:
    """A participant's mechanism and HA machines and its rules after a split, one entry point
    (see the module text).

    Attributes:
        mechanism: its side of the mechanism.
        ha: its side of high availability.
        journal_length: how many events, each with the instructions it gave, `journal` keeps
            (0: no journal).
        journal: the events handled so far and what they gave, with the machine as it was
            before the first (`Journal`, `replay`).
    """

    mechanism: Mechanism
    ha: HAMachine
    journal_length: int = 0
    journal: Journal | None = field(default=None, repr=False, compare=False)

    @classmethod
    def named(cls, name: str, *, ha_interval_s: float = 2.0, journal_length: int = 0, **settings: object) -> ParticipantMachine:
        """A participant `name`'s machine: the mechanism with `settings` (`Mechanism`'s fields),
        HA with its delta interval."""
        return cls(Mechanism(name, **settings), HAMachine(name, interval_s=ha_interval_s), journal_length)

    @property
    def name(self) -> str:
        return self.mechanism.name

    def handle(self, event: Event) -> list[Instruction]:
        """The one entry point: `event` in, the instructions it calls for out."""
        if self.journal_length and self.journal is None:
            self.journal = Journal(start=copy.deepcopy(self), length=self.journal_length)
        match event:
            case Observed():
                out: list[Instruction] = list(self.ha.handle(event))
            case OwnTasksRead():
                out = list(regrain(self.name, event))
            case _:
                out = list(self.mechanism.handle(event))
        # An observation or a read of its own tasks that calls for nothing changes nothing
        # either (HA remembers only what it asks for; the split's rules remember nothing): a
        # replay would answer it with nothing again, and an agent sends one every tick.
        if self.journal is not None and (out or not isinstance(event, Observed | OwnTasksRead)):
            self.journal.add(event, out)
        return out


# ---- the journal -------------------------------------------------------------------------------


@dataclass
class Journal:
    """What a participant's machine was given and what it answered: `start`, the machine
    before its first event (a copy), then each event with the instructions it gave, the
    newest `length` at most (`dropped` counts those that went). A journal that dropped none
    replays (`replay`): the machines read no clock and do no I/O, so the same events give
    the same instructions, on any machine, in a test. Events are kept as given: the
    caller gives events that it does not change afterwards (frozen, over tuples)."""

    start: ParticipantMachine
    length: int
    entries: deque[tuple[Event, tuple[Instruction, ...]]] = field(init=False)
    dropped: int = 0

    def __post_init__(self) -> None:
        self.entries = deque(maxlen=self.length)

    def add(self, event: Event, instructions: Sequence[Instruction]) -> None:
        self.dropped += len(self.entries) == self.length
        self.entries.append((event, tuple(instructions)))


@dataclass(frozen=True)
class Divergence:
    """The first event at which a replay answered otherwise than the journal says."""

    index: int
    event: Event
    journaled: tuple[Instruction, ...]
    replayed: tuple[Instruction, ...]


def replay(journal: Journal, **changes: object) -> Divergence | None:
    """Feed a copy of the journal's first machine (with `changes` to its mechanism's
    settings, if any: another warm-up, margin or settling time) the journaled events; the
    first event it answers otherwise, or None. ValueError when the journal dropped its
    first events (the machine's state before the ones it kept is unknown)."""
    if journal.dropped:
        raise ValueError(f"the journal dropped its first {journal.dropped} events: it replays only whole")
    machine = copy.deepcopy(journal.start)
    for name, value in changes.items():
        if name not in Mechanism.__dataclass_fields__ or name == "name":
            raise ValueError(f"{name!r} is not a setting of the mechanism")
        setattr(machine.mechanism, name, value)
    for i, (event, journaled) in enumerate(journal.entries):
        replayed = tuple(machine.handle(event))
        if replayed != journaled:
            return Divergence(i, event, journaled, replayed)
    return None
