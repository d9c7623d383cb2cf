"""The admin UI in Debian's Chromium, against a real registry process.

Data are created through the JSON API (as agents and people would) while the page is
open; the page must show them without being reloaded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import httpx
import pytest
from playwright.sync_api import expect

from bpm import certificates
from bpm_http.client import RegistryError
from tests.api.ui.browser import sign_in

pytestmark = pytest.mark.slow


def go(page, link: str) -> None:
    page.get_by_role("navigation", name="Views").get_by_role("link", name=link).click()


def mark_page(page) -> None:
    """Leave a mark in the page's memory; a reload would erase it."""
    page.evaluate("window.__sameDocument = true")


def assert_not_reloaded(page) -> None:
    assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"


def contract_row(page, contract_id: int):
    return page.locator("#contracts-table tbody tr").filter(has=page.get_by_text(f"#{contract_id}", exact=True))


def test_sign_in_refuses_a_wrong_key_keeps_the_key_out_of_urls_and_signs_out(federation, page):
    federation.add("alpha")
    requests = []
    page.on("request", lambda r: requests.append((r.url, r.headers.get("authorization"))))
    page.goto(federation.url + "/")
    page.get_by_label("API key").fill("not-a-key")
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#signin-error")).to_have_text("The registry refused this key: invalid API key.")
    expect(page.locator("#app")).to_be_hidden()

    sign_in(page, federation.url, federation.registry.admin_key)
    expect(page.locator("#who")).to_have_text("Signed in as the operator")
    expect(page.locator("#participants-table")).to_contain_text("alpha")
    key = federation.registry.admin_key
    assert key not in page.url
    assert page.evaluate("sessionStorage.getItem('bpm.registry.key')") == key
    assert page.evaluate("localStorage.length") == 0
    api_calls = [(url, auth) for url, auth in requests if "/api/v1/" in url]
    assert api_calls and all(key not in url for url, _ in requests)
    assert {auth for _, auth in api_calls} <= {"Bearer not-a-key", f"Bearer {key}"}

    # A signed-in tab that is reloaded stays signed in (same tab, same session storage).
    page.reload()
    expect(page.locator("#participants-table")).to_contain_text("alpha")

    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_label("API key")).to_be_focused()
    expect(page.locator("#signin-error")).to_have_text("Signed out.")
    assert page.evaluate("sessionStorage.length") == 0
    assert page.locator("#participants-table").inner_text() == ""


def test_participants_show_status_load_against_threshold_and_history_live(federation, page):
    federation.add("alpha", "bravo", "charlie")
    federation["alpha"].heartbeat("alpha", {"load": 0.5, "threshold": 0.7, "marginal_cost": {"shed": 1.4, "take": 1.9}})
    federation["alpha"].heartbeat("alpha", {"load": 0.9, "threshold": 0.7, "marginal_cost": {"shed": 2.5, "take": 3.1}})
    federation["bravo"].heartbeat("bravo", {"load": 0.3, "threshold": 0.7})
    pem = certificates.self_signed("alpha", ["127.0.0.1"])[0].decode()
    federation["alpha"].register_certificate("alpha", pem)
    sign_in(page, federation.url, federation.registry.admin_key)
    mark_page(page)

    rows = page.locator("#participants-table tbody tr")
    expect(rows).to_have_count(3)
    alpha = rows.filter(has_text="alpha")
    expect(alpha).to_contain_text("alive")
    expect(alpha).to_contain_text("0.90 / 0.70")
    expect(alpha).to_contain_text("shed 2.5 · take 3.1")
    expect(alpha.get_by_role("img", name="load 0.90 against threshold 0.70")).to_be_visible()
    expect(alpha.locator(".loadbar .fill.over")).to_have_count(1)
    expect(rows.filter(has_text="bravo").locator(".loadbar .fill.ok")).to_have_count(1)
    charlie = rows.filter(has_text="charlie")
    expect(charlie).to_contain_text("new")
    expect(charlie).to_contain_text("never")
    fingerprint = certificates.parse(pem).sha256
    expect(alpha.get_by_title(f"SHA-256 {fingerprint}")).to_have_text(f"TLS {fingerprint[:16]}…")
    expect(charlie).to_contain_text("no TLS certificate")
    expect(page.locator("#participants-summary")).to_contain_text("Over threshold: alpha (0.90 > 0.70)")

    charts = page.locator("#load-charts figure")
    expect(charts).to_have_count(3)
    expect(charts.filter(has_text="alpha").locator("path.load-line")).to_have_count(1)
    expect(charts.filter(has_text="alpha").locator("path.threshold-line")).to_have_count(1)
    expect(charts.filter(has_text="charlie")).to_contain_text("no samples in this window")

    # charlie starts reporting and takes a task of its own: the open page follows.
    task = federation["charlie"].register_task("conn-p0", load=0.2)
    federation["charlie"].heartbeat("charlie", {"load": 0.2, "threshold": 0.8})
    expect(charlie).to_contain_text("alive")
    expect(charlie).to_contain_text("0.20 / 0.80")
    expect(charlie).to_contain_text(f"#{task['id']}")
    expect(charts.filter(has_text="charlie").locator("circle.load-dot")).to_have_count(1)
    assert_not_reloaded(page)


def test_a_participant_accepts_a_contract_in_the_ui_and_the_operator_sees_it_change(federation, new_page):
    federation.add("alpha", "bravo")
    proposal = federation["alpha"].propose("bravo", 1.0, 1.5, 60)
    cid = proposal["id"]

    operator = new_page()
    sign_in(operator, federation.url, federation.registry.admin_key)
    go(operator, "Contracts")
    mark_page(operator)
    row = contract_row(operator, cid)
    expect(row).to_contain_text("alpha → bravo")
    expect(row).to_contain_text("1 – 1.5")
    expect(row).to_contain_text("proposed")
    expect(operator.locator("#contract-graph path.edge.negotiating")).to_have_count(1)
    # The operator watches: contract actions belong to the parties.
    expect(operator.get_by_role("button", name=f"Accept contract #{cid}")).to_have_count(0)

    bravo = new_page()
    sign_in(bravo, federation.url, federation.keys["bravo"])
    expect(bravo.locator("#who")).to_have_text("Signed in as bravo (participant)")
    go(bravo, "Contracts")
    bravo_row = contract_row(bravo, cid)
    expect(bravo_row).to_contain_text("bravo (you)")
    bravo.get_by_role("button", name=f"Accept contract #{cid}").click()
    expect(bravo.locator("#contract-message")).to_have_text(f"Contract #{cid} is now active.")
    expect(bravo_row).to_contain_text("active")
    expect(bravo.get_by_role("button", name=f"Accept contract #{cid}")).to_have_count(0)
    assert federation.operator.contract(cid)["state"] == "active"

    expect(row).to_contain_text("active")
    expect(operator.locator("#contract-graph path.edge.active")).to_have_count(1)
    expect(operator.locator("#contract-graph path.edge.negotiating")).to_have_count(0)
    assert_not_reloaded(operator)


def test_propose_counter_and_terminate_through_the_forms(federation, page):
    federation.add("alpha", "bravo")
    sign_in(page, federation.url, federation.keys["alpha"])
    go(page, "Contracts")
    form = page.locator("#propose-form")
    form.get_by_label("Counterparty").select_option("bravo")
    form.get_by_label("Price min").fill("1.2")
    form.get_by_label("Price max").fill("1.8")
    form.get_by_label("Min duration (s)").fill("45")
    form.get_by_label("HA mode").select_option("passive_standby")
    form.get_by_role("button", name="Propose").click()
    expect(page.locator("#contract-message")).to_have_text("Proposed contract #1 to bravo; it waits for bravo.")
    expect(page.locator("#contract-error")).to_have_text("")
    expect(form.get_by_label("Price min")).to_have_value("")  # a success empties the form
    stored = federation.operator.contract(1)
    assert (stored["proposer"], stored["price_min"], stored["price_max"], stored["min_duration_s"], stored["ha_mode"]) == ("alpha", 1.2, 1.8, 45.0, "passive_standby")

    # bravo counters through the API; alpha answers with a counter of its own in the UI.
    federation["bravo"].counter(1, 1.5, 2.0, 45)
    page.get_by_role("button", name="Counter contract #1").click()
    counter = page.locator("#counter-form")
    expect(counter.get_by_label("Price min")).to_be_focused()
    expect(counter.get_by_label("Price min")).to_have_value("1.5")
    counter.get_by_label("Price min").fill("1.3")
    counter.get_by_role("button", name="Send counter-proposal").click()
    expect(page.locator("#contract-message")).to_have_text("Countered contract #1; it waits for bravo.")
    stored = federation.operator.contract(1)
    assert (stored["state"], stored["price_min"], stored["price_max"], stored["awaiting"]) == ("countered", 1.3, 2.0, "bravo")

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Terminate contract #1").click()
    expect(page.locator("#contract-message")).to_have_text("Contract #1 is now terminated.")
    assert federation.operator.contract(1)["state"] == "terminated"
    expect(contract_row(page, 1)).to_contain_text("terminated")


def test_refusals_are_shown_as_the_registry_words_them(federation, page):
    federation.add("alpha", "bravo", "charlie")
    federation.contract("alpha", "bravo")
    sign_in(page, federation.url, federation.keys["alpha"])
    go(page, "Contracts")
    form = page.locator("#propose-form")

    def propose(counterparty: str, price_min: str, price_max: str) -> None:
        form.get_by_label("Counterparty").select_option(counterparty)
        form.get_by_label("Price min").fill(price_min)
        form.get_by_label("Price max").fill(price_max)
        form.get_by_label("Min duration (s)").fill("30")
        form.get_by_role("button", name="Propose").click()

    def api_refusal(counterparty: str, price_min: float, price_max: float) -> RegistryError:
        with pytest.raises(RegistryError) as refused:
            federation["alpha"].propose(counterparty, price_min, price_max, 30)
        return refused.value

    propose("bravo", "1", "2")
    expected = api_refusal("bravo", 1, 2)
    assert expected.status == 409
    expect(page.locator("#contract-error")).to_have_text(f"Refused (409): {expected.detail}")
    expect(page.locator("#contract-message")).to_have_text("")

    propose("charlie", "3", "1")
    expected = api_refusal("charlie", 3, 1)
    assert expected.status == 422
    expect(page.locator("#contract-error")).to_have_text(f"Refused (422): {expected.detail}")
    assert federation.operator.contracts(participant="charlie") == []


def test_a_participant_sees_only_what_it_may_see(federation, page):
    federation.add("alpha", "bravo", "charlie")
    federation.contract("alpha", "bravo")
    federation.contract("bravo", "charlie")
    task = federation["bravo"].register_task("conn-p0", load=0.2)
    offer = federation["bravo"].offer(2, [task["id"]], 1.5)
    federation["charlie"].accept_offer(offer["id"])
    sign_in(page, federation.url, federation.keys["alpha"])

    go(page, "Contracts")
    rows = page.locator("#contracts-table tbody tr")
    expect(rows).to_have_count(1)
    expect(rows).to_contain_text("alpha → bravo")
    go(page, "Tasks & movements")
    expect(page.locator("#movement-timeline")).to_contain_text("No movements yet.")
    go(page, "Ledger")
    expect(page.locator("#ledger-balances")).to_contain_text("No payments yet.")
    go(page, "Record")
    expect(page.locator("#events-list")).to_contain_text("alpha proposed contract #1 to bravo")
    expect(page.locator("#events-list")).not_to_contain_text("charlie accepted")


def test_a_movement_appears_live_while_the_federation_runs(federation, page):
    federation.add("alpha", "bravo")
    contract = federation.contract("alpha", "bravo", 1.0, 2.0, duration=1.0)
    task = federation["alpha"].register_task("conn-p3", load=0.25)
    sign_in(page, federation.url, federation.registry.admin_key)
    go(page, "Tasks & movements")
    expect(page.locator("#movement-timeline")).to_contain_text("No movements yet.")
    mark_page(page)

    # The federation's registry side of one BPM step: alpha offers, bravo accepts.
    federation["alpha"].heartbeat("alpha", {"load": 0.95, "threshold": 0.7, "tasks": [{"task_id": task["id"], "load": 0.25}]})
    offer = federation["alpha"].offer(contract["id"], [task["id"]], 1.6)
    accepted = federation["bravo"].accept_offer(offer["id"])
    movement_id = accepted["movements"][0]

    rows = page.locator("#movements-table tbody tr")
    expect(rows).to_have_count(1)
    expect(rows).to_contain_text(f"#{movement_id}")
    expect(rows).to_contain_text("alpha → bravo")
    expect(rows).to_contain_text("conn-p3")
    expect(rows).to_contain_text("1.6")
    expect(rows).to_contain_text("active")
    expect(page.locator("#movement-timeline svg g.move.active")).to_have_count(1)
    expect(page.locator("#movement-timeline")).to_contain_text("@ 1.6")
    expect(page.locator("#tasks-table tbody tr").filter(has_text="conn-p3")).to_contain_text("bravo")
    expect(page.locator("#tasks-table tbody tr").filter(has_text="conn-p3")).to_contain_text("away")
    expect(page.locator("#offers-table tbody tr")).to_contain_text("accepted")

    go(page, "Ledger")
    balances = page.locator("#ledger-balances tbody tr")
    expect(balances).to_have_count(2)
    expect(balances.filter(has_text="alpha").locator("td.neg")).to_have_count(1)
    expect(balances.filter(has_text="bravo").locator("td.pos")).to_have_count(1)

    # After the minimum duration the origin ends it: the page follows without a reload.
    deadline = time.monotonic() + 10
    while True:
        try:
            federation["alpha"].end_movement(movement_id)
            break
        except RegistryError as exc:
            if exc.status != 409 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    go(page, "Tasks & movements")
    expect(rows).to_contain_text("ended")
    expect(page.locator("#movement-timeline svg g.move.ended")).to_have_count(1)
    expect(page.locator("#tasks-table tbody tr").filter(has_text="conn-p3")).not_to_contain_text("away")
    assert_not_reloaded(page)


def test_tasks_a_split_made_show_where_they_came_from_and_the_split_task_ends_then_retires(federation, page):
    federation.add("alpha")
    alpha = federation["alpha"]
    whole = alpha.register_task("g", input_uri="nats://127.0.0.1:4222/alpha")
    sign_in(page, federation.url, federation.registry.admin_key)
    go(page, "Tasks & movements")
    mark_page(page)
    half = alpha.register_task(f"g0-{whole['id']}", input_uri="nats://127.0.0.1:4222/alpha/0", from_tasks=[whole["id"]], since_s=600)
    rows = page.locator("#tasks-table tbody tr")
    expect(rows.filter(has_text=half["name"])).to_contain_text(f"#{whole['id']} from 600")
    expect(rows.filter(has_text=f"#{whole['id']} g")).to_contain_text("ends at 600")
    alpha.retire_task(whole["id"])
    expect(rows.filter(has_text=f"#{whole['id']} g")).to_contain_text("retired")
    assert_not_reloaded(page)


def test_ha_view_shows_the_registrys_replicas_and_an_empty_failover_record(federation, page):
    federation.add("alpha", "bravo")
    proposed = federation["alpha"].propose("bravo", 1.0, 2.0, 30, ha_mode="active_standby")
    federation["bravo"].contract_action(proposed["id"], "accept")  # a replica lives only at a contract partner
    task = federation["alpha"].register_task("conn-p0")
    federation["alpha"].create_replica(task["id"], "bravo", role="passive_standby")
    sign_in(page, federation.url, federation.registry.admin_key)
    go(page, "HA")
    rows = page.locator("#ha-replicas tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("alpha.conn-p0")
    expect(rows.first).to_contain_text("passive_standby")
    expect(page.locator("#ha-failovers")).to_contain_text("No failovers recorded.")
    expect(page.locator("#ha-asked")).to_contain_text("Contract #1 alpha – bravo (active) asks for active_standby.")


def test_ha_view_shows_records_when_the_registry_serves_them(federation, page):
    # Stands in for the registry's future HA endpoints, to check how their answers are shown.
    replicas = [
        {"task_id": 7, "mode": "passive_standby", "host": "bravo", "replica_at": "charlie"},
        {"task_id": 3, "mode": "active_standby", "host": "alpha", "replica_at": "bravo"},
    ]
    page.route("**/api/v1/replicas", lambda route: route.fulfill(status=200, content_type="application/json", body=json.dumps(replicas)))
    page.route("**/api/v1/failovers", lambda route: route.fulfill(status=200, content_type="application/json", body="[]"))
    federation.add("alpha")
    sign_in(page, federation.url, federation.registry.admin_key)
    go(page, "HA")
    rows = page.locator("#ha-replicas tbody tr")
    expect(rows).to_have_count(2)
    expect(rows.first).to_contain_text("3")  # sorted by task
    expect(rows.first).to_contain_text("active_standby")
    expect(rows.nth(1)).to_contain_text("charlie")
    expect(page.locator("#ha-replicas thead")).to_contain_text("replica at")
    expect(page.locator("#ha-failovers")).to_contain_text("No failovers recorded.")


def test_everything_works_from_the_keyboard(federation, page):
    federation.add("alpha", "bravo")
    cid = federation["alpha"].propose("bravo", 1.0, 1.5, 60)["id"]
    page.goto(federation.url + "/")
    expect(page.get_by_label("API key")).to_be_focused()
    page.keyboard.type(federation.keys["bravo"])
    page.keyboard.press("Enter")
    expect(page.locator("#who")).to_have_text("Signed in as bravo (participant)")

    def tab_to(predicate: str, limit: int = 60) -> None:
        for _ in range(limit):
            page.keyboard.press("Tab")
            if page.evaluate(f"(() => {{ const e = document.activeElement; return {predicate}; }})()"):
                return
        raise AssertionError(f"Tab never reached an element where {predicate}")

    tab_to("e.textContent === 'Contracts' && e.tagName === 'A'")
    page.keyboard.press("Enter")
    expect(page.locator("#view-contracts")).to_be_visible()
    # The view lists its contracts once its request answers: tab through it once they are there.
    expect(page.get_by_label(f"Accept contract #{cid}")).to_be_visible()
    tab_to(f"e.getAttribute('aria-label') === 'Accept contract #{cid}'")
    page.keyboard.press("Enter")
    expect(page.locator("#contract-message")).to_have_text(f"Contract #{cid} is now active.")
    assert federation.operator.contract(cid)["state"] == "active"


def test_scales_layouts_and_formats(federation, page):
    page.goto(federation.url + "/")
    result = page.evaluate(
        """async () => {
          const c = await import('/ui/static/charts.js');
          const f = await import('/ui/static/format.js');
          const ring = c.circleLayout(4, 100, 100, 50);
          const a = {x: 0, y: 100}, b = {x: 200, y: 100}, up = {x: 100, y: 0}, down = {x: 100, y: 200};
          const curves = [
            {a, b, c: {x: 100, y: 100}, w: 80, h: 16},
            {a: up, b: down, c: {x: 100, y: 100}, w: 80, h: 16},
          ];
          return {
            ticks: c.ticks(0, 1, 4),
            ticksOdd: c.ticks(0, 0.73, 4),
            timeTicks: c.timeTicks(Date.UTC(2026, 0, 1, 12, 0, 10), Date.UTC(2026, 0, 1, 12, 15, 0), 5).length,
            ring: ring.map((p) => [Math.round(p.x), Math.round(p.y)]),
            labels: c.placeLabels(curves, [], 0),
            levels: [c.loadLevel(0.8, 0.7), c.loadLevel(0.65, 0.7), c.loadLevel(0.2, 0.7), c.loadLevel(null, 0.7)],
            prices: [f.price(1.23456), f.price(2), f.priceRange(1, 1), f.priceRange(0.5, 0.75)],
            durations: [f.duration(4.25), f.duration(59.6), f.duration(600), f.duration(7200)],
            refusals: [f.refusal(409, {detail: 'taken'}), f.refusal(422, {detail: [{}], message: 'price: bad'}), f.refusal(502, null)],
          };
        }"""
    )
    assert result["ticks"] == [0, 0.5, 1]
    assert result["ticksOdd"] == [0, 0.2, 0.4, 0.6]
    assert 3 <= result["timeTicks"] <= 5
    assert result["ring"] == [[100, 50], [150, 100], [100, 150], [50, 100]]
    (x1, y1), (x2, y2) = [(p["x"], p["y"]) for p in result["labels"]]
    assert (x1, y1) == (100, 100)  # the first label takes the middle
    assert abs(x2 - x1) >= 80 or abs(y2 - y1) >= 16, "crossing lines' labels overlap"
    assert result["levels"] == ["over", "near", "ok", "unknown"]
    assert result["prices"] == ["1.235", "2", "1", "0.5 – 0.75"]
    assert result["durations"] == ["4.3 s", "60 s", "10 min", "2.0 h"]
    assert result["refusals"] == ["taken", "price: bad", "the registry answered 502"]


def _list_reads(requests: list[str]) -> dict[str, int]:
    """How often each list was read, by path, from the URLs the page requested."""
    from urllib.parse import urlparse

    counts: dict[str, int] = {}
    for url in requests:
        path = urlparse(url).path
        if path.startswith("/api/v1/") and path != "/api/v1/changes/stream":
            counts[path] = counts.get(path, 0) + 1
    return counts


@contextmanager
def _quiet_feed(url: str, key: str) -> Iterator[Callable[[], None]]:
    """Follows the registry's change feed beside the page: `quiet()` returns at its next
    keepalive, the event it sends when it has looked for changes for 5 s and found none."""
    with httpx.Client(base_url=url, timeout=15.0) as client, \
            client.stream("GET", "/api/v1/changes/stream", headers={"Authorization": f"Bearer {key}"}) as response:
        response.raise_for_status()
        lines = response.iter_lines()

        def quiet() -> None:
            if not any(line == "event: time" for line in lines):
                raise AssertionError("the change feed ended before a keepalive")

        yield quiet


def test_the_page_follows_the_change_feed_instead_of_polling(federation, page):
    federation.add("alpha", "bravo")
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    sign_in(page, federation.url, federation.registry.admin_key)
    go(page, "Contracts")
    expect(page.locator("#contracts-table")).to_contain_text("No contracts yet.")
    assert any(url.endswith("/api/v1/changes/stream") for url in requests), "it follows the feed"
    with _quiet_feed(federation.url, federation.registry.admin_key) as quiet:
        quiet()  # the page's first reads are over
        page.evaluate("0")  # hands over the requests the page made meanwhile
        settled = _list_reads(requests)
        quiet()  # nothing changed for 5 s: nothing is read again (a poll every 2 s would read every list twice)
        page.evaluate("0")
        assert _list_reads(requests) == settled
    proposal = federation["alpha"].propose("bravo", 1.0, 1.5, 60)
    expect(contract_row(page, proposal["id"])).to_contain_text("proposed")
    after = _list_reads(requests)
    assert after["/api/v1/contracts"] == settled["/api/v1/contracts"] + 1, (settled, after)
    assert after.get("/api/v1/tasks") == settled.get("/api/v1/tasks"), "a contract changes no task"


def test_a_key_revoked_while_the_page_follows_the_feed_signs_it_out(federation, page):
    federation.add("alpha")
    sign_in(page, federation.url, federation.keys["alpha"])
    expect(page.locator("#participants-table")).to_contain_text("alpha")
    federation.operator.revoke_key("alpha")
    expect(page.locator("#signin-error")).to_have_text("The registry no longer accepts this key: invalid API key.")
    assert page.evaluate("sessionStorage.length") == 0


def test_long_lists_come_in_pages(federation, page):
    names = [f"p{k:02d}" for k in range(57)]
    federation.add("alpha", "bravo", *names)
    contract = federation.contract("alpha", "bravo")
    task = federation["alpha"].register_task("conn-p0", load=0.1)
    for _ in range(53):  # 53 offers, one pending at a time
        federation["alpha"].withdraw_offer(federation["alpha"].offer(contract["id"], [task["id"]], 1.5)["id"])
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    sign_in(page, federation.url, federation.registry.admin_key)

    rows = page.locator("#participants-table tbody tr")
    expect(rows).to_have_count(50)
    pages = page.get_by_role("navigation", name="Pages of Participants")
    expect(pages).to_contain_text("1–50 of 59")
    expect(pages.get_by_role("button", name="Previous")).to_be_disabled()
    expect(page.locator("#load-charts figure")).to_have_count(50)
    pages.get_by_role("button", name="Next").click()
    expect(rows).to_have_count(9)
    expect(pages).to_contain_text("51–59 of 59")
    expect(page.locator("#load-charts figure")).to_have_count(9)
    expect(pages.get_by_role("button", name="Next")).to_be_disabled()

    # Offers are read from the registry a page at a time, newest first.
    go(page, "Tasks & movements")
    offers = page.locator("#offers-table tbody tr")
    expect(offers).to_have_count(50)
    expect(offers.first).to_contain_text("#53")
    offer_pages = page.get_by_role("navigation", name="Pages of Offers")
    expect(offer_pages).to_contain_text("1–50 of 53")
    offer_pages.get_by_role("button", name="Next").click()
    expect(offers).to_have_count(3)
    expect(offers.last).to_contain_text("#1")
    assert any("/api/v1/offers?limit=50&offset=50&descending=true" in url for url in requests), "the second page, from the registry"
    assert not any(url.endswith("/api/v1/offers") for url in requests), "never the whole list"
