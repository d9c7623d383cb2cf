from pathlib import Path

from typer.testing import CliRunner

from bpm_app.cli import app
from spark_agents.streams import PartitionedStream
from spark_agents.streams.feed import Feeder, due_time, replay
from spark_agents.streams.partitioned import MARK_DATA, MARK_END
from bpm.zeek.conn import Conn, read_logs
from bpm.zeek.definitions import QueryParams

FIXTURES = Path(__file__).parents[2] / "fixtures" / "zeek"


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += max(seconds, 1e-3)


def test_due_time_follows_rate_and_recorded_time():
    assert due_time(10, 0, 0, rate=5, speedup=None) == 2.0
    assert due_time(10, 100, 0, rate=0, speedup=None) == 0.0
    assert due_time(1, 100, 0, rate=5, speedup=10) == 10.0
    assert due_time(1000, 100, 0, rate=5, speedup=10) == 200.0


def test_replay_paces_rows_and_writes_one_file_per_flush(tmp_path):
    stream = PartitionedStream.create(tmp_path / "s", 1)
    clock = FakeClock()
    conns = [Conn(100.0 + i / 10, "10.0.0.1", 1, "10.9.9.9", 80, "tcp") for i in range(50)]
    feeder = replay(Feeder(stream, QueryParams()), conns, rate=10, flush_interval_s=1.0, clock=clock, sleep=clock.sleep)
    assert 4.9 <= clock.now <= 5.1, "50 rows at 10 rows/s take 5 s"
    files = list(stream.read(0))
    assert 5 <= len(files) <= 7
    assert [len([r for r in rows if r.mark == MARK_DATA]) for _, rows in files[1:4]] == [10, 10, 10]
    assert files[-1][1][-1].mark == MARK_END and sum(feeder.written) == 50


def test_replay_command_writes_a_partitioned_stream_and_counts_bad_lines(tmp_path):
    uri = f"file://{tmp_path / 'stream'}"
    result = CliRunner().invoke(app, ["replay", str(FIXTURES / "conn-corrupt.log"), "--stream", uri,
                                      "--partitions", "2", "--rate", "0", "--amplify", "2"])
    assert result.exit_code == 0, result.output
    stderr = " ".join(result.stderr.split())
    assert "skipped 7 of 31 lines" in stderr and "2 rows more than 60 s behind" in stderr, "the late row and its copy"
    stream = PartitionedStream(uri)
    rows = [r for k in range(2) for _, rs in stream.read(k) for r in rs if r.mark == MARK_DATA]
    assert len(rows) == 2 * (len(list(read_logs([FIXTURES / "conn.log"]))) - 1)
    again = CliRunner().invoke(app, ["replay", str(FIXTURES / "conn.log"), "--stream", uri, "--partitions", "3", "--rate", "0"])
    assert again.exit_code == 2 and "already has 2 partitions" in " ".join(again.stderr.split())


def test_a_stopped_replay_closes_the_stream_and_logs_exactly_what_it_fed(tmp_path):
    """SIGTERM mid-replay: the stream ends with an end mark and --fed-log holds the rows in it."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from spark_agents.streams.partitioned import MARK_DATA, MARK_END, PartitionedStream
    from bpm.zeek.conn import read_logs

    source = tmp_path / "traffic.log"
    bpm = str(Path(sys.executable).with_name("bpm"))
    subprocess.run([bpm, "generate-traffic", str(source), "--duration", "600", "--rate", "20", "--seed", "3"], check=True, capture_output=True, timeout=120)
    stream, fed = tmp_path / "stream", tmp_path / "fed.log"
    process = subprocess.Popen([bpm, "replay", str(source), "--stream", str(stream), "--partitions", "2", "--rate", "50",
                                "--flush-interval", "0.2", "--fed-log", str(fed)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(stream.glob("partition=*/*.csv")):
            time.sleep(0.2)
        time.sleep(1.0)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill() if process.poll() is None else None
    assert process.returncode == 0, err
    assert "stopped after" in err
    opened = PartitionedStream(stream)
    records = [r for k in range(2) for _, batch in opened.read(k) for r in batch]
    data = [r for r in records if r.mark == MARK_DATA]
    assert sum(r.mark == MARK_END for r in records) == 2, "each partition ends with an end mark"
    logged = list(read_logs([fed]))
    assert 0 < len(logged) == len(data) < 600 * 20
    assert sorted((round(c.ts * 1e6), c.orig_h) for c in logged) == sorted((r.ts_us, r.src) for r in data)
