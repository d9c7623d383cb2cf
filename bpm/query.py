"""The query API: how a user's Structured Streaming query becomes a task the federation can move.

A query is a `Query` object, found by a reference `module:attribute` (or
`path/to/file.py:attribute`, `load`). It declares

* its input: the columns of one record (`schema`, a flat Spark DDL string), the column whose
  value decides a record's key group (`key`: the unit that tasks split and merge), the
  column of event time (`event_time`, a TIMESTAMP) and how late a record may come
  (`lateness`, seconds, or the name of a parameter holding them: the watermark's delay);
* its computation: `compute(events, params)`, from the streaming DataFrame of its records
  (the watermark set, the federation's own rows removed) to the result DataFrame; and
  optionally `finish(rows, params)`, run on each micro-batch's result rows as dictionaries;
* its result: the columns that identify one result (`result_key`), the column that says at
  which event time a result is final (`result_time`: in append mode a result comes out
  once the watermark passes it), the output mode;
* its parameters (`Param`: a type, a default, bounds), validated by `Query.bind` when an
  agent starts: an unknown or badly typed parameter is an error naming both the query and
  the parameter;
* optionally `align`: seconds (or a parameter) at whose multiples of event time its results
  are independent (a tumbling window's length). A task of a query with `align` can be split
  and merged at such a time; without it, its tasks move whole.

What makes a query movable, and what the federation guarantees for it, is in docs/queries.md.
This module imports no Spark: a query's declaration is checked, digested and its parameters
bound without a JVM; only `compute` (called by the task host) uses PySpark.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import json
import keyword
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Column", "Param", "Params", "Query", "QueryError", "load", "parse_schema", "parse_values"]

OUTPUT_MODES = ("append",)
# Spark SQL type names a record's column may have, and the name the federation uses for each.
_TYPES = {
    "STRING": "STRING", "VARCHAR": "STRING",
    "BIGINT": "BIGINT", "LONG": "BIGINT",
    "INT": "INT", "INTEGER": "INT", "SMALLINT": "SMALLINT", "SHORT": "SMALLINT", "TINYINT": "TINYINT", "BYTE": "TINYINT",
    "DOUBLE": "DOUBLE", "FLOAT": "FLOAT", "REAL": "FLOAT",
    "BOOLEAN": "BOOLEAN", "BOOL": "BOOLEAN",
    "TIMESTAMP": "TIMESTAMP",
}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_COLUMN = re.compile(r"^\s*`?([A-Za-z_][A-Za-z0-9_]*)`?\s+([A-Za-z]+)\s*(?:NOT\s+NULL\s*)?$", re.IGNORECASE)
QUERY_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
DIGEST_PATTERN = r"^[0-9a-f]{8,64}$"
_NAME = re.compile(QUERY_NAME_PATTERN)
# Columns of the stream that the federation adds to every record (`bpm.records`).
RESERVED = ("__ts_us", "__mark")


class QueryError(ValueError):
    """A query that cannot be loaded or is declared wrong, or parameters it does not take;
    the message names the query and what is wrong."""


@dataclass(frozen=True)
class Column:
    """One column of a query's records: its name and Spark SQL type (`_TYPES`' canonical names)."""

    name: str
    type: str


def parse_schema(ddl: str) -> tuple[Column, ...]:
    """The columns of a flat Spark DDL schema (`"ts TIMESTAMP, device STRING, value DOUBLE"`):
    QueryError on anything else (nested types, unknown types, a name twice)."""
    if not isinstance(ddl, str) or not ddl.strip():
        raise QueryError("the schema is empty: give its columns as Spark DDL, e.g. 'ts TIMESTAMP, device STRING, value DOUBLE'")
    columns: list[Column] = []
    for part in ddl.split(","):
        match = _COLUMN.match(part)
        if match is None:
            raise QueryError(f"bad column {part.strip()!r} in the schema: 'NAME TYPE', one of {', '.join(sorted(set(_TYPES.values())))}")
        name, sql = match.group(1), match.group(2).upper()
        if sql not in _TYPES:
            raise QueryError(f"column {name!r} has type {match.group(2)}: records are flat, of types {', '.join(sorted(set(_TYPES.values())))}")
        if name in RESERVED:
            raise QueryError(f"column name {name!r} is the federation's own")
        if any(c.name.lower() == name.lower() for c in columns):
            raise QueryError(f"column {name!r} is in the schema twice")
        columns.append(Column(name, _TYPES[sql]))
    return tuple(columns)


@dataclass(frozen=True)
class Param:
    """A parameter of a query: its type (int, float, str or bool), default and optional bounds."""

    type: type
    default: Any
    help: str = ""
    minimum: float | None = None
    maximum: float | None = None

    def __post_init__(self) -> None:
        if self.type not in (int, float, str, bool):
            raise QueryError(f"a parameter's type is int, float, str or bool, not {self.type!r}")

    def convert(self, value: Any, where: str) -> Any:
        """`value` as this parameter's type (strings as given on a command line are parsed), within its bounds."""
        kind = self.type.__name__
        if isinstance(value, str) and self.type is not str:
            text = value.strip()
            try:
                if self.type is bool:
                    value = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}[text.lower()]
                else:
                    value = self.type(text)
            except (KeyError, ValueError):
                raise QueryError(f"{where} must be {kind}, not {value!r}") from None
        if self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, self.type) or (self.type is not bool and isinstance(value, bool)):
            raise QueryError(f"{where} must be {kind}, not {type(value).__name__} {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise QueryError(f"{where} must be at least {self.minimum}, not {value!r}")
        if self.maximum is not None and value > self.maximum:
            raise QueryError(f"{where} must be at most {self.maximum}, not {value!r}")
        return value


class Params(Mapping[str, Any]):
    """A query's parameter values, bound and checked (`Query.bind`): `params.window_s` or `params["window_s"]`."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"no parameter {name!r}") from None

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Params({self._values!r})"

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._values.items())))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self) == dict(other)


@dataclass(frozen=True)
class Query:
    """A streaming query the federation can run as movable tasks (see the module's text).

    Attributes:
        name: what it is called in the registry, the logs and `bpm query list`.
        schema: its records' columns, a flat Spark DDL string.
        key: the column that decides a record's key group (any type; its text is hashed).
        event_time: the TIMESTAMP column of event time.
        lateness: seconds a record may come behind the newest event time and still count
            (the watermark's delay), or the name of an int parameter holding them.
        compute: `compute(events, params) -> DataFrame`: the streaming computation.
        result_key: the result columns that identify one result.
        result_time: the result column (TIMESTAMP, or epoch seconds) at which a result is final.
        output_mode: how results come out; "append": each result once, when final.
        params: its parameters by name.
        finish: optional `finish(rows, params) -> rows`, applied to each micro-batch's result
            rows (dictionaries); deterministic, and about the rows of one batch only.
        align: seconds (or an int parameter's name) at whose multiples of event time results
            are independent of each other; None: its tasks never split.
        version: the query author's version; a new one tells partners it changed.
        description: one line for `bpm query list`.
        alert: optional `alert(row) -> subject or None`, for the correlated result
            (`bpm agent run --correlate`, `bpm.dpc`): what one of its result rows (a
            dictionary of plain values, as `bpm.results.Result` holds them) raises an alert
            on (a source address, a device), or None when it raises none. Participants that
            correlate publish the subjects that alert at two or more of them in the same
            grain; a query without it has no alerts to share. It needs `align`.
    """

    name: str
    schema: str
    key: str
    event_time: str
    lateness: int | str
    compute: Callable[..., Any]
    result_key: tuple[str, ...]
    result_time: str
    output_mode: str = "append"
    params: Mapping[str, Param] = field(default_factory=dict)
    finish: Callable[..., Any] | None = None
    align: int | str | None = None
    version: str = "1"
    description: str = ""
    alert: Callable[[Mapping[str, Any]], Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "result_key", tuple(self.result_key))
        object.__setattr__(self, "params", dict(self.params))
        self._check()

    def _fail(self, message: str) -> QueryError:
        return QueryError(f"query {self.name!r}: {message}")

    def _check(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise QueryError(f"bad query name {self.name!r}: 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit")
        try:
            columns = {c.name: c for c in parse_schema(self.schema)}
        except QueryError as exc:
            raise self._fail(str(exc)) from None
        for what, column in (("key", self.key), ("event_time", self.event_time)):
            if column not in columns:
                raise self._fail(f"its {what} {column!r} is not a column of its schema ({', '.join(columns)})")
        if self.key == self.event_time:
            raise self._fail("its key and its event time are one column")
        if columns[self.event_time].type != "TIMESTAMP":
            raise self._fail(f"its event time {self.event_time!r} is {columns[self.event_time].type}, not TIMESTAMP")
        if not callable(self.compute):
            raise self._fail("compute is not a function")
        if self.finish is not None and not callable(self.finish):
            raise self._fail("finish is not a function")
        if self.alert is not None and not callable(self.alert):
            raise self._fail("alert is not a function")
        if self.alert is not None and self.align is None:
            raise self._fail("alerts are correlated per grain: a query with alert declares align")
        if not self.result_key or not all(isinstance(c, str) and c for c in self.result_key):
            raise self._fail("result_key names no column: give the result columns that identify one result")
        if not isinstance(self.result_time, str) or not self.result_time:
            raise self._fail("result_time names no column: give the result column at which a result is final")
        if self.output_mode not in OUTPUT_MODES:
            raise self._fail(f"output mode {self.output_mode!r} is not supported: {', '.join(OUTPUT_MODES)} (each result once, when the watermark passes it)")
        for name, param in self.params.items():
            if not isinstance(name, str) or not _IDENTIFIER.match(name) or keyword.iskeyword(name):
                raise self._fail(f"bad parameter name {name!r}: a Python identifier")
            if not isinstance(param, Param):
                raise self._fail(f"parameter {name!r} is not declared with bpm.query.Param")
            param.convert(param.default, f"query {self.name!r}: the default of parameter {name!r}")
        for what, value in (("lateness", self.lateness), ("align", self.align)):
            if isinstance(value, str):
                if value not in self.params or self.params[value].type is not int:
                    raise self._fail(f"its {what} names {value!r}, which is not one of its int parameters")
            elif value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < (0 if what == "lateness" else 1)):
                raise self._fail(f"its {what} must be {'a whole number of seconds, 0 or more' if what == 'lateness' else 'a whole number of seconds, 1 or more'}, not {value!r}")
        if self.lateness is None:
            raise self._fail("it declares no lateness")

    @property
    def columns(self) -> tuple[Column, ...]:
        return parse_schema(self.schema)

    def bind(self, values: Mapping[str, Any] | None = None) -> Params:
        """Its parameters: the defaults, overridden by `values` (each checked and converted).
        QueryError names the query and the parameter that is unknown or wrong."""
        given = dict(values or {})
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            takes = ", ".join(self.params) or "none"
            raise QueryError(f"query {self.name!r} has no parameter {unknown[0]!r} (its parameters: {takes})")
        bound = {name: param.convert(given.get(name, param.default), f"query {self.name!r}: parameter {name!r}")
                 for name, param in self.params.items()}
        for what in ("lateness", "align"):
            value = getattr(self, what)
            if isinstance(value, str) and bound[value] < (0 if what == "lateness" else 1):
                raise QueryError(f"query {self.name!r}: parameter {value!r} is its {what} in seconds and must be at least {0 if what == 'lateness' else 1}")
        return Params(bound)

    def lateness_s(self, params: Params) -> int:
        """The watermark's delay, seconds, with `params`."""
        return params[self.lateness] if isinstance(self.lateness, str) else self.lateness

    def align_s(self, params: Params) -> int | None:
        """The event-time grain at which its tasks split, seconds, with `params` (None: they do not)."""
        return params[self.align] if isinstance(self.align, str) else self.align

    @property
    def digest(self) -> str:
        """A digest of its definition: the declaration and the code of `compute` and `finish`.
        Two participants running one query have the same; a partner refuses a task whose
        query's digest differs from its own."""
        declared = {
            "name": self.name, "version": self.version, "schema": [(c.name, c.type) for c in self.columns], "key": self.key,
            "event_time": self.event_time, "lateness": self.lateness, "result_key": list(self.result_key),
            "result_time": self.result_time, "output_mode": self.output_mode, "align": self.align,
            "params": {n: [p.type.__name__, p.default, p.minimum, p.maximum] for n, p in sorted(self.params.items())},
            "compute": _code(self.compute), "finish": _code(self.finish) if self.finish is not None else None,
        }
        if self.alert is not None:  # absent otherwise: a query without it keeps the digest it had
            declared["alert"] = _code(self.alert)
        return hashlib.sha256(json.dumps(declared, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def parse_values(items: Iterable[str] | None) -> dict[str, str]:
    """Parameters given as `name=value` texts (`--param name=value`), by name; QueryError on one without '='."""
    values: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise QueryError(f"parameter {item!r}: give name=value")
        values[name.strip()] = value
    return values


def _code(function: Callable[..., Any]) -> str:
    """The source text of `function` (its compiled code where no source is at hand)."""
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        code = getattr(function, "__code__", None)
        return repr((code.co_code, code.co_consts)) if code is not None else repr(function)


def load(reference: str) -> Query:
    """The query that `reference` names: `package.module:attribute`, or `path/to/file.py:attribute`
    (the file is loaded as a module of its own). QueryError says what could not be found."""
    if not isinstance(reference, str) or reference.count(":") != 1:
        raise QueryError(f"bad query reference {reference!r}: module:attribute or path/to/file.py:attribute")
    where, attribute = reference.rsplit(":", 1)
    if where.endswith(".py"):
        module = _load_file(Path(where), reference)
    else:
        try:
            module = importlib.import_module(where)
        except Exception as exc:  # noqa: BLE001 - an import runs the user's code: any error is the query's
            raise QueryError(f"query {reference!r}: cannot import {where!r}: {type(exc).__name__}: {exc}") from None
    try:
        query = getattr(module, attribute)
    except AttributeError:
        raise QueryError(f"query {reference!r}: {where!r} has no attribute {attribute!r}") from None
    if not isinstance(query, Query):
        raise QueryError(f"query {reference!r} is a {type(query).__name__}, not a bpm.query.Query")
    return query


def _load_file(path: Path, reference: str):
    if not path.is_file():
        raise QueryError(f"query {reference!r}: no file {str(path)!r}")
    resolved = path.resolve()
    name = f"bpm_query_{resolved.stem}_{hashlib.sha256(str(resolved).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, resolved)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - the user's code
        del sys.modules[name]
        raise QueryError(f"query {reference!r}: loading {str(path)!r} failed: {type(exc).__name__}: {exc}") from None
    return module
