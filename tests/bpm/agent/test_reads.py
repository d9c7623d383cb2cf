"""What an agent reads again, from its heartbeats' change notices (`bpm.agent.reads`)."""

from bpm.agent.reads import KEYS, KINDS, Reads


def test_everything_is_read_first_then_only_what_a_notice_names_and_its_notices_are_acknowledged_once():
    reads = Reads(resync_s=300.0, read_all_at=0.0)
    assert list(reads.due(1.0)) == list(KINDS)
    for kind in KINDS:
        reads.read(kind)
    assert list(reads.due(2.0)) == [] and reads.unread() == []
    reads.noticed([{"id": 7, "kind": "offer"}, {"id": 8, "kind": "offer"}, {"id": 9, "kind": "task"}])
    assert reads.unread() == ["offer", "task"]
    due = reads.due(3.0)
    assert next(due) == "offer"
    reads.read("offer")
    assert reads.acknowledge == {7, 8} and reads.notices == {9: "task"}
    assert list(due) == ["task"]
    reads.read("task")
    reads.sent([7, 8, 9])
    assert reads.acknowledge == set() and reads.notices == {}


def test_a_kind_made_stale_while_reading_an_earlier_one_is_read_in_the_same_pass():
    reads = Reads(resync_s=300.0, read_all_at=0.0, stale={"offer"})
    seen = []
    for kind in reads.due(1.0):
        seen.append(kind)
        if kind == "offer":
            reads.mark(["task"])  # an offer of mine was accepted: my tasks moved
        reads.read(kind)
    assert seen == ["offer", "task"]


def test_the_keys_come_first_and_everything_is_read_again_every_resync():
    reads = Reads(resync_s=60.0, read_all_at=0.0, stale=set())
    reads.noticed([{"id": 1, "kind": "contract"}, {"id": 2, "kind": KEYS}])
    assert list(reads.due(10.0)) == [KEYS, "contract"]
    reads.stale.clear()
    assert list(reads.due(59.0)) == []
    assert list(reads.due(60.0)) == list(KINDS)
    assert list(reads.due(61.0)) == list(KINDS), "still stale until read"
