"""The plain computation of the monitoring query: the definitions of `bpm.zeek.definitions`
applied with dictionaries and sets, no Spark. The streaming query must give the same rows."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from bpm.zeek.conn import Conn
from bpm.zeek.definitions import Admission, QueryParams, ResultRow, admitted, counts_port, source_prefix, ts_micros, window_start


def window_results(window: int, params: QueryParams, conns: dict[str, int], ports: dict[str, set[int]]) -> list[ResultRow]:
    """The rows of one window from its per-source connection counts and port sets."""
    end = window + params.window_s
    rows = [ResultRow("connections", window, end, src, n) for src, n in conns.items() if n > params.min_connections]
    port_alerts = [(src, len(p)) for src, p in ports.items() if len(p) > params.min_ports]
    rows += [ResultRow("ports", window, end, src, n) for src, n in port_alerts]
    per_prefix: dict[str, int] = defaultdict(int)
    for src, _ in port_alerts:
        per_prefix[source_prefix(src)] += 1
    rows += [ResultRow("prefix", window, end, prefix, n) for prefix, n in per_prefix.items()]
    return rows


def compute(conns: Iterable[Conn], params: QueryParams, admission: Admission | None = None) -> list[ResultRow]:
    """All result rows of the query over the connections, sorted; late rows are refused by `admission`."""
    admission = admission if admission is not None else Admission(params.lateness_s)
    counts: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    ports: dict[int, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    for conn in admitted(conns, admission):
        window = window_start(ts_micros(conn.ts), params.window_s)
        counts[window][conn.orig_h] += 1
        if counts_port(conn.proto):
            ports[window][conn.orig_h].add(conn.resp_p)
    rows: list[ResultRow] = []
    for window in counts:
        rows += window_results(window, params, counts[window], ports[window])
    return sorted(rows)
