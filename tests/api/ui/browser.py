"""Driving Debian's Chromium with Playwright for the admin UI's tests and screenshots."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import missing

CHROMIUM = Path("/usr/bin/chromium")
# Headless and quiet: no sandbox (containers), no GPU, and nothing that phones home.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1366, "height": 800}


def require_chromium() -> Path:
    """Chromium's path; a skip on a machine without it, a failure in CI where it must be installed."""
    if CHROMIUM.exists():
        return CHROMIUM
    missing(f"{CHROMIUM}: run scripts/install-browser.sh")


def launch(playwright):
    """A headless Chromium browser from Debian's package (Playwright downloads none here)."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)


def sign_in(page, url: str, key: str) -> None:
    """Open the UI and sign in with `key`, waiting until the signed-in page shows."""
    page.goto(url + "/")
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
    page.locator("#session").wait_for(state="visible")
