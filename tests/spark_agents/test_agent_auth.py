"""Calls between agents carry the registry's grant: nobody else fetches a checkpoint (and so
stops a task), sends a delta or adds a task, whatever names the request carries."""

from __future__ import annotations

import sys

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fastapi.testclient import TestClient

from bpm_http.client import RegistryClient, RegistryError
from bpm.costs import MM1Cost
from bpm.tokens import TokenRefused
from spark_agents.credentials import KEYS_REFRESH_S
from spark_agents.server import create_agent_app
from tests.spark_agents.stepped import MONITORING, stepped_federation
from tests.spark_agents.test_agent import SteppedHost


@pytest.fixture
def moved(tmp_path):
    """a's task a.p0 moved to b (epoch 1) by an accepted offer; c is a stranger. Yields
    (a's agent HTTP, registry clients by name, the task, the registry's clock)."""
    with stepped_federation(tmp_path, lambda now: SteppedHost(MM1Cost(a=0.25, c=1.0))) as (operator, agents, add, clock):
        a = add("a", 1)
        clients = {"a": a.client}
        for name in "bc":
            clients[name] = RegistryClient("http://testserver", operator.add_participant(name, f"http://127.0.0.1:9000/{name}")["api_key"], transport=operator._http._transport)
        contract = clients["a"].propose("b", 1.0, 2.0, 5.0)
        clients["b"].contract_action(contract["id"], "accept")
        task = clients["a"].tasks(origin="a")[0]
        offer = clients["a"].offer(contract["id"], [task["id"]], 1.5)
        clients["b"].accept_offer(offer["id"])
        with TestClient(create_agent_app(a), raise_server_exceptions=False) as http:
            http.agent = a  # the agent behind the app, for tests that step it
            yield http, clients, clients["a"].tasks(origin="a")[0], clock


def _fetch(http, token, epoch=1):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return http.get("/handover/a.p0", params={"epoch": epoch}, headers=headers)


def test_only_the_new_host_with_the_registry_token_fetches_the_checkpoint(moved):
    http, clients, task, clock = moved
    assert task["host"] == "b" and task["epoch"] == 1
    # Naming itself in the request no longer works: no token, no checkpoint.
    bare = http.get("/handover/a.p0", params={"epoch": 1, "to": "b"})
    assert bare.status_code == 401 and bare.json()["detail"].startswith("missing credential")
    # A stranger cannot get a token for the task, nor can the old host.
    for name in "ca":
        with pytest.raises(RegistryError) as refused:
            clients[name].call_token(task["id"], "handover", "a" if name == "c" else "b", 1)
        assert refused.value.status == 409
    # A token signed by anyone but the registry is refused.
    forger = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    forged = jwt.encode({"sub": "b", "aud": "a", "iss": "bpm-registry", "purpose": "handover", "task": "a.p0", "epoch": 1, "iat": 0, "exp": 2**40},
                        forger, algorithm="EdDSA", headers={"kid": "forged"})
    assert _fetch(http, forged).status_code == 401
    # b's token for a call to someone else, or for a delta, or shown for another epoch: 403.
    for_c = clients["b"].call_token(task["id"], "handover", "c", 1)["token"]
    assert _fetch(http, for_c).status_code == 403
    assert _fetch(http, clients["b"].call_token(task["id"], "handover", "a", 1)["token"], epoch=0).status_code == 403
    with pytest.raises(RegistryError) as no_replica:
        clients["b"].call_token(task["id"], "delta", "a", 1)
    assert no_replica.value.status == 403
    # An expired token: 401.
    stale = clients["b"].call_token(task["id"], "handover", "a", 1)["token"]
    clock.advance(600)
    assert _fetch(http, stale).status_code == 401
    # The new host's fresh token: the checkpoint.
    granted = _fetch(http, clients["b"].call_token(task["id"], "handover", "a", 1)["token"])
    assert granted.status_code == 200, granted.text
    assert granted.headers["content-type"] == "application/gzip"


def test_a_rotated_registry_key_still_verifies_tokens_it_signed_until_they_lapse(moved):
    http, clients, task, clock = moved
    before = clients["b"].call_token(task["id"], "handover", "a", 1)
    assert _fetch(http, before["token"]).status_code == 200  # the agent reads the registry's keys
    operator = RegistryClient("http://testserver", "op", transport=clients["b"]._http._transport)
    rotated = operator.rotate_signing_key()
    after = clients["b"].call_token(task["id"], "handover", "a", 1)
    assert before["kid"] != rotated["kid"] == after["kid"]
    assert {k["kid"] for k in operator.signing_keys()} >= {before["kid"], after["kid"]}
    # The new key appeared within the interval of the agent's reads of keys: refused at once
    # (nobody waits), then known once the interval is over.
    refused_now = _fetch(http, after["token"])
    assert refused_now.status_code == 401 and "at most every" in refused_now.json()["detail"]
    clock.advance(KEYS_REFRESH_S)
    assert _fetch(http, after["token"]).status_code == 200
    assert _fetch(http, before["token"]).status_code == 200  # the old key still verifies
    with pytest.raises(RegistryError) as refused:
        clients["a"].rotate_signing_key()
    assert refused.value.status == 403


def test_tokens_with_made_up_key_ids_cost_one_read_of_keys_per_interval_and_hold_up_nobody(moved, monkeypatch):
    """A flood of tokens naming key ids the registry never had: each is refused at once (no
    caller sleeps, which would hold the handover lock up), the registry's keys are read once
    per interval, and the new host's own token then gets the checkpoint."""
    import spark_agents.credentials as credentials

    http, clients, task, clock = moved
    reads = []
    listed = clients["a"].signing_keys
    monkeypatch.setattr(clients["a"], "signing_keys", lambda: reads.append(1) or listed())
    # Sleeps the project's own code makes, whatever thread it runs in; others' (py4j's
    # threads, of a SparkSession another test left in this worker) sleep as before.
    slept, sleep = [], credentials.time.sleep

    def sleeping(s: float) -> None:
        if sys._getframe(1).f_globals.get("__name__", "").startswith(("spark_agents", "bpm", "api")):
            slept.append(s)
        sleep(s)

    monkeypatch.setattr(credentials.time, "sleep", sleeping)
    forger = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    claims = {"sub": "b", "aud": "a", "iss": "bpm-registry", "purpose": "handover", "task": "a.p0", "epoch": 1, "iat": 0, "exp": 2**40}
    for i in range(20):
        assert _fetch(http, jwt.encode(claims, forger, algorithm="EdDSA", headers={"kid": f"made-up-{i}"})).status_code == 401
    assert len(reads) == 1
    clock.advance(KEYS_REFRESH_S)
    assert _fetch(http, jwt.encode(claims, forger, algorithm="EdDSA", headers={"kid": "made-up-again"})).status_code == 401
    assert len(reads) == 2
    assert not slept, f"a caller slept {slept} s"
    assert _fetch(http, clients["b"].call_token(task["id"], "handover", "a", 1)["token"]).status_code == 200


def test_only_the_participant_s_own_key_adds_its_tasks(moved):
    http, clients, _, _ = moved
    body = {"name": "p9", "input_uri": "nats://127.0.0.1:4222/a/1001"}
    assert http.post("/tasks", json=body).status_code == 401
    assert http.post("/tasks", json=body, headers={"Authorization": f"Bearer {clients['b'].key}"}).status_code == 403
    own = {"Authorization": f"Bearer {clients['a'].key}"}
    for wrong, said in (({"query": "no-such-query"}, "which this participant does not have"), ({"params": {"no_such": 1}}, "no_such")):
        refused = http.post("/tasks", json={**body, **wrong}, headers=own)
        assert refused.status_code == 422 and said in refused.json()["detail"], refused.text
    added = http.post("/tasks", json=body, headers=own)
    assert added.status_code == 201 and added.json()["origin"] == "a"
    assert (added.json()["query"], added.json()["query_digest"]) == (MONITORING.name, MONITORING.digest), "the query a's own tasks run"


def test_token_refusals_carry_their_status():
    with pytest.raises(TokenRefused) as missing:
        from bpm.tokens import verify

        verify(None, None, audience="a", purpose="handover", task="a.p0", epoch=1, now=0.0)
    assert missing.value.status == 401


def test_a_running_agent_rotates_its_key_and_goes_on_with_the_new_one(moved, tmp_path):
    http, clients, _, _ = moved
    old = clients["a"].key
    assert http.post("/key/rotate", headers={"Authorization": f"Bearer {clients['b'].key}"}).status_code == 403
    rotated = http.post("/key/rotate", headers={"Authorization": f"Bearer {old}"})
    assert rotated.status_code == 201, rotated.text
    new = rotated.json()["api_key"]
    assert new != old and clients["a"].key == new  # the agent's own client acts with it
    assert (tmp_path / "a" / "participant.key").read_text().strip() == new
    assert clients["a"].request("GET", "/me")["name"] == "a"
    with RegistryClient("http://testserver", old, transport=clients["b"]._http._transport) as stale:
        with pytest.raises(RegistryError) as refused:
            stale.request("GET", "/me")
    assert refused.value.status == 401
    assert http.post("/tasks", json={"name": "p9", "input_uri": "/x"}, headers={"Authorization": f"Bearer {old}"}).status_code == 403


def test_a_key_the_registry_no_longer_lists_stops_verifying_at_an_agent_within_the_max_age():
    """A retired key past its grace leaves the registry's list; an agent that knew it reads the
    list again, in the background, once its copy is older than `KEYS_MAX_AGE_S`, and refuses
    the key from then on. While the registry cannot be read, the known keys stay."""
    from spark_agents.credentials import KEYS_MAX_AGE_S, Credentials

    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    public = private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    listed = [{"kid": "old", "public_key": public}]
    now = [1000.0]

    class Registry:
        reachable = True

        def signing_keys(self):
            if not self.reachable:
                raise ConnectionError("the registry is cut off")
            return list(listed)

        def participant(self, name):
            if not self.reachable:
                raise ConnectionError("the registry is cut off")
            return {"name": name, "key_mark": "b-key"}

    registry = Registry()
    credentials = Credentials(registry, "a", clock=lambda: now[0])  # type: ignore[arg-type]
    claims = {"sub": "b", "ck": "b-key", "aud": "a", "iss": "bpm-registry", "purpose": "handover", "task": "a.p0", "epoch": 1, "iat": 0,
              "exp": 2**40}
    token = jwt.encode(claims, pem, algorithm="EdDSA", headers={"kid": "old"})
    assert credentials.verify(token, "handover", "a.p0", 1).caller == "b"
    listed.clear()  # retired past its grace
    registry.reachable = False
    now[0] += KEYS_MAX_AGE_S
    assert credentials.verify(token, "handover", "a.p0", 1).caller == "b", "the call does not wait on the registry"
    _settle(credentials)
    assert credentials.verify(token, "handover", "a.p0", 1).caller == "b", "unreachable, the registry leaves the keys as they were"
    registry.reachable = True
    now[0] += KEYS_MAX_AGE_S
    try:
        credentials.verify(token, "handover", "a.p0", 1)  # starts the read, which may end before this call looks
    except TokenRefused:
        pass
    _settle(credentials)
    with pytest.raises(TokenRefused) as refused:
        credentials.verify(token, "handover", "a.p0", 1)
    assert refused.value.status == 401


def _settle(credentials) -> None:
    """Wait for a background read of the keys or of a caller's key mark to end."""
    import threading

    for thread in [t for t in threading.enumerate() if t.name in ("bpm-keys", "bpm-key-mark")]:
        thread.join(5)


def test_a_token_stops_working_at_an_agent_soon_after_its_caller_s_key_is_revoked_or_rotated(moved):
    """A token carries the mark of its caller's key; the agent called reads the caller's mark
    from the registry, again in the background once its copy is `KEY_MARK_MAX_AGE_S` old, and
    refuses a token of a key revoked or rotated since (before: it worked for its whole 120 s)."""
    from spark_agents.credentials import KEY_MARK_MAX_AGE_S

    http, clients, task, clock = moved
    operator = RegistryClient("http://testserver", "op", transport=clients["b"]._http._transport)
    assert clients["b"].participant("b")["key_mark"] == operator.participant("b")["key_mark"] != operator.participant("a")["key_mark"]
    stolen = clients["b"].call_token(task["id"], "handover", "a", 1)["token"]
    assert _fetch(http, stolen).status_code == 200
    operator.revoke_key("b")
    assert _fetch(http, stolen).status_code == 200, "within the age of the agent's copy of b's mark"
    clock.advance(KEY_MARK_MAX_AGE_S)
    assert _fetch(http, stolen).status_code == 200, "the call does not wait on the registry"
    _settle(None)
    refused = _fetch(http, stolen)
    assert refused.status_code == 401 and "key changed" in refused.json()["detail"]
    # The operator hands b a new key: b's new tokens work at once (a mark the agent does not
    # know is read before the answer), the stolen one stays refused.
    clients["b"].use_key(operator.rotate_key("b")["api_key"])
    clock.advance(KEY_MARK_MAX_AGE_S)
    fresh = clients["b"].call_token(task["id"], "handover", "a", 1)["token"]
    assert _fetch(http, fresh).status_code == 200
    assert _fetch(http, stolen).status_code == 401
    claims = jwt.decode(fresh, options={"verify_signature": False})  # it names b's key by its mark
    assert claims["ck"] == operator.participant("b")["key_mark"]


def test_a_signing_key_the_operator_revokes_stops_verifying_at_an_agent_at_its_next_heartbeat(moved):
    """The operator rotates the registry's signing key and revokes the old one (thought stolen):
    every participant gets a `keys` change notice, and its agent reads the keys at once, so a
    token the old key signed is refused from its next heartbeat on (before: until the agent's
    copy of the keys was `KEYS_MAX_AGE_S` old, and then for the key's grace period)."""
    http, clients, task, clock = moved
    operator = RegistryClient("http://testserver", "op", transport=clients["b"]._http._transport)
    stolen = clients["b"].call_token(task["id"], "handover", "a", 1)
    assert _fetch(http, stolen["token"]).status_code == 200
    rotated = operator.rotate_signing_key(revoke=True)
    assert [k["kid"] for k in operator.signing_keys()] == [rotated["kid"]], "the old key is no longer listed"
    a = http.agent
    a.heartbeat()
    assert "keys" in a.reads.stale
    a.sync()
    assert "keys" not in a.reads.stale
    refused = _fetch(http, stolen["token"])
    assert refused.status_code == 401 and "not signed by a key the registry lists" in refused.json()["detail"]
    assert _fetch(http, clients["b"].call_token(task["id"], "handover", "a", 1)["token"]).status_code == 200
