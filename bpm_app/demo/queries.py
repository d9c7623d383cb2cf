"""The queries a demo's participants run (`bpm demo --queries NAME=REFERENCE`).

Every participant runs the network-monitoring query unless told otherwise; its input is
generated Zeek traffic (`bpm generate-traffic`, replayed as connections), and its plain
computation is `examples.network_monitoring.expected`. A participant given another query
(any query of the query API, `bpm.query`, whose module has an input generator,
`generate(seconds=, rate=, seed=)`, as `bpm bench move --query` needs) is fed that
generator's records as JSON lines (`bpm replay --query`), and its results are compared
with the plain batch computation of the same query on Spark
(`spark_agents.check.plain_results`) over exactly the records its queried shares were fed.

A query's parameters in the demo: its module's `SHORT_RUN` when it has one (the
network-monitoring example's ten-second windows and thresholds its generated traffic
crosses), else its defaults with its window (`align`, where a parameter) at
`WINDOW_S` and its lateness (where a parameter) at `LATENESS_S`: the phases close a window
every few seconds and the drain ends soon after the input does.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from bpm.keygroups import KEY_GROUPS
from bpm.query import Params, Query, load
from bpm.records import Admission, Records, end_mark_us
from bpm.results import Result
from bpm_app.bench.workload import generator

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MONITORING = "examples.network_monitoring:query"
WINDOW_S = 10
LATENESS_S = 5


@dataclass(frozen=True)
class DemoQuery:
    """A query as a demo participant runs it.

    Attributes:
        reference: how the agents load it (`module:attribute`, or a file's whole path).
        query: its declaration.
        params: its bound parameters.
    """

    reference: str
    query: Query
    params: Params

    @classmethod
    def load(cls, reference: str) -> DemoQuery:
        """The query `reference` names with its demo parameters (see the module); QueryError says
        what is wrong (it does not load, or its module has no generator and it is not the
        network-monitoring query)."""
        where, sep, attribute = reference.rpartition(":")
        if sep and where.endswith(".py"):
            reference = f"{Path(where).resolve()}:{attribute}"  # the agents run in folders of their own
        query = load(reference)
        given = getattr(inspect.getmodule(query.compute), "SHORT_RUN", None)
        if given is None:
            given = {name: value for name, value in ((query.align, WINDOW_S), (query.lateness, LATENESS_S)) if isinstance(name, str)}
        chosen = cls(reference, query, query.bind(given))
        if not chosen.zeek:
            generator(query)  # QueryError without one
        return chosen

    @property
    def zeek(self) -> bool:
        """Whether it is the network-monitoring query, fed generated Zeek traffic."""
        return self.reference == MONITORING

    @property
    def lateness_s(self) -> int:
        return self.query.lateness_s(self.params)

    @property
    def align_s(self) -> int | None:
        return self.query.align_s(self.params)

    def param_args(self) -> list[str]:
        """Its parameters as `name=value` texts (`--param`, an agent's `param`)."""
        return [f"{name}={value}" for name, value in self.params.items()]

    def generate(self, path: Path, seconds: float, rate: float, seed: int) -> Path:
        """Write `seconds` of its module's generated records at `rate` a second as JSON lines to `path`."""
        make = generator(self.query)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", encoding="utf-8") as out:
            for record in make(seconds=int(seconds), rate=rate, seed=seed):
                out.write(json.dumps(record, default=str) + "\n")
        return path

    def queried(self, name: str, fed: Path, chosen: Collection[int]) -> tuple[Path, int | None]:
        """What participant `name`'s queried shares were fed: the records of `fed` (what its
        replayer fed, `bpm replay --fed-log`: a Zeek log, or JSON lines) that the lateness rule
        keeps (applied to all of them, as the feeder did) and whose key group is in `chosen`,
        in the same format beside it; and the end-of-input mark the feeder wrote after them
        all (None: nothing was admitted)."""
        wire = Records(self.query)
        admission = Admission(self.lateness_s)
        whole = set(range(KEY_GROUPS)) <= set(chosen)  # every record's key group is chosen

        def kept(ts_us: int, values: tuple) -> bool:
            return admission.admit(ts_us) and (whole or wire.key_group(values) in chosen)

        out = fed.with_name(f"{name}.queried.{'log' if self.zeek else 'jsonl'}")
        with fed.open(encoding="utf-8") as lines, out.open("w", encoding="utf-8") as handle:
            if self.zeek and whole:
                # Only the lateness rule applies: each line is read for its time alone. A
                # participant whose one task reads a heavy stream was fed millions of connections.
                from bpm.zeek.conn import tsv_lines_kept
                from bpm.zeek.definitions import ts_micros

                handle.writelines(tsv_lines_kept(lines, lambda ts: admission.admit(ts_micros(ts))))
            elif self.zeek:
                from bpm.zeek.conn import parse_lines, write_tsv
                from bpm.zeek.definitions import stream_values

                write_tsv((c for c in parse_lines(lines, source=str(fed)) if kept(*stream_values(c))), handle)
            else:
                handle.writelines(line for line in lines if kept(*wire.parse(json.loads(line))))
        newest = admission.newest_us
        return out, None if newest is None else end_mark_us(newest, self.lateness_s, self.align_s)

    def reference_results(self, path: Path, spark: Callable[[], SparkSession], work_dir: Path) -> list[Result]:
        """Its plain computation over `queried`'s file at `path`: for the network-monitoring
        query `examples.network_monitoring.expected` (its definitions without Spark), for
        another its batch computation on the session `spark()` gives."""
        if self.zeek:
            from bpm.zeek.conn import read_logs
            from examples.network_monitoring import expected

            return expected(read_logs([path]), self.params)
        from spark_agents.check import plain_results

        wire = Records(self.query)
        with path.open(encoding="utf-8") as lines:
            records = [wire.parse(json.loads(line)) for line in lines]
        return plain_results(spark(), self.query, self.params, records, work_dir)


def parse_queries(items: Iterable[str], members: Iterable[str]) -> dict[str, str]:
    """`--queries NAME=REFERENCE` options, by participant; ValueError on a bad one or an unknown participant."""
    known = list(members)
    chosen: dict[str, str] = {}
    for item in items:
        name, sep, reference = item.partition("=")
        if not sep or not reference.strip():
            raise ValueError(f"--queries {item!r}: give PARTICIPANT=module:attribute")
        if name not in known:
            raise ValueError(f"--queries {item!r}: no participant {name!r} in this scenario ({', '.join(known)})")
        chosen[name] = reference.strip()
    return chosen
