#!/usr/bin/env bash
# Debian packages the tests need: Chromium for the admin UI's browser tests,
# docker-compose to validate docker-compose.yml, nats-server (each participant's
# broker), iproute2's `ip` and util-linux's `nsenter` (the hosts' network namespaces).
# Safe to repeat: installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-browser.sh
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
for wanted in docker-compose:docker-compose nats-server:nats-server ip:iproute2 nsenter:util-linux; do
    command="${wanted%%:*}" package="${wanted##*:}"
    PATH="$PATH:/usr/sbin" command -v "$command" >/dev/null && continue
    echo "install-system-deps: installing $package from Debian's packages" >&2
    if ! $SUDO apt-get install -y --no-install-recommends "$package"; then
        $SUDO apt-get update
        $SUDO apt-get install -y --no-install-recommends "$package"
    fi
done
