"""Results that need several participants' inputs, under network partitions: pure, no I/O, no clock.

`correlation` defines the result (per window, the subjects that raise alerts at two or more
participants); `machine` produces it with Delay, Process and Correct: within an
availability bound, tentative while inputs are missing, corrected to stable once they
arrive.
"""

from bpm.dpc.correlation import MIN_PARTICIPANTS, Alert, CorrelatedRow, alert_of, alerting_sources, correlate, plain_correlation
from bpm.dpc.machine import Alerts, CorrelatedView, Correlator, Ignored, Members, Publish, Tick

__all__ = [
    "MIN_PARTICIPANTS",
    "Alert",
    "Alerts",
    "CorrelatedRow",
    "CorrelatedView",
    "Correlator",
    "Ignored",
    "Members",
    "Publish",
    "Tick",
    "alert_of",
    "alerting_sources",
    "correlate",
    "plain_correlation",
]
