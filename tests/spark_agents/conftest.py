import secrets

import pytest

from spark_agents.broker.server import NatsServer, User
from spark_agents.broker.stream import Broker
from tests.spark_session import shared_test_session


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
    from spark_agents.tls import own_certificate

    owner = User("a", secrets.token_urlsafe(16))
    served = own_certificate(tmp_path, "a", ["127.0.0.1"])
    with NatsServer.on_free_ports("a", tmp_path / "nats-a", [owner], tls=served) as server:
        yield server, owner, served.cert_file


@pytest.fixture
def broker(nats_server):
    """A connection to `nats_server` as its owner."""
    server, owner = nats_server
    with Broker(server.url, owner.name, owner.password) as connection:
        yield connection
