"""`bpm agent run`: one participant of the federation."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bpm_app.commands import LogFormat, app, choice

# How the agent prices its load: fitted to its measured batches, or the M/M/1 form alone.
AgentCostModel = choice("AgentCostModel", ("fitted", "mm1"))

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


def own_broker(name: str, workdir: Path, host: str, port: int, http_port: int, address: str | None):
    """The participant's broker, its owner password from BPM_NATS_PASSWORD or kept in its folder."""
    import os
    import secrets

    from bpm.keygroups import PASSWORD_ENV
    from spark_agents.broker.access import OwnBroker
    from spark_agents.broker.server import BrokerError, check_password
    from spark_agents.credentials import write_private

    folder = workdir / "broker"
    password = os.environ.get(PASSWORD_ENV)
    if password:
        try:
            check_password(password)
        except BrokerError as exc:
            raise typer.BadParameter(f"{PASSWORD_ENV}: {exc}") from None
    else:
        kept = folder / "owner.password"
        if not kept.exists():
            write_private(kept, secrets.token_urlsafe(24))
        password = kept.read_text().strip()
    return OwnBroker(name, folder, password, host=host, port=port, http_port=http_port, advertise=address)


@agent_app.command("run")
def run(
    name: Annotated[str, typer.Option(help="Participant name.")],
    registry: Annotated[str, typer.Option(envvar="BPM_REGISTRY_URL", help="Registry base URL.")] = "http://127.0.0.1:8000",
    host: Annotated[str, typer.Option(help="Address this agent listens on: its host's own address (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the agent's HTTP endpoint (status, metrics, handover).")] = 9000,
    endpoint: Annotated[str | None, typer.Option(envvar="BPM_ENDPOINT", help="URL partners reach this agent at (default http://HOST:PORT); set it when HOST is 0.0.0.0, as in a container.")] = None,
    spark_master: Annotated[str, typer.Option(envvar="BPM_SPARK_MASTER", help="Spark master URL: local[*], local[N], spark://host:port.")] = "local[*]",
    spark_driver_host: Annotated[str | None, typer.Option(envvar="BPM_SPARK_DRIVER_HOST", help="Address the Spark driver advertises to its executors (default: 127.0.0.1 on a local master, else HOST).")] = None,
    spark_bind_address: Annotated[str | None, typer.Option(envvar="BPM_SPARK_BIND_ADDRESS", help="Address the Spark driver binds (default: --spark-driver-host).")] = None,
    key: Annotated[str | None, typer.Option(envvar="BPM_KEY", help="This participant's API key.")] = None,
    admin_key: Annotated[str | None, typer.Option(envvar="BPM_ADMIN_KEY", help="Operator key, to register the participant on first run.")] = None,
    workdir: Annotated[Path | None, typer.Option(help="Checkpoints and key file (default ./bpm-agents/NAME).")] = None,
    partitions: Annotated[str, typer.Option(help="Shares of the participant's broker stream (--shares) that are its own tasks, e.g. 0-3.")] = "",
    window: Annotated[int, typer.Option(help="Window of the query, seconds.")] = 60,
    min_connections: Annotated[int, typer.Option(help="Connections alert threshold (strictly more).")] = 100,
    min_ports: Annotated[int, typer.Option(help="Distinct ports alert threshold (strictly more).")] = 10,
    lateness: Annotated[int, typer.Option(help="Allowed lateness / watermark delay, seconds.")] = 60,
    trigger: Annotated[float, typer.Option(help="Micro-batch trigger interval, seconds; each task adds up to a tenth, fixed by its name, so that batches do not all start at once.")] = 1.0,
    period: Annotated[float, typer.Option(help="Mechanism period: offers, answers, ends (Borealis: 7 s).")] = 7.0,
    tick: Annotated[float, typer.Option(help="How often the agent reconciles its tasks with what it read of the registry, seconds.")] = 0.5,
    heartbeat: Annotated[float, typer.Option(min=0.1, help="How often it sends its heartbeat, which brings the registry's change notices, seconds (below the registry's heartbeat timeout).")] = 1.0,
    sample: Annotated[float, typer.Option(help="Load measuring interval, seconds.")] = 5.0,
    cpus: Annotated[float | None, typer.Option(min=0.01, help="The participant's capacity in CPUs, against which its load is measured (default: its cgroup CPU quota when it has one, else Spark's parallelism).")] = None,
    reference_price: Annotated[float | None, typer.Option(help="Price at which the threshold is reported (default: cheapest contract).")] = None,
    cost_model: Annotated[AgentCostModel, typer.Option(help="fitted: from measured batch durations, M/M/1 until samples suffice; mm1: the analytic form only.")] = AgentCostModel.fitted,
    mm1_scale: Annotated[float, typer.Option(help="Scale a of the M/M/1 cost a*u/(1-u) when --cost-model mm1.")] = 1.0,
    warmup: Annotated[float, typer.Option(help="Seconds after start during which the agent neither offers nor takes load (JIT compilation inflates the CPU measured).")] = 30.0,
    settle: Annotated[float, typer.Option(min=0.0, help="Seconds after a task starts or stops here during which the agent neither offers, answers offers nor ends movements, so that it decides on a load window (15 s) that saw only the tasks it runs now.")] = 15.0,
    pass_on: Annotated[bool, typer.Option("--pass-on/--no-pass-on", help="Offer tasks hosted for others on to this participant's own partners when it is over its threshold (only where none of its contracts replicates moved tasks).")] = True,
    margin: Annotated[float, typer.Option(min=0.0, help="Relative margin both sides demand on top of the price when offering and accepting load (bpm.negotiation): 0.1 keeps a partner taking load below its threshold by about 10% of the price.")] = 0.0,
    contract: Annotated[list[str] | None, typer.Option(help="Terms agreed offline, PARTNER:PRICE_MIN:PRICE_MAX:MIN_DURATION_S[:HA_MODE] (repeatable; HA_MODE none, upstream_backup, passive_standby or active_standby); the agent proposes or accepts them in the registry.")] = None,
    ha: Annotated[bool, typer.Option("--ha/--no-ha", help="High availability duties: fail over moved tasks whose host failed, keep replicas and delta checkpoints, repair.")] = True,
    ha_interval: Annotated[float, typer.Option(min=0.1, help="Seconds between a host's passive-standby deltas and stream acknowledgements.")] = 2.0,
    broker_port: Annotated[int | None, typer.Option(min=1, max=65535, help="Run this participant's own NATS server (JetStream) on this port, its storage in WORKDIR/broker; its owner password from BPM_NATS_PASSWORD, else made up and kept there.")] = None,
    broker_http_port: Annotated[int | None, typer.Option(min=1, max=65535, help="Health-check port of the broker (default: --broker-port + 1).")] = None,
    broker_address: Annotated[str | None, typer.Option(help="Address partners reach the broker at (default: HOST).")] = None,
    shares: Annotated[int | None, typer.Option(min=1, max=64, help="With --broker-port: its stream split into N equal shares of its 64 key groups (a power of two); --partitions then picks the shares that are its own tasks, named g<bits>.")] = None,
    correlate: Annotated[bool, typer.Option("--correlate/--no-correlate", help="With --broker-port: share this participant's alerts with its contract partners and correlate them with those they share (per window, sources alerting at two or more participants; tentative while a partner is unreachable).")] = False,
    availability_bound: Annotated[float, typer.Option(min=0.0, help="With --correlate: seconds a window's correlated result waits for a partner's alerts before it is published tentative.")] = 10.0,
    log_format: Annotated[LogFormat, typer.Option(help="text, or json: one JSON object per line (time, level, logger, message, participant).")] = LogFormat.text,
) -> None:
    """Run one participant: host its tasks on Spark and trade load with its contract partners."""
    from bpm.keygroups import shares as key_shares
    from bpm.zeek.definitions import QueryParams
    from bpm.federation.views import AgreedTerms
    from spark_agents.agent import AgentConfig, OwnTask
    from spark_agents.runtime import participant_key, run_agent
    from spark_agents.session import driver_addresses

    from bpm_app.logs import configure

    configure(log_format.value, participant=name)
    workdir = (workdir or Path("bpm-agents") / name).resolve()
    endpoint = endpoint or f"http://{host}:{port}"
    params = {**QueryParams(window, min_connections, min_ports, lateness).to_dict(), "trigger_s": trigger}
    if shares is not None and broker_port is None:
        raise typer.BadParameter("--shares needs --broker-port")
    broker = own_broker(name, workdir, host, broker_port, broker_http_port or broker_port + 1, broker_address) if broker_port else None
    own = []
    if partitions and broker is not None:
        try:
            prefixes = key_shares(shares or 1)
            own = [OwnTask(f"g{prefixes[k]}", broker.location(prefixes[k]), params) for k in parse_partitions(partitions)]
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--shares") from None
        except IndexError:
            raise typer.BadParameter(f"--partitions {partitions} names shares beyond the {shares or 1} of --shares") from None
    elif partitions:
        raise typer.BadParameter("--partitions needs --broker-port: a participant's own tasks read its own broker's stream")
    if correlate and broker_port is None:
        raise typer.BadParameter("--correlate needs --broker-port: alerts are shared on the participant's own broker")
    try:
        agreed = [AgreedTerms.parse(spec) for spec in contract or []]
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--contract") from None
    config = AgentConfig(
        name=name,
        workdir=workdir,
        endpoint=endpoint,
        tasks=own,
        period_s=period,
        tick_s=tick,
        heartbeat_s=heartbeat,
        reference_price=reference_price,
        contracts=agreed,
        warmup_s=warmup,
        settle_s=settle,
        margin=margin,
        pass_on=pass_on,
        ha=ha,
        ha_interval_s=ha_interval,
        correlate=correlate,
        availability_bound_s=availability_bound,
    )
    from bpm.costs import MM1Cost

    fixed = MM1Cost(a=mm1_scale, c=1.0) if cost_model == AgentCostModel.mm1 else None
    api_key = participant_key(registry, name, endpoint, workdir, key, admin_key)
    driver_host, driver_bind = driver_addresses(spark_master, host, spark_driver_host, spark_bind_address)
    run_agent(config, registry_url=registry, key=api_key, bind_host=host, port=port, spark_master=spark_master,
              driver_host=driver_host, driver_bind=driver_bind, cpus=cpus, trigger_s=trigger,
              sample_s=sample, cost_model=fixed, broker=broker)
