import secrets

import pytest

from spark_agents.broker.server import NatsServer, User
from spark_agents.broker.stream import Broker
from spark_agents.testing import shared_test_session


@pytest.fixture(scope="session")
def spark():
    return shared_test_session()


@pytest.fixture
def nats_server(tmp_path):
    """(server, owner user) of participant `a`'s broker: a NATS server of the project's own
    (its own ports and storage folder), stopped at the end of the test."""
    owner = User("a", secrets.token_urlsafe(16))
    with NatsServer.on_free_ports("a", tmp_path / "nats-a", [owner]) as server:
        yield server, owner


@pytest.fixture
def tls_server(tmp_path):
    """(server, owner user, certificate file) of participant `a`'s broker serving TLS with a
    certificate of its own, as an agent's broker does (`spark_agents.broker.access.OwnBroker`)."""
    from bpm.certificates import self_signed
    from spark_agents.credentials import write_private

    cert, key = self_signed("a", ["127.0.0.1"])
    cert_file, key_file = tmp_path / "tls" / "cert.pem", tmp_path / "tls" / "key.pem"
    write_private(key_file, key.decode())
    write_private(cert_file, cert.decode())
    owner = User("a", secrets.token_urlsafe(16))
    with NatsServer.on_free_ports("a", tmp_path / "nats-a", [owner], tls=(cert_file, key_file)) as server:
        yield server, owner, cert_file


@pytest.fixture
def broker(nats_server):
    """A connection to `nats_server` as its owner."""
    server, owner = nats_server
    with Broker(server.url, owner.name, owner.password) as connection:
        yield connection
