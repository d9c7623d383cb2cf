"""A participant's own network: a network namespace with its own address on a run's private bridge.

On one Linux machine each host of a run (a participant, the registry) gets a network
namespace of its own, joined to the run's bridge by a veth pair: its own address (on a
private /24 that no route of the machine covers), its own loopback, its own ports. The
machine's own namespace reaches every host through the bridge (its address is the
subnet's first); hosts have no default route, so nothing they run reaches beyond the run.

Links can be cut and healed, which is how partitions are made:
- `cut(name)` takes the host's end of its veth down: the host is cut off from every other
  host and from the machine (packets are dropped: connections time out); `heal(name)`
  brings it up again.
- `cut_link(a, b)` adds a `prohibit` route to each one's address in the other's namespace:
  those two cannot reach each other (a connection fails at once with "permission denied"),
  everyone else still can; `heal_link(a, b)` removes the routes.

Everything is made with iproute2's `ip` and needs root; `HostNetwork.available()` says why
not otherwise. `close()` kills what still runs in the namespaces and removes them and the
bridge; namespaces and bridges of a run that could not clean up (SIGKILL) are removed by the
next run (`remove_stale`).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "bpm"  # of every namespace and bridge a run makes: `remove_stale` looks for no other
# Where runs take their /24: 10.213.0.0/16 is no one's default; a run takes the first /24 that
# no address or route of the machine (and no other run) covers.
POOL = ipaddress.ip_network("10.213.0.0/16")
# Which process made each run's bridge: a run whose maker is gone left it behind.
OWNERS = Path("/run/bpm-hosts")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,30}$")


class NetworkError(RuntimeError):
    """An `ip` command failed: what it was and what it said."""


def ip(*args: str, check: bool = True) -> str:
    """Run `ip ARGS`; its output, or NetworkError with its message."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout


@dataclass(frozen=True)
class NetHost:
    """One host's namespace, its address and the machine's end of its veth pair."""

    name: str
    namespace: str
    address: str
    veth: str


@dataclass
class HostNetwork:
    """A run's bridge and its hosts' namespaces.

    Attributes:
        run: the run's id, in every name it makes.
        subnet: the run's /24; the bridge has its first address, hosts the next ones.
        bridge: the bridge's name in the machine's namespace.
        hosts: name -> its namespace, address and veth.
    """

    run: str
    subnet: ipaddress.IPv4Network
    bridge: str
    hosts: dict[str, NetHost] = field(default_factory=dict)

    @staticmethod
    def available() -> str | None:
        """None when this process can make network namespaces; else why not, in words for the user."""
        if os.geteuid() != 0:
            return "not root"
        for tool, package in (("ip", "iproute2"), ("nsenter", "util-linux")):
            if shutil.which(tool) is None:
                return f"{package}'s `{tool}` is not installed"
        if not os.path.exists("/proc/self/ns/net"):
            return "this kernel has no network namespaces"
        return None

    @classmethod
    def create(cls) -> HostNetwork:
        """A bridge on a free /24 of `POOL`, with the subnet's first address; NetworkError where that fails."""
        remove_stale()
        run = secrets.token_hex(3)
        subnet = free_subnet(ip("-o", "-4", "addr", "show") + ip("-4", "route", "show", "table", "all"))
        network = cls(run, subnet, f"{PREFIX}{run}")
        OWNERS.mkdir(parents=True, exist_ok=True)
        (OWNERS / network.bridge).write_text(str(os.getpid()))
        try:
            ip("link", "add", network.bridge, "type", "bridge")
            ip("addr", "add", f"{network.gateway}/{subnet.prefixlen}", "dev", network.bridge)
            ip("link", "set", network.bridge, "up")
        except NetworkError:
            network.close()
            raise
        return network

    @property
    def gateway(self) -> str:
        """The machine's address on the bridge: how the machine's own processes reach the hosts."""
        return str(self.subnet.network_address + 1)

    def add(self, name: str) -> NetHost:
        """A namespace for `name` with the next address, its loopback up, joined to the bridge."""
        if not _NAME.match(name):
            raise ValueError(f"bad host name {name!r}: lower-case letters, digits, '-' and '_'")
        if name in self.hosts:
            return self.hosts[name]
        index = len(self.hosts)
        if index + 2 >= self.subnet.num_addresses - 1:
            raise ValueError(f"no address left in {self.subnet}")
        host = NetHost(name, f"{self.bridge}-{name}", str(self.subnet.network_address + 2 + index), f"{self.bridge}h{index}")
        self.hosts[name] = host
        inside = f"{host.veth}i"
        ip("netns", "add", host.namespace)
        ip("link", "add", host.veth, "type", "veth", "peer", "name", inside)
        ip("link", "set", inside, "netns", host.namespace)
        ip("link", "set", host.veth, "master", self.bridge)
        ip("link", "set", host.veth, "up")
        ip("-n", host.namespace, "link", "set", "lo", "up")
        ip("-n", host.namespace, "link", "set", inside, "name", "eth0")
        ip("-n", host.namespace, "addr", "add", f"{host.address}/{self.subnet.prefixlen}", "dev", "eth0")
        ip("-n", host.namespace, "link", "set", "eth0", "up")
        return host

    def command(self, name: str, args: list[str]) -> list[str]:
        """`args` as a command that runs inside `name`'s network namespace: util-linux's
        `nsenter` enters it and execs `args` in place. (`ip netns exec` would also mount a
        /sys of its own, hiding the cgroup hierarchy a participant reads its quota from.)"""
        return ["nsenter", f"--net=/run/netns/{self.hosts[name].namespace}", "--", *args]

    def pids(self, name: str) -> list[int]:
        """Every process in `name`'s namespace."""
        return [int(p) for p in ip("netns", "pids", self.hosts[name].namespace, check=False).split()]

    # Partitions

    def cut(self, name: str) -> None:
        """Cut `name` off from every other host and from the machine: its link goes down."""
        ip("link", "set", self.hosts[name].veth, "down")

    def heal(self, name: str) -> None:
        """Undo `cut(name)`; returns once the link forwards again and the machine has forgotten
        that the host's address did not answer, so that the next connection is not lost to
        a stale neighbour entry."""
        host = self.hosts[name]
        ip("link", "set", host.veth, "up")
        _wait_forwarding(host.veth)
        ip("neigh", "flush", "to", host.address, "dev", self.bridge, check=False)

    def cut_link(self, a: str, b: str) -> None:
        """`a` and `b` can no longer reach each other; both still reach everyone else."""
        for here, there in ((a, b), (b, a)):
            ip("-n", self.hosts[here].namespace, "route", "replace", "prohibit", f"{self.hosts[there].address}/32")

    def heal_link(self, a: str, b: str) -> None:
        """Undo `cut_link(a, b)`."""
        for here, there in ((a, b), (b, a)):
            ip("-n", self.hosts[here].namespace, "route", "del", "prohibit", f"{self.hosts[there].address}/32", check=False)

    def close(self) -> None:
        """Kill what runs in the hosts' namespaces and remove them and the bridge; safe to call twice."""
        for name, host in list(self.hosts.items()):
            _remove_namespace(host.namespace)
            ip("link", "del", host.veth, check=False)  # gone with its peer's namespace, normally
            del self.hosts[name]
        ip("link", "del", self.bridge, check=False)
        (OWNERS / self.bridge).unlink(missing_ok=True)


def _wait_forwarding(veth: str, timeout_s: float = 5.0) -> None:
    """Wait until bridge port `veth` is up and forwarding; NetworkError after `timeout_s`."""
    link = Path("/sys/class/net") / veth
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            up = (link / "operstate").read_text().strip() in ("up", "unknown")
            forwarding = (link / "brport" / "state").read_text().strip() == "3"  # BR_STATE_FORWARDING
        except OSError:
            up = forwarding = False
        if up and forwarding:
            return
        if time.monotonic() > deadline:
            raise NetworkError(f"{veth} did not come back up and forwarding within {timeout_s:g} s")
        time.sleep(0.02)


def free_subnet(used: str, pool: ipaddress.IPv4Network = POOL) -> ipaddress.IPv4Network:
    """The first /24 of `pool` that no address or route in `used` (`ip addr` and `ip route`
    output) overlaps."""
    taken = []
    for token in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)\b", used):
        try:
            taken.append(ipaddress.ip_network(token, strict=False))
        except ValueError:
            continue
    for subnet in pool.subnets(new_prefix=24):
        if not any(subnet.overlaps(t) for t in taken if t.prefixlen > 0):
            return subnet
    raise NetworkError(f"no free /24 left in {pool}")


def kill_all(pids: Iterable[int]) -> int:
    """SIGKILL to each of `pids` (those already gone are skipped); how many there were."""
    count = 0
    for pid in pids:
        count += 1
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return count


def _remove_namespace(namespace: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if time.monotonic() > deadline or not kill_all(int(p) for p in ip("netns", "pids", namespace, check=False).split()):
            break
        time.sleep(0.05)
    ip("netns", "del", namespace, check=False)


def remove_stale() -> list[str]:
    """Remove the bridges and namespaces of earlier runs that ended without removing them (a
    run killed with SIGKILL): those whose maker (`OWNERS`) is no longer running. Returns the
    bridges removed."""
    namespaces = [line.split()[0] for line in ip("netns", "list", check=False).splitlines() if line.strip()]
    bridges = re.findall(rf"^\d+: ({PREFIX}[0-9a-f]{{6}}):", ip("-o", "link", "show", "type", "bridge", check=False), re.M)
    removed = []
    for bridge in bridges:
        if _alive(OWNERS / bridge):
            continue
        for namespace in namespaces:
            if namespace.startswith(f"{bridge}-"):
                _remove_namespace(namespace)
        ip("link", "del", bridge, check=False)
        (OWNERS / bridge).unlink(missing_ok=True)
        removed.append(bridge)
    return removed


def _alive(owner: Path) -> bool:
    try:
        os.kill(int(owner.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True
