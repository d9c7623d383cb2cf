"""Save the admin UI's main views at 1366x800 to docs/img/ui-*.png.

Usage: `.venv/bin/python -m tests.api.ui.screenshots [OUT_DIR]` (default docs/img). The
data come from the scenario in `tests/api/ui/federation.py`, played through the API.
"""

from __future__ import annotations

import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console

from tests.api.ui.browser import VIEWPORT, launch, sign_in
from tests.api.ui.federation import SteppedClock, in_process_registry, play

DURATION_S = 1800.0

# (file name, view, key holder, element whose content must have rendered first)
SHOTS = [
    ("ui-participants.png", "participants", "operator", "#load-charts svg"),
    ("ui-contracts.png", "contracts", "operator", "#contract-graph svg"),
    ("ui-movements.png", "movements", "operator", "#movement-timeline svg"),
    ("ui-ledger.png", "ledger", "operator", "#ledger-balances table"),
    ("ui-ha.png", "ha", "operator", "#ha-failovers .empty"),
    ("ui-events.png", "events", "operator", "#events-list li"),
    ("ui-contracts-participant.png", "contracts", "delta", "#contracts-table button"),
]


def capture(out_dir: Path, browser, console: Console | None = None, duration_s: float = DURATION_S) -> list[Path]:
    """Play `duration_s` of the scenario, then photograph the sign-in page and every view in SHOTS; returns the files."""
    console = console or Console(stderr=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    # The scenario ends at the real present, so the page's local times read naturally.
    clock = SteppedClock(datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=duration_s))
    saved = []
    with tempfile.TemporaryDirectory() as work, in_process_registry(Path(work), clock) as registry:
        with console.status(f"playing {duration_s / 60:.0f} simulated minutes of a federation through the API"):
            keys = play(registry.url, clock, duration_s)
        keys["operator"] = registry.admin_key
        with console.status("taking screenshots"):
            page = browser.new_page(viewport=VIEWPORT)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(registry.url + "/")
            saved.append(_shot(page, out_dir / "ui-signin.png"))
            holder = None
            for name, view, who, ready in SHOTS:
                if who != holder:
                    if holder is not None:
                        page.get_by_role("button", name="Sign out").click()
                    sign_in(page, registry.url, keys[who])
                    holder = who
                page.get_by_role("link", name=_link_text(view)).click()
                page.locator(ready).first.wait_for()
                saved.append(_shot(page, out_dir / name))
            page.close()
            if errors:
                raise RuntimeError(f"the page raised errors: {errors}")
    for path in saved:
        console.print(f"saved {path}")
    return saved


def _link_text(view: str) -> str:
    return {"participants": "Participants", "contracts": "Contracts", "movements": "Tasks & movements", "ledger": "Ledger", "ha": "HA", "events": "Record"}[view]


def _shot(page, path: Path) -> Path:
    page.mouse.move(0, 0)  # no hover highlight in the picture
    page.screenshot(path=str(path))
    return path


def main() -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            capture(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/img"), browser)
        finally:
            browser.close()


if __name__ == "__main__":
    main()
