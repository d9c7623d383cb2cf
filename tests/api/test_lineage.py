"""The registry records which task a split or a merge made came from, and refuses lineage
that is not one: another's task, another stream, key groups that are not a half or the
merged share, a share handed over twice; a task that hands its key groups over ends at one
time, does not move, and retires by its origin's call only."""

from __future__ import annotations

STREAM = "nats://127.0.0.1:4222/a"


def register(registry, key, name, groups="", from_tasks=(), status=201, since_s=None):
    body = {"name": name, "input_uri": STREAM + (f"/{groups}" if groups else ""), "from_tasks": list(from_tasks)}
    if from_tasks:
        body["since_s"] = since_s or 600
    return registry.ok("POST", "/tasks", key, status=status, json=body)


def test_a_split_and_a_merge_are_recorded_with_their_parents(registry):
    a = registry.participant("a")
    whole = register(registry, a, "t")
    assert whole["from_tasks"] == []
    low = register(registry, a, "t-0", "0", [whole["id"]])
    high = register(registry, a, "t-1", "1", [whole["id"]])
    assert low["from_tasks"] == high["from_tasks"] == [whole["id"]]
    again = register(registry, a, "t-m", "", [high["id"], low["id"]], since_s=1200)
    assert again["from_tasks"] == sorted([low["id"], high["id"]])
    assert registry.ok("GET", f"/tasks/{again['id']}", a)["from_tasks"] == again["from_tasks"]
    listed = {t["name"]: (t["from_tasks"], t["since_s"], t["until_s"]) for t in registry.ok("GET", "/tasks", a)}
    assert listed == {"t": ([], None, 600), "t-0": ([whole["id"]], 600, 1200), "t-1": ([whole["id"]], 600, 1200),
                      "t-m": (sorted([low["id"], high["id"]]), 1200, None)}
    events = registry.ok("GET", "/events", a)
    assert any(e["kind"] == "task.registered" and e["data"]["from_tasks"] == [whole["id"]] for e in events), events


def test_lineage_that_is_not_a_split_or_a_merge_is_refused_with_a_reason(registry):
    a, b = registry.participant("a"), registry.participant("b")
    whole = register(registry, a, "t")
    quarter = register(registry, a, "q", "00")
    theirs = registry.ok("POST", "/tasks", b, status=201, json={"name": "t", "input_uri": "nats://127.0.0.1:4222/b"})
    no_input = registry.ok("POST", "/tasks", a, status=201, json={"name": "plain"})
    cases = [
        ({"name": "x", "input_uri": f"{STREAM}/00", "from_tasks": [whole["id"]]}, 422, "not a half"),
        ({"name": "x", "input_uri": f"{STREAM}/0", "from_tasks": [whole["id"], quarter["id"]]}, 422, "not the two halves"),
        ({"name": "x", "input_uri": f"{STREAM}/0", "from_tasks": [whole["id"], whole["id"]]}, 422, "twice"),
        ({"name": "x", "from_tasks": [whole["id"]]}, 422, "input_uri is required"),
        ({"name": "x", "input_uri": "nats://127.0.0.1:4223/a/0", "from_tasks": [whole["id"]]}, 422, "does not read the stream"),
        ({"name": "x", "input_uri": f"{STREAM}/0", "from_tasks": [no_input["id"]]}, 422, "does not read the stream"),
        ({"name": "x", "input_uri": f"{STREAM}/readings/0", "from_tasks": [whole["id"]]}, 422, "input readings"),  # another input of a's stream
        ({"name": "x", "input_uri": f"{STREAM}/0", "from_tasks": [theirs["id"]]}, 403, "b's"),
        ({"name": "x", "input_uri": f"{STREAM}/0", "from_tasks": [999_999]}, 404, "no task"),
        ({"name": "x", "input_uri": f"{STREAM}/0", "from_tasks": [1, 2, 3]}, 422, "at most 2"),
        ({"name": "x", "input_uri": f"{STREAM}/0", "from_tasks": [0]}, 422, "greater than or equal to 1"),
        ({"name": "x", "input_uri": f"{STREAM}/0", "from_tasks": [whole["id"]]}, 422, "since_s comes with from_tasks"),
        ({"name": "x", "input_uri": f"{STREAM}/0", "since_s": 600}, 422, "since_s comes with from_tasks"),
        ({"name": "x", "input_uri": f"{STREAM}/0", "from_tasks": [whole["id"]], "since_s": -1}, 422, "greater than or equal to 0"),
        ({"name": "x", "input_uri": f"{STREAM}/0", "from_tasks": [whole["id"]], "since_s": "soon"}, 422, "valid integer"),
    ]
    for body, status, why in cases:
        response = registry.call("POST", "/tasks", a, json=body)
        assert response.status_code == status and why in str(response.json()["detail"]), (body, response.text)
    assert [t["name"] for t in registry.ok("GET", "/tasks", a, params={"origin": "a"})] == ["t", "q", "plain"], "nothing was registered"


def test_a_share_is_handed_over_once(registry):
    a = registry.participant("a")
    whole = register(registry, a, "t")
    register(registry, a, "t-0", "0", [whole["id"]])
    refused = register(registry, a, "t-0-again", "0", [whole["id"]], status=409)
    assert "handed over already" in refused["detail"]
    assert "t-0-again" not in {t["name"] for t in registry.ok("GET", "/tasks", a)}


def test_a_task_ends_at_one_time_at_home_and_neither_moves_nor_splits_again(registry):
    a, b = registry.participant("a"), registry.participant("b")
    whole = register(registry, a, "t")
    other = register(registry, a, "u", "1")
    register(registry, a, "t-0", "0", [whole["id"]], since_s=600)
    refused = register(registry, a, "t-1", "1", [whole["id"]], since_s=660, status=409)
    assert "ends at 600 already" in refused["detail"]
    contract = registry.active_contract(a, "b", b)
    refused = registry.ok("POST", "/offers", a, status=409, json={"contract_id": contract["id"], "task_ids": [whole["id"]], "price": 1.5})
    assert "hand their key groups over" in refused["detail"]
    # A task away from home hands nothing over; one whose span starts later cannot end before it.
    registry.ok("POST", "/offers", a, status=201, json={"contract_id": contract["id"], "task_ids": [other["id"]], "price": 1.5})
    registry.ok("POST", f"/offers/{registry.ok('GET', '/offers', a)[0]['id']}/accept", b)
    refused = register(registry, a, "u-0", "10", [other["id"]], status=409)
    assert "runs at b, not at home" in refused["detail"]
    half = registry.ok("GET", "/tasks", a, params={"origin": "a"})[2]
    refused = register(registry, a, "t-00", "00", [half["id"]], since_s=600, status=422)
    assert "starts at 600" in refused["detail"]


def test_only_the_origin_retires_a_task_that_ended_and_only_once(registry):
    a, b = registry.participant("a"), registry.participant("b")
    whole = register(registry, a, "t")
    refused = registry.ok("POST", f"/tasks/{whole['id']}/retire", a, status=409)
    assert "has not ended" in refused["detail"]
    register(registry, a, "t-0", "0", [whole["id"]], since_s=600)
    assert "only its origin" in registry.ok("POST", f"/tasks/{whole['id']}/retire", b, status=403)["detail"]
    retired = registry.ok("POST", f"/tasks/{whole['id']}/retire", a)
    assert retired["retired"] and retired["until_s"] == 600
    assert "retired already" in registry.ok("POST", f"/tasks/{whole['id']}/retire", a, status=409)["detail"]
    refused = register(registry, a, "t-1", "1", [whole["id"]], since_s=600, status=409)
    assert "it is retired" in refused["detail"]
    assert registry.ok("POST", "/tasks/999999/retire", a, status=404)
    assert any(e["kind"] == "task.retired" for e in registry.ok("GET", "/events", a))


def test_a_task_records_its_query_and_digest_and_a_split_keeps_them(registry):
    a = registry.participant("a")
    query = {"query": "sensors", "query_digest": "7d41f04a01b0a5f0"}
    whole = registry.ok("POST", "/tasks", a, status=201, json={"name": "t", "input_uri": STREAM, **query})
    assert (whole["query"], whole["query_digest"]) == ("sensors", "7d41f04a01b0a5f0")
    assert registry.ok("GET", f"/tasks/{whole['id']}", a)["query"] == "sensors"
    half = {"input_uri": f"{STREAM}/0", "from_tasks": [whole["id"]], "since_s": 600}
    assert registry.ok("POST", "/tasks", a, status=201, json={"name": "t-0", **half, **query})["query_digest"] == "7d41f04a01b0a5f0"
    plain = registry.ok("POST", "/tasks", a, status=201, json={"name": "plain"})
    assert (plain["query"], plain["query_digest"]) == (None, None)
    cases = [
        ({"name": "x", **half, "input_uri": f"{STREAM}/1", "query": "sensors", "query_digest": "0000000000000000"}, "runs the query of the tasks it came from"),
        ({"name": "x", **half, "input_uri": f"{STREAM}/1"}, "runs the query of the tasks it came from"),
        ({"name": "x", "query": "sensors"}, "query and query_digest come together"),
        ({"name": "x", "query": "../etc", "query_digest": "7d41f04a01b0a5f0"}, "should match pattern"),
        ({"name": "x", "query": "sensors", "query_digest": "not hex!"}, "should match pattern"),
    ]
    for body, why in cases:
        response = registry.call("POST", "/tasks", a, json=body)
        assert response.status_code == 422 and why in str(response.json()["detail"]), (body, response.text)
