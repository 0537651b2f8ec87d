#!/usr/bin/env bash
# Runs the benchmark suite of docs/benchmarks.md on a QUIET machine (nothing else running).
# Results land in $OUT/<name>/results.{json,md} plus charts. Run from the repository root:
#
#   bash benchmarks/run_benchmarks.sh            # everything (~1-2 h on 2 CPU cores)
#   bash benchmarks/run_benchmarks.sh peers      # one part: offline, peers, compare, sweep
#
# LLAMA_BIN: folder with llama-batched-bench/llama-quantize (default: bash
# ../shared/tools/build_llamacpp.sh, which builds llama.cpp once into /tmp/lcpp).
set -euo pipefail
OUT=${OUT:-bench-results}
KV=${KV:-1073741824}  # 1 GiB KV pool: 23k tokens of SmolLM2-135M fp32 (46,080 bytes per token)
parts=${*:-offline peers compare sweep}

for part in $parts; do
  case $part in
    offline)  # the "64 chat prompts" workload, 64 output tokens, paged (default) batching
      jaxgen bench offline --chat --num-prompts 64 --output-len 64 --kv-cache-memory "$KV" \
        --max-model-len 512 --out "$OUT/offline-chat64"
      ;;
    peers)  # same workload through transformers and llama.cpp, jaxgen paged as the reference
      bin=${LLAMA_BIN:-$(bash ../shared/tools/build_llamacpp.sh | tail -1)}
      jaxgen bench peers --chat --num-prompts 64 --output-len 64 --kv-cache-memory "$KV" \
        --max-model-len 512 --peer-batch-size 32 --llama-cpp-bin "$bin" \
        --out "$OUT/peers-chat64"
      ;;
    compare)  # batching strategies, one shared model and KV budget; one scenario per command
      for scenario in 1 2 3; do  # so each writes its results (all three: ~45 min on 2 cores)
        jaxgen bench compare --modes none,static,dynamic,continuous,paged --scenario "$scenario" \
          --num-prompts 64 --max-model-len 512 --max-rolling-batch-size 64 --batch-size 4 \
          --max-batch-delay 0.1 --request-rate 2 --out "$OUT/compare-s$scenario"
      done
      ;;
    sweep)  # closed-loop concurrency sweep, in process
      jaxgen bench sweep --concurrency 1,2,4,8,16,32,64 --input-len 128 --output-len 64 \
        --num-prompts 64 --kv-cache-memory "$KV" --max-model-len 512 --out "$OUT/sweep"
      ;;
    *)
      echo "unknown part: $part (offline, peers, compare, sweep)" >&2
      exit 2
      ;;
  esac
done
