from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from bpm import certificates
from tests.api.conftest import ADMIN_KEY


def test_registration_returns_key_once_and_stores_only_its_hash(registry):
    key = registry.participant("alpha")
    assert key.startswith("bpm_")
    listed = registry.ok("GET", "/participants")
    assert [p["name"] for p in listed] == ["alpha"]
    assert "api_key" not in listed[0]
    assert "api_key" not in registry.ok("GET", "/participants/alpha")
    engine = create_engine(registry.url)
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT key_hash FROM participants")).scalar_one()
    engine.dispose()
    assert stored != key and key not in stored and len(stored) == 64


def test_registration_refusals(registry):
    body = {"name": "alpha", "endpoint": "http://127.0.0.2:9000"}
    assert registry.call("POST", "/participants", key=None, json=body).status_code == 401
    assert registry.call("POST", "/participants", key="wrong", json=body).status_code == 401
    alpha = registry.participant("alpha")
    assert registry.call("POST", "/participants", key=alpha, json={**body, "name": "beta"}).status_code == 403
    taken = registry.call("POST", "/participants", json=body)
    assert taken.status_code == 409 and "taken" in taken.json()["detail"]
    for bad in ({"name": "", "endpoint": "x"}, {"name": "a b", "endpoint": "x"}, {"name": "ok"}, {"name": "ok", "endpoint": "x", "extra": 1}):
        response = registry.call("POST", "/participants", json=bad)
        assert response.status_code == 422, bad
        assert response.json()["message"]
    assert registry.call("GET", "/participants/nobody").status_code == 404


def test_heartbeat_only_by_that_participant_and_updates_load(registry):
    alpha, beta = registry.participant("alpha"), registry.participant("beta")
    task = registry.task(alpha, "t1", load=0.1)
    report = {"load": 0.7, "threshold": 0.6, "marginal_cost": {"shed": 3.0, "take": 4.0}, "tasks": [{"task_id": task["id"], "load": 0.25}]}
    assert registry.call("POST", "/participants/alpha/heartbeat", beta, json=report).status_code == 403
    assert registry.call("POST", "/participants/alpha/heartbeat", ADMIN_KEY, json=report).status_code == 403
    assert registry.call("POST", "/participants/alpha/heartbeat", alpha, json={**report, "load": -1}).status_code == 422
    body = registry.ok("POST", "/participants/alpha/heartbeat", alpha, json=report)
    assert body["load"] == 0.7 and body["threshold"] == 0.6 and body["status"] == "alive"
    assert body["hosted_tasks"] == [task["id"]]
    assert registry.ok("GET", f"/tasks/{task['id']}")["load"] == 0.25
    assert [s["load"] for s in registry.ok("GET", "/participants/alpha/loads")] == [0.7]


def test_liveness_follows_heartbeat_age(registry):
    alpha = registry.participant("alpha")
    assert registry.ok("GET", "/participants/alpha")["status"] == "new"
    registry.ok("POST", "/participants/alpha/heartbeat", alpha, json={"load": 0.1})
    registry.clock.advance(2.0)
    assert registry.ok("GET", "/participants/alpha")["status"] == "alive"
    registry.clock.advance(2.0)
    assert registry.ok("GET", "/participants/alpha")["status"] == "suspected"
    registry.clock.advance(3.0)
    got = registry.ok("GET", "/participants/alpha")
    assert got["status"] == "failed" and got["heartbeat_age_s"] == 7.0


def test_health_and_docs(registry):
    assert registry.client.get("/healthz").json()["status"] == "ok"
    spec = registry.client.get("/openapi.json").json()
    operations = [op for path in spec["paths"].values() for op in path.values()]
    assert all(op.get("description") for op in operations), "every endpoint carries a docstring"


def test_me_tells_whose_key_is_in_use(registry):
    alpha = registry.participant("alpha")
    assert registry.ok("GET", "/me") == {"name": "operator", "role": "operator"}
    assert registry.ok("GET", "/me", alpha) == {"name": "alpha", "role": "participant"}
    assert registry.call("GET", "/me", "nope").status_code == 401


def test_a_participant_rotates_its_own_key_and_the_old_one_stops_working(registry):
    a, b = registry.participant("a"), registry.participant("b")
    assert registry.call("POST", "/participants/b/key", a).status_code == 403
    rotated = registry.ok("POST", "/participants/a/key", a, status=201)
    assert rotated["name"] == "a" and rotated["api_key"] != a
    assert registry.call("GET", "/me", a).status_code == 401
    assert registry.ok("GET", "/me", rotated["api_key"]) == {"name": "a", "role": "participant"}
    assert registry.ok("GET", "/me", b)["name"] == "b"
    kinds = [e["kind"] for e in registry.ok("GET", "/events?participant=a")]
    assert "participant.key_rotated" in kinds


def test_the_operator_revokes_a_key_and_hands_out_a_new_one(registry):
    a, b = registry.participant("a"), registry.participant("b")
    assert registry.call("DELETE", "/participants/a/key", b).status_code == 403
    assert registry.call("DELETE", "/participants/a/key", a).status_code == 403  # not even its own: the operator decides
    assert registry.ok("DELETE", "/participants/a/key") == {"name": "a", "key_revoked": True}
    assert registry.call("GET", "/me", a).status_code == 401
    assert registry.call("POST", "/participants/a/key", a).status_code == 401  # a revoked key cannot rotate itself back
    assert registry.ok("GET", "/participants/a")["key_revoked"] is True
    fresh = registry.ok("POST", "/participants/a/key", status=201)["api_key"]
    assert registry.ok("GET", "/me", fresh)["name"] == "a"
    assert registry.ok("GET", "/participants/a")["key_revoked"] is False
    assert registry.call("DELETE", "/participants/zz/key").status_code == 404


def test_a_rotated_signing_key_loses_its_private_half_at_once_and_is_deleted_after_its_grace(registry):
    """A retired key never signs again: its private half is erased when it retires, its public
    half verifies for the grace period (`GET /keys` lists it), then the next rotation deletes it."""
    from sqlalchemy import select

    from api.models import SigningKey
    from api.signing import ERASED, GRACE, SEALED

    def stored() -> dict[str, str]:
        with registry.client.app.state.read_session() as session:
            return {k.kid: k.private_pem for k in session.scalars(select(SigningKey))}

    first = {k["kid"] for k in registry.ok("GET", "/keys")}
    second = registry.ok("POST", "/keys/rotate", status=201)["kid"]
    kept = stored()
    assert all(kept[kid] == ERASED for kid in first) and kept[second] != ERASED
    assert kept[second].startswith(SEALED) and "PRIVATE KEY" not in kept[second], "sealed with a secret kept outside the database"
    assert {k["kid"] for k in registry.ok("GET", "/keys")} == first | {second}, "the retired key verifies within its grace"
    registry.clock.advance(GRACE.total_seconds() + 1)
    assert {k["kid"] for k in registry.ok("GET", "/keys")} == {second}, "past its grace nobody is told to trust it"
    third = registry.ok("POST", "/keys/rotate", status=201)["kid"]
    assert set(stored()) == {second, third}, "keys retired longer than the grace are deleted"


def test_a_load_history_comes_in_bounded_reads_of_the_newest_samples(registry):
    """A read of a load history returns at most `limit` samples (an hour's by default, never
    more), the newest of those after `since`, oldest first."""
    key = registry.participant("alpha")
    for load in (0.1, 0.2, 0.3, 0.4):
        registry.clock.advance(1)
        registry.ok("POST", "/participants/alpha/heartbeat", key, json={"load": load})
    assert [s["load"] for s in registry.ok("GET", "/participants/alpha/loads", params={"limit": 2})] == [0.3, 0.4]
    first = registry.ok("GET", "/participants/alpha/loads")[0]["at"]
    assert [s["load"] for s in registry.ok("GET", "/participants/alpha/loads", params={"since": first, "limit": 2})] == [0.3, 0.4]
    assert [s["load"] for s in registry.ok("GET", "/participants/alpha/loads", params={"since": first})] == [0.2, 0.3, 0.4]
    for bad in (0, 3601):
        assert registry.call("GET", "/participants/alpha/loads", params={"limit": bad}).status_code == 422


def test_signing_keys_are_sealed_with_a_secret_kept_outside_the_database(registry):
    """A copy of the database alone signs nothing: a key's private half is sealed with the
    registry's signing secret (derived from the operator's key unless set), a key an older
    registry kept in clear is sealed at start, and another secret cannot open it."""
    import jwt
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from fastapi.testclient import TestClient
    from sqlalchemy import select

    from api.app import create_app
    from api.models import SigningKey
    from api.settings import Settings
    from api.signing import SEALED, SealedElsewhere, Sealer

    app = registry.client.app
    with app.state.write_session() as session, session.begin():
        key = session.scalars(select(SigningKey).where(SigningKey.retired_at.is_(None))).one()
        assert key.private_pem.startswith(SEALED)
        # As an older registry kept it: in clear.
        clear = Ed25519PrivateKey.generate()
        key.private_pem = clear.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
        key.public_pem = clear.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
        kid = key.kid
    restarted = create_app(Settings(database_url=registry.url), admin_key=ADMIN_KEY, migrate=False, clock=registry.clock)
    with TestClient(restarted):
        with restarted.state.read_session() as session:
            key = session.scalars(select(SigningKey).where(SigningKey.kid == kid)).one()
        assert key.private_pem.startswith(SEALED) and "PRIVATE KEY" not in key.private_pem, "sealed at start"
        token = jwt.encode({"sub": "x"}, Sealer(f"operator:{ADMIN_KEY}").open(key), algorithm="EdDSA")
        assert jwt.decode(token, key.public_pem, algorithms=["EdDSA"]) == {"sub": "x"}
        with pytest.raises(SealedElsewhere, match="sealed with another secret"):
            Sealer("another registry's secret").open(key)
    elsewhere = create_app(Settings(database_url=registry.url, signing_secret="not this registry's"), admin_key=ADMIN_KEY, migrate=False,
                           clock=registry.clock)
    with TestClient(elsewhere) as client:  # its secret changed (with the operator key): it signs with a new key
        listed = client.get("/api/v1/keys").json()
        assert [k["kid"] for k in listed if k["retired_at"] is None] != [kid] and kid in [k["kid"] for k in listed]


def test_a_rotation_tells_every_participant_and_a_revoking_one_lists_only_the_new_key(registry):
    """Each rotation leaves every participant a `keys` change notice (its agent reads the keys
    again); without `revoke` the old key verifies for its grace, with it the old key is gone."""
    keys = {name: registry.participant(name) for name in ("alpha", "beta")}
    first = {k["kid"] for k in registry.ok("GET", "/keys")}

    def notices(name):
        return [c["kind"] for c in registry.ok("POST", f"/participants/{name}/heartbeat", keys[name], json={"load": 0.1})["changes"]]

    assert "keys" not in notices("alpha")
    second = registry.ok("POST", "/keys/rotate", status=201)["kid"]
    assert {k["kid"] for k in registry.ok("GET", "/keys")} == first | {second}
    assert all(notices(name).count("keys") == 1 for name in keys)
    third = registry.ok("POST", "/keys/rotate", params={"revoke": "true"}, status=201)["kid"]
    assert [k["kid"] for k in registry.ok("GET", "/keys")] == [third], "revoked: no earlier key verifies"
    assert all("keys" in notices(name) for name in keys)
    assert registry.call("POST", "/keys/rotate", keys["alpha"], params={"revoke": "true"}).status_code == 403


def _pem(name: str = "alpha", **kwargs) -> str:
    return certificates.self_signed(name, ["127.0.0.2"], **kwargs)[0].decode()


def test_a_participant_registers_the_certificate_its_agent_serves_and_everyone_reads_it_with_its_fingerprint(registry):
    alpha, beta = registry.participant("alpha"), registry.participant("beta")
    assert registry.ok("GET", "/participants/alpha")["certificate"] is None
    pem = _pem()
    body = registry.ok("PUT", "/participants/alpha/certificate", alpha, json={"certificate": pem})
    assert body["certificate"] == pem and body["certificate_sha256"] == certificates.parse(pem).sha256
    assert registry.ok("GET", "/participants/alpha", beta)["certificate"] == pem
    assert {p["name"]: p["certificate_sha256"] for p in registry.ok("GET", "/participants")} == {"alpha": body["certificate_sha256"], "beta": None}
    again = _pem()  # a new key: the one before is no longer trusted
    registry.ok("PUT", "/participants/alpha/certificate", ADMIN_KEY, json={"certificate": again})
    assert registry.ok("GET", "/participants/alpha", beta)["certificate"] == again
    registry.ok("PUT", "/participants/alpha/certificate", alpha, json={"certificate": again})
    recorded = [e["data"]["sha256"] for e in registry.ok("GET", "/events", params={"kind": "participant.certificate"})]
    assert sorted(recorded) == sorted([certificates.parse(pem).sha256, certificates.parse(again).sha256]), "one event per change"
    created = registry.ok("POST", "/participants", json={"name": "gamma", "endpoint": "https://127.0.0.4:9000", "certificate": _pem("gamma")}, status=201)
    assert created["certificate_sha256"]
    beat = registry.ok("POST", "/participants/alpha/heartbeat", alpha, json={"load": 0.1, "threshold": 0.8, "marginal_cost": {}, "tasks": []})
    assert "certificate" not in beat and "certificate_sha256" not in beat, "a heartbeat's answer does not repeat the certificate"


def test_a_certificate_is_registered_only_by_its_participant_and_only_one_usable_certificate(registry):
    import datetime as dt

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    alpha, beta = registry.participant("alpha"), registry.participant("beta")
    assert registry.call("PUT", "/participants/alpha/certificate", beta, json={"certificate": _pem()}).status_code == 403
    assert registry.call("PUT", "/participants/alpha/certificate", None, json={"certificate": _pem()}).status_code == 401
    assert registry.call("PUT", "/participants/nobody/certificate", ADMIN_KEY, json={"certificate": _pem()}).status_code == 404
    past = dt.datetime.now(dt.UTC) - dt.timedelta(days=30)
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    weak_pem = certificates.self_signed("alpha", [], key=weak)[0].decode()
    refusals = {
        "not PEM": "hello",
        "two certificates": _pem() + _pem(),
        "expired": _pem(now=past, days=1),
        "short RSA key": weak_pem,
        "a private key": weak.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode(),
        "too long": _pem() + "\n" * certificates.PEM_MAX,
    }
    for why, pem in refusals.items():
        response = registry.call("PUT", "/participants/alpha/certificate", alpha, json={"certificate": pem})
        assert response.status_code == 422, why
        assert response.json()["detail"], why
    assert registry.call("POST", "/participants", json={"name": "gamma", "endpoint": "https://x", "certificate": "hello"}).status_code == 422
    assert registry.ok("GET", "/participants/alpha")["certificate"] is None
