"""A participant's broker over TLS: it serves its agent's certificate, and every client, the
owner's and its partners', pins that certificate (as the registry lists it for a partner)."""

from __future__ import annotations

import socket

import pytest

from bpm import certificates
from bpm.keygroups import MAIN, StreamLocation, subject
from spark_agents.broker.access import OwnBroker
from spark_agents.broker.server import BrokerError, free_port
from spark_agents.broker.source import JetStreamInput
from spark_agents.broker.stream import Broker
from spark_agents.tls import PeerRefused, Peers, own_certificate


def test_a_broker_with_tls_takes_only_clients_that_pin_its_certificate(tls_server):
    server, owner, cert = tls_server
    with socket.create_connection((server.host, server.port), timeout=5) as sock:
        assert b'"tls_required":true' in sock.recv(4096), "the server asks every client for TLS before anything else"
    with Broker(server.url, owner.name, owner.password, tls=cert.read_text()) as broker:
        broker.ensure_stream("a")
        assert broker.publish(subject("a", 0), b"1,0\n") == 1
    impostor, _ = certificates.self_signed("a", ["127.0.0.1"])  # same names, another key: what a man in the middle shows
    # Refused at once, saying why (a client left to retry a failed handshake waits forever).
    with pytest.raises(BrokerError, match="the certificate pinned.*CERTIFICATE_VERIFY_FAILED"):
        Broker(server.url, owner.name, owner.password, tls=impostor.decode(), timeout_s=2)
    with pytest.raises(BrokerError, match="its TLS off.*CERTIFICATE_VERIFY_FAILED"):
        Broker(server.url, owner.name, owner.password, timeout_s=2)


def test_an_agent_s_broker_serves_its_certificate_to_the_owner_and_to_a_partner_that_pins_the_registered_one(tmp_path):
    origin = own_certificate(tmp_path / "a", "a", ["127.0.0.1"])
    own = OwnBroker("a", tmp_path / "a" / "broker", "owner-password-1", port=free_port(), http_port=free_port(), tls=origin)
    own.start()
    try:
        assert own.tls == origin.pem
        where = StreamLocation(own.url, "a", "0")
        mine = own.own_input(where)
        assert mine.tls == origin.pem and "BEGIN" not in repr(mine), "the owner's tasks pin it too; a repr shows no certificate"
        own.connection().publish(subject("a", 0), b"1,0\n")
        own.grant({"b": [("a.g0", (MAIN, "0"), True)]})
        user = own.credentials("b")
        registry = {"a": {"endpoint": "https://127.0.0.1:9", "certificate": origin.pem}}
        pinned = Peers(registry.__getitem__).broker_tls("a")
        assert pinned == origin.pem, "a partner pins the certificate the registry lists for the origin's agent"
        partner = JetStreamInput(user["url"], "b", user["password"], "a", "0", tls=pinned)
        assert partner.pending(0) == 1 and "tls" in partner.options() and partner.options()["tls"] == origin.pem
        with pytest.raises(BrokerError, match="its TLS off"):
            Broker(user["url"], "b", user["password"], timeout_s=2)
    finally:
        own.stop()


def test_a_partner_knows_a_broker_in_plain_text_only_with_insecure():
    registry = {"b": {"endpoint": "http://127.0.0.1:9", "certificate": None}, "c": {"endpoint": "https://127.0.0.1:9", "certificate": None}}
    assert Peers(registry.__getitem__, insecure=True).broker_tls("b") is None
    with pytest.raises(PeerRefused, match="only with --insecure"):
        Peers(registry.__getitem__).broker_tls("b")
    with pytest.raises(PeerRefused, match="registered no TLS certificate"):
        Peers(registry.__getitem__, insecure=True).broker_tls("c")
