"""Hosts with networks of their own: addresses on a private bridge, links cut and healed, a host crashing."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import sys
import time

import pytest

from spark_agents.hosts import CpuHosts, Hosts
from spark_agents.network import HostNetwork, free_subnet, ip
from tests.conftest import requires

PORT = 8123
needs_namespaces = requires(HostNetwork.available(), "network namespaces (root, iproute2)")


def test_a_run_takes_the_first_24_that_nothing_on_the_machine_covers():
    used = "2: eth0    inet 10.213.0.7/24 brd 10.213.0.255 scope global eth0\n10.213.1.0/24 dev bpmx proto kernel\ndefault via 192.0.2.1 dev eth0\n"
    assert free_subnet(used) == ipaddress.ip_network("10.213.2.0/24"), "the default route covers everything and is no reason to skip"
    assert free_subnet("") == ipaddress.ip_network("10.213.0.0/24")


def reaches(hosts: Hosts | None, name: str | None, address: str, timeout_s: float = 1.0) -> bool:
    """Whether a connection to `address`:PORT from inside host `name` (from the machine: None) is accepted."""
    if name is None:
        try:
            socket.create_connection((address, PORT), timeout=timeout_s).close()
            return True
        except OSError:
            return False
    probe = f"import socket; socket.create_connection(({address!r}, {PORT}), timeout={timeout_s}).close()"
    return subprocess.run(hosts.command(name, [sys.executable, "-c", probe]), capture_output=True, timeout=30).returncode == 0


def reaches_again(hosts: Hosts | None, name: str | None, address: str, within_s: float = 5.0) -> bool:
    """Whether a connection from `name` to `address` is accepted within `within_s` of a heal: the
    first attempt can lose its SYN to an ARP resolution still under way."""
    deadline = time.monotonic() + within_s
    while not reaches(hosts, name, address):
        if time.monotonic() > deadline:
            return False
    return True


def wait_listening(address: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not reaches(None, None, address):
        assert time.monotonic() < deadline, f"nothing listens on {address}:{PORT}"
        time.sleep(0.1)


@needs_namespaces
@pytest.mark.timeout(120)
def test_hosts_have_their_own_addresses_and_links_are_cut_and_healed(tmp_path):
    hosts = Hosts.open("test", tmp_path, cpus=False)
    try:
        bridge, namespaces = hosts.net.bridge, []
        for name in ("a", "b", "c"):
            host = hosts.add(name)
            namespaces.append(hosts.net.hosts[name].namespace)
            assert host.namespace and ipaddress.ip_address(host.address) in hosts.net.subnet
            assert host.folder.stat().st_mode & 0o077 == 0, "a host's storage is its own"
            # Every host listens on the same port, on its own address.
            hosts.popen(name, [sys.executable, "-m", "http.server", "--bind", host.address, str(PORT)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        a, b, c = (hosts.hosts[n].address for n in "abc")
        for address in (a, b, c):
            wait_listening(address)
        assert reaches(hosts, "a", b) and reaches(hosts, "b", c)
        assert not reaches(hosts, "a", "192.0.2.1") and "default" not in ip("-n", hosts.net.hosts["a"].namespace, "route"), \
            "a host reaches nothing beyond the run's bridge"

        hosts.cut_link("a", "b")
        assert not reaches(hosts, "a", b) and not reaches(hosts, "b", a)
        assert reaches(hosts, "a", c) and reaches(hosts, "c", b) and reaches(None, None, b), "only that link is cut"
        hosts.heal_link("a", "b")
        assert reaches_again(hosts, "a", b) and reaches_again(hosts, "b", a)

        hosts.cut("a")
        assert not reaches(None, None, a, timeout_s=0.5) and not reaches(hosts, "b", a, timeout_s=0.5)
        assert reaches(hosts, "b", c), "the others still reach each other"
        hosts.heal("a")
        assert reaches_again(None, None, a) and reaches_again(hosts, "c", a)

        hosts.crash("b")
        assert not hosts.pids("b") and not reaches(None, None, b), "every process of the host is gone at once"
        assert reaches(None, None, a) and reaches(None, None, c)
    finally:
        hosts.close()
    left = ip("netns", "list")
    assert not any(n in left for n in namespaces) and bridge not in ip("link", "show")


def test_without_namespaces_hosts_are_loopback_addresses_and_links_cannot_be_cut(tmp_path):
    hosts = Hosts.open("test", tmp_path, cpus=False, network=False)
    try:
        assert hosts.add("a").address == "127.0.0.2" and hosts.add("b").address == "127.0.0.3"
        assert not hosts.hosts["a"].isolated
        with pytest.raises(RuntimeError, match="network namespaces"):
            hosts.cut_link("a", "b")
    finally:
        hosts.close()


@needs_namespaces
@requires(CpuHosts.available(), "CPU cgroups (root)")
@pytest.mark.serial
def test_a_process_in_a_host_reads_its_quota_and_runs_on_its_address(tmp_path):
    hosts = Hosts.open("test", tmp_path)
    try:
        host = hosts.add("a", cpus=0.3)
        probe = ("import socket; from spark_agents.hosts import cpu_capacity; "
                 f"s = socket.socket(); s.bind(({host.address!r}, 0)); print(cpu_capacity(9.0))")
        process = hosts.popen("a", [sys.executable, "-c", probe], stdout=subprocess.PIPE, text=True)
        out, _ = process.communicate(timeout=60)
        assert process.returncode == 0 and float(out) == pytest.approx(0.3), "the network namespace hides no cgroup"
        assert host.isolated and host.report() == {"address": host.address, "cpus": 0.3, "isolated": True}
    finally:
        hosts.close()
