#!/usr/bin/env bash
# Make sure the browser test has a Chromium or Chrome (tools/find_browser.py says which).
# When there is none: on Debian, install Debian's chromium; elsewhere (Ubuntu's chromium is a
# snap, which does not run in containers or CI), download Playwright's own Chromium. If that
# fails too, say in one line what was looked for and how to get one.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PY:-.venv/bin/python}
"$py" tools/find_browser.py >/dev/null 2>&1 && exit 0
if [ -r /etc/os-release ] && grep -qx 'ID=debian' /etc/os-release && command -v apt-get >/dev/null
then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
else
    "$py" -m playwright install chromium >&2 || true
fi
"$py" tools/find_browser.py >/dev/null
