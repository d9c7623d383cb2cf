#!/usr/bin/env bash
# The main job: sets up .venv and the Debian packages the federation needs (nats-server,
# iproute2, util-linux), then runs the local federation demo.
# Extra arguments go to `bpm demo`, e.g. `scripts/demo.sh --headless --json`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/install-system-deps.sh --runtime
exec .venv/bin/bpm demo "$@"
