"""The settings of `bpm agent run`: every option, its default and its meaning, in one place.

`bpm agent run`'s options are made from `AgentSettings` (`bpm_app.commands.agent`), and an
operator may set any of them in a TOML file (`bpm agent run --config FILE`), one key per option
named as the option without its leading dashes:

    name = "a"
    spark-master = "local[1]"
    contract = ["b:0.5:1:1200", "c:0.5:1:1200"]
    correlate = true

    [[queries]]                # a further query of the participant's own, over an input of its own
    input = "sensors"
    query = "examples.sensors:query"
    param = { window_s = 10 }
    shares = 2                 # its input in two shares, tasks sensors-g0 and sensors-g1

An option on the command line, or its environment variable, overrides the file; the file
overrides the defaults here. `AgentConfig`'s defaults are these too (`default`).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, TomlConfigSettingsSource

from bpm.keygroups import MAIN, KeyGroupError, check_input, shares as key_shares
from bpm.negotiation import DEFAULT_MARGIN

# Spark settings the agent sets from options of its own (`spark_conf` may not): why not.
SPARK_OWN_SETTINGS = {
    "spark.master": "set by --spark-master",
    "spark.app.name": "the agent names its application after its participant",
    "spark.driver.host": "set by --spark-driver-host",
    "spark.driver.bindAddress": "set by --spark-bind-address",
}
# Settings that are secrets: never printed (`AgentSettings.toml(secrets=False)`).
SECRETS = ("key", "admin_key")


def _option(name: str) -> str:
    return name.replace("_", "-")


def _env(var: str) -> dict[str, Any]:
    """A setting that its environment variable `var` also sets (below the command line, above the file)."""
    return {"envvar": var}


def _text(value: str | int | float | bool) -> str:
    """A TOML value as the command line writes it (a boolean as true or false)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _texts(value: Any) -> Any:
    """`name=value` strings (the command line) or a table (the file), as `name=value` strings."""
    if isinstance(value, dict):
        return [f"{k}={_text(v)}" for k, v in value.items()]
    return value


class InputQuery(BaseModel):
    """A further query of the participant's own tasks, over an input of its stream of its own
    (`bpm.keygroups`): in the file a `[[queries]]` table, on the command line
    `--queries 'INPUT=REFERENCE[;shares=N][;partitions=SPEC][;NAME=VALUE...]'`."""

    model_config = ConfigDict(alias_generator=_option, validate_by_name=True, validate_by_alias=True, extra="forbid", frozen=True)

    input: str = Field(description="The input's name: a letter, then letters, digits, '_' or '-'; not main.")
    query: str = Field(description="The query, module:attribute or path/to/file.py:attribute.")
    param: list[str] = Field(default_factory=list, description="Its parameters, name=value (in the file also a table).")
    shares: int = Field(1, ge=1, le=64, description="Its input in N equal shares of its 64 key groups (a power of two), one task each.")
    partitions: str | None = Field(None, description="The shares that are the participant's own tasks, e.g. 0-1 (default: all).")

    @field_validator("input")
    @classmethod
    def _input(cls, value: str) -> str:
        if check_input(value) == MAIN:
            raise ValueError(f"{MAIN} is the input of --query: name another")
        return value

    @field_validator("param", mode="before")
    @classmethod
    def _param(cls, value: Any) -> Any:
        return _texts(value)

    @field_validator("shares")
    @classmethod
    def _shares(cls, value: int) -> int:
        try:
            key_shares(value)
        except KeyGroupError as exc:
            raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="before")
    @classmethod
    def _spec(cls, value: Any) -> Any:
        """The command line's `INPUT=REFERENCE;shares=N;partitions=SPEC;NAME=VALUE` form, as a table."""
        if not isinstance(value, str):
            return value
        head, *rest = value.split(";")
        input, sep, reference = head.partition("=")
        if not sep:
            raise ValueError(f"{value!r}: give INPUT=REFERENCE[;shares=N][;partitions=SPEC][;NAME=VALUE...]")
        table: dict[str, Any] = {"input": input.strip(), "query": reference.strip(), "param": []}
        for item in filter(None, (r.strip() for r in rest)):
            name, sep, setting = item.partition("=")
            if not sep:
                raise ValueError(f"{item!r} in {value!r}: give NAME=VALUE")
            if name.strip() in ("shares", "partitions"):
                table[name.strip()] = setting.strip()
            else:
                table["param"].append(item)
        return table


class SettingsError(ValueError):
    """A configuration file that cannot be read, or settings that are not valid; the message
    names the file and each wrong key, one per line."""


class AgentSettings(BaseSettings):
    """Everything `bpm agent run` is told (its options' names with underscores)."""

    model_config = SettingsConfigDict(alias_generator=_option, validate_by_name=True, validate_by_alias=True,
                                      extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="Participant name.")
    registry: str = Field("http://127.0.0.1:8000", description="Registry base URL.", json_schema_extra=_env("BPM_REGISTRY_URL"))
    host: str = Field("127.0.0.1", description="Address this agent listens on: its host's own address (loopback by default).")
    port: int = Field(9000, ge=1, le=65535, description="Port of the agent's HTTP endpoint (status, metrics, handover).")
    endpoint: str | None = Field(None, description="URL partners reach this agent at (default https://HOST:PORT, http:// with --insecure); set it when HOST is 0.0.0.0, as in a container.",
                                 json_schema_extra=_env("BPM_ENDPOINT"))
    tls_cert: Path | None = Field(None, description="The TLS certificate (PEM) this agent serves, with --tls-key: say one of the operator's own CA; by default the agent makes a certificate of its own and keeps it in WORKDIR/tls. Either way it registers it with the registry, and partners trust that certificate only.",
                                  json_schema_extra=_env("BPM_TLS_CERT"))
    tls_key: Path | None = Field(None, description="The private key of --tls-cert (PEM).", json_schema_extra=_env("BPM_TLS_KEY"))
    insecure: bool = Field(False, description="Serve plain HTTP and talk plain HTTP to partners that do: checkpoints, broker credentials and tokens then cross the network readable. For a test on one machine only.")
    spark_master: str = Field("local[*]", description="Spark master URL: local[*], local[N], spark://host:port.", json_schema_extra=_env("BPM_SPARK_MASTER"))
    spark_driver_host: str | None = Field(None, description="Address the Spark driver advertises to its executors (default: 127.0.0.1 on a local master, else HOST).",
                                          json_schema_extra=_env("BPM_SPARK_DRIVER_HOST"))
    spark_bind_address: str | None = Field(None, description="Address the Spark driver binds (default: --spark-driver-host).",
                                           json_schema_extra=_env("BPM_SPARK_BIND_ADDRESS"))
    spark_conf: dict[str, str] | None = Field(None, description="A Spark setting of the agent's session, KEY=VALUE (repeatable; in the file a [spark-conf] table), e.g. spark.sql.shuffle.partitions=4, spark.driver.port=7078, spark.executor.memory=2g: what a cluster needs (memory, cores, the driver's ports). Only spark.* keys, and none that an option above sets (the master, the driver's address).")
    key: str | None = Field(None, description="This participant's API key (better in its environment variable than in a file).", json_schema_extra=_env("BPM_KEY"))
    admin_key: str | None = Field(None, description="Operator key, to register the participant on first run.", json_schema_extra=_env("BPM_ADMIN_KEY"))
    workdir: Path | None = Field(None, description="Checkpoints and key file (default ./bpm-agents/NAME).")
    partitions: str = Field("", description="Shares of the participant's broker stream (--shares) that are its own tasks, e.g. 0-3.")
    query: str = Field("examples.network_monitoring:query", description="The query of this participant's own tasks over its stream (bpm.query): module:attribute, or path/to/file.py:attribute.")
    param: list[str] | None = Field(None, description="A parameter of that query, name=value (repeatable), e.g. window_s=10: checked against the query when the agent starts (an unknown or badly typed one is an error).")
    queries: list[InputQuery] | None = Field(None, description="A further query of this participant's own tasks, each over an input of its stream of its own, INPUT=REFERENCE[;shares=N][;partitions=SPEC][;NAME=VALUE...] (repeatable; in the file [[queries]] tables with input, query, param, shares and partitions). Publish its records with bpm replay --stream nats://HOST:PORT/PARTICIPANT/INPUT; its tasks are named INPUT-g<bits>.")
    can_run: list[str] | None = Field(None, description="Another query this participant runs for its partners, module:attribute (repeatable): it refuses to host a task of a query it does not have, or of another version of one.")
    trigger: float = Field(1.0, gt=0, description="Micro-batch trigger interval, seconds; each task adds up to a tenth, fixed by its name, so that batches do not all start at once.")
    period: float = Field(7.0, gt=0, description="Mechanism period: offers, answers, ends (Borealis: 7 s).")
    tick: float = Field(0.5, gt=0, description="How often the agent reconciles its tasks with what it read of the registry, seconds.")
    heartbeat: float = Field(1.0, ge=0.1, description="How often it sends its heartbeat, which brings the registry's change notices, seconds (below the registry's heartbeat timeout).")
    sample: float = Field(5.0, gt=0, description="Load measuring interval, seconds.")
    cpus: float | None = Field(None, ge=0.01, description="The participant's capacity in CPUs, against which its load is measured (default: its cgroup CPU quota when it has one, else Spark's parallelism).")
    reference_price: float | None = Field(None, gt=0, description="Price at which the threshold is reported (default: cheapest contract).")
    cost_model: Literal["fitted", "mm1"] = Field("fitted", description="fitted: from measured batch durations, M/M/1 until samples suffice; mm1: the analytic form only.")
    mm1_scale: float = Field(1.0, gt=0, description="Scale a of the M/M/1 cost a*u/(1-u) when --cost-model mm1.")
    warmup: float | None = Field(None, ge=0, description="Seconds after start, and after each task that starts meanwhile, during which the agent neither offers nor takes load (JIT compilation and a task's first batches inflate the CPU measured); default 30, or two triggers and a load window when longer (50 at --trigger 10).")
    settle: float = Field(15.0, ge=0, description="Seconds after a task starts or stops here during which the agent neither offers, answers offers nor ends movements, so that it decides on loads measured since: a stop leaves a load window that saw only the tasks that stayed after half a window (7.5 s at the default trigger; the window is 15 s, or three triggers when longer), and a task that started has no load of its own until two triggers and half a window past its start (its previous host's figure stands in until then).")
    prime: float = Field(0.0, ge=0, description="Seconds, in all, of each query the agent can run over records made up from its schema, that the agent runs on its Spark at start, before it answers or trades (spark_agents.warmup): a Spark that has run no query spends several times its tasks' steady CPU on its first ones, and loads read then are far off. For an agent that starts without tasks and takes them later; 0: none.")
    pass_on: bool = Field(True, description="Offer tasks hosted for others on to this participant's own partners when it is over its threshold (only where none of its contracts replicates moved tasks).")
    margin: float = Field(DEFAULT_MARGIN, ge=0, description="Relative margin both sides demand on top of the price when offering and accepting load (bpm.negotiation): 0.1 keeps a partner taking load below its threshold by about 10% of the price.")
    contract: list[str] | None = Field(None, description="Terms agreed offline, PARTNER:PRICE_MIN:PRICE_MAX:MIN_DURATION_S[:HA_MODE] (repeatable; HA_MODE none, upstream_backup, passive_standby or active_standby); the agent proposes or accepts them in the registry.")
    ha: bool = Field(True, description="High availability duties: fail over moved tasks whose host failed, keep replicas and delta checkpoints, repair.")
    ha_interval: float = Field(2.0, ge=0.1, description="Seconds between a host's passive-standby deltas and stream acknowledgements.")
    broker_port: int | None = Field(None, ge=1, le=65535, description="Run this participant's own NATS server (JetStream) on this port, its storage in WORKDIR/broker; its owner password from BPM_NATS_PASSWORD, else made up and kept there.")
    broker_http_port: int | None = Field(None, ge=1, le=65535, description="Health-check port of the broker (default: --broker-port + 1).")
    broker_address: str | None = Field(None, description="Address partners reach the broker at (default: HOST).")
    shares: int | None = Field(None, ge=1, le=64, description="With --broker-port: its stream split into N equal shares of its 64 key groups (a power of two); --partitions then picks the shares that are its own tasks, named g<bits>.")
    fixed_cost: float | None = Field(None, ge=0, le=1, description="What one running task costs whatever its input, as a share of the participant's capacity (bpm bench fixed-cost measures it): with it, the agent splits its own tasks over their key groups where their size keeps load from moving, and merges them back where it no longer does; unset: tasks keep their size.")
    correlate: bool = Field(False, description="With --broker-port: share this participant's alerts with its contract partners and correlate them with those they share (per window, sources alerting at two or more participants; tentative while a partner is unreachable).")
    availability_bound: float = Field(10.0, ge=0, description="With --correlate: seconds a window's correlated result waits for a partner's alerts before it is published tentative.")
    log_format: Literal["text", "json"] = Field("text", description="text, or json: one JSON object per line (time, level, logger, message, participant).")

    @field_validator("spark_conf", mode="before")
    @classmethod
    def _spark_conf(cls, value: Any) -> Any:
        """`KEY=VALUE` strings (the command line) or a table (the file), as a table of strings."""
        if value is None:
            return None
        if isinstance(value, (list, tuple)):
            pairs = []
            for item in value:
                key, sep, setting = str(item).partition("=")
                if not sep or not key.strip():
                    raise ValueError(f"{item!r} is not KEY=VALUE")
                pairs.append((key.strip(), setting.strip()))
        elif isinstance(value, dict):
            pairs = list(value.items())
        else:
            raise ValueError("KEY=VALUE strings, or a table of Spark settings")
        table = {}
        for key, setting in pairs:
            if not isinstance(setting, (str, int, float, bool)):
                raise ValueError(f"{key}: a Spark setting's value is a string, a number or a boolean")
            table[str(key)] = _text(setting)
        for key in table:
            if not key.startswith("spark.") or key in SPARK_OWN_SETTINGS:
                raise ValueError(f"{key}: " + (SPARK_OWN_SETTINGS[key] if key in SPARK_OWN_SETTINGS else "not a Spark setting (spark.*)"))
        return table

    @field_validator("queries")
    @classmethod
    def _inputs(cls, value: list[InputQuery] | None) -> list[InputQuery] | None:
        seen = set()
        for query in value or []:
            if query.input in seen:
                raise ValueError(f"input {query.input!r} is named twice: one query per input")
            seen.add(query.input)
        return value

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings):
        # Only what `load` is given: the command line (which reads the environment variables
        # named above itself) over the file.
        return (init_settings,)

    @classmethod
    def load(cls, file: Path | None = None, **given: Any) -> AgentSettings:
        """The settings from `file` (TOML), each overridden by `given` (by name)."""
        in_file: dict[str, Any] = {}
        if file is not None:
            if not file.is_file():
                raise SettingsError(f"{file}: no such configuration file")
            try:
                in_file = TomlConfigSettingsSource(cls, toml_file=file).toml_data
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise SettingsError(f"{file}: not TOML: {exc}") from None
            except OSError as exc:
                raise SettingsError(f"{file}: {exc.strerror or exc}") from None
        merged = {_option(k): v for k, v in in_file.items()} | {_option(k): v for k, v in given.items()}
        try:
            return cls(**merged)
        except ValidationError as exc:
            where = f"{file}: " if file is not None else ""
            lines = [f"{where}{'.'.join(map(str, e['loc'])) or 'settings'}: {_message(e)}" for e in exc.errors()]
            raise SettingsError("\n".join(lines)) from None

    def toml(self, secrets: bool = True) -> str:
        """These settings as a configuration file, only those that differ from the defaults."""
        import tomli_w

        values = self.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=True,
                                 exclude=None if secrets else set(SECRETS))
        values = {"name": self.name, **values}
        return tomli_w.dumps(values)


def _message(error: dict) -> str:
    if error["type"] == "extra_forbidden":
        return "not a setting of bpm agent run (see bpm agent run --help)"
    if error["type"] == "missing":
        return "required: set it in the file or on the command line"
    if error["type"] == "value_error":  # a validator's own words, without pydantic's prefix
        return str(error["ctx"]["error"])
    return error["msg"]


def default(name: str) -> Any:
    """The default of setting `name`."""
    return AgentSettings.model_fields[name].default
