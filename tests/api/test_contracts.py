from __future__ import annotations

import pytest


def _propose(registry, key, counterparty, **terms):
    body = {"counterparty": counterparty, "price_min": 1.0, "price_max": 1.5, "min_duration_s": 30, **terms}
    return registry.call("POST", "/contracts", key, json=body)


def test_negotiation_path_propose_counter_counter_accept(registry):
    a, b = registry.participant("a"), registry.participant("b")
    proposed = _propose(registry, a, "b").json()
    assert proposed["state"] == "proposed" and proposed["awaiting"] == "b" and proposed["proposer"] == "a"
    cid = proposed["id"]
    countered = registry.ok("POST", f"/contracts/{cid}/counter", b, json={"price_min": 1.2, "price_max": 1.4, "min_duration_s": 20})
    assert countered["state"] == "countered" and countered["awaiting"] == "a" and countered["price_min"] == 1.2
    # The side that made the last proposal may not answer it.
    assert registry.call("POST", f"/contracts/{cid}/accept", b).status_code == 403
    assert registry.call("POST", f"/contracts/{cid}/counter", b, json={"price_min": 1, "price_max": 1, "min_duration_s": 1}).status_code == 403
    again = registry.ok("POST", f"/contracts/{cid}/counter", a, json={"price_min": 1.3, "price_max": 1.3, "min_duration_s": 25})
    assert again["awaiting"] == "b"
    active = registry.ok("POST", f"/contracts/{cid}/accept", b)
    assert active["state"] == "active" and active["in_force"] and active["awaiting"] is None
    assert (active["price_min"], active["price_max"], active["min_duration_s"]) == (1.3, 1.3, 25)
    assert registry.call("POST", f"/contracts/{cid}/accept", a).status_code == 409
    assert registry.call("POST", f"/contracts/{cid}/counter", a, json={"price_min": 1, "price_max": 2, "min_duration_s": 1}).status_code == 409
    terminated = registry.ok("POST", f"/contracts/{cid}/terminate", a)
    assert terminated["state"] == "terminated" and not terminated["in_force"]
    assert registry.call("POST", f"/contracts/{cid}/terminate", b).status_code == 409
    kinds = [e["kind"] for e in registry.ok("GET", "/events?kind=contract")]
    assert kinds == ["contract.proposed", "contract.countered", "contract.countered", "contract.active", "contract.terminated"]


def test_reject_ends_negotiation(registry):
    a, b = registry.participant("a"), registry.participant("b")
    cid = _propose(registry, a, "b").json()["id"]
    assert registry.call("POST", f"/contracts/{cid}/reject", a).status_code == 403
    assert registry.ok("POST", f"/contracts/{cid}/reject", b)["state"] == "rejected"
    assert registry.call("POST", f"/contracts/{cid}/accept", b).status_code == 409


@pytest.mark.parametrize(
    ("terms", "fragment"),
    [
        ({"price_min": 0}, "greater than 0"),
        ({"price_min": -1}, "greater than 0"),
        ({"price_min": 2.0, "price_max": 1.0}, "must not exceed"),
        ({"min_duration_s": 0}, "greater than 0"),
        ({"price_max": "cheap"}, "valid number"),
        ({"valid_until": "2020-01-01T00:00:00Z"}, "future"),
        ({"ha_mode": "telepathy"}, "ha_mode"),
        ({"surprise": 1}, "Extra inputs"),
    ],
)
def test_invalid_terms_are_422_with_a_message(registry, terms, fragment):
    a = registry.participant("a")
    registry.participant("b")
    response = _propose(registry, a, "b", **terms)
    assert response.status_code == 422
    body = response.json()
    assert fragment in str(body), body


def test_non_finite_prices_are_422(registry):
    a = registry.participant("a")
    registry.participant("b")
    raw = '{"counterparty": "b", "price_min": NaN, "price_max": Infinity, "min_duration_s": 1}'
    response = registry.call("POST", "/contracts", a, content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 422


def test_refusals_self_unknown_operator(registry):
    a = registry.participant("a")
    assert _propose(registry, a, "a").status_code == 422
    assert _propose(registry, a, "nobody").status_code == 404
    assert _propose(registry, None, "a").status_code == 401
    # The operator is no party: contracts are signed by participants.
    assert registry.call("POST", "/contracts", json={"counterparty": "a", "price_min": 1, "price_max": 1, "min_duration_s": 1}).status_code == 403


def test_one_active_contract_per_pair(registry):
    a, b = registry.participant("a"), registry.participant("b")
    first = _propose(registry, a, "b").json()["id"]
    second = _propose(registry, b, "a").json()["id"]  # negotiating twice is fine
    registry.ok("POST", f"/contracts/{first}/accept", b)
    clash = registry.call("POST", f"/contracts/{second}/accept", a)
    assert clash.status_code == 409 and clash.json()["contract_id"] == first
    assert _propose(registry, a, "b").status_code == 409
    registry.ok("POST", f"/contracts/{first}/terminate", b)
    assert registry.ok("POST", f"/contracts/{second}/accept", a)["state"] == "active"


def test_only_parties_and_operator_read_terms(registry):
    a, b, c = registry.participant("a"), registry.participant("b"), registry.participant("c")
    cid = _propose(registry, a, "b").json()["id"]
    assert registry.ok("GET", f"/contracts/{cid}", a)["id"] == cid
    assert registry.ok("GET", f"/contracts/{cid}", b)["id"] == cid
    assert registry.ok("GET", f"/contracts/{cid}")["id"] == cid
    assert registry.call("GET", f"/contracts/{cid}", c).status_code == 403
    assert registry.call("POST", f"/contracts/{cid}/accept", c).status_code == 403
    assert registry.ok("GET", "/contracts", c) == []
    assert [x["id"] for x in registry.ok("GET", "/contracts?participant=a")] == [cid]
    assert registry.ok("GET", "/contracts?state=active") == []
    assert registry.call("GET", "/contracts/999").status_code == 404


def test_expired_contract_is_not_in_force(registry):
    a, b = registry.participant("a"), registry.participant("b")
    until = (registry.clock.now.replace(microsecond=0)).isoformat().replace("+00:00", "Z")
    registry.clock.advance(-60)
    cid = _propose(registry, a, "b", valid_until=until).json()["id"]
    assert registry.ok("POST", f"/contracts/{cid}/accept", b)["in_force"]
    registry.clock.advance(120)
    assert not registry.ok("GET", f"/contracts/{cid}")["in_force"]
