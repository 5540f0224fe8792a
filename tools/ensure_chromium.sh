#!/usr/bin/env bash
# The browser test drives Debian's Chromium (Playwright's own browser download does not work
# offline); install it when it is missing.
set -euo pipefail
command -v chromium >/dev/null && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "the browser test needs Chromium: sudo apt-get install -y chromium" >&2
    exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
