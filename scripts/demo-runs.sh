#!/usr/bin/env bash
# Run `bpm demo --headless --json` N times in a row, each fresh (its own work and report
# folders under OUT), and print one Markdown table row per run (`scripts/demo-row.py`: the
# run and the checkout's commit, its time, where the time went, each phase's verdict and
# loads, A's tasks moved in phase 2, movements, tasks passed on, lost and duplicated
# results). The rows go into docs/benchmarks.md, "Demo runs". NAME=VALUE arguments after
# OUT set the demo's knobs otherwise (`scripts/demo-with.py`).
#   usage: scripts/demo-runs.sh N OUT [NAME=VALUE ...]
set -euo pipefail
runs=${1:?usage: scripts/demo-runs.sh N OUT [NAME=VALUE ...]}
out=${2:?usage: scripts/demo-runs.sh N OUT [NAME=VALUE ...]}
shift 2
here="$(cd "$(dirname "$0")" && pwd)"
bpm="$here/../.venv/bin/bpm"
mkdir -p "$out"
for i in $(seq 1 "$runs"); do
    run="$out/run-$i"
    rm -rf "$run" && mkdir -p "$run"
    echo "demo run $i of $runs: $run" >&2
    commit=$(git -C "$here" rev-parse --short HEAD)  # read at each run: the checkout is installed editable
    "$(dirname "$bpm")/python" "$here/demo-with.py" "$@" -- --headless --json --workdir "$run/work" --report "$run/report" \
        > "$run/report.json" 2> "$run/demo.log" || echo "run $i failed (exit $?); see $run/demo.log" >&2
    "$(dirname "$bpm")/python" "$here/demo-row.py" "$run/report.json" "$i | $commit${*:+ ($*)}"
done
