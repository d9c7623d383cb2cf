"""TLS between agents: the certificate an agent serves, and a partner that trusts only the one
the registry lists for it."""

from __future__ import annotations

import datetime as dt
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Header, Response

from bpm import certificates
from spark_agents import handover
from spark_agents.tls import RENEW_BEFORE, OwnCertificate, PeerRefused, Peers, own_certificate, pinned_context
from tests.conftest import free_port


def test_an_agent_makes_its_certificate_once_keeps_its_key_private_and_renews_it_near_its_end(tmp_path):
    made = own_certificate(tmp_path, "a", ["127.0.0.2"])
    assert made.cert_file.parent == tmp_path / "tls"
    assert stat.S_IMODE(made.key_file.stat().st_mode) == 0o600
    assert certificates.hosts(made.pem) == {"127.0.0.2"}
    assert own_certificate(tmp_path, "a", ["127.0.0.2"]) == made, "kept across restarts: partners keep trusting it"
    moved = own_certificate(tmp_path, "a", ["a.example.org"])
    assert moved.pem != made.pem and certificates.hosts(moved.pem) == {"a.example.org"}, "a new address: a new certificate"
    late = dt.datetime.now(dt.UTC) + dt.timedelta(days=certificates.VALID_DAYS) - RENEW_BEFORE + dt.timedelta(days=1)
    renewed = own_certificate(tmp_path, "a", ["a.example.org"], now=late)
    assert renewed.pem != moved.pem and certificates.parse(renewed.pem, now=late).not_after > late + RENEW_BEFORE
    made.key_file.write_text("not a key")
    (tmp_path / "tls" / "cert.pem").write_text("not a certificate")
    assert certificates.parse(own_certificate(tmp_path, "a", ["a.example.org"]).pem), "a damaged pair is made anew"


def test_an_operator_s_certificate_is_served_as_given_and_a_bad_one_is_a_clear_error(tmp_path):
    cert, key = certificates.self_signed("a", ["a.example.org"])
    (tmp_path / "c.pem").write_bytes(cert)
    (tmp_path / "k.pem").write_bytes(key)
    given = own_certificate(tmp_path / "work", "a", ["a.example.org"], cert_file=tmp_path / "c.pem", key_file=tmp_path / "k.pem")
    assert given == OwnCertificate(tmp_path / "c.pem", tmp_path / "k.pem", cert.decode())
    assert not (tmp_path / "work" / "tls").exists()
    with pytest.raises(ValueError, match="needs its key"):
        own_certificate(tmp_path, "a", [], cert_file=tmp_path / "c.pem")
    (tmp_path / "bad.pem").write_text("hello")
    with pytest.raises(ValueError, match="bad.pem: not a PEM certificate"):
        own_certificate(tmp_path, "a", [], cert_file=tmp_path / "bad.pem", key_file=tmp_path / "k.pem")
    with pytest.raises(ValueError, match="missing.pem"):
        own_certificate(tmp_path, "a", [], cert_file=tmp_path / "missing.pem", key_file=tmp_path / "k.pem")


@contextmanager
def _agent_like(tmp_path: Path, name: str, tls: bool = True) -> Iterator[tuple[str, OwnCertificate]]:
    """An HTTPS server with `name`'s own certificate (without `tls`: plain HTTP, as with
    `--insecure`), serving a health check and a checkpoint to a caller with the right token."""
    app = FastAPI()

    @app.get("/healthz")
    def healthz():
        return {"ok": True}

    @app.get("/handover/{key}")
    def checkpoint(key: str, authorization: str = Header("")):
        return Response(b"checkpoint of " + key.encode()) if authorization == "Bearer token" else Response(status_code=401)

    own = own_certificate(tmp_path / name, name, ["127.0.0.1"])
    port = free_port()
    served = {"ssl_certfile": str(own.cert_file), "ssl_keyfile": str(own.key_file)} if tls else {}
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **served))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}", own
    finally:
        server.should_exit = True
        thread.join(5)


def _until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not within the time limit"
        time.sleep(0.01)


def test_a_partner_fetches_a_checkpoint_only_from_the_peer_that_shows_the_registered_certificate(tmp_path):
    with _agent_like(tmp_path, "b") as (endpoint, own):
        registry = {"b": {"endpoint": endpoint, "certificate": own.pem}}
        peers = Peers(registry.__getitem__)
        assert peers.endpoint("b") == endpoint
        assert handover.fetch(endpoint, "a.p0", 1, "token", verify=peers.verify(endpoint), timeout_s=5) == b"checkpoint of a.p0"
        assert peers.client(endpoint).get(endpoint + "/healthz").json() == {"ok": True}

        # Someone else's certificate at that address (a man in the middle, or the registry
        # lists a newer one): nothing is fetched from it.
        registry["b"]["certificate"] = certificates.self_signed("b", ["127.0.0.1"])[0].decode()
        impostor = Peers(registry.__getitem__)
        impostor.endpoint("b")
        with pytest.raises(handover.HandoverNotReady, match="CERTIFICATE_VERIFY_FAILED"):
            handover.fetch(endpoint, "a.p0", 1, "token", verify=impostor.verify(endpoint), timeout_s=0.5)
        with pytest.raises(httpx.ConnectError):
            impostor.client(endpoint).get(endpoint + "/healthz")
        # A partner reads the registry's record again once it is `refresh_s` old: it follows b's certificate.
        following = Peers(registry.__getitem__, refresh_s=0.0)
        following.endpoint("b")
        with pytest.raises(httpx.ConnectError):
            following.client(endpoint).get(endpoint + "/healthz")
        registry["b"]["certificate"] = own.pem
        following.endpoint("b")  # read again in the background
        _until(lambda: following.verify(endpoint) is pinned_context(own.pem))
        assert following.client(endpoint).get(endpoint + "/healthz").status_code == 200


def test_a_partner_refuses_plain_http_unless_insecure_and_https_without_a_registered_certificate():
    registry = {"b": {"endpoint": "http://127.0.0.1:9", "certificate": None}, "c": {"endpoint": "https://127.0.0.1:9", "certificate": None}}
    peers = Peers(registry.__getitem__)
    with pytest.raises(PeerRefused, match="plain text to a partner only with --insecure"):
        peers.verify(peers.endpoint("b"))
    with pytest.raises(PeerRefused, match="registered no TLS certificate"):
        peers.client(peers.endpoint("c"))
    assert Peers(registry.__getitem__, insecure=True).verify("http://127.0.0.1:9") is True
    reads = []
    counting = Peers(lambda name: reads.append(name) or registry[name])
    counting.endpoint("c")
    counting.endpoint("c")
    assert reads == ["c", "c"], "a partner that has not registered its certificate yet is read again"


def test_a_partner_s_endpoint_and_certificate_stand_while_the_registry_cannot_be_read():
    now = [0.0]
    record = {"endpoint": "https://127.0.0.1:9", "certificate": certificates.self_signed("b", ["127.0.0.1"])[0].decode()}
    cut = []

    def read(name: str) -> dict:
        if cut:
            raise httpx.ConnectError("the registry is cut off")
        return record

    peers = Peers(read, clock=lambda: now[0], refresh_s=30.0)
    assert peers.endpoint("b") == record["endpoint"]
    cut.append(True)
    now[0] = 100.0
    assert peers.endpoint("b") == record["endpoint"] and peers.verify(record["endpoint"]), "what was read before stands"
    with pytest.raises(httpx.ConnectError):
        peers.endpoint("c")
    _until(lambda: not peers._refreshing)
    assert peers.endpoint("b") == record["endpoint"] and not peers._refreshing, "tried again only `refresh_s` later"


def test_a_participant_that_registers_a_partner_s_endpoint_gets_no_pin_of_its_own_there():
    mine = certificates.self_signed("x", ["127.0.0.1"])[0].decode()
    registry = {"b": {"endpoint": "https://127.0.0.1:9", "certificate": certificates.self_signed("b", ["127.0.0.1"])[0].decode()},
                "x": {"endpoint": "https://127.0.0.1:9", "certificate": mine}}
    peers = Peers(registry.__getitem__)
    peers.endpoint("b")
    with pytest.raises(PeerRefused, match="both register"):
        peers.endpoint("x")
    assert peers.verify("https://127.0.0.1:9") is pinned_context(registry["b"]["certificate"]), "b's pin stands"


def test_an_agent_serves_plain_http_only_when_told_insecure_and_takes_no_half_pair(tmp_path):
    from typer.testing import CliRunner

    from bpm_app.cli import app

    def agent(*args: str):
        return CliRunner().invoke(app, ["agent", "run", "--name", "x", "--workdir", str(tmp_path), *args], env={"COLUMNS": "1000"})

    for args, says in ((["--endpoint", "http://127.0.0.1:9000"], "is plain HTTP: use https://, or --insecure"),
                       (["--insecure", "--endpoint", "https://127.0.0.1:9000"], "is not http://, which --insecure serves"),
                       (["--tls-cert", str(tmp_path / "c.pem")], "needs its key")):
        done = agent(*args)
        assert done.exit_code == 2 and says in " ".join(done.output.split()), done.output
    assert not (tmp_path / "tls").exists(), "nothing made for an agent that does not start"


def test_an_agent_registers_its_certificate_once_the_registry_answers_and_stops_on_a_refusal():
    from bpm_http.client import RegistryClient
    from spark_agents.runtime import register_certificate

    pem = certificates.self_signed("a", ["127.0.0.1"])[0].decode()
    answers = [httpx.ConnectError("down"), httpx.Response(503, json={"detail": "starting"}),
               httpx.Response(200, json={"certificate_sha256": certificates.sha256(pem)})]
    asked = []

    def registry(request: httpx.Request) -> httpx.Response:
        asked.append((request.method, request.url.path))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    with RegistryClient("http://registry", "key", transport=httpx.MockTransport(registry)) as client:
        register_certificate(client, "a", pem, threading.Event(), retry_s=0.01)
    assert asked == [("PUT", "/api/v1/participants/a/certificate")] * 3, "tried until the registry took it"

    answers.append(httpx.Response(422, json={"detail": "not valid now"}))
    with RegistryClient("http://registry", "key", transport=httpx.MockTransport(registry)) as client:
        with pytest.raises(SystemExit, match="the registry refuses its TLS certificate: 422: not valid now"):
            register_certificate(client, "a", pem, threading.Event(), retry_s=0.01)
