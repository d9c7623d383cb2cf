"""The registry as a real process: concurrency, restarts, migrations, production refusal, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from threading import Barrier

import pytest
from sqlalchemy import create_engine, inspect

from api.migrate import downgrade, upgrade
from bpm import tokens
from bpm_http.client import RegistryClient, RegistryError
from tests.conftest import require_postgres
from tests.registry_server import BPM, running_registries, running_registry

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", "postgresql"])
def backend_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'served.db'}"
        return
    url = require_postgres()
    downgrade(url, "base")  # start from an empty database
    yield url
    # Leave the schema in place for the other registry tests that share this database.
    upgrade(url)


def _setup_pair(client: RegistryClient, url: str):
    a = RegistryClient(url, client.add_participant("a", "http://127.0.0.1:9000")["api_key"])
    b = RegistryClient(url, client.add_participant("b", "http://127.0.0.3:9000")["api_key"])
    contract = a.propose("b", 1.0, 2.0, 5.0)
    b.contract_action(contract["id"], "accept")
    return a, b, contract


def test_concurrent_accepts_exactly_one_wins(tmp_path, backend_url):
    with running_registry(tmp_path, backend_url) as reg:
        with RegistryClient(reg.url, reg.admin_key) as operator:
            a, b, contract = _setup_pair(operator, reg.url)
            b_key = b._http.headers["Authorization"].split()[1]
            for round_ in range(5):
                task = a.register_task(f"t{round_}", load=0.1)
                offer = a.offer(contract["id"], [task["id"]], 1.5)
                barrier = Barrier(8)

                def decide(i: int):
                    with RegistryClient(reg.url, b_key) as client:
                        barrier.wait()
                        try:
                            if i % 2:
                                client.reject_offer(offer["id"])
                            else:
                                client.accept_offer(offer["id"])
                            return 200
                        except RegistryError as exc:
                            return exc.status

                with ThreadPoolExecutor(8) as pool:
                    statuses = list(pool.map(decide, range(8)))
                assert sorted(statuses) == [200] + [409] * 7, statuses
                final = a.request("GET", f"/offers/{offer['id']}")
                moved = [m for m in a.movements() if m["offer_id"] == offer["id"]]
                assert len(moved) == (1 if final["state"] == "accepted" else 0)
                # Reset for the next round: a decided offer frees the slot for a new one.
            a.close()
            b.close()


def test_a_crowd_of_requests_takes_turns_and_none_fails(tmp_path, backend_url):
    """100 participants send their heartbeats at once, three times over: more requests than
    the registry has worker threads and connections. Each waits its turn before it takes a
    connection, so none waits for a connection while holding a thread others need (which
    ended in the pool's timeout and a 500)."""
    with running_registry(tmp_path, backend_url) as reg, RegistryClient(reg.url, reg.admin_key) as operator:
        keys = {f"p{i}": operator.add_participant(f"p{i}", "http://127.0.0.1:9000")["api_key"] for i in range(100)}
        barrier = Barrier(len(keys))

        def beats(name: str) -> list[int]:
            statuses = []
            with RegistryClient(reg.url, keys[name], timeout=60.0) as client:
                barrier.wait()
                for _ in range(3):
                    try:
                        client.heartbeat(name, {"load": 0.5, "threshold": 0.8})
                        statuses.append(200)
                    except RegistryError as exc:
                        statuses.append(exc.status)
            return statuses

        with ThreadPoolExecutor(len(keys)) as pool:
            statuses = [s for batch in pool.map(beats, keys) for s in batch]
    assert statuses == [200] * 300, sorted(set(statuses))


def test_an_origin_ending_its_movement_and_a_third_party_accepting_the_pass_on_end_with_the_task_at_home(tmp_path, backend_url):
    """The origin a ends its movement to b while c accepts b's offer of the same task: in either
    order the task ends at home with no movement active. c's accept after the end is refused
    (409); an end that finds the task moved on meanwhile ends nothing (409) and, asked again,
    unwinds the whole chain."""
    with running_registry(tmp_path, backend_url) as reg:
        with RegistryClient(reg.url, reg.admin_key) as operator:
            keys = {n: operator.add_participant(n, f"http://127.0.0.1:9000/{n}")["api_key"] for n in "abc"}
            a, b, c = (RegistryClient(reg.url, keys[n]) for n in "abc")
            ab = a.propose("b", 1.0, 2.0, 0.05)
            b.contract_action(ab["id"], "accept")
            bc = b.propose("c", 1.0, 2.0, 0.05)
            c.contract_action(bc["id"], "accept")
            for round_ in range(6):
                task = a.register_task(f"t{round_}", load=0.1)
                moved = b.accept_offer(a.offer(ab["id"], [task["id"]], 1.5)["id"])["movements"][0]
                onward = b.offer(bc["id"], [task["id"]], 1.2)
                time.sleep(0.1)  # past the contracts' minimum duration
                barrier = Barrier(2)

                def race(i: int):
                    with RegistryClient(reg.url, keys["a" if i == 0 else "c"]) as client:
                        barrier.wait()
                        try:
                            client.end_movement(moved) if i == 0 else client.accept_offer(onward["id"])
                            return 200
                        except RegistryError as exc:
                            return exc.status

                with ThreadPoolExecutor(2) as pool:
                    ended, accepted = pool.map(race, range(2))
                assert (ended, accepted) in ((200, 200), (200, 409), (409, 200)), (ended, accepted)
                if ended == 409:  # the accept came first and the end saw it: nothing ended, the chain stands
                    now = a.request("GET", f"/tasks/{task['id']}")
                    active = [(m["from"], m["to"]) for m in a.movements(state="active") if m["task_id"] == task["id"]]
                    assert now["host"] == "c" and sorted(active) == [("a", "b"), ("b", "c")], (now["host"], active)
                    a.end_movement(moved)  # asked again, the origin takes its task back
                now = a.request("GET", f"/tasks/{task['id']}")
                active = [m for m in a.movements(state="active") if m["task_id"] == task["id"]]
                assert now["host"] == "a" and active == [], (round_, ended, accepted, now["host"], active)
                if c.request("GET", f"/offers/{onward['id']}")["state"] == "pending":
                    c.request("POST", f"/offers/{onward['id']}/reject")  # b's next offer waits for this one
            for client in (a, b, c):
                client.close()


def test_concurrent_contract_accepts_keep_one_active_per_pair(tmp_path, backend_url):
    with running_registry(tmp_path, backend_url) as reg:
        with RegistryClient(reg.url, reg.admin_key) as operator:
            a = RegistryClient(reg.url, operator.add_participant("a", "x")["api_key"])
            b_key = operator.add_participant("b", "y")["api_key"]
            proposals = [a.propose("b", 1.0, 1.0 + i, 5.0)["id"] for i in range(6)]
            barrier = Barrier(len(proposals))

            def accept(cid: int):
                with RegistryClient(reg.url, b_key) as client:
                    barrier.wait()
                    try:
                        client.contract_action(cid, "accept")
                        return 200
                    except RegistryError as exc:
                        return exc.status

            with ThreadPoolExecutor(len(proposals)) as pool:
                statuses = list(pool.map(accept, proposals))
            assert sorted(statuses) == [200] + [409] * 5
            assert len(operator.contracts(state="active")) == 1
            a.close()


def _race(*calls) -> list[int]:
    """Run the calls at once (each after a barrier); each one's HTTP status."""
    barrier = Barrier(len(calls))

    def run(call):
        barrier.wait()
        try:
            call()
            return 200
        except RegistryError as exc:
            assert exc.status < 500, exc
            return exc.status

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def _clients(reg, operator, *names):
    return [RegistryClient(reg.url, operator.add_participant(n, f"http://127.0.0.{i + 2}:9000")["api_key"]) for i, n in enumerate(names)]


def _contract_events(client: RegistryClient, contract_id: int) -> list[str]:
    return [e["kind"] for e in client.events(limit=1000) if e["kind"].startswith("contract.") and e["data"].get("contract_id") == contract_id]


def test_accept_and_terminate_of_a_proposal_end_as_one_order_of_the_two(tmp_path, backend_url):
    """Terminating a proposal while it is accepted: both may succeed (accepted, then
    terminated) or one may, never both with the contract left active."""
    with running_registry(tmp_path, backend_url) as reg, RegistryClient(reg.url, reg.admin_key) as operator:
        a, b = _clients(reg, operator, "a", "b")
        for _ in range(10):
            cid = a.propose("b", 1.0, 2.0, 5.0)["id"]
            accept, terminate = _race(lambda: b.contract_action(cid, "accept"), lambda: a.contract_action(cid, "terminate"))
            state = a.contract(cid)["state"]
            kinds = _contract_events(operator, cid)
            if accept == terminate == 200:
                assert state == "terminated" and kinds == ["contract.proposed", "contract.active", "contract.terminated"], (state, kinds)
            elif accept == 200:
                assert terminate == 409 and state == "active" and kinds == ["contract.proposed", "contract.active"], (terminate, state, kinds)
                a.contract_action(cid, "terminate")
            else:
                assert (accept, terminate) == (409, 200) and state == "terminated", (accept, terminate, state)
                assert kinds == ["contract.proposed", "contract.terminated"], kinds


def test_accept_and_counter_by_the_same_side_one_wins(tmp_path, backend_url):
    with running_registry(tmp_path, backend_url) as reg, RegistryClient(reg.url, reg.admin_key) as operator:
        a, b = _clients(reg, operator, "a", "b")
        for _ in range(10):
            cid = a.propose("b", 1.0, 2.0, 5.0)["id"]
            accept, counter = _race(lambda: b.contract_action(cid, "accept"), lambda: b.counter(cid, 1.5, 2.5, 5.0))
            # The loser sees the winner's change: 409, or 403 when its side made the last proposal.
            assert sorted((accept, counter)) in ([200, 403], [200, 409]), (accept, counter)
            contract = a.contract(cid)
            if accept == 200:
                assert (contract["state"], contract["price_min"], contract["last_proposed_by"]) == ("active", 1.0, "a"), contract
            else:
                assert (contract["state"], contract["price_min"], contract["last_proposed_by"]) == ("countered", 1.5, "b"), contract
            a.contract_action(cid, "terminate")


def test_concurrent_offers_of_one_participant_leave_one_pending(tmp_path, backend_url):
    with running_registry(tmp_path, backend_url) as reg, RegistryClient(reg.url, reg.admin_key) as operator:
        a, b = _clients(reg, operator, "a", "b")
        cid = a.propose("b", 1.0, 2.0, 5.0)["id"]
        b.contract_action(cid, "accept")
        tasks = [a.register_task(f"t{i}", load=0.1)["id"] for i in range(20)]
        statuses = _race(*[(lambda t=t: a.offer(cid, [t], 1.5)) for t in tasks])
        assert sorted(statuses) == [200] + [409] * 19, statuses
        assert len(a.offers(state="pending")) == 1


def test_data_survives_restart_and_migrations_repeat(tmp_path, backend_url):
    with running_registry(tmp_path, backend_url) as reg:
        with RegistryClient(reg.url, reg.admin_key) as operator:
            a, b, contract = _setup_pair(operator, reg.url)
            a_key = a._http.headers["Authorization"].split()[1]
            a.close()
            b.close()
    with running_registry(tmp_path, backend_url) as reg:
        with RegistryClient(reg.url, a_key) as a:
            assert a.contract(contract["id"])["state"] == "active"
            assert [p["name"] for p in a.participants()] == ["a", "b"]


def test_migrations_up_from_empty_and_down_to_base(backend_url):
    upgrade(backend_url)
    engine = create_engine(backend_url)
    tables = set(inspect(engine).get_table_names())
    assert {"participants", "contracts", "tasks", "offers", "movements", "events", "load_samples", "replicas", "failovers"} <= tables
    downgrade(backend_url, "0001")  # the HA records go, the rest stays
    assert {"replicas", "failovers"}.isdisjoint(inspect(engine).get_table_names())
    assert "movements" in inspect(engine).get_table_names()
    downgrade(backend_url, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    upgrade(backend_url)
    assert {"movements", "replicas", "failovers"} <= set(inspect(engine).get_table_names())
    engine.dispose()


def test_production_mode_refuses_to_start_without_key(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "BPM_ADMIN_KEY"}
    env["BPM_MODE"] = "production"
    result = subprocess.run([BPM, "registry", "serve", "--port", "1"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "BPM_ADMIN_KEY" in result.stderr


def test_local_mode_generates_key_once(tmp_path):
    from api.settings import Settings
    from api.app import resolve_admin_key

    key_file = tmp_path / ".bpm-admin-key"
    key, generated = resolve_admin_key(Settings(admin_key=None), key_file)
    assert generated and key_file.read_text().strip() == key
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert resolve_admin_key(Settings(admin_key=None), key_file) == (key, False)


def test_two_participants_negotiate_with_the_cli(tmp_path):
    with running_registry(tmp_path) as reg:
        env = {**os.environ, "BPM_REGISTRY_URL": reg.url, "BPM_ADMIN_KEY": reg.admin_key}

        def bpm(*args: str, key: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
            full = [BPM, *args] + (["--key", key] if key else [])
            result = subprocess.run(full, env=env, capture_output=True, text=True, timeout=60)
            if check:
                assert result.returncode == 0, result.stderr
            return result

        keys = {}
        for name in ("north", "south"):
            keys[name] = json.loads(bpm("participants", "add", name, "--endpoint", f"http://127.0.0.9:9000/{name}", "--json").stdout)["api_key"]
        proposed = json.loads(bpm("contracts", "propose", "south", "--price-min", "1", "--price-max", "1.5", "--min-duration", "30", "--json", key=keys["north"]).stdout)
        cid = str(proposed["id"])
        refused = bpm("contracts", "accept", cid, key=keys["north"], check=False)
        assert refused.returncode == 1 and "other party" in refused.stderr
        bpm("contracts", "counter", cid, "--price-min", "1.2", "--price-max", "1.4", "--min-duration", "20", key=keys["south"])
        accepted = json.loads(bpm("contracts", "accept", cid, "--json", key=keys["north"]).stdout)
        assert accepted["state"] == "active" and accepted["price_min"] == 1.2
        listed = bpm("contracts", "list", key=keys["south"]).stdout
        assert "active" in listed
        assert json.loads(bpm("participants", "list", "--json").stdout)[0]["name"] == "north"
        # A participant rotates its key; the operator revokes one and hands out a new one.
        rotated = json.loads(bpm("participants", "rotate-key", "north", "--json", key=keys["north"]).stdout)["api_key"]
        assert bpm("contracts", "list", key=keys["north"], check=False).returncode == 1
        assert "active" in bpm("contracts", "list", key=rotated).stdout
        assert "revoked south's key" in bpm("participants", "revoke-key", "south").stdout
        assert "invalid API key" in bpm("contracts", "list", key=keys["south"], check=False).stderr
        not_operator = bpm("participants", "revoke-key", "north", "--key", rotated, check=False)
        assert not_operator.returncode == 1 and "only the operator" in not_operator.stderr
        fresh = json.loads(bpm("participants", "rotate-key", "south", "--json").stdout)["api_key"]
        assert "active" in bpm("contracts", "list", key=fresh).stdout


def test_the_registry_stops_on_sigterm_while_a_change_feed_is_open(tmp_path):
    """An admin page left open does not keep the registry from stopping: its stream is cut
    after the grace period (`SHUTDOWN_GRACE_S`)."""
    import threading

    import httpx

    from bpm_app.commands.registry import SHUTDOWN_GRACE_S

    with running_registry(tmp_path) as registry:
        opened = threading.Event()

        def follow() -> None:
            headers = {"Authorization": f"Bearer {registry.admin_key}"}
            try:
                with httpx.stream("GET", registry.url + "/api/v1/changes/stream", headers=headers, timeout=60) as response:
                    for line in response.iter_lines():
                        if line.startswith("event: change"):
                            opened.set()
            except httpx.HTTPError:
                pass  # cut by the registry's shutdown

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        assert opened.wait(30), "the stream opened"
        began = time.monotonic()
        registry.process.terminate()
        registry.process.wait(timeout=SHUTDOWN_GRACE_S + 20)
        assert time.monotonic() - began < SHUTDOWN_GRACE_S + 10
        reader.join(10)
        assert not reader.is_alive(), "the stream ended with the registry"


def test_open_change_feed_streams_hold_no_turn_and_a_key_s_streams_are_bounded(tmp_path):
    """Streams that stay open (admin pages) hold no request turn: with more of them open than
    there are turns, other requests are still answered. One key holds `FEED_STREAMS` at most;
    the next gets 429, and a stream that ends frees its place."""
    import contextlib

    import httpx

    from api.db import REQUEST_TURNS
    from api.quotas import FEED_STREAMS

    assert FEED_STREAMS > REQUEST_TURNS
    with running_registry(tmp_path) as registry, contextlib.ExitStack() as streams:
        headers = {"Authorization": f"Bearer {registry.admin_key}"}
        opened = []
        for _ in range(FEED_STREAMS):
            response = streams.enter_context(httpx.stream("GET", registry.url + "/api/v1/changes/stream", headers=headers, timeout=30))
            assert response.status_code == 200
            opened.append(response)
        assert httpx.get(registry.url + "/api/v1/participants", headers=headers, timeout=30).status_code == 200
        refused = httpx.get(registry.url + "/api/v1/changes/stream", headers=headers, timeout=30)
        assert refused.status_code == 429 and "Retry-After" in refused.headers
        opened[0].close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the registry notices the closed stream within its feed interval
            with httpx.stream("GET", registry.url + "/api/v1/changes/stream", headers=headers, timeout=30) as again:
                if again.status_code == 200:
                    break
            time.sleep(0.5)
        else:
            raise AssertionError("a closed stream did not free its place")


def test_registries_started_at_once_on_one_postgresql_database_migrate_it_once_and_answer_as_one(tmp_path):
    """Registry machines behind a load balancer (docs/deploy.md, "Several registry machines"):
    what one writes the other reads, a token one signs verifies with the keys the other lists,
    and neither holds in its memory what the other needs."""
    url = require_postgres()
    downgrade(url, "base")  # both find an empty database and migrate it at the same time
    try:
        with running_registries(tmp_path, url, 2) as (one, two), RegistryClient(one.url, one.admin_key) as operator:
            a_key = operator.add_participant("a", "http://127.0.0.1:9000")["api_key"]
            b_key = RegistryClient(two.url, two.admin_key).add_participant("b", "http://127.0.0.3:9000")["api_key"]
            a_one, a_two, b_two = RegistryClient(one.url, a_key), RegistryClient(two.url, a_key), RegistryClient(two.url, b_key)
            contract = a_one.propose("b", 1.0, 2.0, 5.0)
            b_two.contract_action(contract["id"], "accept")
            task = a_two.register_task("t0", load=0.1)
            offer = a_one.offer(contract["id"], [task["id"]], 1.5)
            assert b_two.accept_offer(offer["id"])["state"] == "accepted"
            for client in (a_one, a_two):
                assert [(t["name"], t["host"], t["epoch"]) for t in client.tasks(involving="a")] == [("t0", "b", 1)]
            # the change notices one registry wrote come with the heartbeat the other answers
            beat = a_one.heartbeat("a", {"load": 0.1, "threshold": 0.5, "tasks": []})
            assert {"task", "offer", "contract"} <= {n["kind"] for n in beat["changes"]}, beat["changes"]
            token = b_two.call_token(task["id"], "stream", "a", 1)["token"]
            keys = {k["kid"]: k["public_key"] for k in a_one.signing_keys()}
            grant = tokens.verify(token, keys.get(tokens.key_id(token)), audience="a", purpose="stream", task="a.t0", epoch=1, now=time.time())
            assert grant.caller == "b"
        logs = one.log.read_text() + two.log.read_text()
        assert "Traceback" not in logs, logs[-3000:]
    finally:
        upgrade(url)
