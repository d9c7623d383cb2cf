"""Schema-based fuzzing of the registry's OpenAPI against a real `bpm registry serve`.

Every operation gets generated requests, valid and invalid, as the operator and as a
participant of a small federation; none may answer with a server error, and every
answer is JSON with the status codes the schema documents. Bounded: a few examples per
operation (more with BPM_FUZZ_EXAMPLES). Each database's run ends by printing its figures
(operations, cases, requests, server errors) as one JSON line, shown with `pytest -s`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import status_code_conformance

from tests.conftest import require_postgres
from tests.registry_server import running_registry

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("BPM_FUZZ_EXAMPLES", "25"))


def _seed(url: str, admin_key: str) -> dict[str, str]:
    """Two participants with a contract, tasks, an offer and a movement: ids 1 and 2 exist."""
    with httpx.Client(base_url=url + "/api/v1", timeout=10) as http:
        def call(method, path, key, **kw):
            response = http.request(method, path, headers={"Authorization": f"Bearer {key}"}, **kw)
            response.raise_for_status()
            return response.json()

        keys = {}
        for name in ("a", "b"):
            keys[name] = call("POST", "/participants", admin_key, json={"name": name, "endpoint": f"http://127.0.0.1:1/{name}"})["api_key"]
        contract = call("POST", "/contracts", keys["a"], json={"counterparty": "b", "price_min": 1, "price_max": 2, "min_duration_s": 1})
        call("POST", f"/contracts/{contract['id']}/accept", keys["b"])
        tasks = [call("POST", "/tasks", keys["a"], json={"name": f"t{k}", "load": 0.1})["id"] for k in range(3)]
        offer = call("POST", "/offers", keys["a"], json={"contract_id": contract["id"], "task_ids": tasks[:1], "price": 1.5})
        call("POST", f"/offers/{offer['id']}/accept", keys["b"])
        return keys


# The CI tier fuzzes the registry on SQLite; the second tier on PostgreSQL too (the hostile-input
# and concurrency tests run on both databases in either tier).
@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.full)])
def fuzzed_registry(request, tmp_path_factory):
    """A served registry on one database, seeded, and the tally of its run, printed at the end."""
    tally = Tally()
    workdir = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    database_url = None
    if request.param == "postgresql":
        from api.migrate import downgrade

        database_url = require_postgres()
        downgrade(database_url, "base")
    # A change feed's stream ends at once: each call of it answers, instead of lasting minutes.
    with running_registry(workdir, database_url, extra_env={"BPM_FEED_LIFETIME_S": "0.1", "BPM_FEED_INTERVAL_S": "0.05"}) as registry:
        keys = _seed(registry.url, registry.admin_key)
        yield registry, {"operator": registry.admin_key, "participant": keys["a"]}, tally
    print("\nfuzz " + tally.summary(request.param))
    if database_url:
        from api.migrate import downgrade

        downgrade(database_url, "base")


@pytest.fixture(scope="module")
def api_schema(fuzzed_registry):
    registry, _, _ = fuzzed_registry
    return schemathesis.openapi.from_url(registry.url + "/openapi.json")


@dataclass
class Tally:
    """What one database's run sent and got back."""

    operations: set[str] = field(default_factory=set)
    cases: int = 0
    requests: int = 0
    server_errors: int = 0

    def summary(self, database: str) -> str:
        return json.dumps({"database": database, "examples_per_operation": EXAMPLES, "operations": len(self.operations),
                           "cases": self.cases, "requests": self.requests, "server_errors": self.server_errors})


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
def test_no_server_errors_and_documented_statuses(case, fuzzed_registry):
    registry, keys, tally = fuzzed_registry
    tally.operations.add(case.operation.label)
    tally.cases += 1
    for key in keys.values():
        response = case.call(base_url=registry.url, headers={"Authorization": f"Bearer {key}"}, timeout=20)
        tally.requests += 1
        tally.server_errors += response.status_code >= 500
        case.validate_response(response, checks=[not_a_server_error, status_code_conformance])
        if response.status_code >= 400:
            assert response.headers.get("content-type", [""])[0].startswith("application/json"), response.text
            assert "detail" in response.json()
