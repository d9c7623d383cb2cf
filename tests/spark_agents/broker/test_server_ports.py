"""A port chosen free is held back from other choosers until its server binds it; a broker on
ports it chose free chooses again when another process binds one first; one on ports it was
told fails, naming the port."""

from __future__ import annotations

import secrets
import socket

import pytest

from spark_agents.broker.server import BrokerError, NatsServer, User, free_port


@pytest.fixture
def taken():
    """A port of 127.0.0.1 that another socket listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2"])
def test_a_port_chosen_free_is_held_from_other_choosers_and_a_server_binds_it(host):
    port = free_port(host)
    with socket.socket() as chooser:  # as another process choosing, or connecting, would
        with pytest.raises(OSError, match="Address already in use"):
            chooser.bind((host, port))
    with socket.socket() as server:  # as uvicorn and nats-server bind
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((host, port))
        server.listen()
    chosen = {free_port(host) for _ in range(200)}
    assert port not in chosen and len(chosen) == 200, "no port given twice while held"


def test_a_server_on_free_ports_chooses_again_when_one_was_taken_meanwhile(tmp_path, taken):
    server = NatsServer.on_free_ports("a", tmp_path / "store", [User("a", secrets.token_urlsafe(16))])
    server.http_port = taken  # taken after the choice, before the start
    with server:
        assert server.http_port != taken and server.process.poll() is None
    assert "address already in use" in server.log_path.read_text(), "the first start failed on the port"


def test_a_server_on_given_ports_fails_naming_the_port(tmp_path, taken):
    server = NatsServer("a", tmp_path / "store", port=taken, http_port=taken, users=[User("a", secrets.token_urlsafe(16))])
    with pytest.raises(BrokerError, match=f"127.0.0.1:{taken}.*address already in use"):
        server.start()


def test_the_health_check_answers_on_the_loopback_address_only_not_where_clients_connect(tmp_path):
    # Clients connect at 127.0.0.2 (a loopback address of its own, as a host's address would
    # be); the monitoring pages (`/varz`, `/connz`: the server's clients and configuration)
    # answer on 127.0.0.1 only.
    import httpx

    with NatsServer.on_free_ports("a", tmp_path / "store", [User("a", secrets.token_urlsafe(16))], host="127.0.0.2") as server:
        assert server.url.startswith("nats://127.0.0.2:")
        assert httpx.get(f"http://127.0.0.1:{server.http_port}/healthz", timeout=5).status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.2:{server.http_port}/varz", timeout=5)
        with socket.create_connection(("127.0.0.2", server.port), timeout=5):
            pass  # where clients connect
