"""A contract partner's user on an origin's broker reads only the key groups of the tasks it
hosts and writes only their results; the server refuses the rest."""

from __future__ import annotations

import secrets

import pytest

from bpm.keygroups import groups, key_group
from bpm.zeek.definitions import QueryParams, ResultRow
from spark_agents.broker.results import BrokerFence, ensure_results
from spark_agents.broker.server import BrokerError, User, partner_user
from spark_agents.broker.source import _fetch
from spark_agents.broker.stream import STREAM, Broker, BrokerStream
from tests.spark_agents.conns import Feeder
from bpm.zeek.stream import MARK_DATA, StreamRecord
from tests.spark_agents.broker.test_source import _conns

pytestmark = pytest.mark.slow


def test_a_partner_reads_its_share_and_writes_its_results_only(nats_server):
    server, owner = nats_server
    with Broker(server.url, owner.name, owner.password) as mine:
        Feeder(BrokerStream(mine, "a"), QueryParams()).feed(_conns(300))
        ensure_results(mine)
        last = mine.last_seq()
    b = partner_user("b", secrets.token_urlsafe(12), [("a.t0", "0", True)])
    server.reload([owner, b])
    with Broker(server.url, b.name, b.password, timeout_s=2) as theirs:
        assert theirs.last_seq() == last
        share = theirs.call(_fetch(theirs.js, STREAM, "in.a.0.>", 0, last))
        prefixes = [r.prefix for chunk in share for r in map(StreamRecord.from_line, chunk.decode().splitlines()) if r.mark == MARK_DATA]
        assert prefixes and all(key_group(p) in groups("0") for p in prefixes)
        for outside in ("in.a.1.>", "in.a.>"):
            with pytest.raises(BrokerError, match="(?i)refused by .*permissions violation"):
                theirs.call(_fetch(theirs.js, STREAM, outside, 0, last))
        BrokerFence(theirs, "a.t0").write(1, 0, [ResultRow("ports", 0, 10, "10.0.0.9", 31).as_result()], "b")
        with pytest.raises(BrokerError, match="(?i)refused by .*permissions violation for publish to \"?out.a.t1"):
            BrokerFence(theirs, "a.t1").write(1, 0, [ResultRow("ports", 0, 10, "10.0.0.9", 31).as_result()], "b")
    with pytest.raises(BrokerError):
        Broker(server.url, "c", "no-such-user", timeout_s=1)


def test_a_partner_user_s_subjects_come_from_checked_names():
    with pytest.raises(ValueError):
        partner_user("b", "pw", [("a.t0", "2", True)])
    with pytest.raises(ValueError):
        partner_user("b", "pw", [("a>.t0", "", True)])
    user = partner_user("b", "pw", [("a.t0", "", True)])
    assert "$JS.API.CONSUMER.CREATE.INPUT.*.in.a.>" in user.publish and "out.a.t0" in user.publish
    assert user.subscribe == ("_INBOX.b.>",)
    assert isinstance(user, User)
    replica = partner_user("b", "pw", [("a.t0", "", False)])
    assert "$JS.API.CONSUMER.CREATE.INPUT.*.in.a.>" in replica.publish and "out.a.t0" not in replica.publish, \
        "a replica holder reads the task's key groups and writes no results"
