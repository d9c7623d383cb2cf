"""`bpm agent run`: one participant of the federation."""

from __future__ import annotations

import inspect
import logging
from enum import Enum
from pathlib import Path
from typing import Annotated, Literal, get_args, get_origin
from urllib.parse import urlsplit

import typer

from bpm_app.commands import app, choice, fail

log = logging.getLogger(__name__)

agent_app = typer.Typer(help="Run a participant's agent.", no_args_is_help=True)
app.add_typer(agent_app, name="agent")


def parse_partitions(spec: str) -> list[int]:
    """'0-3,7' -> [0, 1, 2, 3, 7]."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        lo, _, hi = part.partition("-")
        try:
            out.extend(range(int(lo), int(hi or lo) + 1))
        except ValueError as exc:
            raise typer.BadParameter(f"bad partition list {spec!r}: use e.g. 0-3,7") from exc
    return sorted(set(out))


def broker_password(workdir: Path) -> str:
    """The owner password of the participant's broker: BPM_NATS_PASSWORD, or the one kept in
    its folder (made on first use)."""
    import os
    import secrets

    from bpm.keygroups import PASSWORD_ENV
    from spark_agents.broker.server import BrokerError, check_password
    from spark_agents.credentials import write_private

    password = os.environ.get(PASSWORD_ENV)
    if password:
        try:
            return check_password(password)
        except BrokerError as exc:
            raise typer.BadParameter(f"{PASSWORD_ENV}: {exc}") from None
    kept = workdir / "broker" / "owner.password"
    if not kept.exists():
        write_private(kept, secrets.token_urlsafe(24))
    return kept.read_text().strip()


def _options() -> list[inspect.Parameter]:
    """`bpm agent run`'s options, one per setting of `AgentSettings`: its help, default,
    bounds, choices and environment variable."""
    import annotated_types

    from spark_agents.settings import AgentSettings

    params = []
    for name, field in AgentSettings.model_fields.items():
        annotation, default, required = field.annotation, field.default, field.is_required()
        if dict in {get_origin(a) for a in (annotation, *get_args(annotation))} or _of_tables(annotation):
            annotation = list[str] | None  # tables in the file, texts here (the setting's validators read both)
        elif get_origin(annotation) is Literal:
            annotation = choice(f"Setting_{name}", get_args(annotation))
            default = annotation(default)
        flag = "--" + name.replace("_", "-")
        bounds = {}  # the command line checks the inclusive ones; the settings then refuse a strict one's edge
        for rule in field.metadata:
            if isinstance(rule, annotated_types.Ge):
                bounds["min"] = rule.ge
            elif isinstance(rule, annotated_types.Gt):
                bounds["min"] = rule.gt
            elif isinstance(rule, annotated_types.Le):
                bounds["max"] = rule.le
        option = typer.Option(f"{flag}/--no-{flag[2:]}" if annotation is bool else flag, help=field.description,
                              envvar=(field.json_schema_extra or {}).get("envvar"), show_default=not required, **bounds)
        # A required setting may come from the file: on the command line it is optional too.
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None if required else default,
                                        annotation=Annotated[(annotation | None) if required else annotation, option]))
    return params


def _of_tables(annotation: object) -> bool:
    """Whether a setting is a list of tables (`spark_agents.settings.InputQuery`)."""
    from pydantic import BaseModel

    lists = [a for a in (annotation, *get_args(annotation)) if get_origin(a) is list]
    return any(isinstance(t, type) and issubclass(t, BaseModel) for a in lists for t in get_args(a))


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether option `name` was given on the command line or by its environment variable (not its default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def run(
    ctx: typer.Context,
    config: Path | None = None,
    print_config: bool = False,
    **options: object,
) -> None:
    """Run one participant: host its tasks on Spark and trade load with its contract partners.

    Every option may also be set in a TOML configuration file (--config), one key per option without its leading dashes (spark-master = "local[1]", contract = ["b:0.5:1:600"]); an option given here, or its environment variable, overrides the file.
    """
    from spark_agents.settings import AgentSettings, SettingsError

    given = {name: value.value if isinstance(value, Enum) else value for name, value in options.items()
             if _given(ctx, name)}
    try:
        settings = AgentSettings.load(config, **given)
    except SettingsError as exc:
        fail(exc)
    if print_config:
        typer.echo(settings.toml(secrets=False), nl=False)
        raise typer.Exit()
    _run(settings)


run.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
    inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[Path | None, typer.Option(
        "--config", envvar="BPM_AGENT_CONFIG", exists=True, dir_okay=False,
        help="TOML file of settings, one key per option below without its dashes; options given here override it.")]),
    inspect.Parameter("print_config", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=Annotated[bool, typer.Option(
        "--print-config", help="Print the settings this would run with, as a configuration file (keys left out), and exit.")]),
    *_options(),
])
run.__annotations__ = {p.name: p.annotation for p in run.__signature__.parameters.values()}  # type: ignore[attr-defined]
agent_app.command("run")(run)


def agent_queries(reference: str, params: list[str] | None, can_run: list[str] | None, inputs=()):
    """(the query of the participant's own tasks over its main input, its parameters bound,
    every query it can run by name, and per further input of its own (`inputs`:
    `spark_agents.settings.InputQuery`) its query and parameters bound) from its settings; a
    query that does not load, a parameter it does not take, or two queries of one name are a
    BadParameter naming them."""
    from bpm.query import QueryError, parse_values
    from bpm_app.commands.query import load_query

    try:
        own = load_query(reference)
        bound = own.bind(parse_values(params))
        others = [load_query(r) for r in can_run or []]
    except QueryError as exc:
        raise typer.BadParameter(str(exc), param_hint="--query/--param/--can-run") from None
    per_input = {}
    for spec in inputs:
        try:
            query = load_query(spec.query)
            per_input[spec.input] = (query, dict(query.bind(parse_values(spec.param))))
        except QueryError as exc:
            raise typer.BadParameter(f"input {spec.input}: {exc}", param_hint="--queries") from None
    queries = {}
    for query in (own, *others, *(q for q, _ in per_input.values())):
        if query.name in queries and queries[query.name].digest != query.digest:
            raise typer.BadParameter(f"two different queries are named {query.name!r}", param_hint="--query/--queries/--can-run")
        queries[query.name] = query
    return own, dict(bound), queries, per_input


def own_tasks(settings, broker, own_query, params: dict, per_input: dict, trigger_s: float) -> list:
    """The participant's own tasks (`spark_agents.agent.OwnTask`): the shares `--partitions` of
    its main input running `own_query`, and every share (or those its `partitions` name) of
    each further input of `--queries` running its query, named `INPUT-g<bits>`."""
    from bpm.keygroups import MAIN
    from bpm.keygroups import shares as key_shares
    from spark_agents.agent import OwnTask

    def tasks(input: str, count: int, spec: str, query, bound: dict, where: str) -> list[OwnTask]:
        try:
            prefixes = key_shares(count)
        except ValueError as exc:
            raise typer.BadParameter(f"{where}{exc}") from None
        picked = parse_partitions(spec)
        if any(k >= len(prefixes) for k in picked):
            raise typer.BadParameter(f"{where}partitions {spec} name shares beyond the {count} of its shares")
        name = "g{}" if input == MAIN else f"{input}-g{{}}"
        return [OwnTask(name.format(prefixes[k]), broker.location(prefixes[k], input), {**bound, "trigger_s": trigger_s},
                        query.name, query.digest) for k in picked]

    if broker is None and (settings.partitions or per_input):
        raise typer.BadParameter(f"{'--partitions' if settings.partitions else '--queries'} needs --broker-port: "
                                 "a participant's own tasks read its own broker's stream")
    own = tasks(MAIN, settings.shares or 1, settings.partitions, own_query, params, "") if settings.partitions else []
    for spec in settings.queries or []:
        query, bound = per_input[spec.input]
        every = f"0-{spec.shares - 1}"
        own += tasks(spec.input, spec.shares, every if spec.partitions is None else spec.partitions, query, bound, f"--queries {spec.input}: ")
    return own


def _run(s) -> None:
    """Run the agent with settings `s` (`spark_agents.settings.AgentSettings`)."""
    from bpm.costs import MM1Cost
    from bpm.federation.views import AgreedTerms
    from spark_agents.agent import AgentConfig
    from spark_agents.broker.access import OwnBroker
    from bpm.load import default_warmup_s
    from spark_agents.runtime import participant_key, run_agent
    from spark_agents.session import driver_addresses
    from spark_agents.tls import own_certificate

    from bpm_app.logs import configure

    configure(s.log_format, participant=s.name)
    workdir = (s.workdir or Path("bpm-agents") / s.name).resolve()
    endpoint = s.endpoint or f"{'http' if s.insecure else 'https'}://{s.host}:{s.port}"
    if urlsplit(endpoint).scheme != ("http" if s.insecure else "https"):
        raise typer.BadParameter(f"{endpoint} is plain HTTP: use https://, or --insecure" if not s.insecure
                                 else f"{endpoint} is not http://, which --insecure serves", param_hint="--endpoint")
    own_query, bound, queries, per_input = agent_queries(s.query, s.param, s.can_run, s.queries or ())
    if s.shares is not None and s.broker_port is None:
        raise typer.BadParameter("--shares needs --broker-port")
    password = broker_password(workdir) if s.broker_port else ""  # checked before anything is written
    tls = None
    if s.insecure:
        log.warning("%s: --insecure: this agent and its broker serve plain text, and it speaks plain text to partners that do; "
                    "whoever is on the path reads its checkpoints, broker credentials, call tokens and streams", s.name)
    else:
        try:
            tls = own_certificate(workdir, s.name, [urlsplit(endpoint).hostname or s.host], cert_file=s.tls_cert, key_file=s.tls_key)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--tls-cert") from None
    broker = OwnBroker(s.name, workdir / "broker", password, host=s.host, port=s.broker_port, http_port=s.broker_http_port or s.broker_port + 1,
                       advertise=s.broker_address, tls=tls) if s.broker_port else None
    own = own_tasks(s, broker, own_query, bound, per_input, s.trigger)
    if s.correlate and s.broker_port is None:
        raise typer.BadParameter("--correlate needs --broker-port: alerts are shared on the participant's own broker")
    if s.correlate and (own_query.alert is None or own_query.align_s(own_query.bind(bound)) is None):
        raise typer.BadParameter(f"--correlate shares the alerts of the query of --query, and {own_query.name} declares "
                                 "no `alert` and `align` (the queries of --queries are not correlated)")
    try:
        agreed = [AgreedTerms.parse(spec) for spec in s.contract or []]
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--contract") from None
    config = AgentConfig(
        name=s.name,
        workdir=workdir,
        endpoint=endpoint,
        tasks=own,
        period_s=s.period,
        tick_s=s.tick,
        heartbeat_s=s.heartbeat,
        reference_price=s.reference_price,
        contracts=agreed,
        warmup_s=default_warmup_s(s.trigger) if s.warmup is None else s.warmup,
        settle_s=s.settle,
        margin=s.margin,
        pass_on=s.pass_on,
        ha=s.ha,
        ha_interval_s=s.ha_interval,
        fixed_cost=s.fixed_cost,
        correlate=s.correlate,
        availability_bound_s=s.availability_bound,
        queries=queries,
        insecure=s.insecure,
    )
    fixed = MM1Cost(a=s.mm1_scale, c=1.0) if s.cost_model == "mm1" else None
    api_key = participant_key(s.registry, s.name, endpoint, workdir, s.key, s.admin_key)
    driver_host, driver_bind = driver_addresses(s.spark_master, s.host, s.spark_driver_host, s.spark_bind_address)
    run_agent(config, registry_url=s.registry, key=api_key, bind_host=s.host, port=s.port, spark_master=s.spark_master,
              driver_host=driver_host, driver_bind=driver_bind, cpus=s.cpus, trigger_s=s.trigger,
              sample_s=s.sample, cost_model=fixed, broker=broker, prime_s=s.prime, tls=tls, spark_conf=s.spark_conf)
