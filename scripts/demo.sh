#!/usr/bin/env bash
# The main job: sets up .venv, then runs the local federation demo.
# Extra arguments go to `bpm demo`, e.g. `scripts/demo.sh --headless --json`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/bpm demo "$@"
