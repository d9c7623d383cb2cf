#!/usr/bin/env bash
# The second tier (`scripts/test.sh --full`): everything the CI tier leaves out, each part a
# pass/fail check, its artifacts under OUT (default test-results/nightly):
#
#   1. tests/      the whole suite: the CI tier (scripts/test.sh), then the second tier's tests
#                  (`-m full`: the full-size demo, split, failover, partition and registry-cut
#                  scenarios, the HA process tests, the demo's Ctrl-C), one at a time; JUnit XML
#   2. demo-runs/  `scripts/demo-runs.sh DEMO_RUNS` (default 5) of the phases demo, each fresh:
#                  fails unless every run loses and duplicates nothing and at least
#                  DEMO_PASS_PERCENT (default 80) % of them end every phase as meant
#                  (scripts/demo-series.py); demo-runs.md holds the table rows
#   3. bench/      the benchmarks, each `bpm bench NAME --json` with its plot where it draws
#                  one, and the registry under contention (registry-contend.json): fails when
#                  a goal its JSON reports is missed (scripts/check-goals.py)
#
# Every part runs even when one before failed; the script exits non-zero if any failed, and
# lists the artifacts at the end.
#   usage: scripts/nightly.sh [OUT]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-test-results/nightly}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
scripts/bootstrap.sh && scripts/install-system-deps.sh || exit 1
py=.venv/bin/python
bpm=.venv/bin/bpm
failed=()
started=$(date +%s)
stamp() { echo "nightly: $(( ($(date +%s) - started) / 60 )) min: $*" >&2; }

stamp "1. the test suite"
mkdir -p "$out/tests"
BPM_TEST_RESULTS="$out/tests" scripts/test.sh || failed+=("the CI tier's tests")
$py -m pytest -m full -p no:xdist --junitxml="$out/tests/full.xml" --durations=0 --durations-min=1.0 \
    --basetemp="$out/tests/tmp" || failed+=("the second tier's tests")

stamp "2. the demo series"
scripts/demo-runs.sh "${DEMO_RUNS:-5}" "$out/demo-runs" > "$out/demo-runs.md"
$py scripts/demo-series.py --pass-percent "${DEMO_PASS_PERCENT:-80}" "$out"/demo-runs/run-*/report.json || failed+=("the demo series")

stamp "3. the benchmarks"
bench="$out/bench"
mkdir -p "$bench"
run_bench() {  # NAME ARGS...: bpm bench NAME ARGS --json > bench/NAME.json
    local name=$1
    shift
    stamp "   bpm bench $name $*"
    $bpm bench "$name" "$@" --json > "$bench/$name.json" 2> "$bench/$name.log" || failed+=("bpm bench $name (exit $?, see $bench/$name.log)")
}
run_bench simulate
run_bench registry --clients 20 --rounds 10
stamp "   bpm bench registry --contend --clients 50 --rounds 10"
$bpm bench registry --contend --clients 50 --rounds 10 --json > "$bench/registry-contend.json" 2> "$bench/registry-contend.log" \
    || failed+=("bpm bench registry --contend (exit $?, see $bench/registry-contend.log)")
run_bench control-plane --agents 50 --seconds 60
run_bench view-reads
run_bench move --plot "$bench/move.png"
run_bench ha --plot "$bench/ha.png"
run_bench partition --plot "$bench/partition.png"
run_bench overhead
run_bench source
run_bench load-model --plot "$bench/load-model.png"
run_bench fixed-cost --plot "$bench/fixed-cost.png"
run_bench first-queries --prime 10
$py scripts/check-goals.py "$bench"/*.json | tee "$bench/goals.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || failed+=("the benchmarks' goals (see $bench/goals.txt)")

stamp "done; the artifacts:"
find "$out" -maxdepth 2 \( -name '*.xml' -o -name '*.json' -o -name '*.png' -o -name '*.md' -o -name '*.txt' \) -not -path '*/tmp/*' | sort
if [ ${#failed[@]} -gt 0 ]; then
    printf 'nightly: FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
echo "nightly: every part passed" >&2
