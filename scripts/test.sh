#!/usr/bin/env bash
# The test command. Sets up .venv and the Debian packages the tests need, then:
#
#   scripts/test.sh            the tier every change must pass (CI runs it): the tests that start
#                              no federation in parallel, then, alone, those that measure time or
#                              CPU and the scenario federation (`-m serial`); the second tier's
#                              tests (`-m full`) are left out
#   scripts/test.sh --full     the second tier (scripts/nightly.sh): every test, the demo series
#                              and the benchmarks with their goals; artifacts under test-results/
#   scripts/test.sh ARGS...    one pytest run of your own selection, e.g. `scripts/test.sh tests/bpm -x`
#                              or `scripts/test.sh -m "not slow" -n 2`
#
# Per-test durations: JUnit XML under test-results/ (BPM_TEST_RESULTS selects another folder)
# and, in the log, every test that took a second or more.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--full" ]; then
    shift
    exec scripts/nightly.sh "$@"
fi
scripts/bootstrap.sh
scripts/install-system-deps.sh
if [ $# -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
results="${BPM_TEST_RESULTS:-test-results}"
mkdir -p "$results"
# One more worker than CPUs: part of each test waits (for a process, a socket, a JVM to start).
workers=$(( $(nproc) + 1 ))
[ "$workers" -gt 5 ] && workers=5
started=$(date +%s)
status=0
echo "test.sh: the tests that start no federation, $workers at a time" >&2
.venv/bin/python -m pytest -m "not serial and not full" -n "$workers" --dist loadgroup \
    --junitxml="$results/parallel.xml" --durations=0 --durations-min=1.0 || status=$?
echo "test.sh: the tests that measure time or CPU and the scenario federation, one at a time" >&2
.venv/bin/python -m pytest -m "serial and not full" -p no:xdist \
    --junitxml="$results/serial.xml" --durations=0 --durations-min=1.0 || status=$?
echo "test.sh: $(( ($(date +%s) - started) / 60 )) min $(( ($(date +%s) - started) % 60 )) s of tests; JUnit XML in $results/" >&2
exit "$status"
