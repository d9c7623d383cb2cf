"""Every task's results merged into one set, to compare with the expected rows.

Tasks publish each micro-batch's rows to their origin's broker through the output fence
(`spark_agents.broker.results`); the reader merges the batches of the tasks asked for. A
row present in more than one batch is a duplicate; a row of the expected set that no batch
holds is lost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from bpm.zeek.definitions import ResultRow


@dataclass
class OutputSet:
    """Every task's output merged.

    Attributes:
        rows: each distinct row once.
        copies: how many batches hold each row (more than one means duplicated output).
    """

    rows: set[ResultRow] = field(default_factory=set)
    copies: Counter = field(default_factory=Counter)

    def add(self, rows: Iterable[ResultRow]) -> None:
        """Merge one batch's rows."""
        for row in rows:
            self.rows.add(row)
            self.copies[row] += 1

    @property
    def duplicates(self) -> list[ResultRow]:
        """Rows present in more than one batch."""
        return sorted(row for row, n in self.copies.items() if n > 1)

    def lost(self, expected: Iterable[ResultRow]) -> list[ResultRow]:
        """Expected rows that no batch holds."""
        return sorted(set(expected) - self.rows)

    def extra(self, expected: Iterable[ResultRow]) -> list[ResultRow]:
        """Rows that no expected row matches."""
        return sorted(self.rows - set(expected))
