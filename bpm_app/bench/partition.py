"""`bpm bench partition`: the correlated result across network partitions of given lengths.

Three participants, each a host of its own (`spark_agents.hosts`: a network namespace
with its own address where the machine allows it) running its own NATS server and
closing a window of alerts every `window_s` seconds of wall time, which it shares on its
broker (`spark_agents.correlation`). Participant `a` correlates: it follows its own
alerts and its partners', under Delay, Process and Correct (`bpm.dpc`). The run cuts a
link for each length in turn (by default host `b` from every other host), heals it, and
lets the result stabilise; then it reads what `a` published and every participant's
alerts, and measures, per partition:

- `max_first_result_delay_s`: from a window's end (when its inputs are due: every
  participant closes it then) to its first published version;
- `tentative_rows`: rows added by tentative versions;
- `stabilisation_s`: from the heal to the last window closed before it being stable;
- `lost_results`, `duplicate_results`: the stable rows against the plain correlation of
  every alert every participant published (`bpm.dpc.plain` over what their streams hold).

The alerts are synthetic (per window, each participant sees each of a pool of scanners
with some probability, and sources of its own): the benchmark measures how the result
flows across the partition, not the query that raises alerts.
"""

from __future__ import annotations

import json
import math
import random
import secrets
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

PARTICIPANTS = ("a", "b", "c")
CORRELATOR = "a"
CUTS = ("host", "link")  # b cut off from every host; only the link between b and the correlator
BROKER_PORT = 4222
HTTP_PORT = 8222


class PartitionBenchError(RuntimeError):
    pass


@dataclass(frozen=True)
class PartitionSettings:
    """What `bpm bench partition` runs.

    Attributes:
        lengths_s: the partitions' lengths, in order.
        cut: "host" cuts `cut_host` off from every other host; "link" cuts only the link
            between the correlating participant and `cut_host`.
        cut_host: the participant cut off.
        bound_s: the availability bound of the correlated result.
        window_s: the windows' length (wall time).
        lead_s: time before each cut, in which the result runs whole.
        recover_s: time after each heal before the next lead starts (the bound and the
            catching up fit in it).
        scanners: how many sources may raise alerts at several participants per window.
        seed: seed of the synthetic alerts.
        hosts: network namespaces where the machine allows them (else loopback addresses, and no cut).
    """

    lengths_s: tuple[float, ...] = (5.0, 15.0, 30.0, 60.0)
    cut: str = "host"
    cut_host: str = "b"
    bound_s: float = 10.0
    window_s: int = 2
    lead_s: float = 8.0
    recover_s: float = 20.0
    scanners: int = 12
    seed: int = 0
    hosts: bool = True

    def __post_init__(self) -> None:
        if not self.lengths_s or any(length <= 0 for length in self.lengths_s):
            raise ValueError("partition lengths must be positive seconds")
        if self.cut not in CUTS:
            raise ValueError(f"cut must be one of {', '.join(CUTS)}")
        if self.cut_host not in PARTICIPANTS or self.cut_host == CORRELATOR:
            raise ValueError(f"the participant cut off must be one of {', '.join(p for p in PARTICIPANTS if p != CORRELATOR)}")
        if self.window_s < 1 or self.bound_s < 0 or self.lead_s < 0 or self.recover_s < self.bound_s:
            raise ValueError("window_s must be at least 1 s, bound_s and lead_s not negative, recover_s at least bound_s")

    def schedule(self, start: float) -> list[tuple[float, float]]:
        """(cut, heal) wall times of each partition, the run starting at `start`."""
        out, t = [], start
        for length in self.lengths_s:
            cut = t + self.lead_s
            out.append((cut, cut + length))
            t = cut + length + self.recover_s
        return out


def synthetic_alerts(seed: int, participant: str, window_start: int, scanners: int) -> list[str]:
    """`participant`'s alerting sources in the window: each scanner with probability 0.4, and one or two of its own."""
    rng = random.Random(f"{seed}:{participant}:{window_start}")
    shared = [f"192.0.2.{i + 1}" for i in range(scanners) if rng.random() < 0.4]
    own = PARTICIPANTS.index(participant) + 1
    local = [f"198.51.{own}.{rng.randrange(1, 255)}" for _ in range(rng.randrange(1, 3))]
    return shared + local


# ---- a host's side: its broker, its alerts, and at `a` the correlated result ------------------


def host_main(config_path: str) -> None:
    """Run one participant's side (config written by the driver into its own folder); the
    run's start and end come on stdin once every broker is up; SIGTERM ends it."""
    from spark_agents.broker.server import NatsServer, User
    from spark_agents.broker.stream import Broker
    from spark_agents.correlation import Endpoint, LiveCorrelator, alerts_reader, ensure_streams, share_alerts

    config = json.loads(Path(config_path).read_text())
    name = config["name"]
    users = [User(name, config["password"])] + [alerts_reader(p, pw) for p, pw in config["readers"].items()]
    server = NatsServer(name, Path("store"), port=BROKER_PORT, http_port=HTTP_PORT, users=users, host=config["address"]).start()
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    own = Endpoint(f"nats://{config['address']}:{BROKER_PORT}", name, config["password"])
    broker = Broker(own.url, own.user, own.password)
    ensure_streams(broker, correlated=config["correlate"])
    print("ready", flush=True)
    run = json.loads(sys.stdin.readline())
    correlating = None
    if config["correlate"]:
        correlating = LiveCorrelator(name, own, window_s=config["window_s"], bound_s=config["bound_s"]).start()
        correlating.set_sources({p: Endpoint(**ep) for p, ep in config["partners"].items()})
    window_s = config["window_s"]
    start = run["start"]
    while start + window_s <= run["end"] and not stopping.is_set():
        if stopping.wait(max(0.0, start + window_s - time.time())):
            break
        share_alerts(broker, name, (start, start + window_s), synthetic_alerts(config["seed"], name, start, config["scanners"]))
        start += window_s
    stopping.wait()
    if correlating is not None:
        correlating.close()
    broker.close()
    server.stop()


# ---- the driver ---------------------------------------------------------------------------------


@dataclass
class Measured:
    """What the driver read back: every version `a` published and every participant's alerts."""

    versions: list = field(default_factory=list)
    alerts: dict = field(default_factory=dict)


def run_partition_bench(settings: PartitionSettings, root: Path, progress: Callable[[str], None] = lambda _: None) -> dict:
    """Run the benchmark (see the module text) in `root`; returns the report."""
    from spark_agents.hosts import Hosts

    began = time.monotonic()
    hosts = Hosts.open("bench-partition", root / "hosts", cpus=False, say=progress) if settings.hosts else None
    if hosts is None or hosts.net is None:
        if hosts is not None:
            hosts.close()
        raise PartitionBenchError("partitions need hosts with networks of their own (run as root on Linux, with iproute2)")
    processes = {}
    try:
        addresses = {p: hosts.add(p).address for p in PARTICIPANTS}
        passwords = {p: secrets.token_urlsafe(18) for p in PARTICIPANTS}
        # what each participant's broker lets each partner read with: made up by the owner, given to the partner
        reader = {(owner, partner): secrets.token_urlsafe(18) for owner in PARTICIPANTS for partner in PARTICIPANTS if owner != partner}
        for p in PARTICIPANTS:
            config = {
                "name": p, "address": addresses[p], "password": passwords[p], "correlate": p == CORRELATOR,
                "readers": {partner: reader[(p, partner)] for partner in PARTICIPANTS if partner != p},
                "partners": {o: {"url": f"nats://{addresses[o]}:{BROKER_PORT}", "user": p, "password": reader[(o, p)]}
                             for o in PARTICIPANTS if o != p} if p == CORRELATOR else {},
                "bound_s": settings.bound_s, "window_s": settings.window_s, "seed": settings.seed, "scanners": settings.scanners,
            }
            path = hosts.hosts[p].folder / "partition.json"
            path.write_text(json.dumps(config))
            path.chmod(0o600)
            log = (hosts.hosts[p].folder / "host.log").open("ab")
            processes[p] = hosts.popen(p, [sys.executable, "-m", "bpm_app.bench.partition", str(path)], stdin=-1, stdout=-1, stderr=log)
        for p, process in processes.items():
            line = process.stdout.readline()
            if line.strip() != b"ready":
                raise PartitionBenchError(f"participant {p}'s side did not start; see {hosts.hosts[p].folder / 'host.log'}")
        progress("brokers up")
        start = math.ceil(time.time() / settings.window_s + 1) * settings.window_s
        schedule = settings.schedule(start)
        end = schedule[-1][1] + settings.recover_s
        end = int(math.ceil(end / settings.window_s) * settings.window_s)
        for process in processes.values():
            process.stdin.write(json.dumps({"start": start, "end": end}).encode() + b"\n")
            process.stdin.flush()
        for i, (cut, heal) in enumerate(schedule):
            _sleep_until(cut)
            progress(f"partition {i + 1} of {len(schedule)}: {heal - cut:g} s")
            _cut(hosts, settings, heal=False)
            _sleep_until(heal)
            _cut(hosts, settings, heal=True)
        measured = _collect(hosts, addresses, passwords, settings, end)
    finally:
        for process in processes.values():
            process.terminate()
        for process in processes.values():
            try:
                process.wait(timeout=15)
            except Exception:
                process.kill()
        hosts.close()
    report = measure(settings, schedule, measured)
    report["elapsed_s"] = round(time.monotonic() - began, 1)
    return report


def _sleep_until(t: float) -> None:
    time.sleep(max(0.0, t - time.time()))


def _cut(hosts, settings: PartitionSettings, *, heal: bool) -> None:
    if settings.cut == "host":
        (hosts.heal if heal else hosts.cut)(settings.cut_host)
    else:
        (hosts.heal_link if heal else hosts.cut_link)(CORRELATOR, settings.cut_host)


def _collect(hosts, addresses, passwords, settings: PartitionSettings, end: int) -> Measured:
    """Wait until `a` published every window stable (or the bound and the recovery time ran
    out), then read its versions and every participant's alerts."""
    from bpm.dpc import CorrelatedView
    from spark_agents.broker.stream import Broker
    from spark_agents.correlation import ALERTS, read_correlated, read_stream

    deadline = time.time() + settings.recover_s + settings.bound_s + 30
    with Broker(f"nats://{addresses[CORRELATOR]}:{BROKER_PORT}", CORRELATOR, passwords[CORRELATOR]) as broker:
        while True:
            versions = read_correlated(broker)
            view = CorrelatedView()
            for v in versions:
                view.apply(v)
            last_stable = max((w[1] for w in view.stable), default=0)
            if (last_stable >= end and not view.tentative_windows()) or time.time() > deadline:
                break
            time.sleep(1.0)
    alerts = {}
    for p in PARTICIPANTS:
        with Broker(f"nats://{addresses[p]}:{BROKER_PORT}", p, passwords[p]) as broker:
            alerts[p] = [json.loads(data) for data in read_stream(broker, ALERTS)]
    return Measured(versions, alerts)


def measure(settings: PartitionSettings, schedule: list[tuple[float, float]], measured: Measured) -> dict:
    """The report from what was read back (see the module text)."""
    from bpm.dpc import CorrelatedView, correlate

    per_window: dict[tuple[int, int], dict[str, list[str]]] = {}
    for p, messages in measured.alerts.items():
        for m in messages:
            per_window.setdefault((m["window_start"], m["window_end"]), {})[p] = m["sources"]
    expected = {w: correlate(w, inputs) for w, inputs in per_window.items() if len(inputs) == len(PARTICIPANTS)}
    view = CorrelatedView()
    first: dict = {}
    stable_at: dict = {}
    tentative_rows: Counter = Counter()
    adds: Counter = Counter()
    for v in measured.versions:
        view.apply(v)
        first.setdefault(v.window, v.at)
        for row in v.added:
            adds[row] += 1
        for row in v.retracted:
            adds[row] -= 1
        if v.stable:
            stable_at[v.window] = v.at
        else:
            tentative_rows[v.window] += len(v.added)
    # each partition owns the windows that end from its lead's start to the next lead's start
    bounds = [cut - settings.lead_s for cut, _ in schedule] + [math.inf]
    partitions = []
    for i, (cut, heal) in enumerate(schedule):
        mine = [w for w in expected if bounds[i] <= w[1] < bounds[i + 1] or (i == 0 and w[1] < bounds[0])]
        delays = [first[w] - w[1] for w in mine if w in first]
        closed = [w for w in mine if w[1] <= heal]
        stabilised = [stable_at.get(w, math.inf) - heal for w in closed]
        want = set().union(*(expected[w] for w in mine)) if mine else set()
        got = {row for w in mine if w in view.stable for row in view.rows[w]}
        tentative = [w for w in mine if w in tentative_rows]
        partitions.append({
            "length_s": heal - cut,
            "windows": len(mine),
            "max_first_result_delay_s": round(max(delays), 3) if delays else None,
            "availability_bound_s": settings.bound_s,
            "tentative_windows": len(tentative),
            "published_during_partition": sum(1 for w in mine if cut <= first.get(w, math.inf) < heal),
            "tentative_rows": sum(tentative_rows[w] for w in mine),
            "tentative_outside_partition": sum(1 for w in tentative if not (cut - settings.bound_s - settings.window_s <= w[1] <= heal)),
            "stabilisation_s": round(max(0.0, max(stabilised)), 3) if stabilised and max(stabilised) < math.inf else None,
            "unpublished_windows": sum(1 for w in mine if w not in first),
            "unstable_windows": sum(1 for w in mine if w not in view.stable),
            "lost_results": len(want - got),
            "duplicate_results": sum(1 for w in mine for row in view.rows.get(w, ()) if adds[row] > 1),
            "extra_results": len(got - want),
        })
    goals = {
        "first_result_within_bound": all(p["max_first_result_delay_s"] is not None and p["max_first_result_delay_s"] <= settings.bound_s + 1 for p in partitions),
        "nothing_lost_or_duplicated": all(p["lost_results"] == p["duplicate_results"] == p["extra_results"] == p["unstable_windows"] == 0
                                          for p in partitions),
        "tentative_only_in_partitions": all(p["tentative_outside_partition"] == 0 for p in partitions),
    }
    t0 = schedule[0][0] - settings.lead_s
    timeline = [{"t": round(w[1] - t0, 3), "first_s": round(first[w] - w[1], 3) if w in first else None,
                 "stable_s": round(stable_at[w] - w[1], 3) if w in stable_at else None,
                 "tentative_rows": tentative_rows.get(w, 0), "stable_rows": len(view.rows.get(w, ())) if w in view.stable else None}
                for w in sorted(expected)]
    return {"settings": {**asdict(settings), "lengths_s": list(settings.lengths_s)}, "participants": list(PARTICIPANTS),
            "correlator": CORRELATOR, "windows": len(expected), "versions": len(measured.versions),
            "partitions": partitions, "goals": goals,
            "cuts": [[round(cut - t0, 3), round(heal - t0, 3)] for cut, heal in schedule], "timeline": timeline}


def plot_partitions(result: dict, path: str | Path) -> Path:
    """A PNG: per window (by its end), the delay of its first and of its stable version, and its
    tentative and stable rows, with the partitions shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = result["timeline"]
    bound = result["settings"]["bound_s"]
    fig, (delay, rows) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True)
    for ax in (delay, rows):
        for cut, heal in result["cuts"]:
            ax.axvspan(cut, heal, color="tab:red", alpha=0.12)
        ax.grid(alpha=0.3)
    t = [w["t"] for w in timeline]
    delay.plot(t, [w["first_s"] for w in timeline], "o", ms=3, color="tab:blue", label="first version (tentative or stable)")
    delay.plot(t, [w["stable_s"] for w in timeline], "x", ms=4, color="black", label="stable version")
    delay.axhline(bound, color="tab:blue", lw=1, ls="--", label=f"availability bound ({bound:g} s)")
    delay.set_ylabel("delay after the window's end, s")
    delay.legend(loc="upper right", fontsize="small")
    delay.set_title("correlated result at a, partner " + result["settings"]["cut_host"] + " cut off (shaded: partitions)", fontsize=10)
    width = result["settings"]["window_s"] * 0.8
    rows.bar(t, [w["stable_rows"] or 0 for w in timeline], width=width, color="tab:green", label="stable rows")
    rows.bar(t, [-w["tentative_rows"] for w in timeline], width=width, color="tab:orange", label="tentative rows (drawn below 0)")
    rows.set_ylabel("rows per window")
    rows.set_xlabel("time since the run's start, s (window ends)")
    rows.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    host_main(sys.argv[1])
