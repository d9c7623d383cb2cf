"""A participant's CPU capacity: reading a cgroup's quota, and making quotas for a run's participants."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_agents.hosts import CgroupLayout, CpuHosts, CpuMeter, Hosts, Throttling, cpu_layout, cpu_quota, own_cgroup, quota_of, remove_stale, throttling_of
from tests.conftest import requires

V1_MOUNTINFO = """\
30 25 0:26 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
32 30 0:28 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
33 30 0:29 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def test_the_cpu_controller_is_found_in_a_v1_hierarchy():
    assert cpu_layout(V1_MOUNTINFO) == CgroupLayout(Path("/sys/fs/cgroup/cpu"), 1)
    assert cpu_layout("24 1 0:5 / /proc rw - proc proc rw\n") is None


def test_a_v2_mount_counts_only_when_it_offers_cpu(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    mountinfo = f"35 1 0:30 / {tmp_path} rw,relatime - cgroup2 cgroup2 rw\n"
    assert cpu_layout(mountinfo) is None
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert cpu_layout(mountinfo) == CgroupLayout(tmp_path, 2)


def test_own_cgroup_follows_the_cpu_line_in_v1_and_the_unified_line_in_v2():
    lines = "4:memory:/elsewhere\n1:cpu,cpuacct:/bpm-demo/a\n0::/system.slice/x\n"
    assert own_cgroup(CgroupLayout(Path("/cg"), 1), lines) == Path("/cg/bpm-demo/a")
    assert own_cgroup(CgroupLayout(Path("/cg"), 2), lines) == Path("/cg/system.slice/x")


def test_the_tightest_quota_on_the_way_up_is_the_capacity(tmp_path):
    child = tmp_path / "bpm-demo" / "a"
    child.mkdir(parents=True)
    for folder, quota in ((tmp_path, -1), (tmp_path / "bpm-demo", 150_000), (child, 40_000)):
        (folder / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        (folder / "cpu.cfs_period_us").write_text("100000\n")
    layout = CgroupLayout(tmp_path, 1)
    assert quota_of(tmp_path, 1) is None, "-1 is no quota"
    assert cpu_quota(layout, "1:cpu:/bpm-demo/a\n") == pytest.approx(0.4)
    (child / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_quota(layout, "1:cpu:/bpm-demo/a\n") == pytest.approx(1.5), "a parent's quota bounds its children"
    assert cpu_quota(layout, "1:cpu:/\n") is None


def test_v2_reads_cpu_max(tmp_path):
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert quota_of(tmp_path, 2) is None
    (tmp_path / "cpu.max").write_text("25000 50000\n")
    assert quota_of(tmp_path, 2) == pytest.approx(0.5)


def test_host_names_become_folders_only_when_safe(tmp_path):
    hosts = CpuHosts(CgroupLayout(tmp_path, 1), tmp_path / "bpm-run")
    assert hosts.folder("replay-a") == tmp_path / "bpm-run" / "replay-a"
    for bad in ("../escape", "a/b", "", "A", "x" * 80):
        with pytest.raises(ValueError):
            hosts.folder(bad)


def test_throttling_is_read_in_either_layout(tmp_path):
    v1, v2, none = tmp_path / "v1", tmp_path / "v2", tmp_path / "none"
    for folder in (v1, v2, none):
        folder.mkdir()
    (v1 / "cpu.stat").write_text("nr_periods 40\nnr_throttled 10\nthrottled_time 2500000000\n")
    (v2 / "cpu.stat").write_text("usage_usec 9\nuser_usec 5\nsystem_usec 4\nnr_periods 40\nnr_throttled 30\nthrottled_usec 1500000\n")
    assert throttling_of(v1, 1) == Throttling(40, 10, 2.5)
    assert throttling_of(v2, 2) == Throttling(40, 30, 1.5)
    assert throttling_of(none, 2) is None
    assert throttling_of(v2, 1) is None, "v1 names its wait throttled_time"


needs_cgroups = requires(CpuHosts.available(), "CPU cgroups (root)")


@needs_cgroups
@pytest.mark.serial
def test_a_participant_runs_under_its_quota_and_reads_it_as_its_capacity():
    """A process started in a host of 0.3 CPU, spinning for 2 s, reads 0.3 as its capacity and
    gets about 0.6 s of CPU; its child (as the Spark JVM is the agent's) is in the host too."""
    spin = ("import os, sys, time\n"
            "from spark_agents.hosts import cpu_capacity\n"
            "print(cpu_capacity(default=99.0), flush=True)\n"
            "child = os.fork()\n"
            "if child == 0:\n"
            "    time.sleep(30)\n"
            "    os._exit(0)\n"
            "print(child, flush=True)\n"
            "before = sum(os.times()[:2])\n"  # the CPU of the spin alone, not of the imports before it
            "end = time.time() + 2\n"
            "while time.time() < end: pass\n"
            "print(sum(os.times()[:2]) - before, flush=True)\n"
            "time.sleep(30)\n")
    hosts = CpuHosts.create("test")
    try:
        hosts.add("a", 0.3)
        process = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2],
                                   **hosts.popen_kwargs("a"))
        capacity, child, cpu = (process.stdout.readline() for _ in range(3))
        assert float(capacity) == pytest.approx(0.3)
        assert float(cpu) == pytest.approx(0.6, abs=0.2), "the quota holds the process to 0.3 CPU"
        assert set(hosts.pids("a")) == {process.pid, int(child)}
        assert set(_procs(hosts.folder("a") / "main")) == {process.pid, int(child)}, "its processes start in main"
        parent = hosts.parent
    finally:
        hosts.close()
    assert process.wait(timeout=10) != 0, "closing the hosts kills what is left in them"
    assert not parent.exists()
    assert _gone(int(child)), "the child was killed too"


def _gone(pid: int) -> bool:
    """No such process, or only its exit status left (a zombie its new parent has not reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


@needs_cgroups
def test_cgroups_left_by_a_killed_run_are_removed_by_the_next():
    layout = cpu_layout()
    left = CpuHosts.create("left")
    left.add("a", 0.2)
    old = time.time() - 3600
    os.utime(left.parent, (old, old))
    try:
        assert left.parent in remove_stale(layout)
        assert not left.parent.exists()
    finally:
        left.close()


def _procs(folder: Path) -> list[int]:
    return [int(p) for p in (folder / "cgroup.procs").read_text().split()]


@needs_cgroups
@pytest.mark.serial
def test_spark_s_python_processes_of_a_participant_run_first_within_its_quota(tmp_path):
    """`python_first` in a participant's host gives an interpreter that runs in the host's
    `python` cgroup, weighted above `main`; elsewhere one that stays where it is."""
    probe = ("import sys\n"
             "from pathlib import Path\n"
             "from spark_agents.hosts import python_first\n"
             "print(python_first(Path(sys.argv[1]), sys.executable), flush=True)\n")
    root = Path(__file__).parents[2]
    outside = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "outside")], capture_output=True, text=True, cwd=root).stdout.strip()
    assert outside == str(tmp_path / "outside" / "python-first") and "cgroup.procs" not in Path(outside).read_text()
    hosts = CpuHosts.create("test")
    try:
        folder = hosts.add("a", 0.3)
        weights = [int((folder / child / "cpu.shares").read_text()) for child in ("python", "main")] if hosts.layout.version == 1 else \
                  [int((folder / child / "cpu.weight").read_text()) for child in ("python", "main")]
        assert weights[0] > 4 * weights[1]
        found = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "a")], capture_output=True, text=True, cwd=root, **hosts.popen_kwargs("a"))
        wrapper = found.stdout.strip()
        assert wrapper == str(tmp_path / "a" / "python-first"), found.stderr
        where = "from spark_agents.hosts import cpu_layout, own_cgroup; print(own_cgroup(cpu_layout()))"
        shown = subprocess.run([wrapper, "-c", where], capture_output=True, text=True, cwd=root, **hosts.popen_kwargs("a"))
        assert shown.returncode == 0, shown.stderr
        assert Path(shown.stdout.strip()) == folder / "python", "the interpreter moved itself into python"
    finally:
        hosts.close()


def test_spark_s_python_imports_the_installed_pyspark_not_spark_s_zips(tmp_path):
    """Spark puts its bundled zips of pyspark and py4j first on its Python processes' path;
    `spark_python` leaves them off, so pyspark comes with its compiled bytecode."""
    import pyspark

    from spark_agents.session import spark_python

    zips = sorted(str(p) for p in (Path(pyspark.__file__).parent / "python" / "lib").glob("*.zip"))
    assert zips, "a pip installation bundles them"
    env = {k: v for k, v in os.environ.items() if k != "SPARK_HOME"}
    shown = subprocess.run([spark_python(tmp_path), "-c", "import os, pyspark; print(pyspark.__file__); print(os.environ['PYTHONPATH'])"],
                           env={**env, "PYTHONPATH": ":".join([*zips, "/elsewhere"])}, capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    imported, path = shown.stdout.splitlines()
    assert ".zip" not in imported and path == "/elsewhere"


@pytest.mark.serial
def test_a_process_put_behind_the_agent_and_what_it_starts_later_have_the_lower_priority():
    """`lower_priority` reaches every thread of the process, and what it starts afterwards
    inherits it: the Spark driver's later threads and Python workers run behind the agent."""
    from spark_agents.hosts import JVM_NICE, lower_priority

    script = (
        "import os, sys, threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "sys.stdin.readline()\n"  # the priority is lowered meanwhile
        "later = threading.Thread(target=lambda: print(os.getpriority(os.PRIO_PROCESS, 0)), daemon=True)\n"
        "later.start(); later.join()\n"
        "print(os.getpriority(os.PRIO_PROCESS, 0))\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{process.pid}/task")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        lower_priority(process.pid)
        niceness = {int(t): os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{process.pid}/task")}
        out, _ = process.communicate("go\n", timeout=10)
    finally:
        process.kill()
    assert len(niceness) >= 2 and set(niceness.values()) == {JVM_NICE}, niceness
    assert [int(line) for line in out.split()] == [JVM_NICE, JVM_NICE]
    assert os.getpriority(os.PRIO_PROCESS, 0) == 0, "the caller keeps its own priority"


@needs_cgroups
@pytest.mark.serial
def test_the_meter_finds_a_host_that_spins_throttled_and_an_idle_one_not():
    """Measured from when both processes have started (a Python start-up under 0.2 CPU is
    held back too: on a busy machine it took b's share to 0.19 over the whole run)."""
    # Each says it has started, waits for the word, then spins or sleeps for 1.5 s.
    body = "import sys, time\nprint('up', flush=True)\nsys.stdin.readline()\nend = time.time() + 1.5\n"
    hosts = CpuHosts.create("test")
    try:
        hosts.add("a", 0.2)
        hosts.add("b", 0.2)
        spinning, idle = (subprocess.Popen([sys.executable, "-c", body + step], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                           **hosts.popen_kwargs(name))
                          for name, step in (("a", "while time.time() < end: pass"), ("b", "time.sleep(1.5)")))
        assert [p.stdout.readline() for p in (spinning, idle)] == ["up\n", "up\n"]
        meter = CpuMeter(hosts)
        for process in (spinning, idle):
            process.stdin.write("go\n")
            process.stdin.flush()
        time.sleep(1.0)
        sample = meter.sample()  # while both still run: the processes of a sample are those alive at both readings
        spinning.wait(timeout=20)
        idle.wait(timeout=20)
    finally:
        hosts.close()
    assert sample["throttled"]["a"] > 0.5, "a process that wants a whole CPU under 0.2 is held back most of the time"
    assert sample["throttled"]["b"] < 0.1, "one that sleeps hardly"
    assert 0.1 <= sample["busy"] <= 1.0, "the machine's CPUs were busy with at least a's 0.2 of one of them"
    spun, slept = (sum(sample["processes"][name].values()) for name in ("a", "b"))
    assert 0.1 <= spun <= 0.3, f"a's process used about its quota of 0.2 CPU, not {spun}"
    assert slept < 0.05, f"b's hardly any, not {slept}"
    assert list(sample["processes"]["a"]) == [Path(sys.executable).name[:15]], "named by its program (the name it was started by)"


@needs_cgroups
@pytest.mark.serial
def test_a_hosts_quota_changes_while_it_runs(tmp_path):
    """The demo's hosts start their JVMs and tasks under a larger quota, then get their
    capacity (`Hosts.set_cpus`); a host without a quota keeps none."""
    hosts = Hosts.open("test", tmp_path / "hosts", network=False)
    try:
        hosts.add("a", 0.8)
        hosts.add("shared")  # no quota given
        folder = hosts.cpu.folder("a")
        assert quota_of(folder, hosts.cpu.layout.version) == pytest.approx(0.8)
        assert hosts.set_cpus("a", 0.4).cpus == 0.4
        assert quota_of(folder, hosts.cpu.layout.version) == pytest.approx(0.4), "the cgroup's quota itself"
        assert hosts.report()["a"]["cpus"] == 0.4, "and the host's report"
        assert hosts.set_cpus("shared", 0.4).cpus is None, "no quota to change"
        assert not hosts.cpu.folder("shared").exists()
    finally:
        hosts.close()


def test_a_process_is_named_by_what_it_runs():
    from spark_agents.hosts import PYTHON, process_kind

    process = subprocess.Popen([sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.readline()", "replay"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert process.stdout.readline() == b"up\n"
        assert process_kind(process.pid) == "replay", "a bpm command is named by its subcommand"
        assert process_kind(process.pid, PYTHON) == "spark python", "whatever runs in the python child is Spark's"
        assert process_kind(os.getpid()) == Path(sys.executable).name[:15], "anything else by its program"
    finally:
        process.communicate(b"\n", timeout=10)
    assert process_kind(process.pid) == "gone"
