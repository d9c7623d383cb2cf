"""HA decisions: the mode that applies, who takes a failed host's task, where repair goes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bpm.ha import HA_MODES, PRECISE_MODES, effective_mode, failover_target, is_failed, repair_target

ALIVE = "alive"


def replica(participant, role, state="active", **extra):
    return {"participant": participant, "role": role, "state": state, **extra}


@pytest.mark.parametrize(
    ("task_mode", "contract_mode", "expected"),
    [
        ("none", None, "none"),
        ("none", "passive_standby", "passive_standby"),
        ("upstream_backup", "active_standby", "upstream_backup"),
        ("active_standby", None, "active_standby"),
        ("none", "none", "none"),
    ],
)
def test_effective_mode(task_mode, contract_mode, expected):
    assert effective_mode(task_mode, contract_mode) == expected


def test_modes_and_unknown_mode():
    assert PRECISE_MODES == ("upstream_backup", "passive_standby", "active_standby")
    assert HA_MODES[0] == "none"
    with pytest.raises(ValueError, match="unknown HA mode"):
        effective_mode("hot", None)
    with pytest.raises(ValueError):
        failover_target(mode="gap", origin="a", host="b", replicas=[], status={})


@pytest.mark.parametrize(("status", "failed"), [("new", False), ("alive", False), ("suspected", True), ("failed", True)])
def test_is_failed(status, failed):
    assert is_failed(status) is failed


# (mode, replicas, status, expected): origin "a", failed host "b".
FAILOVER_CASES = [
    ("active_standby", [replica("c", "active_standby")], {"a": ALIVE, "c": ALIVE}, "c"),
    ("active_standby", [replica("c", "active_standby")], {"a": ALIVE, "c": "suspected"}, "a"),
    ("active_standby", [replica("c", "active_standby", "failed")], {"a": ALIVE, "c": ALIVE}, "a"),
    ("active_standby", [replica("c", "passive_standby")], {"a": ALIVE, "c": ALIVE}, "a"),
    ("active_standby", [replica("c", "active_standby")], {"a": "failed", "c": "failed"}, None),
    ("passive_standby", [replica("d", "passive_standby")], {"a": ALIVE, "d": ALIVE}, "d"),
    ("passive_standby", [replica("a", "passive_standby")], {"a": ALIVE}, "a"),
    ("passive_standby", [replica("d", "passive_standby", "dropped")], {"a": ALIVE, "d": ALIVE}, "a"),
    ("passive_standby", [], {"a": "new"}, None),
    ("upstream_backup", [replica("c", "active_standby")], {"a": ALIVE, "c": ALIVE}, "a"),
    ("upstream_backup", [], {"a": "suspected"}, None),
    ("none", [], {"a": ALIVE}, "a"),
    # The replica with the newest copy wins among live holders.
    (
        "passive_standby",
        [replica("c", "passive_standby", position=3), replica("d", "passive_standby", position=7)],
        {"a": ALIVE, "c": ALIVE, "d": ALIVE},
        "d",
    ),
]


@pytest.mark.parametrize(("mode", "replicas", "status", "expected"), FAILOVER_CASES)
def test_failover_target(mode, replicas, status, expected):
    assert failover_target(mode=mode, origin="a", host="b", replicas=replicas, status={"b": "suspected", **status}) == expected


def test_failover_of_a_task_at_home_never_picks_the_failed_origin():
    status = {"a": "failed", "c": ALIVE}
    assert failover_target(mode="active_standby", origin="a", host="a", replicas=[replica("c", "active_standby")], status=status) == "c"
    assert failover_target(mode="upstream_backup", origin="a", host="a", replicas=[], status=status) is None


# (mode, replicas, status, candidates, expected): origin "a", host "c" (after failover).
REPAIR_CASES = [
    ("passive_standby", [], {"a": ALIVE, "d": ALIVE}, ["d"], "a"),
    ("passive_standby", [replica("a", "passive_standby", "failed")], {"a": ALIVE, "d": ALIVE}, ["c", "d"], "d"),
    ("active_standby", [replica("c", "active_standby", "promoted")], {"a": "failed", "d": ALIVE, "e": ALIVE}, ["c", "d", "e"], "d"),
    ("active_standby", [replica("d", "active_standby")], {"a": ALIVE, "d": ALIVE}, ["e"], None),  # level intact
    ("active_standby", [replica("d", "active_standby")], {"a": ALIVE, "d": "suspected"}, ["e"], "a"),
    ("active_standby", [], {"a": "failed", "d": "new"}, ["d"], None),
    ("upstream_backup", [], {"a": ALIVE}, ["d"], None),
    ("none", [], {"a": ALIVE}, ["d"], None),
]


@pytest.mark.parametrize(("mode", "replicas", "status", "candidates", "expected"), REPAIR_CASES)
def test_repair_target(mode, replicas, status, candidates, expected):
    got = repair_target(mode=mode, origin="a", host="c", replicas=replicas, status={"c": ALIVE, **status}, candidates=candidates)
    assert got == expected


NAMES = ["a", "b", "c", "d", "e"]
STATUSES = ["new", "alive", "suspected", "failed"]
replicas_st = st.lists(
    st.fixed_dictionaries(
        {
            "participant": st.sampled_from(NAMES),
            "role": st.sampled_from(["active_standby", "passive_standby"]),
            "state": st.sampled_from(["active", "promoted", "failed", "dropped"]),
        }
    ),
    max_size=6,
)
status_st = st.fixed_dictionaries({n: st.sampled_from(STATUSES) for n in NAMES})


@given(mode=st.sampled_from(HA_MODES), origin=st.sampled_from(NAMES), host=st.sampled_from(NAMES), replicas=replicas_st, status=status_st)
def test_failover_target_is_live_and_not_the_host(mode, origin, host, replicas, status):
    target = failover_target(mode=mode, origin=origin, host=host, replicas=replicas, status=status)
    live = {p for p in NAMES if p != host and status[p] == "alive"}
    holders = {r["participant"] for r in replicas if r["role"] == mode and r["state"] == "active"} & live
    if holders:  # only ever for the replicated modes: the role must equal the mode
        assert mode in ("active_standby", "passive_standby") and target in holders
    elif origin in live:
        assert target == origin
    else:
        assert target is None


@given(
    mode=st.sampled_from(HA_MODES),
    origin=st.sampled_from(NAMES),
    host=st.sampled_from(NAMES),
    replicas=replicas_st,
    status=status_st,
    candidates=st.lists(st.sampled_from(NAMES), max_size=5),
)
def test_repair_target_restores_the_level_where_the_registry_allows(mode, origin, host, replicas, status, candidates):
    target = repair_target(mode=mode, origin=origin, host=host, replicas=replicas, status=status, candidates=candidates)
    live_replica = any(r["state"] == "active" and r["participant"] != host and status[r["participant"]] == "alive" for r in replicas)
    if mode not in ("active_standby", "passive_standby") or live_replica:
        assert target is None
        return
    holding = {r["participant"] for r in replicas if r["state"] != "dropped"}
    allowed = [p for p in (origin, *candidates) if p != host and status[p] == "alive" and p not in holding]
    assert target == (allowed[0] if allowed else None)
