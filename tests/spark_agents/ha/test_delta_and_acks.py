"""Delta checkpoints, acknowledgement positions and heartbeats on hand-made checkpoints (no Spark)."""

import os
import secrets
import socket
import time

import pytest

from spark_agents.ha.delta import DeltaRefused, DeltaShipper, apply_delta, applied_copy, checkpoint_cut
from spark_agents.ha.heartbeat import FRESH_S, HeartbeatReceiver, HeartbeatSender, HeartbeatWatcher, beat_datagram, parse_beat, silent
from spark_agents.ha.upstream import oldest_open_window_us, processed_ack_seq, replay_seq
from tests.conftest import wait_until


def write(path, text="x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    (path.parent / f".{path.name}.crc").write_text("crc")


def run_batch(ck, batch, seq, watermark_ms=0, commit=True):
    """What Spark leaves for one batch of the JetStream source: offsets (the sequence read up
    to), state version batch+1 of 2 partitions, commit."""
    write(ck / "offsets" / str(batch), f'v1\n{{"batchWatermarkMs":{watermark_ms},"batchTimestampMs":1,"conf":{{}}}}\n{{"seq":{seq}}}\n')
    for part in (0, 1):
        write(ck / "state" / "0" / str(part) / f"{batch + 1}.delta", f"state {batch}")
    if commit:
        write(ck / "commits" / str(batch), "v1\n{}\n")


@pytest.fixture
def checkpoint(tmp_path):
    ck = tmp_path / "ck"
    write(ck / "metadata", '{"id":"q"}')
    write(ck / "state" / "0" / "0" / "_metadata" / "schema", "schema")
    (ck / ".bpm-epoch").write_text("1")
    return ck


def test_a_cut_stops_at_the_newest_committed_batch(checkpoint):
    run_batch(checkpoint, 0, 64)
    run_batch(checkpoint, 1, 128)
    run_batch(checkpoint, 2, 128)  # a batch that only moved the watermark
    run_batch(checkpoint, 3, 192, commit=False)  # still running
    (checkpoint / "offsets" / ".3.abc.tmp").write_text("half")
    cut = checkpoint_cut(checkpoint)
    assert (cut.committed, cut.position) == (2, 128), "a restart from the copy reads after sequence 128"
    assert sorted(cut.files) == sorted([
        "metadata", "commits/0", "commits/1", "commits/2", "offsets/0", "offsets/1", "offsets/2", "state/0/0/_metadata/schema",
        *[f"state/0/{p}/{v}.delta" for p in (0, 1) for v in (1, 2, 3)],
    ])
    assert processed_ack_seq(checkpoint) == 128


def test_deltas_carry_only_new_files_and_the_backup_restarts_from_a_cut(checkpoint, tmp_path):
    backup = tmp_path / "backup"
    shipper = DeltaShipper(checkpoint)
    run_batch(checkpoint, 0, 64)
    first = shipper.pack()
    assert (first.committed, first.position, first.ack_position) == (0, 64, 64)
    applied = apply_delta(first.data, backup)
    shipper.confirm(first)
    assert applied.ack_position == 64 and applied_copy(backup) == applied
    run_batch(checkpoint, 1, 128)
    lost = shipper.pack()  # never arrives
    run_batch(checkpoint, 2, 192)
    second = shipper.pack()
    assert second.carried == 2 * 4, "batches 1 and 2: offsets, two state versions and a commit each"
    assert second.total == first.total + 8
    apply_delta(second.data, backup)
    shipper.confirm(second)
    with pytest.raises(DeltaRefused):
        apply_delta(lost.data, backup)
    assert checkpoint_cut(backup).files.keys() == checkpoint_cut(checkpoint).files.keys()
    assert not list(backup.rglob("*.crc")) and not (backup / ".bpm-epoch").exists()
    assert applied_copy(backup).ack_position == 192
    # Spark's maintenance removes old state versions at the primary: the backup follows.
    for part in (0, 1):
        os.unlink(checkpoint / "state" / "0" / str(part) / "1.delta")
    third = shipper.pack()
    assert third.carried == 0
    assert apply_delta(third.data, backup).removed == 2
    assert not (backup / "state" / "0" / "0" / "1.delta").exists()
    shipper.reset()
    assert shipper.pack().carried == third.total


def test_a_delta_before_any_commit_holds_only_the_query_identity(checkpoint, tmp_path):
    run_batch(checkpoint, 0, 64, commit=False)
    delta = DeltaShipper(checkpoint).pack()
    assert (delta.committed, delta.ack_position) == (None, None)
    assert sorted(delta.cut) == ["metadata"], "state and logs come with the first committed batch"


def test_the_oldest_open_window_is_the_one_that_ends_after_the_watermark():
    # 10 s windows; the watermark in ms, windows in us.
    assert oldest_open_window_us(25_000, 10) == 20_000_000
    assert oldest_open_window_us(30_000, 10) == 20_000_000, "the window ending at the watermark counts as open"
    assert oldest_open_window_us(30_001, 10) == 30_000_000
    assert oldest_open_window_us(0, 60) == -60_000_000


def test_silence_counts_from_the_last_beat_or_from_the_start_of_the_watch():
    assert not silent(10.0, since=0.0, now=12.9, timeout_s=3.0)
    assert silent(10.0, since=0.0, now=13.1, timeout_s=3.0)
    assert silent(None, since=5.0, now=8.5, timeout_s=3.0) and not silent(None, since=5.0, now=7.0, timeout_s=3.0)


def test_a_watcher_reports_a_host_whose_beats_stopped_arriving():
    key = secrets.token_bytes(32)
    receiver = HeartbeatReceiver(key).start()
    beats = HeartbeatSender("a", key, receiver.address, interval_s=0.02).start()
    seen = []
    watcher = HeartbeatWatcher(lambda: receiver.last_beat("a"), timeout_s=0.3, on_failure=lambda at, last: seen.append((at, last)), poll_s=0.01).start()
    try:
        first = wait_until(lambda: receiver.last_beat("a"), 10.0, "a's first beat")
        wait_until(lambda: receiver.last_beat("a") - first > 0.6, 10.0, "a's beats over twice the timeout")
        assert watcher.detected_at is None, "a beating host is not failed"
        assert receiver.last_beat("b") is None
        beats.stop()
        stopped = receiver.last_beat("a")
        assert watcher.wait(10.0) is not None
        (at, last), = seen
        assert last == stopped and at - last > 0.3
    finally:
        beats.stop()
        watcher.stop()
        receiver.close()


def test_forged_malformed_and_replayed_beats_do_not_count():
    key = secrets.token_bytes(32)
    assert parse_beat(key, beat_datagram(key, "a", 7)) == ("a", 7)
    assert parse_beat(secrets.token_bytes(32), beat_datagram(key, "a", 7)) is None, "another key"
    beat = beat_datagram(key, "a", 7)
    assert parse_beat(key, beat[:-1] + bytes([beat[-1] ^ 1])) is None, "a bad MAC"
    assert parse_beat(key, beat_datagram(key, "../x", 7)) is None, "a name that is no participant's"
    assert parse_beat(key, b"") is None and parse_beat(key, b"\xff" * 100) is None
    receiver = HeartbeatReceiver(key).start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    now = time.time_ns()
    recorded = beat_datagram(key, "a", now - int((FRESH_S + 5) * 1e9))  # a real beat, recorded and sent again later
    try:
        for data in (beat_datagram(b"k" * 32, "a", 1), b"nonsense", recorded, beat_datagram(key, "a", now), beat_datagram(key, "a", now),
                     beat_datagram(key, "a", now - 1), beat_datagram(key, "a", now + int((FRESH_S + 5) * 1e9))):
            sock.sendto(data, receiver.address)
        deadline = time.monotonic() + 5
        while receiver.refused < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
        first = receiver.last_beat("a")
        assert first is not None and receiver.refused == 6, "two forged ones, two replays and two beats out of their time refused"
        with pytest.raises(ValueError):
            HeartbeatSender("a/b", key, receiver.address)
    finally:
        sock.close()
        receiver.close()


def test_upstream_backup_acknowledges_what_the_watermarks_prove_unneeded(checkpoint):
    # 10 s windows, a 5 s watermark delay. Batch B + 1 runs under the watermark of everything
    # up to B minus the delay, so no row of batches up to B is newer than that watermark + 5 s.
    assert replay_seq(checkpoint, 10, 5) is None and processed_ack_seq(checkpoint) is None
    run_batch(checkpoint, 0, 100, 0)
    run_batch(checkpoint, 1, 200, 10_000)  # batch 0's rows are at most 15 s
    run_batch(checkpoint, 2, 300, 21_000)  # batch 1's at most 26 s
    run_batch(checkpoint, 3, 400, 33_000)  # batch 2's at most 38 s; under it, [30 s, 40 s) may be open
    assert replay_seq(checkpoint, 10, 5) == 200, "batches 0 and 1 hold nothing at or past 30 s; batch 2 may"
    assert processed_ack_seq(checkpoint) == 400
    run_batch(checkpoint, 4, 500, 60_000, commit=False)  # planned, not committed: not counted
    assert replay_seq(checkpoint, 10, 5) == 200 and processed_ack_seq(checkpoint) == 400
    cut = checkpoint_cut(checkpoint)
    assert (cut.committed, cut.position) == (3, 400), "a restart from the copy reads after sequence 400"
