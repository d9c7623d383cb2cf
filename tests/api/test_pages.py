"""Pages of the registry's lists (`api.pages`): limit, offset, newest first, and the total of
what the caller may read in `X-Total-Count`; on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from tests.api.conftest import ADMIN_KEY


def _page(registry, path: str, key: str = ADMIN_KEY, **params) -> tuple[list, int]:
    response = registry.call("GET", path, key, params=params)
    assert response.status_code == 200, response.text
    return response.json(), int(response.headers["X-Total-Count"])


def test_every_list_pages_with_its_total(registry):
    keys = {name: registry.participant(name) for name in "abcde"}
    for other in "bcde":
        registry.active_contract(keys["a"], other, keys[other])
    for k in range(7):
        registry.task(keys["a"], f"t{k}")
    names, total = _page(registry, "/participants", limit=2, offset=1)
    assert [p["name"] for p in names] == ["b", "c"] and total == 5
    newest, _ = _page(registry, "/participants", limit=2, descending="true")
    assert [p["name"] for p in newest] == ["e", "d"]
    whole, total = _page(registry, "/tasks")
    assert len(whole) == total == 7, "without limit, the whole list"
    tasks, total = _page(registry, "/tasks", limit=3, offset=6)
    assert [t["name"] for t in tasks] == ["t6"] and total == 7
    ids = [c["id"] for c in _page(registry, "/contracts", limit=10, descending="true")[0]]
    assert ids == sorted(ids, reverse=True) and len(ids) == 4
    # The total counts what the filter keeps and what the caller may read.
    assert _page(registry, "/contracts", keys["b"], limit=1)[1] == 1, "b is party to one contract"
    assert _page(registry, "/contracts", limit=1, state="proposed")[1] == 0
    beyond, total = _page(registry, "/tasks", limit=5, offset=100)
    assert beyond == [] and total == 7
    task = registry.ok("GET", "/tasks")[0]
    contract = registry.ok("GET", "/contracts", keys["a"])[0]
    registry.ok("POST", "/offers", keys["a"], status=201, json={"contract_id": contract["id"], "task_ids": [task["id"]], "price": 1.5})
    assert _page(registry, "/offers", limit=1)[1] == 1 and _page(registry, "/movements", limit=1)[1] == 0


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 1001}, {"offset": -1}, {"limit": "x"}, {"descending": "maybe"}])
def test_a_wrong_page_is_refused_with_a_readable_detail(registry, params):
    response = registry.call("GET", "/movements", params=params)
    assert response.status_code == 422 and response.json()["detail"], response.text


def test_states_are_one_list_the_api_checks(registry):
    from bpm.negotiation import MovementState, OfferState

    for path, states in (("/offers", OfferState), ("/movements", MovementState)):
        refused = registry.call("GET", path, params={"state": "bogus"})
        assert refused.status_code == 422 and all(s.value in refused.text for s in states), refused.text
        assert registry.call("GET", path, params={"state": list(states)[-1].value}).status_code == 200
    schema = registry.client.get("/openapi.json").json()["components"]["schemas"]
    assert set(schema["OfferState"]["enum"]) == {s.value for s in OfferState}
    assert set(schema["MovementState"]["enum"]) == {s.value for s in MovementState}
