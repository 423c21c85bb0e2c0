#!/usr/bin/env bash
# Paired runs of one benchmark: this tree against an older revision's worktree, alternating.
#
# For benchmarks without a --compare option. Each side runs its OWN copy of the benchmark
# with its OWN rls code (module paths differ between revisions): the base side with
# PYTHONPATH=<base worktree>, which comes before this venv's editable install, so the rls
# imported in-process and every `python -m rls` the benchmark spawns are the base's code.
# Rounds alternate the order (new,old then old,new ...) so both sides see the same machine
# noise. Each run's stdout and its results JSON are kept in OUTDIR as {new,old}-<round>.*
#
#     git worktree add /tmp/base-b8411f1 b8411f1
#     benchmarks/paired_rev.sh /tmp/base-b8411f1 3 /tmp/out -- quota_candidates.py --quick
set -euo pipefail
base=$1 rounds=$2 out=$3
shift 3
[[ $1 == -- ]] && shift
script=$1
shift
args=("$@")
tree=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python}
mkdir -p "$out"

run() {  # run SIDE ROUND
    local side=$1 round=$2 root
    if [[ $side == new ]]; then root=$tree; else root=$base; fi
    echo "== $side round $round: $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    if [[ $side == new ]]; then
        (cd "$root" && "$python" -c 'import rls; print("rls from", rls.__file__)')
        (cd "$root" && "$python" "benchmarks/$script" "${args[@]}") >"$out/$side-$round.txt" 2>&1
    else
        (cd "$root" && PYTHONPATH="$root" "$python" -c 'import rls; print("rls from", rls.__file__)')
        (cd "$root" && PYTHONPATH="$root" "$python" "benchmarks/$script" "${args[@]}") \
            >"$out/$side-$round.txt" 2>&1
    fi
    local json
    json=$(sed -n 's/^results: //p' "$out/$side-$round.txt" | tail -1)
    [[ -n $json ]] && cp "$root/$json" "$out/$side-$round.json"
    tail -n 3 "$out/$side-$round.txt"
}

for ((i = 1; i <= rounds; i++)); do
    if ((i % 2)); then order="new old"; else order="old new"; fi
    for side in $order; do run "$side" "$i"; done
done
