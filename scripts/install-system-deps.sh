#!/usr/bin/env bash
# Debian packages the project needs: nats-server (each participant's broker), iproute2's
# `ip` and util-linux's `nsenter` (the hosts' network namespaces); for the tests also
# Chromium (the admin UI's browser tests), docker-compose (to validate
# docker-compose.yml) and systemd's systemd-analyze (to verify deploy/systemd's units). Safe to repeat: installs only what is missing.
#   usage: scripts/install-system-deps.sh [--runtime]   (--runtime: what running the federation needs, no test tools)
set -euo pipefail
cd "$(dirname "$0")/.."
runtime=false
[ "${1:-}" = "--runtime" ] && runtime=true
wanted="nats-server:nats-server ip:iproute2 nsenter:util-linux"
if ! $runtime; then
    scripts/install-browser.sh
    wanted="docker-compose:docker-compose systemd-analyze:systemd $wanted"
fi
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
for item in $wanted; do
    command="${item%%:*}" package="${item##*:}"
    PATH="$PATH:/usr/sbin" command -v "$command" >/dev/null && continue
    echo "install-system-deps: installing $package from Debian's packages" >&2
    if ! $SUDO apt-get install -y --no-install-recommends "$package"; then
        $SUDO apt-get update
        $SUDO apt-get install -y --no-install-recommends "$package"
    fi
done
