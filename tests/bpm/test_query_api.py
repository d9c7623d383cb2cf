"""The query API's declarations, parameters, references and digests (no Spark)."""

from __future__ import annotations

import textwrap

import pytest

from bpm.query import Param, Query, QueryError, load, parse_schema


def _compute(events, params):
    return events


def _query(**changes) -> Query:
    declared = dict(name="readings", schema="ts TIMESTAMP, device STRING, value DOUBLE", key="device", event_time="ts",
                    lateness="lateness_s", compute=_compute, result_key=("device", "window_start"), result_time="window_end",
                    align="window_s", params={"window_s": Param(int, 60, minimum=1), "lateness_s": Param(int, 10, minimum=0),
                                              "scale": Param(float, 1.0), "label": Param(str, "x"), "strict": Param(bool, False)})
    return Query(**{**declared, **changes})


def test_a_schema_is_flat_spark_ddl_with_canonical_type_names():
    assert [(c.name, c.type) for c in parse_schema("ts TIMESTAMP, `device` string, n LONG, ok BOOLEAN")] == [
        ("ts", "TIMESTAMP"), ("device", "STRING"), ("n", "BIGINT"), ("ok", "BOOLEAN")]


@pytest.mark.parametrize("ddl, says", [
    ("", "empty"),
    ("ts TIMESTAMP, tags ARRAY<STRING>", "bad column"),
    ("ts TIMESTAMP, m MAP", "type MAP"),
    ("ts TIMESTAMP, a INT, A STRING", "twice"),
    ("ts TIMESTAMP, __mark INT", "federation's own"),
])
def test_a_schema_the_federation_cannot_carry_is_refused(ddl, says):
    with pytest.raises(QueryError, match=says):
        parse_schema(ddl)


@pytest.mark.parametrize("changes, says", [
    ({"name": "a b"}, "bad query name"),
    ({"key": "nope"}, "key 'nope' is not a column"),
    ({"event_time": "device"}, "key and its event time are one column"),
    ({"event_time": "value"}, "is DOUBLE, not TIMESTAMP"),
    ({"compute": None}, "compute is not a function"),
    ({"alert": "device"}, "alert is not a function"),
    ({"alert": lambda row: row["device"], "align": None}, "a query with alert declares align"),
    ({"result_key": ()}, "result_key names no column"),
    ({"result_time": ""}, "result_time names no column"),
    ({"output_mode": "complete"}, "output mode 'complete' is not supported"),
    ({"lateness": "nope"}, "lateness names 'nope'"),
    ({"lateness": "scale"}, "lateness names 'scale'"),
    ({"lateness": -1}, "lateness must be a whole number"),
    ({"align": 0}, "align must be a whole number"),
    ({"params": {"bad-name": Param(int, 1)}}, "bad parameter name"),
    ({"params": {"window_s": 60}}, "not declared with bpm.query.Param"),
    ({"params": {"window_s": Param(int, "sixty")}, "align": None, "lateness": 5}, "default of parameter 'window_s' must be int"),
])
def test_a_wrong_declaration_is_an_error_naming_the_query(changes, says):
    with pytest.raises(QueryError, match=says) as error:
        _query(**changes)
    assert "readings" in str(error.value) or "name" in says


def test_parameters_take_their_defaults_and_convert_what_a_command_line_gives():
    params = _query().bind({"window_s": "30", "scale": 2, "strict": "true"})
    assert dict(params) == {"window_s": 30, "lateness_s": 10, "scale": 2.0, "label": "x", "strict": True}
    assert params.window_s == 30 and params["scale"] == 2.0
    assert _query().lateness_s(params) == 10 and _query().align_s(params) == 30
    assert _query(lateness=5, align=None).lateness_s(params) == 5 and _query(align=None).align_s(params) is None


@pytest.mark.parametrize("given, says", [
    ({"windows": 30}, "query 'readings' has no parameter 'windows' \\(its parameters: window_s, lateness_s, scale, label, strict\\)"),
    ({"window_s": "thirty"}, "query 'readings': parameter 'window_s' must be int, not 'thirty'"),
    ({"window_s": 1.5}, "parameter 'window_s' must be int, not float 1.5"),
    ({"window_s": True}, "parameter 'window_s' must be int, not bool"),
    ({"window_s": 0}, "parameter 'window_s' must be at least 1"),
    ({"strict": "perhaps"}, "parameter 'strict' must be bool"),
    ({"label": 3}, "parameter 'label' must be str"),
])
def test_an_unknown_or_badly_typed_parameter_is_an_error_naming_query_and_parameter(given, says):
    with pytest.raises(QueryError, match=says):
        _query().bind(given)


def test_the_digest_follows_the_declaration_and_the_code():
    assert _query().digest == _query().digest
    assert _query(version="2").digest != _query().digest
    assert _query(result_key=("device",)).digest != _query().digest

    def other(events, params):
        return events.limit(1)

    assert _query(compute=other).digest != _query().digest
    assert _query(alert=lambda row: row["device"]).digest != _query().digest, "what it alerts on is part of it"


def test_a_reference_names_a_module_or_a_file_and_errors_say_what_is_missing(tmp_path):
    assert load("examples.sensors:query").name == "sensors"
    source = tmp_path / "mine.py"
    source.write_text(textwrap.dedent("""
        from bpm.query import Query
        query = Query(name="mine", schema="at TIMESTAMP, who STRING", key="who", event_time="at", lateness=5,
                      compute=lambda events, params: events, result_key=("who",), result_time="at")
        not_a_query = 3
    """))
    assert load(f"{source}:query").name == "mine"
    assert load(f"{source}:query") is load(f"{source}:query"), "a file is loaded once"
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    for reference, says in [
        ("examples.sensors", "bad query reference"),
        ("no_such_module_here:query", "cannot import 'no_such_module_here': ModuleNotFoundError"),
        ("examples.sensors:nothing", "has no attribute 'nothing'"),
        (f"{source}:not_a_query", "is a int, not a bpm.query.Query"),
        (f"{tmp_path / 'absent.py'}:query", "no file"),
        (f"{tmp_path / 'broken.py'}:query", "failed: RuntimeError: boom"),
    ]:
        with pytest.raises(QueryError, match=says):
            load(reference)


@pytest.mark.parametrize("reference", ["examples.network_monitoring:query", "examples.sensors:query", "examples.sessions:query"])
def test_the_examples_declare_valid_queries(reference):
    query = load(reference)
    params = query.bind()
    assert query.lateness_s(params) >= 0 and len(query.digest) == 16
