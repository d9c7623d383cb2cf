"""`bpm replay` into a participant's broker and `bpm results` out of it, as an operator runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bpm_app.cli import app
from bpm.zeek.conn import read_logs
from bpm.zeek.definitions import ResultRow
from spark_agents.broker.results import BrokerFence
from spark_agents.broker.source import _fetch
from spark_agents.broker.stream import Broker
from spark_agents.broker.subjects import INPUT
from bpm.zeek.stream import MARK_DATA, MARK_END, StreamRecord

FIXTURES = Path(__file__).parents[2] / "fixtures" / "zeek"


def _records(server, owner):
    """Every record of participant a's stream, in order."""
    with Broker(server.url, owner.name, owner.password) as broker:
        chunks = broker.call(_fetch(broker, INPUT, "in.a.main.>", 0, broker.last_seq()))
    return [StreamRecord.from_line(line) for chunk in chunks for line in chunk.decode().splitlines()]


def test_replay_publishes_every_admitted_row_and_counts_bad_and_late_ones(nats_server):
    server, owner = nats_server
    out = CliRunner().invoke(app, ["replay", str(FIXTURES / "conn-corrupt.log"), "--stream", f"{server.url}/a", "--insecure", "--rate", "0", "--amplify", "2"],
                             env={"BPM_NATS_PASSWORD": owner.password})
    assert out.exit_code == 0, out.output
    stderr = " ".join(out.stderr.split())
    assert "skipped 7 of 31 lines" in stderr and "2 rows more than 60 s behind" in stderr, "the late row and its copy"
    rows = [r for r in _records(server, owner) if r.mark == MARK_DATA]
    assert len(rows) == 2 * (len(list(read_logs([FIXTURES / "conn.log"]))) - 1)


def test_a_stopped_replay_closes_the_stream_and_logs_exactly_what_it_fed(nats_server, tmp_path):
    """SIGTERM mid-replay: every key group ends with an end mark and --fed-log holds the rows published."""
    import os
    import signal
    import subprocess
    import sys
    import time

    server, owner = nats_server
    source = tmp_path / "traffic.log"
    bpm = str(Path(sys.executable).with_name("bpm"))
    subprocess.run([bpm, "generate-traffic", str(source), "--duration", "600", "--rate", "20", "--seed", "3"], check=True, capture_output=True, timeout=120)
    fed = tmp_path / "fed.log"
    with Broker(server.url, owner.name, owner.password) as broker:
        broker.ensure_stream("a")  # as the participant's agent makes it at its start
    process = subprocess.Popen([bpm, "replay", str(source), "--stream", f"{server.url}/a", "--insecure", "--rate", "50", "--flush-interval", "0.2",
                                "--fed-log", str(fed)], stderr=subprocess.PIPE, text=True, env={**os.environ, "BPM_NATS_PASSWORD": owner.password})
    try:
        with Broker(server.url, owner.name, owner.password) as broker:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and broker.last_seq() < 100:  # a few flushes in, far from the end
                time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill() if process.poll() is None else None
    assert process.returncode == 0, err
    assert "stopped after" in err
    records = _records(server, owner)
    data = [r for r in records if r.mark == MARK_DATA]
    assert sum(r.mark == MARK_END for r in records) == 64, "each key group ends with an end mark"
    logged = list(read_logs([fed]))
    assert 0 < len(logged) == len(data) < 600 * 20
    assert sorted((round(c.ts * 1e6), c.orig_h) for c in logged) == sorted((r.ts_us, r.src) for r in data)


def test_a_replay_feeds_the_key_groups_it_is_told_and_more_as_they_come_on_stdin(nats_server, tmp_path):
    """--feed 0 at first, then 11 from standard input: nothing else is published (no rows,
    no ticks, no end marks), and --fed-log holds exactly the rows published."""
    import os
    import subprocess
    import sys
    import time

    from bpm.keygroups import groups, subject

    server, owner = nats_server
    source = tmp_path / "traffic.log"
    bpm = str(Path(sys.executable).with_name("bpm"))
    subprocess.run([bpm, "generate-traffic", str(source), "--duration", "8", "--rate", "100", "--seed", "5"], check=True, capture_output=True, timeout=120)
    fed = tmp_path / "fed.log"
    with Broker(server.url, owner.name, owner.password) as broker:
        broker.ensure_stream("a")
        process = subprocess.Popen([bpm, "replay", str(source), "--stream", f"{server.url}/a", "--insecure", "--rate", "0", "--speedup", "2",
                                    "--flush-interval", "0.2", "--feed", "0", "--feed-from-stdin", "--fed-log", str(fed)],
                                   stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "BPM_NATS_PASSWORD": owner.password})
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and broker.last_seq() == 0:
                time.sleep(0.1)
            process.stdin.write("2\n11\n")  # a bad prefix is said and passed over
            process.stdin.flush()
            _, err = process.communicate(timeout=60)
        finally:
            process.kill() if process.poll() is None else None
        assert process.returncode == 0, err
        assert "bad key-group prefix '2'" in " ".join(err.split())
        by_subject: dict[str, list] = {}
        for message in broker.call(_messages(broker.js)):
            by_subject.setdefault(message.subject, []).extend(StreamRecord.from_line(line) for line in message.data.decode().splitlines())
    fed_subjects = {subject("a", g) for g in [*groups("0"), *groups("11")]}
    assert set(by_subject) <= fed_subjects and {subject("a", g) for g in groups("0")} <= set(by_subject)
    assert any(s in by_subject for s in (subject("a", g) for g in groups("11"))), "fed once its prefix came"
    assert all(records[-1].mark == MARK_END for records in by_subject.values())
    data = [r for records in by_subject.values() for r in records if r.mark == MARK_DATA]
    logged = list(read_logs([fed]))
    assert 0 < len(logged) == len(data) < len(list(read_logs([source])))
    assert sorted((round(c.ts * 1e6), c.orig_h) for c in logged) == sorted((r.ts_us, r.src) for r in data)


async def _messages(js):
    """Every message of participant a's stream, with its subject."""
    import nats.errors

    sub = await js.subscribe("in.a.main.>", ordered_consumer=True)
    out = []
    try:
        while True:
            try:
                out.append(await sub.next_msg(timeout=1))
            except nats.errors.TimeoutError:
                return out
    finally:
        await sub.unsubscribe()


pytestmark = pytest.mark.slow


def test_replay_publishes_a_log_into_the_broker_and_results_prints_a_task_s_rows(tls_server, tmp_path):
    """Over TLS, as a participant's broker serves it: both commands pin the certificate given."""
    server, owner, cert = tls_server
    runner = CliRunner()
    log = tmp_path / "conn.log"
    assert runner.invoke(app, ["generate-traffic", str(log), "--duration", "30", "--rate", "50"]).exit_code == 0
    location = f"{server.url}/a"
    env = {"BPM_NATS_PASSWORD": owner.password, "BPM_BROKER_CERT": str(cert)}
    out = runner.invoke(app, ["replay", str(log), "--stream", location, "--rate", "0"], env=env)
    assert out.exit_code == 0, out.output
    assert "rows in" in out.output and "a's stream at" in out.output
    with Broker(server.url, owner.name, owner.password, tls=cert.read_text()) as broker:
        assert broker.last_seq() > 0
        BrokerFence(broker, "a.t0").write(1, 0, [ResultRow("ports", 0, 10, "10.0.0.9", 31).as_result()], "b")
    shown = runner.invoke(app, ["results", "a.t0", "--broker", location], env=env)
    assert shown.exit_code == 0, shown.output
    assert [json.loads(line) for line in shown.stdout.splitlines()] == [
        {"kind": "ports", "window_start": 0, "window_end": 10, "key": "10.0.0.9", "value": 31, "epoch": 1, "batch": 0}]
    followed = runner.invoke(app, ["results", "a.t0", "--broker", location, "--follow", "--seconds", "0.5", "--poll", "0.2"], env=env)
    assert followed.exit_code == 0 and len(followed.stdout.splitlines()) == 1, "each row once, however many reads"


def test_the_commands_refuse_a_broker_that_shows_another_certificate_and_plain_text_unasked(tls_server, tmp_path):
    from bpm.certificates import self_signed

    server, owner, _ = tls_server
    other = tmp_path / "other.pem"
    other.write_bytes(self_signed("a", ["127.0.0.1"])[0])
    env = {"BPM_NATS_PASSWORD": owner.password}
    for tls, said in ((["--broker-cert", str(other)], "the certificate pinned"), (["--insecure"], "its TLS off"),
                      ([], "--broker-cert WORKDIR/tls/cert.pem")):
        out = CliRunner().invoke(app, ["results", "a.t0", "--broker", f"{server.url}/a", *tls], env=env)
        assert out.exit_code == 2 and said in " ".join(out.stderr.split()), (tls, out.output)
    not_one = tmp_path / "not.pem"
    not_one.write_text("not a certificate")
    out = CliRunner().invoke(app, ["replay", str(tmp_path / "x.log"), "--stream", f"{server.url}/a", "--broker-cert", str(not_one),
                                   "--rate", "0"], env=env)
    assert out.exit_code == 2 and "not a PEM certificate" in out.stderr, out.output


@pytest.mark.parametrize(("args", "message"), [
    (["replay", "x.log", "--stream", "nats://127.0.0.1/a", "--rate", "0"], "nats://HOST:PORT/PARTICIPANT"),
    (["replay", "x.log", "--stream", "nats://u:p@127.0.0.1:4222/a", "--rate", "0"], "no credentials"),
    (["replay", "x.log", "--stream", "nats://127.0.0.1:4222/../etc", "--rate", "0"], "bad participant name"),
    (["replay", "x.log", "--stream", "folder", "--rate", "0"], "nats://HOST:PORT/PARTICIPANT"),
    (["results", "b.t0", "--broker", "nats://127.0.0.1:4222/a"], "not a's"),
    (["results", "a.t0", "--broker", "nats://127.0.0.1:4222/a"], "BPM_NATS_PASSWORD"),
])
def test_bad_locations_and_missing_passwords_are_readable_errors(args, message, tmp_path):
    (tmp_path / "x.log").write_text("")
    out = CliRunner().invoke(app, [a.replace("x.log", str(tmp_path / "x.log")) for a in args], env={"BPM_NATS_PASSWORD": ""})
    assert out.exit_code == 2, out.output
    assert message in " ".join(out.output.split()), out.output


def test_broker_serve_runs_a_participant_s_server_until_stopped(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    import httpx

    from tests.conftest import free_port

    from bpm.certificates import self_signed

    port, http_port = free_port(), free_port()
    bpm = str(Path(sys.executable).with_name("bpm"))
    env = {**os.environ, "BPM_NATS_PASSWORD": "pw-1234"}
    cert, key = self_signed("a", ["127.0.0.1"])
    (tmp_path / "cert.pem").write_bytes(cert)
    (tmp_path / "key.pem").write_bytes(key)
    tls = ["--tls-cert", str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "key.pem")]
    process = subprocess.Popen([bpm, "broker", "serve", "--name", "a", "--store", str(tmp_path / "store"), "--port", str(port),
                                "--http-port", str(http_port), *tls, "--seconds", "60"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        # The command says where its broker is once it serves (and Ctrl-C stops it from then on);
        # it ends by itself after --seconds, which bounds this read.
        said = process.stderr.readline()
        assert said.startswith("a's broker:") and "TLS" in said, said
        assert httpx.get(f"http://127.0.0.1:{http_port}/healthz", timeout=5).status_code == 200
        with Broker(f"nats://127.0.0.1:{port}", "a", "pw-1234", tls=cert.decode()) as broker:
            broker.ensure_stream("a")
            assert broker.last_seq() == 0
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert "a's broker stopped" in stderr and (tmp_path / "store").is_dir()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{http_port}/healthz", timeout=1)
    missing = CliRunner().invoke(app, ["broker", "serve", "--name", "a", "--store", str(tmp_path / "s2")], env={"BPM_NATS_PASSWORD": ""})
    assert missing.exit_code == 2 and "BPM_NATS_PASSWORD" in missing.output
    half = CliRunner().invoke(app, ["broker", "serve", "--name", "a", "--store", str(tmp_path / "s2"), *tls[:2]], env={"BPM_NATS_PASSWORD": "pw-1234"})
    assert half.exit_code == 2 and "needs its key" in " ".join(half.output.split()), half.output


@pytest.mark.parametrize(("args", "message"), [
    (["--shares", "4", "--partitions", "0"], "--shares needs --broker-port"),
    (["--broker-port", "4222", "--shares", "3", "--partitions", "0"], "power of two"),
    (["--broker-port", "4222", "--shares", "4", "--partitions", "2-5"], "beyond the 4"),
    (["--partitions", "0"], "needs --broker-port"),
])
def test_agent_run_refuses_tasks_it_cannot_have(args, message, tmp_path):
    out = CliRunner().invoke(app, ["agent", "run", "--name", "a", "--workdir", str(tmp_path / "a"), *args])
    assert out.exit_code == 2, out.output
    assert message in " ".join(out.output.split()), out.output


def test_agent_run_refuses_a_broker_password_its_server_cannot_hold(tmp_path):
    out = CliRunner().invoke(app, ["agent", "run", "--name", "a", "--workdir", str(tmp_path / "a"), "--broker-port", "4222"],
                             env={"BPM_NATS_PASSWORD": 'pass"word'})
    assert out.exit_code == 2, out.output
    assert "letters, digits" in " ".join(out.output.split()), out.output
    assert not (tmp_path / "a").exists(), "nothing written"


def test_replay_and_broker_tell_in_json_lines_with_json_logs(nats_server, tmp_path):
    """--log-format json: every line on stderr is a JSON object, progress and warnings included."""
    import os
    import subprocess
    import sys

    from bpm_app.logs import configure
    from tests.conftest import free_port

    server, owner = nats_server
    try:
        out = CliRunner().invoke(app, ["replay", str(FIXTURES / "conn-corrupt.log"), "--stream", f"{server.url}/a", "--insecure", "--rate", "0",
                                       "--log-format", "json"], env={"BPM_NATS_PASSWORD": owner.password})
    finally:
        configure("text")
    assert out.exit_code == 0, out.output
    lines = [json.loads(line) for line in out.stderr.splitlines() if line.strip()]
    assert {line["logger"] for line in lines} == {"bpm.replay"}, lines
    warnings = [line["message"] for line in lines if line["level"] == "warning"]
    assert any("skipped 7 of 31 lines" in w for w in warnings) and not any("[" in w and "[/" in w for w in warnings), warnings
    assert any(line["message"].startswith("wrote ") for line in lines) and any("replaying" in line["message"] for line in lines), lines
    bpm = str(Path(sys.executable).with_name("bpm"))
    done = subprocess.run([bpm, "broker", "serve", "--name", "a", "--store", str(tmp_path / "store"), "--port", str(free_port()),
                           "--http-port", str(free_port()), "--seconds", "1", "--log-format", "json"],
                          env={**os.environ, "BPM_NATS_PASSWORD": "pw-12345678"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    told = [json.loads(line) for line in done.stderr.splitlines()]
    assert [line["message"].split(":")[0] for line in told] == ["a's broker", "a's broker stopped"]
    assert {line["participant"] for line in told} == {"a"}


@pytest.mark.slow
def test_a_replay_of_any_query_s_records_reads_back_through_the_stream_as_the_batch_computation(spark, nats_server, tmp_path):
    """Sensor readings (a schema of no Zeek) published with --query into an input of the
    participant's stream of their own (`readings`), then read by the query through the source
    a task reads with: the results of the plain batch computation, and nothing in the main input."""
    import os
    import subprocess
    import sys

    import examples.sensors as sensors
    from bpm.records import BadRecords, Records, end_mark_us, end_watermark_ms, parse_lines
    from spark_agents.broker.source import JetStreamInput
    from spark_agents.checkpoint import committed_watermark_ms
    from tests.conftest import wait_until
    from spark_agents.check import check_query
    from spark_agents.frames import batch_results, events

    server, owner = nats_server
    query, params = sensors.query, sensors.query.bind({"window_s": 20})
    wire = Records(query)
    lines = [json.dumps(r) for r in sensors.generate(seconds=200, devices=9, rate=5.0, seed=4)]
    lines.insert(7, '{"ts": "later", "device": "d"}')
    source = tmp_path / "readings.jsonl"
    source.write_text("\n".join(lines) + "\n")
    with Broker(server.url, owner.name, owner.password) as broker:
        broker.ensure_stream("a")
    bpm = str(Path(sys.executable).with_name("bpm"))
    done = subprocess.run([bpm, "replay", str(source), "--query", "examples.sensors:query", "--param", "window_s=20",
                           "--stream", f"{server.url}/a/readings", "--insecure", "--rate", "0", "--fed-log", str(tmp_path / "fed.jsonl")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "BPM_NATS_PASSWORD": owner.password})
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stderr.split())
    assert "1 records did not fit query 'sensors'" in said and "line 8: ts: 'later'" in said
    assert "input readings" in said and _records(server, owner) == [], "nothing went into the main input"
    fed = list(parse_lines(wire, (tmp_path / "fed.jsonl").read_text().splitlines(), "jsonl", BadRecords()))
    assert fed == list(parse_lines(wire, lines, "jsonl", BadRecords())), "the fed log holds the records published"

    collected = []
    task = JetStreamInput(server.url, owner.name, owner.password, "a", input="readings")
    checkpoint = tmp_path / "checkpoint"
    running = (query.compute(events(task.read(spark, wire.wire_ddl), query, params), params).writeStream.outputMode("append")
               .option("checkpointLocation", str(checkpoint))
               .foreachBatch(lambda frame, _: collected.extend(batch_results(frame, query, params))).start())
    end_ms = end_watermark_ms(end_mark_us(max(ts for ts, _ in fed), 30, 20), 30)
    try:
        wait_until(lambda: committed_watermark_ms(checkpoint) == end_ms, 300, "the batch that closes the last windows")
    finally:
        running.stop()
    expected = check_query(spark, query, params, fed, tmp_path / "check").expected
    assert len(expected) > 50 and sorted(collected) == expected
