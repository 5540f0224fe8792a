"""Find a Chromium or Chrome for the browser tests: the first one present that is not a snap.

    python tools/find_browser.py    # prints its path, or one line saying what was looked for

Looked for, in order: $BOOK_BROWSER (a path), Google Chrome and Chromium on PATH (Chrome first:
GitHub's Ubuntu runners have it, and their non-snap Chromium fails over sandbox settings,
actions/runner-images#12096), then Playwright's own Chromium (`python -m playwright install
chromium`, in $PLAYWRIGHT_BROWSERS_PATH or ~/.cache/ms-playwright). A command that only
forwards to a snap (Ubuntu's transitional `chromium` package) is skipped: snaps do not run in
containers or CI. Tests import `find_browser` from here (tests/test_browser.py and others).
"""

import os
import shutil
import sys
from pathlib import Path

NAMES = ("google-chrome", "google-chrome-stable", "chrome", "chromium", "chromium-browser")
PLAYWRIGHT_GLOBS = ("chromium-*/chrome-linux*/chrome", "chromium_headless_shell-*/*/chrome-*shell")


class BrowserNotFound(RuntimeError):
    """No usable Chromium or Chrome; the message says what was looked for and how to get one."""


def is_snap(path: Path) -> bool:
    """A snap, or a small script that only starts one."""
    real = path.resolve()
    if real.parts[:2] == ("/", "snap"):
        return True
    try:
        if real.stat().st_size > 100_000:  # a browser binary, not a wrapper script
            return False
        return b"/snap/" in real.read_bytes()
    except OSError:
        return True


def playwright_browsers() -> list[Path]:
    """Playwright's downloaded Chromium builds, newest first."""
    root = Path(os.environ.get("PLAYWRIGHT_BROWSERS_PATH") or Path.home() / ".cache" /
                "ms-playwright")
    found = [path for pattern in PLAYWRIGHT_GLOBS for path in root.glob(pattern)]
    return sorted(found, key=lambda p: p.as_posix(), reverse=True)


def find_browser() -> str:
    """The path of the first usable Chromium or Chrome; BrowserNotFound when there is none."""
    override = os.environ.get("BOOK_BROWSER")
    if override:
        if not (Path(override).is_file() and os.access(override, os.X_OK)):
            raise BrowserNotFound(f"BOOK_BROWSER={override} is not an executable file")
        return override
    candidates = [Path(p) for p in map(shutil.which, NAMES) if p is not None]
    candidates += playwright_browsers()
    for path in candidates:
        if os.access(path, os.X_OK) and not is_snap(path):
            return str(path)
    raise BrowserNotFound(
        f"no Chromium or Chrome found: looked for $BOOK_BROWSER, {', '.join(NAMES)} on PATH "
        "(snaps skipped) and Playwright's Chromium; install one (apt-get install chromium on "
        "Debian, Google Chrome, or `python -m playwright install chromium`)"
    )


def main() -> None:
    try:
        print(find_browser())
    except BrowserNotFound as err:
        sys.exit(f"find_browser.py: {err}")


if __name__ == "__main__":
    main()
