#!/usr/bin/env bash
# The test command: sets up .venv, then runs the whole suite.
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not slow"`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
scripts/install-system-deps.sh
exec .venv/bin/python -m pytest "$@"
