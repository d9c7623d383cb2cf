"""A step that lost a race with a change the agent had not read yet: the one place that tells
such a step from an error, and handles it.

A step is taken on what the agent last read; by the time it reaches the registry or a
partner, that may no longer be true: the task moved on or its epoch changed, the offer was
answered or withdrawn, the replica was dropped, another agent's failover won. The registry
then refuses with 409, a partner with `Refused`. That is not an error: the agent counts it,
reads again what the step depended on, and its next tick acts on what is now true. Any other
`PermissionError` (a file this agent may not write, say) is an error.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from bpm_http.client import RegistryError


class Refused(PermissionError):
    """A partner refused a step, or this agent a partner's call (the server answers it with
    409), because the registry, as last read, says something else is true now."""


def lost_race(exc: BaseException, also: Collection[int] = ()) -> bool:
    """Whether `exc` says that a step lost a race: a partner refused it, or the registry did
    with 409 (or one of the statuses `also` that the step's caller reads the same way)."""
    return isinstance(exc, Refused) or isinstance(exc, RegistryError) and (exc.status == 409 or exc.status in also)


@dataclass
class Lost:
    """What `Races.lost` caught: true when the step lost its race (`exc` says how)."""

    exc: Exception | None = None

    def __bool__(self) -> bool:
        return self.exc is not None


@dataclass
class Races:
    """The steps of one agent that lost a race.

    Attributes:
        note: records what happened (kind, message), as the agent records everything.
        read_again: marks kinds of what the agent reads to read again before acting on them
            (`bpm.agent.reads.Reads.mark`).
        count: how many steps lost a race so far (`bpm_agent_races_total`).
    """

    note: Callable[[str, str], None]
    read_again: Callable[[Iterable[str]], None]
    count: int = field(default=0)

    @contextmanager
    def lost(self, what: str, *, kind: str = "agent.race", reread: Iterable[str] = ("task", "offer"),
             also: Collection[int] = ()) -> Iterator[Lost]:
        """Run the step in the `with` block; if it loses a race, record it (as `kind`), mark
        `reread` to read again, and go on after the block with the `Lost` it yields true.
        Any other exception passes through."""
        lost = Lost()
        try:
            yield lost
        except (Refused, RegistryError) as exc:
            if not lost_race(exc, also):
                raise
            lost.exc = exc
            self.count += 1
            self.read_again(reread)
            self.note(kind, f"{what}: {exc}; reading again")
