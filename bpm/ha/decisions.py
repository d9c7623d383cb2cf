"""High availability's decisions: which mode applies, who takes a task over, where to repair.

Pure functions of what the registry reports (modes, replicas, liveness): no I/O, no
clock. The registry enforces the rules (fencing by epoch, one winner per failover); these
decide what a participant asks it for, in the live agents and in the simulator alike.

Detection is the heartbeat timeout alone: a host the registry calls `suspected` (silent
past the timeout) counts as failed, with no consensus round, so failover starts as soon as
anyone can notice. A host that was only slow comes back fenced: its epoch is older than
the task's, so its writes are refused and it sees it no longer hosts the task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

HA_MODES = ("none", "upstream_backup", "passive_standby", "active_standby")
PRECISE_MODES = HA_MODES[1:]
# Modes that keep a replica at a second participant; only these are repaired.
REPLICATED_MODES = ("passive_standby", "active_standby")

_FAILED = frozenset({"suspected", "failed"})


def _check_mode(mode: str) -> str:
    if mode not in HA_MODES:
        raise ValueError(f"unknown HA mode {mode!r}; one of {', '.join(HA_MODES)}")
    return mode


def effective_mode(task_mode: str, contract_mode: str | None) -> str:
    """The task's own mode, unless it is "none" and the contract under which it moved asks for one.

    A task's own choice wins because its origin knows the query best; a contract's mode is
    the default the two partners agreed for everything moved between them.
    """
    _check_mode(task_mode)
    if task_mode != "none" or contract_mode is None:
        return task_mode
    return _check_mode(contract_mode)


def task_mode(own: str, *, movement_state: str | None = None, contract_mode: str | None = None,
              failover_mode: str | None = None, ended_too: bool = False) -> str:
    """A task's HA mode now, the one rule the registry, the agents and the simulator share.

    A task that a failover put where it is keeps the failover's mode (`failover_mode`: the
    mode of its newest failover, if the task has not changed epoch since). Otherwise its
    own mode, or (`effective_mode`) the mode `contract_mode` of the contract its newest
    movement ran under, while that movement runs or after it failed: once it ended
    normally the task is home again. With `ended_too` an ended movement counts as well (a
    task whose movement ended while its host failed restarts from what that mode kept).
    """
    if failover_mode is not None:
        return _check_mode(failover_mode)
    applies = movement_state is not None and (ended_too or movement_state != "ended")
    return effective_mode(own, contract_mode if applies else None)


def recovery(mode: str, *, standby_here: bool) -> str:
    """How a new host recovers a task failed over to it under `mode`.

    Active standby without a replica running here (the origin took the task as the
    fallback) rebuilds by replaying the retained stream, as upstream backup does; every
    other mode recovers as itself.
    """
    _check_mode(mode)
    return "upstream_backup" if mode == "active_standby" and not standby_here else mode


def is_failed(status: str) -> bool:
    """Whether a participant's liveness (new|alive|suspected|failed) counts as failed.

    Suspected counts: waiting for `failed` (twice the timeout) would double detection
    time, and fencing makes a wrong guess safe.
    """
    return status in _FAILED


def _partner_failed(contract, status: Mapping[str, str]) -> bool:
    """Whether `contract`'s partner counts as failed; one whose liveness is unknown counts as live."""
    return is_failed(status.get(contract.partner, "alive"))


def with_live_partners(contracts: Sequence, status: Mapping[str, str]) -> tuple:
    """The contracts (each with a `partner`) whose partner does not count as failed: an offer
    to a failed partner would wait for an answer that cannot come."""
    return tuple(c for c in contracts if not _partner_failed(c, status))


def failed_partners(contracts: Sequence, status: Mapping[str, str]) -> tuple[str, ...]:
    """The partners of `contracts` that count as failed: those `with_live_partners` leaves out."""
    return tuple(sorted({c.partner for c in contracts if _partner_failed(c, status)}))


def _live(participant: str, host: str, status: Mapping[str, str]) -> bool:
    return participant != host and status.get(participant) == "alive"


def _live_holders(replicas: Sequence[Mapping], role: str, host: str, status: Mapping[str, str]) -> list[str]:
    """Live holders of active replicas of `role`, the most advanced first (by `position` when given)."""
    held = [
        r
        for r in replicas
        if r["role"] == role and r["state"] == "active" and _live(r["participant"], host, status)
    ]
    # sorted() is stable: among equal positions the caller's order (the registry's: oldest first) stays.
    held = sorted(held, key=lambda r: -(r.get("position") if r.get("position") is not None else -1))
    return [r["participant"] for r in held]


def failover_target(
    *,
    mode: str,
    origin: str,
    host: str,
    replicas: Sequence[Mapping],
    status: Mapping[str, str],
) -> str | None:
    """Who takes the task over from its failed `host`, or None when no live participant can.

    - active_standby: a live holder of an active-standby replica: its copy already runs,
      so its output takes over at once.
    - passive_standby: the live holder of the backup (a passive-standby replica, by
      default at the origin): it restarts from the last copied checkpoint and replays.
    - upstream_backup and none: the origin, which owns the input and rebuilds by replay
      (or, for none, restarts from the newest input).
    Any mode falls back to the origin when it is live and not the failed host.

    `replicas` are dicts with `participant`, `state`, `role` (and optionally `position`,
    used to prefer the replica with the newest copy); `status` maps participant to liveness.
    """
    _check_mode(mode)
    if mode in REPLICATED_MODES:
        holders = _live_holders(replicas, mode, host, status)
        if holders:
            return holders[0]
    return origin if _live(origin, host, status) else None


def repair_target(
    *,
    mode: str,
    origin: str,
    host: str,
    replicas: Sequence[Mapping],
    status: Mapping[str, str],
    candidates: Sequence[str],
) -> str | None:
    """A live participant to hold a new replica when the task has none left, else None.

    Only the replicated modes (active and passive standby) are repaired; the level is
    restored as long as one active replica lives at a participant other than the host.
    The origin comes first (it owns the task and, for passive standby, is the default
    backup), then `candidates` in the caller's order (e.g. contract partners, cheapest
    first). A participant already holding a replica of the task that is not dropped
    (even a failed one, until it is dropped) is skipped: the registry allows one per holder.
    """
    _check_mode(mode)
    if mode not in REPLICATED_MODES:
        return None
    if any(r["state"] == "active" and _live(r["participant"], host, status) for r in replicas):
        return None
    holding = {r["participant"] for r in replicas if r["state"] != "dropped"}
    for participant in (origin, *candidates):
        if _live(participant, host, status) and participant not in holding:
            return participant
    return None
