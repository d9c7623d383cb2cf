"""The registry's Prometheus metrics at GET /metrics: counts from the database, request
durations by route template, the connection pool; open, bounded labels, no secrets."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import StaticPool

from tests.api.test_ha import moved, silence  # noqa: F401 - moved is a fixture

DURATIONS = "bpm_registry_request_duration_seconds"


def scrape(registry) -> dict:
    response = registry.client.get("/metrics")  # no key: open, like /healthz
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == CONTENT_TYPE_LATEST
    return {family.name: family for family in text_string_to_metric_families(response.text)}


def by(families: dict, name: str, *labels: str) -> dict:
    """The family's own samples (not _bucket, _count...) by the values of `labels`."""
    samples = [s for s in families[name].samples if s.name == name]
    return {(s.labels[labels[0]] if len(labels) == 1 else tuple(s.labels[label] for label in labels)): s.value for s in samples}


def counts(families: dict, name: str, *labels: str) -> dict:
    """`by`, without the label values that count 0 (every known one is exported)."""
    return {key: v for key, v in by(families, name, *labels).items() if v}


def value(families: dict, name: str) -> float:
    """The value of an unlabelled gauge."""
    (sample,) = families[name].samples
    return sample.value


def requests(families: dict) -> dict[tuple[str, str, str], float]:
    """How many requests the duration histogram counted, by (method, route, status)."""
    return {(s.labels["method"], s.labels["route"], s.labels["status"]): s.value
            for s in families[DURATIONS].samples if s.name == DURATIONS + "_count"}


def offer(registry, key, contract_id, task_id, **extra) -> dict:
    return registry.ok("POST", "/offers", key, status=201, json={"contract_id": contract_id, "task_ids": [task_id], "price": 1.5, **extra})


def test_an_empty_registry_exports_0_for_every_known_state(registry):
    """A dashboard sees every series from the first scrape, before any record of its kind."""
    families = scrape(registry)
    assert by(families, "bpm_registry_participants", "status") == dict.fromkeys(["new", "alive", "suspected", "failed"], 0)
    assert by(families, "bpm_registry_offers", "state") == dict.fromkeys(["pending", "accepted", "rejected", "withdrawn", "expired"], 0)
    assert by(families, "bpm_registry_tasks", "away") == {"true": 0, "false": 0}
    assert set(by(families, "bpm_registry_contracts", "state")) >= {"proposed", "active"}
    assert set(by(families, "bpm_registry_movements", "state")) == set(by(families, "bpm_registry_payments_accrued", "state")) >= {"active", "ended", "failed"}
    assert set(by(families, "bpm_registry_replicas", "role", "state")) >= {("passive_standby", "active"), ("active_standby", "promoted")}
    assert set(by(families, "bpm_registry_failovers", "kind", "state")) == {(k, s) for k in ("failover", "repair") for s in ("in_progress", "completed")}
    for name in ("participants", "contracts", "tasks", "offers", "movements", "payments_accrued", "replicas", "failovers"):
        assert not any(sample.value for sample in families[f"bpm_registry_{name}"].samples), name


def test_the_counts_follow_what_the_registry_records(registry):
    families = scrape(registry)
    assert counts(families, "bpm_registry_offers", "state") == {} and value(families, "bpm_registry_db_up") == 1
    a, b = registry.participant("a"), registry.participant("b")
    contract = registry.active_contract(a, "b", b, price_min=1.0, price_max=2.0)
    tasks = [registry.task(a, f"t{i}", load=0.5)["id"] for i in range(4)]
    accepted = offer(registry, a, contract["id"], tasks[0])
    movement_id = registry.ok("POST", f"/offers/{accepted['id']}/accept", b)["movements"][0]
    registry.ok("POST", f"/offers/{offer(registry, a, contract['id'], tasks[1])['id']}/reject", b)
    registry.ok("POST", f"/offers/{offer(registry, a, contract['id'], tasks[2])['id']}/withdraw", a)
    offer(registry, a, contract["id"], tasks[3], ttl_s=5)  # stored as pending, expired once the clock passes it
    registry.clock.advance(10)

    families = scrape(registry)
    assert counts(families, "bpm_registry_offers", "state") == {"accepted": 1, "rejected": 1, "withdrawn": 1, "expired": 1}
    assert counts(families, "bpm_registry_movements", "state") == {"active": 1}
    assert counts(families, "bpm_registry_contracts", "state") == {"active": 1}
    assert counts(families, "bpm_registry_tasks", "away") == {"true": 1, "false": 3}
    assert counts(families, "bpm_registry_participants", "status") == {"new": 2}
    # What the movement accrued so far, as the ledger counts it: 1.5 x 0.5 x 10 s.
    ledger = registry.ok("GET", "/ledger")
    assert counts(families, "bpm_registry_payments_accrued", "state") == {"active": pytest.approx(7.5)}
    assert sum(entry["amount"] for entry in ledger["entries"]) == pytest.approx(7.5)

    registry.clock.advance(10)
    registry.ok("POST", f"/movements/{movement_id}/end", b)
    offer(registry, a, contract["id"], tasks[1])
    families = scrape(registry)
    assert counts(families, "bpm_registry_offers", "state") == {"accepted": 1, "rejected": 1, "withdrawn": 1, "expired": 1, "pending": 1}
    assert counts(families, "bpm_registry_movements", "state") == {"ended": 1}
    assert counts(families, "bpm_registry_payments_accrued", "state") == {"ended": pytest.approx(15.0)}
    assert counts(families, "bpm_registry_tasks", "away") == {"false": 4}


def test_failovers_and_their_recovery_are_counted(registry, moved):
    keys, task, movement = moved
    silence(registry, keys, "b")
    record = registry.ok("POST", f"/tasks/{task['id']}/failover", keys["a"], status=201, json={"to": "a", "expected_epoch": 1})
    families = scrape(registry)
    assert counts(families, "bpm_registry_failovers", "kind", "state") == {("failover", "in_progress"): 1}
    assert counts(families, "bpm_registry_movements", "state") == {"failed": 1}
    assert counts(families, "bpm_registry_participants", "status") == {"alive": 3, "suspected": 1}
    registry.ok("POST", f"/failovers/{record['id']}/complete", keys["a"], json={"recovery_s": 0.4})
    families = scrape(registry)
    assert counts(families, "bpm_registry_failovers", "kind", "state") == {("failover", "completed"): 1}
    recovery = {s.name: s.value for s in families["bpm_registry_failover_recovery_seconds"].samples if s.labels == {"kind": "failover"}}
    assert recovery == {"bpm_registry_failover_recovery_seconds_count": 1, "bpm_registry_failover_recovery_seconds_sum": pytest.approx(0.4)}
    assert "bpm_registry_replicas" in families


def test_request_durations_are_labelled_by_route_template(registry):
    a = registry.participant("alpha")
    task = registry.task(a, "t0")
    for _ in range(3):
        registry.ok("GET", f"/tasks/{task['id']}", a)
    registry.call("GET", "/tasks/999999", a)
    registry.call("BREW", "/tasks", a)  # a method no one uses: no label value of its own
    counted = requests(scrape(registry))
    assert counted[("GET", "/api/v1/tasks/{task_id}", "200")] == 3
    assert counted[("GET", "/api/v1/tasks/{task_id}", "404")] == 1
    assert counted[("POST", "/api/v1/participants", "201")] == 1
    assert counted[("POST", "/api/v1/tasks", "201")] == 1
    assert counted[("other", "/api/v1/tasks", "405")] == 1
    served = {"unmatched", *registry.client.get("/openapi.json").json()["paths"]}  # the templates, /metrics among them
    assert {route for _, route, _ in counted} <= served
    assert not any(re.search(r"/\d+(/|$)", route) for _, route, _ in counted), "no raw id in a route label"


def test_unknown_paths_share_one_label_value(registry):
    for path in ("/nope/1", "/nope/2", "/api/v1/tasks/1/nope", "/api/v1/zzz", "/..%2f..%2fetc/passwd"):
        assert registry.client.get(path).status_code == 404
    first = requests(scrape(registry))
    assert first[("GET", "unmatched", "404")] == 5
    for k in range(20):
        registry.client.get(f"/random/{k}/path")
    again = requests(scrape(registry))
    assert again[("GET", "unmatched", "404")] == 25
    assert {route for _, route, _ in first} == {"unmatched"}
    assert {route for _, route, _ in again} == {"unmatched", "/metrics"}  # the first scrape, counted once answered


def test_the_pool_is_read_where_the_pool_tells(registry):
    families = scrape(registry)
    assert value(families, "bpm_registry_db_pool_size") >= 1
    for name in ("checked_out", "checked_in", "overflow"):
        assert value(families, f"bpm_registry_db_pool_{name}") >= 0
    app = registry.client.app
    working = app.state.engine
    app.state.engine = create_engine("sqlite://", poolclass=StaticPool)  # a pool without size or overflow
    try:
        families = scrape(registry)
    finally:
        app.state.engine.dispose()
        app.state.engine = working
    assert not any(name.startswith("bpm_registry_db_pool_") for name in families)
    assert value(families, "bpm_registry_db_up") == 1


def test_a_database_that_does_not_answer_leaves_the_other_metrics(registry):
    registry.client.get("/healthz")
    app = registry.client.app
    working = app.state.read_session
    broken = create_engine("sqlite:////nonexistent-folder/registry.db")
    app.state.read_session = sessionmaker(broken)
    try:
        response = registry.client.get("/metrics")
    finally:
        broken.dispose()
        app.state.read_session = working
    assert response.status_code == 200
    families = {family.name: family for family in text_string_to_metric_families(response.text)}
    assert value(families, "bpm_registry_db_up") == 0
    assert "bpm_registry_offers" not in families and DURATIONS in families
    assert "nonexistent" not in response.text


def test_the_metrics_name_no_one_and_show_no_key(registry):
    operator_key = registry.client.app.state.admin_key
    a = registry.participant("alpha")
    registry.task(a, "secret-task")
    registry.ok("GET", "/participants/alpha", a)
    response = registry.client.get("/metrics")
    assert response.status_code == 200 and "bpm_registry_participants" in response.text
    for secret in (a, operator_key, "alpha", "secret-task"):
        assert secret not in response.text
