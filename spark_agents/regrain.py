"""The agent's splits and merges of its own tasks over their key groups (`bpm.negotiation.granularity`).

The state machine asks for a `Split` of a task, or a `Merge` of two halves, both running
at home; the agent carries it out at a window boundary (`spark_agents.broker.source.hand_over`):

1. It reads the split time from its stream (the first window start after the newest
   event it holds) and registers the new tasks with the registry, each with its key groups,
   `from_tasks` and `since_s` at that time. The registry ends the old tasks' input there
   (`until_s`), once, in the same transaction, and from then on refuses to move them.
2. Every tick, a task of its own running here whose record ends where its running query
   does not is restarted from its checkpoint over its ended input: it completes every
   window that starts before the split time; rows from that time on are the new tasks'.
   The new tasks start like any new task, on whichever host the registry names.
3. Once the old task's progress marks on the results stream say that its last window is
   out, the agent retires it in the registry, and its host stops it for good.

Steps 2 and 3, and the registration of a half that is missing, are decided by the
participant's machine (`bpm.agent.regrain`, through `bpm.agent.participant`) from what the
sync read; this class carries them out.

Each step is idempotent and resumes from what the registry and the broker say: an agent
that restarts between steps registers the half of a split it had not registered yet,
restarts the old task over its ended input (its record says where it ends) and retires
it when its windows are out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from bpm.agent import machine
from bpm.agent.regrain import OwnTasksRead, RegisterMissing, Restart, Retire
from bpm.federation.views import key_groups
from bpm.keygroups import halves, merged, parse_location
from bpm.names import task_key
from bpm.negotiation import Task
from bpm.negotiation.granularity import regrained_name
from spark_agents.broker.results import closed_through
from spark_agents.broker.source import InputEnded, hand_over

if TYPE_CHECKING:
    from spark_agents.agent import Agent


class Regrain:
    """One agent's splits and merges, the restarts of the tasks they ended, and their retirement.

    Attributes:
        ends: per task key running here, where the running query's input ends (None: it does not).
        progress: per ending task key, (the results sequence read up to, the newest window end it said is out).
        start_after: per new task key not started yet, the stream's sequence at the split: it
            holds no row of the new task's span, so the task reads after it (an agent that
            restarted meanwhile has forgotten it, and the task reads the stream from its start).
        restarts: task keys stopped to start again here over their input's new end, not started
            yet: the sync starts each from its own checkpoint (not as a failover's take-over,
            even when a failover brought it here).
    """

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.restarts: set[str] = set()
        self.ends: dict[str, int | None] = {}
        self.progress: dict[str, tuple[int, int | None]] = {}
        self.start_after: dict[str, int] = {}

    def split(self, task: Task) -> list[machine.Instruction]:
        record = self._record(task.id)
        return self._hand_over([record], halves(key_groups(record) or ""), "split")

    def merge(self, tasks: tuple[Task, Task]) -> list[machine.Instruction]:
        records = [self._record(t.id) for t in tasks]
        first, second = (key_groups(r) or "" for r in records)
        return self._hand_over(records, [merged(first, second)], "merge")

    def _record(self, task_id: str) -> Mapping:
        found = [t for t in self.agent.seen.tasks if str(t["id"]) == task_id]
        if not found:
            raise LookupError(f"task #{task_id} is not among the tasks read")
        return found[0]

    def _hand_over(self, records: Sequence[Mapping], prefixes: Sequence[str], how: str) -> list[machine.Instruction]:
        """Hand the key groups of `records` over to new tasks over `prefixes`; what the state
        machine asks for next (once the input has ended, it splits and merges no more)."""
        agent = self.agent
        olds = [agent.stream_input(r) for r in records]
        if any(o is None for o in olds):
            raise ValueError(f"tasks {[r['id'] for r in records]} read no broker stream: they have no key groups to hand over")
        align = agent.align_s(task_key(records[0]), records[0].get("query"), records[0].get("params") or {})
        if align is None:
            raise ValueError(f"tasks {[r['id'] for r in records]} run query {records[0].get('query')!r}, which declares no align: its tasks move whole")
        try:
            ended, new = hand_over(olds, prefixes, align)
        except InputEnded as exc:  # not an error: the tasks drain as they are
            agent.decide(machine.InputEnded(agent.clock(), f"no {how} of tasks {[r['id'] for r in records]}: {exc}"))
            return []
        at = ended[0].until_s
        parents = [r["id"] for r in records]
        # The old tasks' queries run on until their restart over the ended input, a tick or
        # more later (17 s on a 0.2-CPU host): their windows from the split time on are the
        # new tasks', and must not reach the output (a run of `bpm demo --scenario split`
        # wrote the window at the split time twice).
        for r in records:
            agent.host.end_output(task_key(r), at)
        made = []
        for source in new:
            with agent.races.lost(f"{how} of tasks {parents}") as lost:
                made.append(self._register(records[0], source.location, source.prefix, parents, at))
            if lost:
                if not made:  # the registry ended nothing: the old tasks go on as they were
                    for r in records:
                        agent.host.end_output(task_key(r), r.get("until_s"))
                return []
            self.start_after[task_key(made[-1])] = source.start_seq
        agent.reads.mark(["task"])
        agent.tasks_changed()
        agent.counts[f"{how}s"] += 1
        names = ", ".join(f"#{t['id']} {t['name']} ({t['input_uri'].rsplit('/', 1)[-1] or 'all'})" for t in made)
        olds_named = ", ".join(f"#{r['id']} {r['name']}" for r in records)
        verb = "split" if how == "split" else "merged"
        agent.note(f"task.{how}", f"{verb} {olds_named} into {names} at {at}: the old task(s) complete the windows before it",
                   report=True, data={"from_tasks": parents, "tasks": [t["id"] for t in made], "at": at})
        return []

    def _register(self, parent: Mapping, location: str, prefix: str, parents: Sequence[int], at: int) -> dict:
        return self.agent.client.register_task(regrained_name(prefix, parents), input_uri=location, params=parent.get("params") or {},
                                               query=parent.get("query"), query_digest=parent.get("query_digest"),
                                               ha_mode=parent.get("ha_mode", "none"), from_tasks=list(parents), since_s=at)

    # Every tick (`Agent.sync`)

    def started(self, key: str, until_s: int | None) -> None:
        self.ends[key] = until_s
        self.start_after.pop(key, None)
        self.restarts.discard(key)

    def stopped(self, key: str) -> None:
        self.ends.pop(key, None)

    def act(self, tasks: Sequence[Mapping]) -> None:
        """What follows the splits and merges of my tasks, decided by the participant's machine
        (`bpm.agent.regrain`) from what the sync read: each instruction carried out on its own."""
        agent = self.agent
        read = OwnTasksRead(tuple(tasks), frozenset(agent.hosting()), dict(self.ends))
        for instruction in agent.machine.handle(read):
            match instruction:
                case RegisterMissing(task, prefixes):
                    agent.guarded(f"complete the split of {task_key(task)}", lambda t=task, p=prefixes: self._register_missing(t, p))
                case Restart():
                    agent.guarded(f"restart {instruction.key}", lambda i=instruction: self._restart(i))
                case Retire(task):
                    if agent.broker is not None:  # its results stream says when its windows are out
                        agent.guarded(f"retire {task_key(task)}", lambda t=task: self._retire(t))

    def _register_missing(self, task: Mapping, prefixes: Sequence[str]) -> None:
        """Register the halves of a split task that are missing: the agent stopped between its
        two registrations."""
        location = parse_location(task["input_uri"])
        for prefix in prefixes:
            made = self._register(task, str(replace(location, prefix=prefix)), prefix, [task["id"]], task["until_s"])
            self.agent.reads.mark(["task"])
            self.agent.note("task.split", f"registered #{made['id']} {made['name']}, the missing half of the split of {task_key(task)}")

    def _restart(self, restart: Restart) -> None:
        """Stop the task as a task that left stops (`Agent.release_all`: in the background once
        the sync has waited a second, so that the loop goes on), but to stay: the sync starts it
        again once stopped, over its input ending at `until_s` (`started` records that end)."""
        agent, key = self.agent, restart.key
        if key not in self.restarts:
            agent.note("task.ending", f"restarting {key} over its input ending at {restart.until_s}: it completes its windows before that")
        self.restarts.add(key)
        agent.release_all([(key, restart.epoch)], leaving=False)

    def _retire(self, task: Mapping) -> None:
        agent, key = self.agent, task_key(task)
        after, closed = self.progress.get(key, (0, None))
        seq, newest = closed_through(agent.broker.connection(), key, after)
        known = [c for c in (closed, newest) if c is not None]
        closed = max(known) if known else None
        self.progress[key] = (seq, closed)
        if closed is None or closed < task["until_s"] * 1_000_000:
            return
        with agent.races.lost(f"retirement of {key}") as lost:
            agent.client.retire_task(task["id"])
        if lost:
            return
        self.progress.pop(key, None)
        agent.reads.mark(["task"])
        agent.counts["tasks_retired"] += 1
        agent.note("task.retired", f"retired {key}: its windows until {task['until_s']} are out")
