"""`bpm agent run`'s settings: a TOML file, overridden by options and their environment
variables, over one set of defaults (`spark_agents.settings`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from bpm.load import default_warmup_s
from bpm_app.cli import app
from spark_agents.agent import AgentConfig
from spark_agents.settings import AgentSettings, SettingsError, default


def _effective(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """What `bpm agent run ARGS --print-config` prints (the settings it would run with), on a
    terminal wide enough that an error's box does not fold a long path."""
    out = CliRunner().invoke(app, ["agent", "run", *args, "--print-config"], env={"COLUMNS": "1000", **(env or {})})
    return out.exit_code, out.output


def _settings(*args: str, env: dict[str, str] | None = None) -> AgentSettings:
    code, printed = _effective(*args, env=env)
    assert code == 0, printed
    import tomllib

    return AgentSettings.load(**{k.replace("-", "_"): v for k, v in tomllib.loads(printed).items()})


def test_options_override_the_file_which_overrides_the_defaults(tmp_path):
    config = tmp_path / "a.toml"
    config.write_text('name = "a"\nwarmup = 3\nspark-master = "local[1]"\ncontract = ["b:1:2:30"]\nha = false\nparam = ["window_s=20"]\n')
    s = _settings("--config", str(config), "--param", "window_s=30", "--ha")
    assert (s.name, s.warmup, s.spark_master, s.contract, s.ha, s.param) == ("a", 3.0, "local[1]", ["b:1:2:30"], True, ["window_s=30"])
    assert s.settle == default("settle") == 15.0, "what neither sets keeps its default"
    # An environment variable overrides the file too, and an option overrides the variable.
    assert _settings("--config", str(config), env={"BPM_SPARK_MASTER": "local[2]"}).spark_master == "local[2]"
    assert _settings("--config", str(config), "--spark-master", "local[3]", env={"BPM_SPARK_MASTER": "local[2]"}).spark_master == "local[3]"
    # Repeated options replace the file's list; keys may be spelt with underscores too.
    config.write_text('name = "a"\ncan_run = ["examples.sensors:query"]\ncontract = ["b:1:2:30"]\n')
    s = _settings("--config", str(config), "--contract", "c:1:2:30", "--contract", "d:1:2:30")
    assert (s.can_run, s.contract) == (["examples.sensors:query"], ["c:1:2:30", "d:1:2:30"])


def test_without_a_file_the_options_alone_and_name_is_required():
    assert _settings("--name", "b", "--cost-model", "mm1").cost_model == "mm1"
    code, printed = _effective("--param", "window_s=5")
    assert code == 2 and "name: required" in printed


@pytest.mark.parametrize("content, words", [
    ('name = "a"\nbogus = 1\n', ["bogus: not a setting of bpm agent run"]),
    ('name = "a"\ntrigger = -3\nport = "x"\n', ["trigger: Input should be greater than 0", "port: Input should be a valid integer"]),
    ('name = "a"\ncost-model = "linear"\n', ["cost-model: Input should be 'fitted' or 'mm1'"]),
    ('name = "a\n', ["not TOML"]),
])
def test_a_wrong_file_is_refused_naming_the_file_and_each_key(tmp_path, content, words):
    config = tmp_path / "agent.toml"
    config.write_text(content)
    code, printed = _effective("--config", str(config))
    assert code == 2, printed
    assert str(config) in printed.replace("\n", "") or "agent.toml" in printed
    for word in words:
        assert word in " ".join(printed.split()), printed


def test_a_missing_file_is_refused(tmp_path):
    code, printed = _effective("--config", str(tmp_path / "none.toml"))
    assert code == 2 and "none.toml" in printed
    with pytest.raises(SettingsError, match="no such configuration file"):
        AgentSettings.load(tmp_path / "none.toml", name="a")


def test_printed_settings_are_a_file_that_runs_the_same_without_its_keys(tmp_path):
    s = AgentSettings(name="a", key="secret-key", admin_key="operator-key", contract=["b:1:2:30"], correlate=True, cpus=0.4, workdir=Path("/x"),
                      spark_conf={"spark.driver.port": "7078"})
    config = tmp_path / "a.toml"
    config.write_text(s.toml())
    assert AgentSettings.load(config) == s
    code, printed = _effective("--config", str(config))
    assert code == 0 and "secret-key" not in printed and "operator-key" not in printed
    assert "correlate = true" in printed and "cpus = 0.4" in printed
    assert "warmup" not in printed, "only what differs from the defaults"


def test_the_agent_and_its_command_share_one_set_of_defaults():
    config = AgentConfig(name="a", workdir=Path("/x"), endpoint="http://x")
    pairs = {"period_s": "period", "tick_s": "tick", "heartbeat_s": "heartbeat", "margin": "margin",
             "pass_on": "pass_on", "settle_s": "settle", "ha": "ha", "ha_interval_s": "ha_interval", "correlate": "correlate",
             "availability_bound_s": "availability_bound"}
    for attribute, setting in pairs.items():
        assert getattr(config, attribute) == default(setting), attribute
    assert default("warmup") is None and config.warmup_s == default_warmup_s(default("trigger"))
    assert (config.warmup_s, config.settle_s) == (30.0, 15.0)


@pytest.mark.parametrize("given, trigger, expected", [([], 10.0, 50.0), ([], 1.0, 30.0), (["--warmup", "12"], 10.0, 12.0)])
def test_the_agent_runs_with_the_warm_up_its_trigger_calls_for_unless_one_is_given(tmp_path, monkeypatch, given, trigger, expected):
    import spark_agents.runtime as runtime

    ran = {}
    monkeypatch.setattr(runtime, "participant_key", lambda *args: "key")
    monkeypatch.setattr(runtime, "run_agent", lambda config, **kw: ran.update(config=config, trigger=kw["trigger_s"]))
    out = CliRunner().invoke(app, ["agent", "run", "--name", "a", "--workdir", str(tmp_path), "--key", "k",
                                   "--trigger", str(trigger), *given])
    assert out.exit_code == 0, out.output
    assert (ran["trigger"], ran["config"].warmup_s) == (trigger, expected)


def test_every_setting_is_an_option_with_its_help_default_and_environment_variable():
    import typer

    command = typer.main.get_command(app).commands["agent"].commands["run"]
    options = {p.name: p for p in command.params}
    assert set(options) == set(AgentSettings.model_fields) | {"config", "print_config"}
    for name, field in AgentSettings.model_fields.items():
        option = options[name]
        assert option.help == field.description, name
        assert "--" + name.replace("_", "-") in option.opts, name
        assert option.envvar == (field.json_schema_extra or {}).get("envvar"), name
        if not field.is_required():
            value = option.default.value if hasattr(option.default, "value") else option.default
            assert value == field.default, name


def test_spark_settings_come_from_a_table_in_the_file_or_key_value_options_and_reach_the_agent_s_session(tmp_path, monkeypatch):
    import spark_agents.runtime as runtime
    from spark_agents.session import agent_conf

    config = tmp_path / "a.toml"
    config.write_text('name = "a"\n\n[spark-conf]\n"spark.sql.shuffle.partitions" = 4\n"spark.driver.port" = 7078\n"spark.eventLog.enabled" = false\n')
    s = _settings("--config", str(config))
    assert s.spark_conf == {"spark.sql.shuffle.partitions": "4", "spark.driver.port": "7078", "spark.eventLog.enabled": "false"}
    options = _settings("--config", str(config), "--spark-conf", "spark.executor.memory = 2g", "--spark-conf", "spark.driver.port=7079")
    assert options.spark_conf == {"spark.executor.memory": "2g", "spark.driver.port": "7079"}, "options replace the file's table"

    ran = {}
    monkeypatch.setattr(runtime, "participant_key", lambda *args: "key")
    monkeypatch.setattr(runtime, "run_agent", lambda config, **kw: ran.update(kw))
    out = CliRunner().invoke(app, ["agent", "run", "--config", str(config), "--workdir", str(tmp_path), "--key", "k", "--spark-master", "local[1]"])
    assert out.exit_code == 0, out.output
    conf = agent_conf(ran["spark_master"], ran["spark_conf"])
    assert conf["spark.sql.shuffle.partitions"] == "4" and conf["spark.driver.memory"] == "2g", conf
    assert agent_conf("local[1]", {"spark.driver.memory": "4g"})["spark.driver.memory"] == "4g", "the operator's over the agent's own"
    assert "spark.driver.memory" not in agent_conf("spark://m:7077"), "a cluster's driver keeps Spark's defaults"


@pytest.mark.parametrize("args, says", [
    (["--spark-conf", "spark.master=local[4]"], "spark-conf: spark.master: set by --spark-master"),
    (["--spark-conf", "spark.driver.host=10.0.0.1"], "spark.driver.host: set by --spark-driver-host"),
    (["--spark-conf", "hadoop.fs.defaultFS=file:///"], "hadoop.fs.defaultFS: not a Spark setting (spark.*)"),
    (["--spark-conf", "spark.driver.port"], "'spark.driver.port' is not KEY=VALUE"),
])
def test_a_spark_setting_the_agent_owns_or_not_spark_s_is_refused_naming_it(args, says):
    code, printed = _effective("--name", "a", *args)
    assert code == 2 and says in " ".join(printed.split()), printed


def test_a_spark_table_in_the_file_with_a_nested_value_is_refused(tmp_path):
    config = tmp_path / "a.toml"
    config.write_text('name = "a"\n\n[spark-conf]\n"spark.driver.port" = [1, 2]\n')
    code, printed = _effective("--config", str(config))
    assert code == 2 and "spark.driver.port: a Spark setting's value is a string, a number or a boolean" in " ".join(printed.split()), printed


def test_further_queries_each_over_an_input_of_its_own_come_from_tables_in_the_file_or_options_and_make_their_tasks(tmp_path, monkeypatch):
    """`[[queries]]` (or `--queries INPUT=REFERENCE;...`): a participant runs several queries
    of its own, each over an input of its stream; its tasks read that input's shares, run that
    query with its parameters, and are named after the input."""
    import spark_agents.runtime as runtime
    from bpm.keygroups import parse_location
    from examples import network_monitoring, sensors, sessions

    config = tmp_path / "a.toml"
    config.write_text('name = "a"\npartitions = "0"\nshares = 2\n\n'
                      '[[queries]]\ninput = "readings"\nquery = "examples.sensors:query"\nparam = { window_s = 10 }\nshares = 2\n\n'
                      '[[queries]]\ninput = "clicks"\nquery = "examples.sessions:query"\nshares = 4\npartitions = "1,3"\n')
    s = _settings("--config", str(config))
    assert [(q.input, q.query, q.param, q.shares, q.partitions) for q in s.queries] == [
        ("readings", "examples.sensors:query", ["window_s=10"], 2, None), ("clicks", "examples.sessions:query", [], 4, "1,3")]
    assert AgentSettings.load(config, queries=["readings=examples.sensors:query;shares=4;partitions=0-1;window_s=20"]).queries[0] == \
        s.queries[0].model_copy(update={"param": ["window_s=20"], "shares": 4, "partitions": "0-1"}), "an option overrides the file's list"

    ran = {}
    monkeypatch.setattr(runtime, "participant_key", lambda *args: "key")
    monkeypatch.setattr(runtime, "run_agent", lambda config, **kw: ran.update(config=config))
    out = CliRunner().invoke(app, ["agent", "run", "--config", str(config), "--workdir", str(tmp_path), "--key", "k",
                                   "--broker-port", "4999", "--insecure"])
    assert out.exit_code == 0, out.output
    config = ran["config"]
    tasks = {t.name: (parse_location(t.input_uri).share, t.query, t.params.get("window_s")) for t in config.tasks}
    assert tasks == {"g0": (("main", "0"), network_monitoring.query.name, 60),
                     "readings-g0": (("readings", "0"), sensors.query.name, 10), "readings-g1": (("readings", "1"), sensors.query.name, 10),
                     "clicks-g01": (("clicks", "01"), sessions.query.name, None), "clicks-g11": (("clicks", "11"), sessions.query.name, None)}
    assert {network_monitoring.query.name, sensors.query.name, sessions.query.name} <= set(config.queries), "it can run each"


@pytest.mark.parametrize("args, says", [
    (["--queries", "main=examples.sensors:query"], "main is the input of --query: name another"),
    (["--queries", "s.x=examples.sensors:query"], "bad input name 's.x'"),
    (["--queries", "examples.sensors:query"], "give INPUT=REFERENCE"),
    (["--queries", "r=examples.sensors:query;shares=3"], "a power of two"),
    (["--queries", "r=examples.sensors:query", "--queries", "r=examples.sessions:query"], "input 'r' is named twice"),
])
def test_a_bad_further_query_is_refused_naming_what_is_wrong(args, says):
    code, printed = _effective("--name", "a", *args)
    assert code == 2 and says in " ".join(printed.split()), printed


@pytest.mark.parametrize("args, says", [
    (["--queries", "r=examples.sensors:query;width_s=3"], "width_s"),
    (["--queries", "r=examples.nothing:query"], "input r:"),
    (["--queries", "r=examples.sensors:query;partitions=0-2"], "beyond the 1 of its shares"),
    (["--queries", "r=examples.sensors:query"], "--queries needs --broker-port"),
    (["--query", "examples.sensors:query", "--correlate"], "sensors declares no `alert` and `align`"),
])
def test_a_further_query_that_does_not_load_or_bind_or_fit_its_shares_stops_the_agent_before_it_starts(tmp_path, monkeypatch, args, says):
    import spark_agents.runtime as runtime

    monkeypatch.setattr(runtime, "run_agent", lambda config, **kw: pytest.fail("the agent started"))
    port = [] if "needs --broker-port" in says else ["--broker-port", "4999"]
    out = CliRunner().invoke(app, ["agent", "run", "--name", "a", "--workdir", str(tmp_path), "--key", "k", "--insecure", *port, *args],
                             env={"COLUMNS": "1000"})
    assert out.exit_code == 2 and says in " ".join(out.output.split()), out.output


def test_an_agent_correlates_its_main_query_s_alerts_beside_further_queries(tmp_path, monkeypatch):
    """`--correlate` with `--queries`: the agent starts, correlating the alerts of the query of
    `--query` only (`Agent._correlated_tasks`)."""
    import spark_agents.runtime as runtime

    started = []
    monkeypatch.setattr(runtime, "run_agent", lambda config, **kw: started.append(config))
    out = CliRunner().invoke(app, ["agent", "run", "--name", "a", "--workdir", str(tmp_path), "--key", "k", "--insecure", "--broker-port", "4999",
                                   "--partitions", "0", "--queries", "r=examples.sensors:query", "--correlate"], env={"COLUMNS": "1000"})
    assert out.exit_code == 0 and started, out.output
    assert started[0].correlate and {t.name for t in started[0].tasks} == {"g", "r-g"}
