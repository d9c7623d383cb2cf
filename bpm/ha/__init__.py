"""High availability of moved tasks: pure decisions (no I/O, no clock, no Spark).

The registry records replicas and failovers and enforces fencing; agents and the
simulator call these to decide what to ask it for.
"""

from bpm.ha.decisions import (
    HA_MODES,
    PRECISE_MODES,
    REPLICATED_MODES,
    effective_mode,
    failed_partners,
    failover_target,
    is_failed,
    recovery,
    repair_target,
    task_mode,
    with_live_partners,
)

__all__ = [
    "HA_MODES",
    "PRECISE_MODES",
    "REPLICATED_MODES",
    "effective_mode",
    "failed_partners",
    "failover_target",
    "is_failed",
    "recovery",
    "repair_target",
    "task_mode",
    "with_live_partners",
]
