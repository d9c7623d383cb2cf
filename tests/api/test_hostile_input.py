"""Hostile input to the registry gets a 4xx with a readable JSON detail, never a 500."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine

from bpm_http.web import MAX_BODY


@pytest.mark.parametrize(
    "name",
    ["t/../../../../tmp/evil", "../up", ".hidden", "-flag", "a b", "tab\tname", "nul\x00", "ü", "x" * 129],
)
def test_a_task_name_that_could_become_a_path_is_refused(registry, name):
    a = registry.participant("a")
    response = registry.call("POST", "/tasks", a, json={"name": name})
    assert response.status_code == 422, response.text
    assert response.json()["message"]


@pytest.mark.parametrize(
    ("uri", "why"),
    [("nats://127.0.0.1:4222/b", "not b's"), ("nats://127.0.0.1:4222/a/2", "key-group"), ("nats://u:p@127.0.0.1:4222/a", "no credentials"),
     ("nats://127.0.0.1/a", "HOST:PORT"), ("nats://127.0.0.1:4222/../etc", "participant"),
     ("/etc/passwd", "nats://HOST:PORT"), ("file:///data/a/conn", "nats://HOST:PORT"),  # a path is no input: no shared disk
     # Partners' agents connect to a task's broker: only the origin's own host, the one its endpoint names.
     ("nats://10.0.0.1:4222/a", "origin's own host"), ("nats://localhost:4222/a", "origin's own host")],
)
def test_a_task_reads_only_a_broker_stream_of_its_own_origin(registry, uri, why):
    a = registry.participant("a")
    response = registry.call("POST", "/tasks", a, json={"name": "t", "input_uri": uri})
    assert response.status_code == 422, response.text
    assert why in response.json()["detail"]
    good = registry.call("POST", "/tasks", a, json={"name": "t", "input_uri": "nats://127.0.0.1:4222/a/01"})
    assert good.status_code == 201, good.text


def test_a_participant_name_that_could_become_a_path_is_refused(registry):
    response = registry.call("POST", "/participants", json={"name": "../b", "endpoint": "http://127.0.0.1:1"})
    assert response.status_code == 422, response.text


def test_a_participant_name_has_no_dot_so_task_keys_cannot_collide(registry):
    """`acme`'s task `eu.p0` and a participant `acme.eu`'s task `p0` would both have the key
    `acme.eu.p0`: the second participant is refused."""
    acme = registry.participant("acme")
    assert registry.call("POST", "/tasks", acme, json={"name": "eu.p0"}).status_code == 201
    response = registry.call("POST", "/participants", json={"name": "acme.eu", "endpoint": "http://127.0.0.1:1"})
    assert response.status_code == 422 and "name" in response.text, response.text


@pytest.mark.parametrize(
    "body",
    [
        {"name": "t", "params": {"k": "nul\x00byte"}},
        {"name": "t", "params": {"n": 2**64}},
        {"name": "t", "load": 1e300},
        {"name": "t", "params": {"deep": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}},
    ],
    ids=["nul", "int65", "huge-load", "deep"],
)
def test_values_the_database_cannot_store_are_refused(registry, body):
    a = registry.participant("a")
    response = registry.call("POST", "/tasks", a, json=body)
    assert response.status_code == 422, response.text


@pytest.mark.parametrize("path", ["/tasks/99999999999999999999", "/tasks/2147483648", "/offers/0", "/contracts/-1", "/events?after_id=9223372036854775808"])
def test_ids_beyond_the_id_columns_in_urls_are_refused(registry, path):
    response = registry.call("GET", path)
    assert response.status_code == 422, response.text


def test_ids_within_the_id_columns_that_do_not_exist_are_not_found(registry):
    response = registry.call("GET", "/tasks/2147483647")
    assert response.status_code == 404, response.text


def test_terms_that_overflow_the_registry_arithmetic_are_refused(registry):
    registry.participant("a")
    b = registry.participant("b")
    for terms in ({"min_duration_s": 1e15}, {"valid_until": "9999-12-31T23:59:59Z"}, {"price_max": 1e300}):
        body = {"counterparty": "a", "price_min": 1, "price_max": 2, "min_duration_s": 10, **terms}
        response = registry.call("POST", "/contracts", b, json=body)
        assert response.status_code == 422, (terms, response.text)
    response = registry.call("GET", "/participants/a/loads", params={"since": "0001-01-01T00:00:00"})
    assert response.status_code == 422, response.text


def test_query_strings_are_bounded_too(registry):
    for path, params in (("/tasks", {"host": "a\x00"}), ("/events", {"kind": "x" * 100}), ("/movements", {"state": "'; drop"})):
        response = registry.call("GET", path, params=params)
        assert response.status_code == 422, (path, response.text)


def test_a_body_over_the_cap_gets_413_declared_or_streamed(registry):
    a = registry.participant("a")
    big = b'{"name": "t", "params": {"x": "' + b"y" * (MAX_BODY + 10) + b'"}}'
    response = registry.call("POST", "/tasks", a, content=big, headers={"Content-Type": "application/json"})
    assert response.status_code == 413 and "detail" in response.json()

    def chunks():
        for start in range(0, len(big), 65536):
            yield big[start:start + 65536]

    response = registry.call("POST", "/tasks", a, content=chunks(), headers={"Content-Type": "application/json"})
    assert response.status_code == 413 and "detail" in response.json()


def test_health_check_does_not_reveal_the_database_error(registry):
    app = registry.client.app
    working = app.state.engine
    app.state.engine = create_engine("sqlite:////nonexistent-folder/registry.db")
    try:
        response = registry.client.get("/healthz")
    finally:
        app.state.engine.dispose()
        app.state.engine = working
    assert response.status_code == 503
    assert "nonexistent" not in response.text and "sqlite" not in response.text.lower()


def test_a_production_registry_serves_no_page_with_a_third_party_s_scripts(tmp_path):
    """/docs and /redoc load their scripts from a CDN into the registry's origin, where the
    operator types keys: a production registry serves neither; its OpenAPI stays."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from api.settings import Settings

    for mode, pages in (("local", 200), ("production", 404)):
        app = create_app(Settings(database_url=f"sqlite:///{tmp_path}/{mode}.db", mode=mode), admin_key="operator-key")
        with TestClient(app) as client:
            assert client.get("/openapi.json").status_code == 200
            for page in ("/docs", "/redoc"):
                answer = client.get(page)
                assert answer.status_code == pages, (mode, page)
                assert "cdn.jsdelivr.net" in answer.text if pages == 200 else "cdn" not in answer.text
