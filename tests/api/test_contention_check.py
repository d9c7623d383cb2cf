"""`bpm bench registry --contend`'s check of the registry's invariants after a run: it finds
what it looks for when the database holds it, and nothing in a registry that keeps them."""

from __future__ import annotations

import asyncio

import httpx
from sqlalchemy import create_engine, text

from bpm_app.bench.registry import Crowd, crowd_violations
from tests.api.conftest import ADMIN_KEY


def _violations(registry, crowd: Crowd) -> list[str]:
    async def check() -> list[str]:
        transport = httpx.ASGITransport(app=registry.client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://registry") as http:
            return await crowd_violations(http, ADMIN_KEY, crowd)

    return asyncio.run(check())


def test_the_check_finds_a_task_its_movements_do_not_lead_to_and_a_movement_nobody_was_told_of(registry):
    a, b = registry.participant("pa"), registry.participant("pb")
    contract = registry.active_contract(a, "pb", b)
    task = registry.task(a, "t0")
    offer = registry.ok("POST", "/offers", a, status=201, json={"contract_id": contract["id"], "task_ids": [task["id"]], "price": 1.5})
    registry.ok("POST", f"/offers/{offer['id']}/accept", b)
    crowd = Crowd(keys={"pa": a, "pb": b}, contracts={}, host={}, away={}, accepted=1)
    assert _violations(registry, crowd) == []

    crowd.accepted = 2
    assert _violations(registry, crowd) == ["2 accepts were acknowledged, the registry holds 1 movements"]
    crowd.accepted = 1
    # The task back at its origin while its movement stays active: what a lost update would leave.
    engine = create_engine(registry.url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE tasks SET host_id = origin_id WHERE id = :id"), {"id": task["id"]})
    engine.dispose()
    assert _violations(registry, crowd) == [f"task #{task['id']} runs at pa, but its active movements lead to pb"]
