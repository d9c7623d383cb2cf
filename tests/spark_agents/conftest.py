import pytest

from spark_agents.testing import shared_test_session


@pytest.fixture(scope="session")
def spark():
    return shared_test_session()
