"""A NATS server of the project's own for the broker's tests: its own ports and storage folder."""

from __future__ import annotations

import secrets

import pytest

from spark_agents.broker.server import NatsServer, User
from tests.conftest import free_port


@pytest.fixture
def nats_server(tmp_path):
    """(server, owner user) of participant `a`'s broker, stopped at the end of the test."""
    owner = User("a", secrets.token_urlsafe(16))
    with NatsServer("a", tmp_path / "nats-a", port=free_port(), http_port=free_port(), users=[owner]) as server:
        yield server, owner
