#!/usr/bin/env bash
# Installs Debian's Chromium for the browser tests of the admin UI (tests/api/ui/).
# Playwright drives /usr/bin/chromium directly: no Playwright browser download is needed.
# Safe to repeat: does nothing when /usr/bin/chromium is already there.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
echo "install-browser: installing chromium from Debian's packages" >&2
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may have no package lists yet: update once and retry.
if ! $SUDO apt-get install -y --no-install-recommends chromium; then
    $SUDO apt-get update
    $SUDO apt-get install -y --no-install-recommends chromium
fi
/usr/bin/chromium --version >&2
