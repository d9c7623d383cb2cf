#!/usr/bin/env bash
# Debian packages the tests need: Chromium for the admin UI's browser tests, and
# docker-compose to validate docker-compose.yml. Safe to repeat: installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-browser.sh
if ! command -v docker-compose >/dev/null; then
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "install-system-deps: installing docker-compose from Debian's packages" >&2
    export DEBIAN_FRONTEND=noninteractive
    if ! $SUDO apt-get install -y --no-install-recommends docker-compose; then
        $SUDO apt-get update
        $SUDO apt-get install -y --no-install-recommends docker-compose
    fi
fi
