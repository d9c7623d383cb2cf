"""Browser fixtures: one Chromium for this package's tests, a real registry process per test."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from bpm_http.client import RegistryClient
from tests.api.ui.browser import VIEWPORT, launch, require_chromium
from tests.registry_server import RunningRegistry, running_registry


# Package scope: Playwright's sync API keeps an event loop current in this thread while it
# runs, so it is stopped before tests outside this package run.
@pytest.fixture(scope="package")
def browser():
    require_chromium()
    from playwright.sync_api import expect, sync_playwright

    # The page reads a list again within about a second of its change; allow for a slow machine.
    expect.set_options(timeout=10_000)
    with sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()


@dataclass
class Federation:
    """A running registry and API clients for the operator and each participant added."""

    registry: RunningRegistry
    operator: RegistryClient
    members: dict[str, RegistryClient] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.registry.url

    def add(self, *names: str) -> None:
        for name in names:
            self.keys[name] = self.operator.add_participant(name, f"http://127.0.0.1:9100/{name}")["api_key"]
            self.members[name] = RegistryClient(self.url, self.keys[name])

    def __getitem__(self, name: str) -> RegistryClient:
        return self.members[name]

    def contract(self, proposer: str, counterparty: str, price_min: float = 1.0, price_max: float = 2.0, duration: float = 30.0) -> dict:
        """An active contract between the two, proposed by the first and accepted by the second."""
        proposal = self[proposer].propose(counterparty, price_min, price_max, duration)
        return self[counterparty].contract_action(proposal["id"], "accept")


@pytest.fixture
def federation(tmp_path, browser) -> Iterator[Federation]:
    # A long heartbeat timeout: a participant that reported once stays alive for the whole test.
    with running_registry(tmp_path, extra_env={"BPM_HEARTBEAT_TIMEOUT_S": "120"}) as registry:
        operator = RegistryClient(registry.url, registry.admin_key)
        fed = Federation(registry, operator)
        try:
            yield fed
        finally:
            for client in [operator, *fed.members.values()]:
                client.close()


@pytest.fixture
def new_page(browser):
    """Open pages in fresh contexts (separate session storage, like separate people); uncaught page errors fail the test."""
    contexts, errors = [], []

    def open_page():
        context = browser.new_context(viewport=VIEWPORT)
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        return page

    yield open_page
    for context in contexts:
        context.close()
    assert not errors, f"the page raised: {errors}"


@pytest.fixture
def page(new_page):
    return new_page()
