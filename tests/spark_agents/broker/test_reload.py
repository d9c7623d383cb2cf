"""Reads through a broker that reloads its accounts (a grant or revoke of a partner's access):
JetStream answers no request for a moment, and a read waits it out (`through_reload`)."""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
import time

import nats
import pytest

from bpm.keygroups import MAIN
from bpm.zeek.definitions import QueryParams, ResultRow
from spark_agents.broker.results import BrokerFence, ensure_results, read_results
from spark_agents.broker.source import _pending
from spark_agents.broker.stream import BrokerStream, through_reload
from spark_agents.broker.subjects import INPUT, partner_user
from tests.spark_agents.conns import Feeder
from tests.spark_agents.broker.test_source import _conns


def _flaky(failures: int, error=nats.js.errors.ServiceUnavailableError, refusals: list[str] | None = None):
    """A read that fails `failures` times with `error` (noting a refusal in `refusals` each time, if given)."""
    calls = []

    async def make():
        calls.append(1)
        if len(calls) <= failures:
            if refusals is not None:
                refusals.append("permissions violation")
            raise error()
        return "read"

    return make, calls


def test_a_read_the_server_does_not_answer_for_a_moment_is_made_again():
    make, calls = _flaky(3)
    assert asyncio.run(through_reload(make)) == "read" and len(calls) == 4
    make, calls = _flaky(1, nats.errors.TimeoutError)
    assert asyncio.run(through_reload(make)) == "read" and len(calls) == 2, "a request dropped in a reload: once more"


def test_a_server_that_answers_no_read_past_the_wait_or_refuses_it_is_an_error():
    make, calls = _flaky(1000)
    with pytest.raises(nats.js.errors.ServiceUnavailableError):
        asyncio.run(through_reload(make, wait_s=0.3))
    assert 2 <= len(calls) < 10, "it waited, a few times, then gave up"
    make, calls = _flaky(2, nats.errors.TimeoutError)
    with pytest.raises(nats.errors.TimeoutError):
        asyncio.run(through_reload(make))
    assert len(calls) == 2, "a second timeout is the answer"
    refusals: list[str] = []
    make, calls = _flaky(1, nats.errors.TimeoutError, refusals)
    with pytest.raises(nats.errors.TimeoutError):
        asyncio.run(through_reload(make, refusals))
    assert len(calls) == 1, "a read the server refused for the user's permissions is not made again"


@pytest.mark.slow
def test_reads_go_on_while_the_server_reloads_its_accounts(nats_server, broker):
    """A partner's access granted and revoked every 0.2 s, 40 times (without `through_reload`,
    such a run failed 7 of about 7,000 reads), while the owner reads all the time."""
    server, owner = nats_server
    Feeder(BrokerStream(broker, "a"), QueryParams()).feed(_conns(300))
    ensure_results(broker)
    BrokerFence(broker, "a.t0").write(1, 0, [ResultRow("ports", 0, 10, "10.0.0.9", 31).as_result()], "a")
    stop, reloads = threading.Event(), [0]

    def reload() -> None:
        partner = partner_user("b", secrets.token_urlsafe(12), [("a.t0", (MAIN, "0"), True)])
        while not stop.is_set() and reloads[0] < 40:
            server.reload([owner, partner] if reloads[0] % 2 else [owner])
            reloads[0] += 1
            time.sleep(0.2)

    thread = threading.Thread(target=reload)
    thread.start()
    reads = 0
    try:
        while thread.is_alive():
            assert len(read_results(broker, "a.t0")) == 1
            assert broker.read(lambda: _pending(broker, INPUT, "in.a.main.>", 0)) > 0
            reads += 1
    finally:
        stop.set()
        thread.join()
    assert reloads[0] == 40 and reads >= 100, (reloads, reads)


def test_the_configuration_with_the_users_passwords_is_never_readable_by_others(tmp_path):
    """Written as the owner's alone from its first byte, at the first write and at every reload,
    under the usual mask that leaves new files readable by all: a file made readable and
    narrowed afterwards shows the passwords to anyone who reads it in between."""
    from spark_agents.broker.server import NatsServer

    previous = os.umask(0o022)
    try:
        server = NatsServer("a", tmp_path / "store", port=1, http_port=2, users=[partner_user("b", secrets.token_hex(8), [])])
        server.reload([partner_user("c", secrets.token_hex(8), [])])
    finally:
        os.umask(previous)
    assert server.config_path.stat().st_mode & 0o077 == 0
