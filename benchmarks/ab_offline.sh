#!/bin/bash
# Alternating A/B of `jaxgen bench offline` between two checkouts, for a machine whose speed
# drifts by tens of percent over minutes: each round runs every mode on A, then on B.
#
#   git worktree add /tmp/base <rev>          # A: the commit to compare against
#   bash benchmarks/ab_offline.sh /tmp/base . 2 -- --input-len 64 --mixed-outputs 32,64,128 \
#       --num-prompts 64 --max-model-len 512 --kv-cache-memory 1073741824
#
# Modes: paged (page 16) and dynamic (batch 4), or MODES="paged;continuous" style overrides.
# Prints one line per run: side (A/B) and checkout, mode, round, seconds, output tok/s, mean
# step ms, compiles.
set -euo pipefail
a=$(cd "$1" && pwd)
b=$(cd "$2" && pwd)
rounds=$3
shift 4  # the three arguments and "--"
IFS=';' read -ra modes <<< "${MODES:-paged --page-size 16;dynamic --batch-size 4}"
out=${OUT:-$(mktemp -d)}
for round in $(seq "$rounds"); do
  for side in A B; do
    if [ "$side" = A ]; then checkout=$a; else checkout=$b; fi
    for mode in "${modes[@]}"; do
      # A/B prefix: comparing a checkout with itself (`. .`) keeps both runs' results.
      name=$side-$(basename "$checkout")-${mode%% *}-r$round
      # shellcheck disable=SC2086
      PYTHONPATH=$checkout python -m jaxgen bench offline "$@" --quiet --batching $mode \
        --out "$out/$name" > /dev/null 2>&1
      python - "$out/$name/results.json" "$name" <<'EOF'
import json
import sys

row = json.load(open(sys.argv[1]))["rows"][1]
print(sys.argv[2], round(row["seconds"], 1), round(row["output_tok_s"], 1),
      round(row["mean_step_ms"], 1), row["compiles"])
EOF
    done
  done
done
