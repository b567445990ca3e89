"""Debian's Chromium, headless, driven by Playwright (the `playwright` package's driver, no browser download):
the rollout viewer's browser tests. `chromium_page()` yields a page that records console errors and page errors;
without /usr/bin/chromium (`apt-get install chromium`, which `.ci/run` does as root) the tests skip and say so."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

CHROMIUM = "/usr/bin/chromium"
# As the machine's own check starts it: no sandbox (root), and none of the background connections a closed network
# refuses (they would show as console noise, not as the page's errors).
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


@contextmanager
def chromium_page(width: int = 1400, height: int = 900) -> Iterator[tuple[object, list[str]]]:
    """(page, errors): a fresh headless Chromium page and the console errors and uncaught exceptions it records."""
    if shutil.which(CHROMIUM) is None:
        pytest.skip(f"needs Debian's chromium at {CHROMIUM} (apt-get install chromium; .ci/run installs it as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package (a dev dependency)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            errors: list[str] = []
            page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
            page.on("pageerror", lambda error: errors.append(str(error)))
            yield page, errors
        finally:
            browser.close()


def open_page(page, url: str) -> None:
    """Go to `url` and wait until the viewer has rendered (it marks <html data-ready>)."""
    page.goto(url)
    page.wait_for_selector("html[data-ready='1']", timeout=10_000)
