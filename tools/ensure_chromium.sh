#!/usr/bin/env bash
# The browser test drives Debian's Chromium (Playwright's own browser download does not work
# offline); install it when it is missing.
set -euo pipefail
command -v chromium >/dev/null && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
