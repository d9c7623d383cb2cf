"""Results that need several participants' inputs, under network partitions: pure, no I/O, no clock.

`correlation` defines the result (per window, the sources that raise alerts at two or more
participants); `machine` produces it with Delay, Process and Correct: within an
availability bound, tentative while inputs are missing, corrected to stable once they
arrive.
"""

from bpm.dpc.correlation import ALERT_KINDS, MIN_PARTICIPANTS, CorrelatedRow, alerting_sources, correlate, plain_correlation
from bpm.dpc.machine import Alerts, CorrelatedView, Correlator, Ignored, Members, Publish, Tick

__all__ = [
    "ALERT_KINDS",
    "MIN_PARTICIPANTS",
    "Alerts",
    "CorrelatedRow",
    "CorrelatedView",
    "Correlator",
    "Ignored",
    "Members",
    "Publish",
    "Tick",
    "alerting_sources",
    "correlate",
    "plain_correlation",
]
