"""A contract partner's user on an origin's broker reads only the key groups of the tasks it
hosts and writes only their results; the server refuses the rest."""

from __future__ import annotations

import secrets

import pytest

from bpm.keygroups import MAIN, groups, key_group
from bpm.zeek.definitions import QueryParams, ResultRow
from spark_agents.broker.results import BrokerFence, ensure_results, final_bound, read_results
from spark_agents.broker.server import BrokerError, User
from spark_agents.broker.source import JetStreamInput, _end_message, _fetch
from spark_agents.broker.stream import Broker, BrokerStream
from spark_agents.broker.subjects import INPUT, RESULTS, partner_user
from spark_agents.ha.fence import FencedError
from tests.spark_agents.conns import Feeder
from bpm.zeek.stream import MARK_DATA, StreamRecord
from tests.spark_agents.broker.test_source import _conns

pytestmark = pytest.mark.slow


def test_a_partner_reads_its_share_and_writes_its_results_only(nats_server):
    server, owner = nats_server
    with Broker(server.url, owner.name, owner.password) as mine:
        Feeder(BrokerStream(mine, "a"), QueryParams()).feed(_conns(300))
        Feeder(BrokerStream(mine, "a", "readings"), QueryParams()).feed(_conns(300))  # another input of a's stream
        ensure_results(mine)
        last = mine.last_seq()
        newest_in_share = mine.call(_end_message(mine, INPUT, "in.a.main.0.>"))[0]
        owners = mine.call(mine.js.add_consumer(INPUT, name="of-the-owner", filter_subject="in.a.main.>", inactive_threshold=60)).name
    b = partner_user("b", secrets.token_urlsafe(12), [("a.t0", (MAIN, "0"), True)])
    server.reload([owner, b])
    with Broker(server.url, b.name, b.password, timeout_s=2) as theirs:
        with pytest.raises(BrokerError, match="(?i)refused by .*permissions violation"):
            theirs.last_seq()  # the stream's own state (its size, its newest sequence over every key group) is a's
        assert 0 < newest_in_share < last
        assert JetStreamInput(server.url, b.name, b.password, "a", "0").newest_seq() == newest_in_share
        share = theirs.call(_fetch(theirs, INPUT, "in.a.main.0.>", 0, last))
        prefixes = [r.prefix for chunk in share for r in map(StreamRecord.from_line, chunk.decode().splitlines()) if r.mark == MARK_DATA]
        assert prefixes and all(key_group(p) in groups("0") for p in prefixes)
        for outside in ("in.a.main.1.>", "in.a.main.>", "in.a.>", "in.a.readings.0.>", "in.a.readings.>", "in.a.*.0.>"):
            with pytest.raises(BrokerError, match="(?i)refused by .*permissions violation"):
                theirs.call(_fetch(theirs, INPUT, outside, 0, last))
        with pytest.raises(BrokerError, match="(?i)refused by .*permissions violation"):
            theirs.call(theirs.js.consumer_info(INPUT, owners))  # another's consumer, even by its name: neither its state
        with pytest.raises(BrokerError, match="(?i)refused by .*permissions violation"):
            theirs.call(theirs.js.consumers_info(INPUT))  # nor the names of any
        BrokerFence(theirs, "a.t0").write(1, 0, [ResultRow("ports", 0, 10, "10.0.0.9", 31).as_result()], "b")
        with pytest.raises(BrokerError, match="(?i)refused by .*permissions violation for publish to \"?[^\"]*out.a.t1"):
            BrokerFence(theirs, "a.t1").write(1, 0, [ResultRow("ports", 0, 10, "10.0.0.9", 31).as_result()], "b")
    with pytest.raises(BrokerError):
        Broker(server.url, "c", "no-such-user", timeout_s=1)


def test_a_partner_user_s_subjects_come_from_checked_names():
    with pytest.raises(ValueError):
        partner_user("b", "pw", [("a.t0", (MAIN, "2"), True)])
    with pytest.raises(ValueError):
        partner_user("b", "pw", [("a>.t0", (MAIN, ""), True)])
    with pytest.raises(ValueError, match="input name"):
        partner_user("b", "pw", [("a.t0", ("s.x", ""), True)])
    user = partner_user("b", "pw", [("a.t0", (MAIN, ""), True), ("a.s-g01", ("readings", "01"), True)])
    creates = {p for p in user.publish if p.startswith("$JS.API.CONSUMER.CREATE.")}
    assert creates == {"$JS.API.CONSUMER.CREATE.INPUT.*.in.a.main.>", "$JS.API.CONSUMER.CREATE.INPUT.*.in.a.readings.0.1.>"}
    assert "out.a.t0" in user.publish
    assert user.subscribe == ("_INBOX.b.>",)
    assert isinstance(user, User)
    replica = partner_user("b", "pw", [("a.t0", (MAIN, ""), False)])
    assert "$JS.API.CONSUMER.CREATE.INPUT.*.in.a.main.>" in replica.publish and "out.a.t0" not in replica.publish, \
        "a replica holder reads the task's key groups and writes no results"


def _partner(server, owner, name: str, granted) -> Broker:
    """A connection as partner `name`, granted `granted` alone among the origin's users."""
    user = partner_user(name, secrets.token_urlsafe(12), granted)
    server.reload([owner, user])
    return Broker(server.url, user.name, user.password, timeout_s=2)


def test_a_partner_reads_no_result_but_its_own_task_s_fence(nats_server):
    server, owner = nats_server
    secret = ResultRow("ports", 0, 10, "10.0.0.7", 99).as_result()
    with Broker(server.url, owner.name, owner.password) as mine:
        BrokerFence(mine, "a.t1").write(1, 0, [secret], "c")  # another partner's task's results
    with _partner(server, owner, "b", [("a.t0", (MAIN, "0"), True)]) as theirs:
        fence = BrokerFence(theirs, "a.t0")
        fence.write(1, 0, [ResultRow("ports", 0, 10, "10.0.0.9", 31).as_result()], "b")
        assert fence.state().epoch == 1
        for seq in (1, 2):  # by sequence: the stream's API refuses the user
            with pytest.raises(BrokerError, match="(?i)permissions violation"):
                theirs.call(theirs.js.get_msg(RESULTS, seq=seq))
        with pytest.raises(BrokerError, match="(?i)permissions violation"):
            theirs.call(theirs.js.get_last_msg(RESULTS, "out.a.t1", direct=True))
        with pytest.raises(BrokerError, match="(?i)permissions violation"):
            theirs.call(theirs.js.stream_info(RESULTS))
        # Its own subject's direct get with a request for another message is refused by the server.
        for ask in (b'{"seq": 1}', b'{"last_by_subj": "out.a.t1"}', b'{"next_by_subj": "out.a.t1", "seq": 1}'):
            answer = theirs.call(theirs.nc.request(f"$JS.API.DIRECT.GET.{RESULTS}.out.a.t0", ask, timeout=2))
            assert not answer.data and answer.headers.get("Status") != "200" and b"10.0.0.7" not in answer.data


def test_a_claim_beyond_the_registry_s_newest_epoch_jams_no_later_host(nats_server):
    """A host that held the task claims an epoch of 10^9 on its results subject; the next host
    the registry names (epoch 2) writes all the same, and the late host is fenced."""
    server, owner = nats_server
    with Broker(server.url, owner.name, owner.password) as mine:
        ensure_results(mine)
    registry = {"a.t0": 1}
    with _partner(server, owner, "b", [("a.t0", (MAIN, "0"), True)]) as hostile:
        fence = BrokerFence(hostile, "a.t0")
        _, seq = fence._last()
        assert fence._publish({"kind": "claim", "epoch": 10**9, "written_us": None}, seq) is not None
    registry["a.t0"] = 2  # the task moves on to c
    with _partner(server, owner, "c", [("a.t0", (MAIN, "0"), True)]) as theirs:
        with pytest.raises(FencedError, match="epoch 1000000000 holds"):
            BrokerFence(theirs, "a.t0").write(2, 0, [ResultRow("ports", 0, 10, "10.0.0.9", 31).as_result()], "c")  # believed: jammed
        bounded = BrokerFence(theirs, "a.t0", registry.get)
        seq, dropped = bounded.write(2, 0, [ResultRow("ports", 0, 10, "10.0.0.9", 31).as_result()], "c")
        assert seq is not None and dropped == 0 and bounded.state().epoch == 2
        with pytest.raises(FencedError, match="epoch 1 is fenced; epoch 2 holds"):
            BrokerFence(theirs, "a.t0", registry.get).check(1)
        # A claim beyond the registry's newest fences an older writer at the registry's newest.
        _, seq = bounded._last()
        assert bounded._publish({"kind": "claim", "epoch": 10**9, "written_us": 10_000_000}, seq) is not None
        with pytest.raises(FencedError, match="epoch 1 is fenced; epoch 2 holds"):
            BrokerFence(theirs, "a.t0", registry.get).check(1)
        assert bounded.write(2, 1, [ResultRow("ports", 10, 20, "10.0.0.9", 31).as_result()], "c")[0] is not None
    with Broker(server.url, owner.name, owner.password) as mine:
        assert [b.epoch for b in read_results(mine, "a.t0")] == [2, 2]


def test_a_written_time_past_the_task_s_input_jams_no_later_host(nats_server):
    """A host that held the task writes a batch whose time is years past anything the task's
    input holds; the next host counts nothing as written, so it drops none of its results;
    the host after it still drops what that one wrote (no result twice)."""
    server, owner = nats_server
    with Broker(server.url, owner.name, owner.password) as mine:
        Feeder(BrokerStream(mine, "a"), QueryParams()).feed(_conns(300))
        ensure_results(mine)
    registry = {"a.t0": 1}

    def host(name: str):
        """(a connection as partner `name` granted a.t0, the bound of the task's results as it reads it, at a lateness of 5 s)."""
        user = partner_user(name, secrets.token_urlsafe(12), [("a.t0", (MAIN, "0"), True)])
        server.reload([owner, user])
        return (Broker(server.url, user.name, user.password, timeout_s=2),
                final_bound(JetStreamInput(server.url, user.name, user.password, "a", "0"), 5))

    hostile, _ = host("b")
    with hostile:
        years_ahead = ResultRow("ports", 4_000_000_000, 4_000_000_010, "10.0.0.6", 31).as_result()
        assert BrokerFence(hostile, "a.t0").write(1, 0, [years_ahead], "b")[0] is not None
    registry["a.t0"] = 2
    theirs, bound = host("c")
    with theirs:
        end = bound()
        assert end is not None and end < years_ahead.time_us
        window = end // 1_000_000 - 30
        rows = [ResultRow("ports", window, window + 10, f"10.0.0.{i}", 31).as_result() for i in range(3)]
        assert BrokerFence(theirs, "a.t0", registry.get).write(2, 0, rows, "c") == (None, 3), "believed: every result dropped"
        seq, dropped = BrokerFence(theirs, "a.t0", registry.get, bound).write(2, 0, rows, "c")
        assert seq is not None and dropped == 0
    registry["a.t0"] = 3
    later, bound = host("d")
    with later:
        fence = BrokerFence(later, "a.t0", registry.get, bound)
        assert fence.state().written_us == rows[0].time_us
        assert fence.write(3, 0, rows, "d") == (None, 3), "what c wrote is written"
        assert fence.write(3, 1, [ResultRow("ports", window + 10, window + 20, "10.0.0.9", 31).as_result()], "d")[0] is not None
    with Broker(server.url, owner.name, owner.password) as mine:
        assert [(b.epoch, len(b.rows)) for b in read_results(mine, "a.t0")] == [(1, 1), (2, 3), (3, 1)]


def test_a_partner_s_consumers_outlive_neither_its_grant_nor_the_origin_s_limits(tmp_path):
    """The server keeps a consumer a partner made after its grant ends; the origin's sweep deletes
    it then, and at once those named in nobody's name, kept beyond a reader's life or too many."""
    from nats.js.api import AckPolicy, ConsumerConfig

    from spark_agents.broker.access import CONSUMERS_PER_TASK, OwnBroker
    from spark_agents.broker.server import free_port

    origin = OwnBroker("a", tmp_path / "a", secrets.token_urlsafe(16), port=free_port(), http_port=free_port()).start()
    try:
        with Broker(origin.url, "a", origin.password) as mine:
            Feeder(BrokerStream(mine, "a"), QueryParams()).feed(_conns(300))
            own = mine.call(mine.js.add_consumer(INPUT, ConsumerConfig(name=f"{mine.tag}-mine", filter_subject="in.a.main.>",
                                                                        ack_policy=AckPolicy.NONE, inactive_threshold=30.0)))
        origin.grant({"b": [("a.t0", (MAIN, "0"), True), ("a.t1", (MAIN, "1"), True)]})
        password = origin.credentials("b")["password"]
        with Broker(origin.url, "b", password, timeout_s=2) as theirs:
            def make(name, filter_, **config):
                config.setdefault("inactive_threshold", 30.0)
                return theirs.call(theirs.js.add_consumer(INPUT, ConsumerConfig(name=name, filter_subject=filter_, ack_policy=AckPolicy.NONE, **config))).name

            def pull(name):
                async def one():
                    sub = await theirs.js.pull_subscribe_bind(name, stream=INPUT)
                    try:
                        return len(await sub.fetch(1, timeout=2))
                    finally:
                        await sub.unsubscribe()
                return theirs.call(one())

            kept = make(f"{theirs.tag}-kept", "in.a.main.0.>")
            stranger = make("c0ffee-mine", "in.a.main.1.>")  # in nobody's name
            lingering = make(f"{theirs.tag}-linger", "in.a.main.1.>", inactive_threshold=3600.0)
            many = [make(f"{theirs.tag}-{i}", "in.a.main.1.>") for i in range(3 * CONSUMERS_PER_TASK)]
            swept = set(origin.sweep())
            assert {stranger, lingering} <= swept and kept not in swept and own.name not in swept
            assert len(set(many) - swept) == CONSUMERS_PER_TASK, "at most CONSUMERS_PER_TASK over one task's key groups"
            assert pull(kept) == 1
            origin.grant({"b": [("a.t1", (MAIN, "1"), True)]})  # the registry moves t0 away from b
            assert pull(kept) == 1, "the server alone keeps delivering through a consumer made before"
            assert kept in origin.sweep()
            with pytest.raises(Exception):
                pull(kept)
            with pytest.raises(BrokerError, match="(?i)permissions violation"):
                make(f"{theirs.tag}-again", "in.a.main.0.>")
        with Broker(origin.url, "a", origin.password) as mine:
            names = {i.name for i in mine.call(mine.js.consumers_info(INPUT))}
            assert own.name in names, "the owner's consumers stay"
            assert kept not in names and not names & swept
    finally:
        origin.stop()


def test_a_results_stream_made_before_direct_gets_is_opened_to_them(nats_server):
    """A broker kept from before partners read their fence by direct get: the origin turns it on."""
    from nats.js.api import StorageType, StreamConfig

    server, owner = nats_server
    with Broker(server.url, owner.name, owner.password) as mine:
        mine.call(mine.js.add_stream(StreamConfig(name=RESULTS, subjects=["out.>"], storage=StorageType.FILE)))
        assert not mine.call(mine.js.stream_info(RESULTS)).config.allow_direct
        ensure_results(mine)
        assert mine.call(mine.js.stream_info(RESULTS)).config.allow_direct
