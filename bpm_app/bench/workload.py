"""What a benchmark's task computes and reads: a query (`bpm.query`), its parameters, and endless generated input.

A benchmark names its query by reference (`module:attribute`, or `path/to/file.py:attribute`)
and its parameters as `name=value` texts, so that both can cross to a worker process as plain
data; each process loads the query itself (`Workload.load`). The input comes from the
generator of the query's module: `generate(seconds=..., rate=..., seed=...)`, which yields
the query's records as dictionaries in input order (`examples/` has one per query). The
benchmark's input is made of consecutive stretches of it, each shifted in event time after
the one before, so that a long run never holds all of it and the same seed gives the same
records again: the reference computation sees exactly what was fed.
"""

from __future__ import annotations

import inspect
import itertools
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bpm.query import Params, Query, QueryError, load
from bpm.records import Records
from bpm.results import Result

MONITORING = "examples.network_monitoring:query"
CHUNK_S = 120


@dataclass(frozen=True)
class Workload:
    """A benchmark task's query and parameters.

    Attributes:
        reference: the query, `module:attribute` or `path/to/file.py:attribute` (made absolute).
        params: its parameters as given, (name, value) pairs (texts as on a command line, or values).
        folder: where a module of the reference is looked for besides the installed packages
            (default: the folder the benchmark runs in).
    """

    reference: str = MONITORING
    params: tuple[tuple[str, Any], ...] = ()
    folder: str = ""

    def __post_init__(self) -> None:
        # A worker runs elsewhere (another folder, another host): a file is named by its whole
        # path, and a module is looked for in the folder the benchmark was started in, as
        # `python -m` looks for it there.
        where, sep, attribute = self.reference.rpartition(":")
        if sep and where.endswith(".py"):
            object.__setattr__(self, "reference", f"{Path(where).resolve()}:{attribute}")
        if not self.folder:
            object.__setattr__(self, "folder", os.getcwd())

    def load(self) -> tuple[Query, Params]:
        """The query and its bound parameters; QueryError says what is wrong."""
        if self.folder not in sys.path:
            sys.path.insert(0, self.folder)
        query = load(self.reference)
        return query, query.bind(dict(self.params))

    def check(self) -> None:
        """Raise ValueError (a QueryError) when the query does not load, its parameters do not
        bind, or its module has no input generator."""
        query, _ = self.load()
        generator(query)

    def records(self, rate: float, seed: int) -> Iterator[tuple[int, tuple]]:
        """Endless records of the query (`bpm.records.Records.parse`'s form), deterministic for `rate` and `seed`."""
        query, _ = self.load()
        make, wire = generator(query), Records(query)
        for i in itertools.count():
            shift = i * CHUNK_S * 1_000_000
            for record in make(seconds=CHUNK_S, rate=rate, seed=seed * 1_000_003 + i):
                ts_us, values = wire.parse(record)
                yield ts_us + shift, values


    def expected(self, rate: float, seed: int, fed: int, work_dir: Path) -> list[Result]:
        """The results of the first `fed` records of `records(rate, seed)` by the plain batch
        computation of the same query on a local Spark (`spark_agents.check.plain_results`, which
        refuses late records as the feeder does; the process's session, when it has one)."""
        from spark_agents.check import plain_results
        from spark_agents.session import make_session

        query, params = self.load()
        return plain_results(make_session("local[1]", "bpm-bench-reference"), query, params, itertools.islice(self.records(rate, seed), fed), work_dir)


def generator(query: Query):
    """The `generate` function of the module that defines `query`'s `compute`; QueryError without one."""
    module = inspect.getmodule(query.compute)
    make = getattr(module, "generate", None)
    if not callable(make):
        raise QueryError(f"query {query.name!r}: its module defines no generate(seconds=..., rate=..., seed=...), "
                         "which a benchmark or the demo needs to make its input")
    return make
