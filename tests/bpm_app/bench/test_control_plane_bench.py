"""`bpm bench control-plane`: real agents over simulated Spark hosts against a registry it
starts itself; every tick, request and offer counted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port

pytestmark = pytest.mark.slow
BPM = str(Path(sys.executable).with_name("bpm"))


def _bench(*options: str) -> dict:
    out = subprocess.run([BPM, "bench", "control-plane", "--port", str(free_port()), "--json", "--processes", "1", *options], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_agents_over_their_thresholds_make_offers_and_every_tick_and_request_is_counted():
    # Every participant over its threshold and no wave: all offer, none can take; offers flow.
    result = _bench("--agents", "3", "--seconds", "4", "--warmup", "0", "--period", "0.5", "--load-factor", "1.4", "--amplitude", "0")
    assert result["agents"] == 3 and result["contracts"] == 3 and result["errors"] == 0
    assert 3 * 4 / 0.5 * 0.9 <= result["ticks"] <= 3 * 4 / 0.5 + 3, "each agent ticks every 0.5 s"
    assert result["requests_per_agent_s"] > 1 / 1.0, "a heartbeat a second, and offers and what they change read"
    assert result["registry_cpu_s_per_agent_s"] > 0
    assert result["offers_per_s"] > 0, "overloaded participants offer"
    assert result["movements_per_s"] == 0, "nobody has room"
    assert 0 <= result["tick_lateness_p50_s"] <= result["tick_lateness_p99_s"]


@pytest.mark.parametrize("ha_mode", ["none", "passive_standby"])
def test_a_participant_with_room_takes_load_from_an_overloaded_partner(ha_mode):
    # One participant at 1.35 of its threshold, its partner at 0.45: load moves, handed over between the agents.
    result = _bench("--agents", "2", "--seconds", "5", "--warmup", "0", "--period", "0.5", "--load-factor", "0.9", "--skew", "0.5", "--amplitude", "0",
                    "--ha-mode", ha_mode)
    assert result["errors"] == 0 and result["contracts"] == 1 and result["ha_mode"] == ha_mode
    assert result["movements_per_s"] > 0
    placed = result["requests_per_agent_s_by_route"].get("POST /tasks/{id}/replicas", 0)
    assert (placed > 0) == (ha_mode == "passive_standby"), "with HA on, the origin places a replica of what moved"


def test_in_steady_state_an_agent_makes_one_request_per_heartbeat():
    # Every participant below its threshold, no wave: after the warm-up nothing changes, so an
    # agent sends its heartbeat and reads nothing: one request per heartbeat, however many ticks.
    result = _bench("--agents", "4", "--seconds", "6", "--warmup", "3", "--heartbeat", "2", "--period", "0.5",
                    "--load-factor", "0.4", "--amplitude", "0")
    assert result["errors"] == 0 and result["offers_per_s"] == 0
    assert result["ticks"] >= 4 * 6 / 0.5 * 0.9
    assert 0.4 <= result["requests_per_agent_s"] <= 0.5 + 0.1, result


def test_agents_in_several_processes_trade_within_their_blocks_and_every_block_is_counted():
    # Two blocks of two agents, each block a contract between an overloaded participant (the
    # even one) and one with room: load moves (in the warm-up, as the first block waits for the
    # second, or later), and the ticks of every agent of both are counted.
    result = _bench("--agents", "4", "--processes", "2", "--seconds", "5", "--warmup", "1", "--period", "0.5", "--load-factor", "0.9",
                    "--skew", "0.5", "--amplitude", "0")
    assert result["processes"] == 2 and result["contracts"] == 2 and result["errors"] == 0, result
    assert 4 * 5 / 0.5 * 0.9 <= result["ticks"] <= 4 * 5 / 0.5 + 4, "each agent of both blocks ticks every 0.5 s"
    assert result["movements_before"] + result["movements_per_s"] * 5 >= 2, "a movement in each block at least"
    assert result["requests_per_agent_s"] >= 0.9 and result["registry_cpu_s_per_agent_s"] > 0, "a heartbeat a second from each agent"
