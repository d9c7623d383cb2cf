"""A participant's host: its CPU capacity (a cgroup quota of its own, which its agent reads),
its network (`spark_agents.network`) and its storage.

A participant is a host of its own (docs/hosts.md); `Hosts` makes a run's hosts on one
Linux machine, each with a network namespace, a CPU quota and a folder, and can crash a
host (every process at once) and cut its links. The CPU part: every process of a
participant (its agent, the Spark driver JVM the agent launches, Python workers) runs in
one cgroup whose CPU quota is the participant's capacity, so what one participant does cannot raise the load another
measures. The agent reads its capacity from its own cgroup (`cpu_capacity`) and measures
load against it.

`CpuHosts` makes those cgroups for a run (the demo, tests, the compose processes): one
parent per run, one child per participant with its quota, processes started inside with
`popen_kwargs`; `close()` kills what is left in them and removes them, and the launchers
call it on the way out, on errors and on Ctrl-C alike. Both cgroup layouts are handled:
v1 (a `cpu` hierarchy: `cpu.cfs_quota_us` / `cpu.cfs_period_us`) and v2 (`cpu.max`).
Creating cgroups needs root; without it `CpuHosts.available()` says why, and the
launchers run the same processes without a quota, saying so once.

Inside a participant's cgroup, its processes start in `main`; `python` beside it, weighted
far above `main` within the participant's one quota, is for Spark's Python processes
(`python_first`): a query over a Python data source starts a Python process that must
connect back to Spark within 10 s, which it misses on a small quota when it competes
evenly with a busy JVM. In `main`, the agent's process runs before its Spark driver's
(`lower_priority`), so that a saturated participant still answers its partners.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from spark_agents.metrics import machine_cpu, process_cpu_seconds
from spark_agents.network import kill_all

if TYPE_CHECKING:
    from spark_agents.network import HostNetwork

log = logging.getLogger(__name__)

# The quota is enforced per period: a participant that used its share of a period waits for
# the next one, every thread of it at once. With the kernel's default of 100 ms, a 0.4-CPU
# participant stalled up to 60 ms at a time, several times in each micro-batch (each step
# between the JVM, its Python workers and the broker is a round trip), and its batches took
# longer than their CPU said: shorter periods make the stalls short.
PERIOD_US = 10_000
# The parent of a run's participants gets this weight against everything else on the
# machine (the registry, replayers, a test runner): up to its quota a participant gets the
# CPU it asks for, so its capacity is what it is told.
PARENT_SHARES_V1 = 8192
PARENT_WEIGHT_V2 = 800
# Within a participant: its Python processes against the rest (weights, not quotas: the
# participant's quota bounds both together).
PYTHON_SHARES_V1, MAIN_SHARES_V1 = 8192, 1024
PYTHON_WEIGHT_V2, MAIN_WEIGHT_V2 = 800, 100
MAIN, PYTHON = "main", "python"
# The Spark driver's niceness within `main`, the agent's process being at 0 (`lower_priority`).
JVM_NICE = 5
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


@dataclass(frozen=True)
class CgroupLayout:
    """Where the CPU controller's hierarchy is mounted and which version it is."""

    root: Path
    version: int  # 1 or 2


def cpu_layout(mountinfo: str | None = None) -> CgroupLayout | None:
    """The CPU controller's mount: a v1 hierarchy with the `cpu` option, else a v2 mount
    that offers `cpu`; None where neither is mounted."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return None
    v2: Path | None = None
    for line in mountinfo.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        point, fstype, options = Path(fields[4]), tail[0], tail[2].split(",")
        if fstype == "cgroup" and "cpu" in options:
            return CgroupLayout(point, 1)
        if fstype == "cgroup2" and v2 is None:
            controllers = point / "cgroup.controllers"
            if controllers.exists() and "cpu" in controllers.read_text().split():
                v2 = point
    return CgroupLayout(v2, 2) if v2 is not None else None


def own_cgroup(layout: CgroupLayout, proc_cgroup: str | None = None) -> Path:
    """This process's cgroup folder under `layout.root`."""
    if proc_cgroup is None:
        proc_cgroup = Path("/proc/self/cgroup").read_text()
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if layout.version == 1 and "cpu" in controllers.split(","):
            return layout.root / path.lstrip("/")
        if layout.version == 2 and controllers == "":
            return layout.root / path.lstrip("/")
    return layout.root


def quota_of(folder: Path, version: int) -> float | None:
    """The CPU quota set on one cgroup folder, in CPUs; None where unlimited or unreadable."""
    try:
        if version == 1:
            quota = int((folder / "cpu.cfs_quota_us").read_text())
            period = int((folder / "cpu.cfs_period_us").read_text())
        else:
            text = (folder / "cpu.max").read_text().split()
            if text[0] == "max":
                return None
            quota, period = int(text[0]), int(text[1])
    except (OSError, ValueError, IndexError):
        return None
    return quota / period if quota > 0 and period > 0 else None


@dataclass(frozen=True)
class Throttling:
    """A cgroup's CPU quota enforcement so far (its `cpu.stat`)."""

    periods: int  # quota periods in which it ran
    throttled: int  # of those, the periods at whose end it had used its quota and waited
    throttled_s: float  # how long its threads waited for the next period, summed


def throttling_of(folder: Path, version: int) -> Throttling | None:
    """The throttling of one cgroup folder (either layout); None where unreadable."""
    try:
        stat = dict(line.split() for line in (folder / "cpu.stat").read_text().splitlines() if line.strip())
        waited = int(stat["throttled_time"]) / 1e9 if version == 1 else int(stat["throttled_usec"]) / 1e6
        return Throttling(int(stat["nr_periods"]), int(stat["nr_throttled"]), waited)
    except (OSError, ValueError, KeyError):
        return None


def cpu_quota(layout: CgroupLayout | None = None, proc_cgroup: str | None = None) -> float | None:
    """The tightest CPU quota on this process's cgroup and its ancestors, in CPUs; None without one."""
    layout = layout or cpu_layout()
    if layout is None:
        return None
    folder = own_cgroup(layout, proc_cgroup)
    quotas = []
    while True:
        quota = quota_of(folder, layout.version)
        if quota is not None:
            quotas.append(quota)
        if folder == layout.root or layout.root not in folder.parents:
            break
        folder = folder.parent
    return min(quotas) if quotas else None


def cpu_capacity(default: float) -> float:
    """The participant's capacity in CPUs: its cgroup's quota when it has one (never more
    than the machine's CPUs), else `default` (its Spark's parallelism, or what it was told)."""
    quota = cpu_quota()
    if quota is None:
        return default
    return min(quota, float(os.cpu_count() or quota))


@dataclass
class CpuHosts:
    """The cgroups of one run: a parent, and a child per participant with its CPU quota.

    Attributes:
        layout: the CPU controller's mount.
        parent: the run's cgroup folder (`bpm-<id>` under the hierarchy's root).
        quotas: participant name -> CPUs, for every cgroup made so far.
    """

    layout: CgroupLayout
    parent: Path
    quotas: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def available() -> str | None:
        """None when this process can make CPU cgroups; else why not, in words for the user."""
        if os.geteuid() != 0:
            return "not root"
        layout = cpu_layout()
        if layout is None:
            return "no cgroup CPU controller is mounted"
        if not os.access(layout.root, os.W_OK):
            return f"{layout.root} is not writable"
        return None

    @classmethod
    def create(cls, label: str = "run") -> CpuHosts:
        """The run's parent cgroup; raises OSError where that cannot be done (see `available`)."""
        layout = cpu_layout()
        if layout is None:
            raise OSError("no cgroup CPU controller is mounted")
        remove_stale(layout)
        parent = layout.root / f"bpm-{label}-{uuid.uuid4().hex[:8]}"
        parent.mkdir()
        hosts = cls(layout, parent)
        try:
            if layout.version == 1:
                (parent / "cpu.shares").write_text(str(PARENT_SHARES_V1))
            else:
                _enable_cpu(layout.root)
                (parent / "cpu.weight").write_text(str(PARENT_WEIGHT_V2))
                _enable_cpu(parent)
        except OSError:
            hosts.close()
            raise
        return hosts

    def folder(self, name: str) -> Path:
        if not _NAME.match(name):
            raise ValueError(f"bad host name {name!r}: lower-case letters, digits, '-' and '_'")
        return self.parent / name

    def add(self, name: str, cpus: float) -> Path:
        """A participant's cgroup with a quota of `cpus` CPUs (made once; the quota is updated)."""
        if not 0.01 <= cpus <= (os.cpu_count() or 1):
            raise ValueError(f"a host's CPUs must be between 0.01 and the machine's {os.cpu_count()}, not {cpus}")
        folder = self.folder(name)
        folder.mkdir(exist_ok=True)
        quota = int(round(cpus * PERIOD_US))
        if self.layout.version == 1:
            (folder / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (folder / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (folder / "cpu.max").write_text(f"{quota} {PERIOD_US}")
            _enable_cpu(folder)
        for child, v1, v2 in ((MAIN, MAIN_SHARES_V1, MAIN_WEIGHT_V2), (PYTHON, PYTHON_SHARES_V1, PYTHON_WEIGHT_V2)):
            (folder / child).mkdir(exist_ok=True)
            if self.layout.version == 1:
                (folder / child / "cpu.shares").write_text(str(v1))
            else:
                (folder / child / "cpu.weight").write_text(str(v2))
        self.quotas[name] = cpus
        return folder

    def popen_kwargs(self, name: str) -> dict:
        """`subprocess.Popen` arguments that start the process inside `name`'s cgroup, before it
        runs anything: every process it starts (the Spark JVM) is inside too."""
        procs = str(self.folder(name) / MAIN / "cgroup.procs")

        def enter() -> None:
            with open(procs, "w") as handle:
                handle.write(str(os.getpid()))

        return {"preexec_fn": enter}

    def pids(self, name: str) -> list[int]:
        """Every process in `name`'s cgroup and the cgroups under it."""
        return _pids(self.folder(name))

    def processes(self, name: str) -> dict[int, tuple[str, float]]:
        """Each live process of `name`'s cgroup: pid -> (its `process_kind`, its own CPU seconds)."""
        found = {}
        for child in (MAIN, PYTHON):
            for pid in _pids(self.folder(name) / child):
                cpu = process_cpu_seconds(pid)
                if cpu is not None:
                    found[pid] = (process_kind(pid, child), cpu)
        return found

    def throttling(self) -> dict[str, Throttling]:
        """Each participant's throttling so far (those whose `cpu.stat` can be read)."""
        read = {name: throttling_of(self.folder(name), self.layout.version) for name in self.quotas}
        return {name: t for name, t in read.items() if t is not None}

    def close(self, timeout_s: float = 10.0) -> None:
        """Kill what is left in the run's cgroups and remove them; safe to call twice."""
        if not self.parent.exists():
            return
        kill_all(_pids(self.parent))
        deadline = time.monotonic() + timeout_s
        # Deepest first: a cgroup goes only once it has no children.
        for folder in sorted((Path(f) for f, _, _ in os.walk(self.parent)), key=lambda f: len(f.parts), reverse=True):
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if time.monotonic() > deadline:
                        log.warning("could not remove cgroup %s: %s", folder, exc)
                        break
                    time.sleep(0.05)
        self.quotas.clear()

    def __enter__(self) -> CpuHosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def remove_stale(layout: CgroupLayout, older_than_s: float = 60.0) -> list[Path]:
    """Remove the cgroups of earlier runs that ended without removing them (a run killed with
    SIGKILL): those with no process left, untouched for `older_than_s`. Returns them."""
    removed = []
    for parent in layout.root.glob("bpm-*"):
        try:
            hosts = CpuHosts(layout, parent)
            children = [c.name for c in parent.iterdir() if c.is_dir()]
            if any(hosts.pids(name) for name in children) or time.time() - parent.stat().st_mtime < older_than_s:
                continue
        except (OSError, ValueError):
            continue
        hosts.close()
        removed.append(parent)
    return removed


def _pids(folder: Path) -> list[int]:
    found = []
    for here, _, _ in os.walk(folder):
        try:
            found += [int(p) for p in (Path(here) / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            pass
    return found


def process_kind(pid: int, child: str = MAIN) -> str:
    """What a participant's process is, for a person reading where its quota went: `spark
    python` (Spark's Python workers, in the `python` child of its cgroup), `jvm` (its Spark
    driver), `agent` or `replay` (the `bpm` command it runs), else the program's name."""
    if child == PYTHON:
        return "spark python"
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "gone"
    if comm == "java":
        return "jvm"
    for kind in ("agent", "replay"):
        if kind in argv[1:4]:
            return kind
    return comm


def python_first(workdir: Path, python: str) -> str:
    """`spark_agents.session.spark_python`'s executable in `workdir`, for PYSPARK_PYTHON:
    where this process runs in `main` of a participant's cgroup (`CpuHosts`) that it may
    write to, it moves itself into `python` beside it first, so that Spark's Python
    processes come first within the participant's quota."""
    from spark_agents.session import spark_python

    target = None
    layout = cpu_layout()
    if layout is not None:
        try:
            here = own_cgroup(layout)
        except OSError:
            here = None
        if here is not None and here.name == MAIN and os.access(here.parent / PYTHON / "cgroup.procs", os.W_OK):
            target = here.parent / PYTHON / "cgroup.procs"
    return spark_python(workdir, python, cgroup_procs=target)


def lower_priority(pid: int, nice: int = JVM_NICE) -> None:
    """Give every thread of process `pid` the CPU priority `nice` (the threads and processes
    it starts later inherit it): within a participant's quota, the agent's own work
    (answering partners and the registry, measuring, handing checkpoints over) then comes
    before its Spark driver's when both want the CPU, and a saturated participant still
    answers. Threads that are gone, or that this user may not change, are left as they are."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for thread in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, int(thread), nice)
        except OSError:
            pass


def _enable_cpu(folder: Path) -> None:
    control = folder / "cgroup.subtree_control"
    if "cpu" not in control.read_text().split():
        control.write_text("+cpu")


def open_hosts(label: str, say=None) -> CpuHosts | None:
    """A run's `CpuHosts`, or None (said once through `say`, or logged) where this machine or
    user cannot make them: the run's processes then share the machine's CPUs."""
    reason = CpuHosts.available()
    if reason is None:
        try:
            return CpuHosts.create(label)
        except OSError as exc:
            reason = str(exc)
    _tell(f"participants share this machine's CPUs: no CPU quota per participant ({reason})", say)
    return None


@dataclass(frozen=True)
class Host:
    """One participant's (or the registry's) host in a run.

    Attributes:
        name: the host's name (the participant's).
        address: where its servers listen and others reach it: its own address on the run's
            bridge, or a loopback address of its own where namespaces cannot be made.
        cpus: its CPU quota (None: it shares the machine's CPUs).
        folder: its own storage; its processes start there.
        namespace: whether it has a network namespace of its own.
    """

    name: str
    address: str
    cpus: float | None
    folder: Path
    namespace: bool

    @property
    def isolated(self) -> bool:
        """Whether it has CPU and network of its own: a quota and a namespace."""
        return self.namespace and self.cpus is not None

    def report(self) -> dict:
        return {"address": self.address, "cpus": self.cpus, "isolated": self.isolated}


class Hosts:
    """A run's hosts on one Linux machine: per host a network namespace with its own address
    (`spark_agents.network`), a cgroup CPU quota (`CpuHosts`) and a storage folder of its own.

    What this machine or user cannot make is left out, said once: without root, hosts are
    loopback addresses (127.0.0.2 on) sharing the machine's CPUs, and links cannot be cut.
    `close()` kills every process of every host and removes the namespaces, the bridge and the
    cgroups; launchers call it on the way out, on errors and on Ctrl-C alike.
    """

    def __init__(self, root: Path, cpu: CpuHosts | None, net: HostNetwork | None) -> None:
        self.root = root
        self.cpu = cpu
        self.net = net
        self.hosts: dict[str, Host] = {}
        self._processes: dict[str, list] = {}
        self.closed = False

    @classmethod
    def open(cls, label: str, root: Path, *, cpus: bool = True, network: bool = True, say=None) -> Hosts:
        """Whatever hosts this machine allows: namespaces with `network`, CPU quotas with `cpus`."""
        from spark_agents.network import HostNetwork, NetworkError

        net = None
        if network:
            reason = HostNetwork.available()
            if reason is None:
                try:
                    net = HostNetwork.create()
                except NetworkError as exc:
                    reason = str(exc)
            if net is None:
                _tell(f"participants share this machine's loopback: no network namespace per participant ({reason})", say)
        cpu = open_hosts(label, say) if cpus else None
        return cls(root, cpu, net)

    def add(self, name: str, cpus: float | None = None) -> Host:
        """The host `name` (made once), with a quota of `cpus` CPUs where quotas can be made."""
        if name in self.hosts:
            return self.hosts[name]
        if self.closed:
            raise RuntimeError("these hosts are closed")
        if self.net is not None:
            address = self.net.add(name).address
        else:
            address = f"127.0.0.{len(self.hosts) + 2}"
        quota = None
        if cpus is not None and self.cpu is not None:
            self.cpu.add(name, cpus)
            quota = cpus
        folder = self.root / name
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o700)
        self.hosts[name] = host = Host(name, address, quota, folder, self.net is not None)
        return host

    def set_cpus(self, name: str, cpus: float) -> Host:
        """Change the CPU quota of host `name` where it has one (its processes keep running);
        a host without a quota is left as it is."""
        host = self.hosts[name]
        if host.cpus is None or self.cpu is None:
            return host
        self.cpu.add(name, cpus)
        self.hosts[name] = host = replace(host, cpus=cpus)
        return host

    def command(self, name: str, args: list[str]) -> list[str]:
        """`args` as a command run inside `name`'s network namespace (itself where there is none)."""
        return self.net.command(name, args) if self.net is not None else list(args)

    def popen(self, name: str, args: list[str], **kwargs):
        """Start `args` inside host `name` (its namespace and its cgroup, in its own session; in
        its folder unless `cwd` is given): every process it starts is inside too."""
        import subprocess

        if self.cpu is not None and name in self.cpu.quotas:
            kwargs = {**self.cpu.popen_kwargs(name), **kwargs}
        kwargs.setdefault("cwd", self.hosts[name].folder)
        process = subprocess.Popen(self.command(name, args), start_new_session=True, **kwargs)
        self._processes.setdefault(name, []).append(process)
        return process

    def pids(self, name: str) -> set[int]:
        """Every process of host `name`: in its cgroup, its namespace, and the sessions it was started in."""
        found = set(self.cpu.pids(name)) if self.cpu is not None and name in self.cpu.quotas else set()
        if self.net is not None:
            found |= set(self.net.pids(name))
        for process in self._processes.get(name, []):
            found |= _session(process.pid)
        return found

    def crash(self, name: str) -> None:
        """Host `name` fails: every one of its processes is killed at once (SIGKILL), nothing
        of it is told first."""
        for _ in range(3):  # a process forked while the first were killed
            if not kill_all(self.pids(name)):
                break
        for process in self._processes.pop(name, []):
            process.wait()

    # Partitions (network namespaces only)

    def cut(self, name: str) -> None:
        """Cut host `name` off from every other host (and the machine)."""
        self._network().cut(name)

    def heal(self, name: str) -> None:
        self._network().heal(name)

    def cut_link(self, a: str, b: str) -> None:
        """Cut the link between hosts `a` and `b` only."""
        self._network().cut_link(a, b)

    def heal_link(self, a: str, b: str) -> None:
        self._network().heal_link(a, b)

    def _network(self) -> HostNetwork:
        if self.net is None:
            raise RuntimeError("links can be cut only between hosts with network namespaces of their own (this needs root on Linux)")
        return self.net

    def report(self) -> dict[str, dict]:
        return {name: host.report() for name, host in self.hosts.items()}

    def close(self) -> None:
        """Kill every process of every host, then remove the namespaces, the bridge and the
        cgroups; safe to call twice. `hosts` keeps what they were, for reports."""
        if self.closed:
            return
        self.closed = True
        for name in list(self.hosts):
            self.crash(name)
        if self.net is not None:
            self.net.close()
        if self.cpu is not None:
            self.cpu.close()

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class CpuMeter:
    """How busy the machine and each host's quota were between two readings: the share of the
    machine's CPUs busy and stolen (`spark_agents.metrics.machine_cpu`), and per host with a
    quota the share of the time its quota held it back (the quota periods that passed meanwhile
    which it ended throttled: it had used its quota and its threads waited for the next), and
    the CPUs each kind of its processes used (`process_kind`). A quota caps a host's share of
    the machine, it does not reserve it: where the machine is busy, a host below its quota
    waits too, and its batches take longer."""

    def __init__(self, cpu: CpuHosts | None) -> None:
        self.cpu = cpu
        self._last = self._read()

    def _read(self):
        if self.cpu is None:
            return time.monotonic(), machine_cpu(), {}, {}
        return time.monotonic(), machine_cpu(), self.cpu.throttling(), {name: self.cpu.processes(name) for name in self.cpu.quotas}

    def sample(self) -> dict:
        """Since the last sample (or the meter's start): `busy`, `steal` (shares of the
        machine's CPUs), `throttled` (host name -> share of the time its quota held it back) and
        `processes` (host name -> process kind -> CPUs, of the processes alive at both readings)."""
        (now, machine, hosts, procs), (then, machine0, hosts0, procs0) = self._read(), self._last
        self._last = (now, machine, hosts, procs)
        elapsed = now - then
        periods = elapsed * 1e6 / PERIOD_US
        throttled = {}
        for name, t in hosts.items():
            before = hosts0.get(name)
            if before is not None and periods > 0:
                throttled[name] = round(min(1.0, (t.throttled - before.throttled) / periods), 3)
        processes = {}
        for name, now_read in procs.items():
            kinds: dict[str, float] = {}
            for pid, (kind, cpu) in now_read.items():
                before = procs0.get(name, {}).get(pid)
                if before is not None and elapsed > 0:
                    kinds[kind] = kinds.get(kind, 0.0) + max(0.0, cpu - before[1]) / elapsed
            processes[name] = {kind: round(cpus, 3) for kind, cpus in sorted(kinds.items())}
        return {**machine.since(machine0), "throttled": throttled, "processes": processes}


def _session(sid: int) -> set[int]:
    """The processes of session `sid` (a process started with `start_new_session` leads one)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == sid:
                    found.add(int(entry.name))
            except OSError:
                pass
    return found


def _tell(message: str, say) -> None:
    if say is not None:
        say(message)
    else:
        log.warning(message)
