"""What crosses the network between two participants, as someone on the path records it: a
handover's checkpoint from a partner's agent, and a partner's read of an origin's stream and
write of its results. Over TLS none of it is readable; in plain text (`--insecure`) all of
it is, which shows that the recording sees what crosses."""

from __future__ import annotations

import secrets
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from bpm.keygroups import MAIN, StreamLocation, subject, subject_filter
from bpm.results import Result
from spark_agents import handover
from spark_agents.broker.access import OwnBroker
from spark_agents.broker.results import BrokerFence, read_results
from spark_agents.broker.server import free_port
from spark_agents.broker.source import JetStreamInput, _fetch
from spark_agents.tls import Peers, own_certificate
from tests.spark_agents.test_tls import _agent_like


@contextmanager
def _on_the_path(host: str, port: int) -> Iterator[tuple[int, bytearray]]:
    """A relay on a port of its own that passes every byte to `host:port` and back, and
    keeps a copy of both directions: what a router between two hosts sees. Yields (its
    port, the bytes seen so far)."""
    seen = bytearray()
    lock = threading.Lock()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                with lock:
                    seen.extend(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            server = socket.create_connection((host, port), timeout=10)
            for src, dst in ((client, server), (server, client)):
                src.settimeout(None)
                thread = threading.Thread(target=pipe, args=(src, dst), daemon=True)
                thread.start()
                threads.append(thread)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield listener.getsockname()[1], seen
    finally:
        stop.set()
        acceptor.join(5)
        listener.close()
        for thread in threads:
            thread.join(5)


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "insecure"])
def test_a_handover_s_checkpoint_and_token_cross_the_path_unreadable(tmp_path, tls):
    with _agent_like(tmp_path, "b", tls=tls) as (endpoint, own), _on_the_path("127.0.0.1", int(endpoint.rsplit(":", 1)[1])) as (port, seen):
        relayed = f"{endpoint.split('://')[0]}://127.0.0.1:{port}"
        peers = Peers({"b": {"endpoint": relayed, "certificate": own.pem if tls else None}}.__getitem__, insecure=not tls)
        fetched = handover.fetch(relayed, "a.p0", 1, "token", verify=peers.verify(peers.endpoint("b")), timeout_s=5)
    assert fetched == b"checkpoint of a.p0"
    readable = [what for what in (b"checkpoint of a.p0", b"Bearer token") if what in seen]
    assert len(seen) > 1000 if tls else len(seen) > 0, "the relay saw the exchange"
    assert readable == ([] if tls else [b"checkpoint of a.p0", b"Bearer token"])


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "insecure"])
def test_a_partner_s_read_of_the_stream_and_write_of_results_cross_the_path_unreadable(tmp_path, tls):
    origin_tls = own_certificate(tmp_path / "a", "a", ["127.0.0.1"]) if tls else None
    origin = OwnBroker("a", tmp_path / "a" / "broker", secrets.token_urlsafe(16), port=free_port(), http_port=free_port(), tls=origin_tls).start()
    try:
        row = b"1,1600000000000000,10.99.88.77,secret-row\n"
        origin.connection().publish(subject("a", 0), row)
        origin.grant({"b": [("a.t0", (MAIN, "0"), True)]})
        password = origin.credentials("b")["password"]
        registry = {"a": {"endpoint": "https://127.0.0.1:9" if tls else "http://127.0.0.1:9", "certificate": origin_tls.pem if tls else None}}
        pinned = Peers(registry.__getitem__, insecure=not tls).broker_tls("a")
        with _on_the_path("127.0.0.1", origin.server.port) as (port, seen):
            where = StreamLocation(f"nats://127.0.0.1:{port}", "a", "0")
            partner = JetStreamInput(where.url, "b", password, "a", "0", tls=pinned)
            broker = partner.connection()
            last = partner.newest_seq()
            read = broker.read(lambda: _fetch(broker, "INPUT", subject_filter("a", "0"), 0, last))
            BrokerFence(broker, "a.t0").write(1, 0, [Result(1600000060000000, ("10.77.66.55",), (("count", 42), ("secret", "secret-result")))], "b")
            broker.close()
        assert read == [row], "the partner read its key groups through the path"
        assert [r["secret"] for batch in read_results(origin.connection(), "a.t0") for r in batch.rows] == ["secret-result"]
        readable = [what for what in (password.encode(), b"secret-row", b"10.99.88.77", b"secret-result") if what in seen]
        assert len(seen) > 1000, "the relay saw the exchange"
        assert readable == ([] if tls else [password.encode(), b"secret-row", b"10.99.88.77", b"secret-result"])
    finally:
        origin.stop()
