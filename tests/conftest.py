"""What the browser tests share: one headless Chromium or Chrome, found by tools/find_browser.py."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from find_browser import BrowserNotFound, find_browser  # noqa: E402

# Headless, as root, on a machine with no network: no sandbox, GPU or background services.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    try:
        executable = find_browser()
    except BrowserNotFound as err:
        pytest.fail(f"{err} (or run tools/ensure_chromium.sh)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
