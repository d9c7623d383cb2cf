"""What follows a split or merge of a participant's own tasks, decided from what it read.

A split or merge (`bpm.agent.machine.Split`, `Merge`) registers new tasks over the old
tasks' key groups from a time on, and the registry ends the old tasks' input there
(`until_s`). From then on, at every read of its tasks (`OwnTasksRead`), the participant
decides for each of its own tasks that ended so and still runs at home:

- `RegisterMissing`: the halves of a split that are not registered yet (the agent stopped
  between its two registrations; a merge registers its one task with both ends at once);
- `Restart`: the running query's input does not end where the record says: stop it and
  start it again from its checkpoint over its ended input, so that it completes every
  window before `until_s` and no other;
- `Retire`: it runs over its ended input: retire it once its last window is out (which its
  results stream says: the effects read it).

Pure, like the rest of `bpm.agent`: events in, instructions out, every step idempotent, so
that an agent that restarts between two steps resumes from what the registry says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bpm.federation.views import key_groups
from bpm.keygroups import BITS, halves
from bpm.names import task_key


@dataclass(frozen=True, slots=True)
class OwnTasksRead:
    """What the participant read at a sync: the task records it sees (the registry's), the
    keys of the tasks running here, and where each running query's input ends (per task
    key; None: it does not end)."""

    tasks: Sequence[Mapping]
    running: frozenset[str]
    ends: Mapping[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RegisterMissing:
    """Register the new tasks over `prefixes` that the split of `task` (a record) is missing."""

    task: Mapping
    prefixes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Restart:
    """Stop task `key` (at `epoch`) to start it again over its input ending at `until_s`."""

    key: str
    epoch: int
    until_s: int


@dataclass(frozen=True, slots=True)
class Retire:
    """Retire `task` (a record) once its windows until `until_s` are out."""

    task: Mapping
    until_s: int


Instruction = RegisterMissing | Restart | Retire


def regrain(me: str, read: OwnTasksRead) -> list[Instruction]:
    """What `me` does next for each of its own tasks that a split or merge ended (see the
    module text), in the order of `read.tasks`."""
    out: list[Instruction] = []
    for t in read.tasks:
        key, until = task_key(t), t.get("until_s")
        if t["origin"] != me or t["host"] != me or until is None or t.get("retired") or key not in read.running:
            continue
        missing = missing_halves(t, read.tasks)
        if missing:
            out.append(RegisterMissing(t, missing))
        out.append(Restart(key, t["epoch"], until) if read.ends.get(key, -1) != until else Retire(t, until))
    return out


def missing_halves(task: Mapping, tasks: Sequence[Mapping]) -> tuple[str, ...]:
    """The halves of `task`'s key groups that no task registered from it covers: none when a
    merge made its successor (one task from two), else those of a split not registered yet."""
    children = [t for t in tasks if task["id"] in (t.get("from_tasks") or ())]
    prefix = key_groups(task)
    if any(len(t["from_tasks"]) > 1 for t in children) or prefix is None or len(prefix) == BITS:
        return ()  # a merge's, or a task that never split (it reads no key groups, or one)
    return tuple(sorted(set(halves(prefix)) - {key_groups(t) for t in children}))
