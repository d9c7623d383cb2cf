"""`bpm bench registry` against a registry it starts itself: every round trip counted, and the
server's CPU per round trip measured; in contention mode, races refused and the registry's
invariants kept."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bpm_app.bench.registry import request_p99_bound_ms
from bpm_app.commands.bench_registry import local_database_pid, registry_goals
from tests.conftest import free_port, require_postgres

pytestmark = pytest.mark.slow
BPM = str(Path(sys.executable).with_name("bpm"))


def test_the_registry_benchmark_reports_round_trips_latency_and_server_cpu():
    out = subprocess.run([BPM, "bench", "registry", "--clients", "3", "--rounds", "4", "--port", str(free_port()), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["errors"] == 0 and result["round_trips"] == 12
    assert result["round_trips_per_s"] > 0 and 0 < result["p50_ms"] <= result["p99_ms"]
    assert result["server_cpu_s"] > 0, "the server did the work of twelve round trips"
    assert result["server_cpu_ms_per_round_trip"] == pytest.approx(1000 * result["server_cpu_s"] / 12, rel=0.05, abs=0.01)
    assert result["server_cpu_counts"] == ["registry"], "SQLite's work is the registry's own"
    assert result["registry_request_p99_ms_at_most"] > 0, "the registry's own timer saw the 24 requests"
    assert result["client_cpu_ms_per_round_trip"] > 0, "the clients' own CPU, which the machine's cores share with the server"
    assert result["goals"] == dict.fromkeys(["round_trips_per_s_at_least_1000", "p99_under_50_ms", "server_cpu_at_most_2_ms_per_round_trip"]), \
        "the goals are set for 100 clients on PostgreSQL"
    assert result["client_processes"] == 1


def test_clients_split_over_processes_play_every_round_trip_and_count_their_cpu():
    out = subprocess.run([BPM, "bench", "registry", "--clients", "5", "--rounds", "3", "--processes", "2", "--port", str(free_port()), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["client_processes"] == 2
    assert result["errors"] == 0 and result["round_trips"] == 15, "each of the five clients, in one process or the other, played its three"
    assert result["client_cpu_ms_per_round_trip"] > 0 and result["server_cpu_s"] > 0
    assert result["elapsed_s"] > 0 and result["round_trips_per_s"] == pytest.approx(15 / result["elapsed_s"], rel=0.05)


def test_the_server_s_cpu_counts_a_postgresql_server_on_this_machine_too():
    pid = local_database_pid(require_postgres())
    assert pid is not None and Path(f"/proc/{pid}/comm").read_text().strip() == "postgres", pid
    assert local_database_pid("sqlite:///bench.db") is None
    assert local_database_pid("postgresql+psycopg://postgres@db.example:5432/x") is None, "a server elsewhere is not read"


@pytest.mark.parametrize("processes", [1, 2])
def test_clients_that_race_for_the_same_participants_are_refused_and_the_registry_keeps_its_invariants(processes):
    out = subprocess.run([BPM, "bench", "registry", "--contend", "--clients", "12", "--rounds", "8", "--processes", str(processes),
                          "--port", str(free_port()), "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["mode"] == "contend" and result["participants"] == 4 and result["client_processes"] == processes
    assert result["errors"] == 0, result["first_errors"]
    assert result["crowd_violations"] == [] and result["goals"] == {"invariants_kept": True}
    assert sum(result["refused"].values()) > 0, "twelve clients acting as four participants raced"
    assert result["round_trips"] > 0, result


def test_the_goals_are_judged_at_their_own_setting_only():
    run = {"clients": 100, "database": "postgresql", "server_cpu_counts": ["registry", "postgresql"], "round_trips_per_s": 38.4,
           "p99_ms": 7447.7, "server_cpu_ms_per_round_trip": 19.7}
    assert registry_goals(run) == {"round_trips_per_s_at_least_1000": False, "p99_under_50_ms": False, "server_cpu_at_most_2_ms_per_round_trip": False}
    fast = {**run, "round_trips_per_s": 1200.0, "p99_ms": 41.0, "server_cpu_ms_per_round_trip": 1.9}
    assert set(registry_goals(fast).values()) == {True}
    assert set(registry_goals({**fast, "server_cpu_counts": ["registry"]}).values()) == {None}, "PostgreSQL's CPU must be counted"
    assert registry_goals({"mode": "contend", "crowd_violations": ["task #1 runs at a, but ..."]}) == {"invariants_kept": False}


def test_the_registry_s_own_p99_is_the_bound_of_the_bucket_that_holds_it_between_two_readings():
    before = Counter({0.01: 5.0, 0.1: 5.0, 1.0: 5.0, float("inf"): 5.0})
    after = Counter({0.01: 905.0, 0.1: 1004.0, 1.0: 1005.0, float("inf"): 1005.0})  # 900, then 99, then 1 more
    assert request_p99_bound_ms(before, after) == 100.0
    assert request_p99_bound_ms(before, Counter({**after, 0.1: 990.0})) == 1000.0, "985 of 1000 within 0.1 s: not 99%"
    assert request_p99_bound_ms(before, Counter({0.01: 5.0, 0.1: 5.0, 1.0: 5.0, float("inf"): 105.0})) is None, "past every bound"
    assert request_p99_bound_ms(None, after) is None and request_p99_bound_ms(before, before) is None
