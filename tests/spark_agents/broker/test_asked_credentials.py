"""What a partner's agent answers when asked for credentials is checked before use: a hostile
answer is refused with a RuntimeError, never used (`spark_agents.broker.access.ask_agent`)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from spark_agents.broker.access import ask_credentials
from spark_agents.correlation import ask_alerts_credentials


@pytest.fixture
def partner():
    """A partner's agent on loopback that answers every GET with `answer` (status, JSON body)."""
    answer = {"status": 200, "body": {}}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            data = json.dumps(answer["body"]).encode()
            self.send_response(answer["status"])
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", answer
    finally:
        server.shutdown()
        server.server_close()


def test_credentials_for_me_are_used(partner):
    endpoint, answer = partner
    answer["body"] = {"user": "b", "password": "pw-12345678"}
    assert ask_credentials(endpoint, "a.t0", 1, "token", "b", timeout_s=5) == ("b", "pw-12345678")


@pytest.mark.parametrize("body", [
    {"user": "c", "password": "pw-12345678"},  # someone else's
    {"user": "b", "password": "short"},
    {"user": "b", "password": "pw 12345678; rm"},
    {"user": "b", "password": 12345678},
    {"user": "b"},
    ["b", "pw-12345678"],
])
def test_an_answer_that_is_not_my_credentials_is_refused(partner, body):
    endpoint, answer = partner
    answer["body"] = body
    with pytest.raises(RuntimeError, match="credentials"):
        ask_credentials(endpoint, "a.t0", 1, "token", "b", timeout_s=5)


def test_a_refusal_because_the_task_moved_is_a_lost_race(partner):
    endpoint, answer = partner
    answer.update(status=409, body={"detail": "not at this epoch"})
    with pytest.raises(PermissionError):
        ask_credentials(endpoint, "a.t0", 1, "token", "b", timeout_s=5)


def test_alerts_credentials_must_point_at_the_partner_s_own_host(partner):
    endpoint, answer = partner
    answer["body"] = {"url": "nats://127.0.0.1:4222", "user": "b", "password": "pw-12345678"}
    assert ask_alerts_credentials(endpoint, "token", "b", timeout_s=5).user == "b"
    answer["body"] = {"url": "nats://127.0.0.2:4222", "user": "b", "password": "pw-12345678"}
    with pytest.raises(RuntimeError, match="another host"):
        ask_alerts_credentials(endpoint, "token", "b", timeout_s=5)
    answer["body"] = {"url": "nats://127.0.0.1:4222", "user": "c", "password": "pw-12345678"}
    with pytest.raises(RuntimeError, match="not b's"):
        ask_alerts_credentials(endpoint, "token", "b", timeout_s=5)
