#!/usr/bin/env bash
# Make sure the browser test has a Chromium or Chrome (tools/find_browser.py says which), and a
# font with Chinese characters for the Chinese edition's pages (fc-list :lang=zh).
# When there is no browser: on Debian, install Debian's chromium; elsewhere (Ubuntu's chromium
# is a snap, which does not run in containers or CI), download Playwright's own Chromium. If
# that fails too, say in one line what was looked for and how to get one. When there is no
# Chinese font: on Debian, install fonts-noto-cjk; elsewhere, say how to get one.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PY:-.venv/bin/python}
debian() { [ -r /etc/os-release ] && grep -qx 'ID=debian' /etc/os-release && command -v apt-get >/dev/null; }
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
updated=""
apt_install() {
    [ -n "$updated" ] || { $sudo apt-get update -qq; updated=1; }
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}
if ! "$py" tools/find_browser.py >/dev/null 2>&1; then
    if debian; then
        apt_install chromium
    else
        "$py" -m playwright install chromium >&2 || true
    fi
    "$py" tools/find_browser.py >/dev/null
fi
if ! { command -v fc-list >/dev/null && [ -n "$(fc-list :lang=zh family)" ]; }; then
    if debian; then
        apt_install fonts-noto-cjk
    else
        echo "ensure_chromium.sh: no font with Chinese characters (fc-list :lang=zh): install" \
             "Noto Sans CJK (fonts-noto-cjk on Debian and Ubuntu)" >&2
        exit 1
    fi
fi
