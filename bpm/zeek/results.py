"""Every task's results merged into one set, to compare with the expected rows.

Tasks publish each micro-batch's rows to their origin's broker through the output fence
(`spark_agents.broker.results`); the reader merges the batches of the tasks asked for
(`bpm.results.OutputSet`). A row present in more than one batch is a duplicate; a row of
the expected set that no batch holds is lost.
"""

from __future__ import annotations

from bpm.results import OutputSet

__all__ = ["OutputSet"]
