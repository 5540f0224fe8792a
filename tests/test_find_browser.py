"""tools/find_browser.py: which Chromium or Chrome the browser tests drive, or why there is none."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from find_browser import BrowserNotFound, find_browser  # noqa: E402


def fake_browser(path: Path, text: str = "#!/bin/sh\necho fake browser\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def nothing_installed(tmp_path, monkeypatch):
    """An empty PATH and an empty Playwright folder: no browser anywhere."""
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("PLAYWRIGHT_BROWSERS_PATH", str(tmp_path / "ms-playwright"))
    monkeypatch.delenv("BOOK_BROWSER", raising=False)
    return tmp_path


def test_find_browser_picks_google_chrome_when_it_is_the_only_one_on_path(nothing_installed):
    chrome = fake_browser(nothing_installed / "bin" / "google-chrome")
    assert find_browser() == str(chrome)


def test_find_browser_prefers_chrome_to_chromium(nothing_installed):
    fake_browser(nothing_installed / "bin" / "chromium")
    chrome = fake_browser(nothing_installed / "bin" / "google-chrome-stable")
    assert find_browser() == str(chrome)


def test_find_browser_skips_a_wrapper_that_only_starts_a_snap(nothing_installed):
    fake_browser(nothing_installed / "bin" / "chromium-browser",
                 "#!/bin/sh\nexec /snap/bin/chromium \"$@\"\n")
    with pytest.raises(BrowserNotFound):
        find_browser()


def test_find_browser_finds_playwrights_own_chromium(nothing_installed):
    chrome = fake_browser(
        nothing_installed / "ms-playwright" / "chromium-1200" / "chrome-linux" / "chrome")
    assert find_browser() == str(chrome)


def test_find_browser_takes_book_browser_first_and_rejects_a_bad_one(nothing_installed,
                                                                      monkeypatch):
    fake_browser(nothing_installed / "bin" / "google-chrome")
    mine = fake_browser(nothing_installed / "mine" / "browser")
    monkeypatch.setenv("BOOK_BROWSER", str(mine))
    assert find_browser() == str(mine)
    monkeypatch.setenv("BOOK_BROWSER", str(nothing_installed / "missing"))
    with pytest.raises(BrowserNotFound, match="BOOK_BROWSER=.*missing is not an executable"):
        find_browser()


def test_find_browser_without_any_browser_says_in_one_line_what_it_looked_for(
    nothing_installed
):
    with pytest.raises(BrowserNotFound) as error:
        find_browser()
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("no Chromium or Chrome found: looked for $BOOK_BROWSER, "
                              "google-chrome, ")
    assert "Playwright's Chromium" in message and "apt-get install chromium" in message
