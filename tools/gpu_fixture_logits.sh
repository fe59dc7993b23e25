#!/usr/bin/env bash
# Runs `clawmine logits --device cuda` on every committed golden fixture, whole
# and in chunks of 1 and 7 tokens, and compares each output with transformers'
# logits (tools/compare_logits.py: max|Δ| ≤ tol of max|logit|, argmax ≥ 95%).
# Prints one line per run and a final count; exits 1 when a run failed to
# produce logits (a tolerance miss is reported, not fatal: the summary says it).
# Usage: tools/gpu_fixture_logits.sh BIN OUTDIR [TOL]
set -uo pipefail
BIN=$1 OUT=$2 TOL=${3:-0.03}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
runs=0 errors=0 misses=0
for d in "$ROOT"/tests/data/golden/* "$ROOT"/tests/data/golden_quant_*; do
  [ -f "$d/expected.safetensors" ] || continue
  name=$(basename "$d")
  tokens=$(python3 "$ROOT/tools/compare_logits.py" tokens "$d") || { echo "$name: cannot read tokens"; errors=$((errors + 1)); continue; }
  for chunk in all 1 7; do
    args=()
    [ "$chunk" = all ] || args=(--chunk "$chunk")
    o="$OUT/$name.chunk-$chunk.safetensors"
    runs=$((runs + 1))
    if ! "$BIN" logits --device cuda -m "$d" --tokens "$tokens" "${args[@]}" -o "$o" >"$OUT/$name.chunk-$chunk.log" 2>&1; then
      echo "$name chunk $chunk: clawmine failed: $(tail -1 "$OUT/$name.chunk-$chunk.log")"
      errors=$((errors + 1))
      continue
    fi
    echo -n "chunk $chunk: "
    python3 "$ROOT/tools/compare_logits.py" check "$d" "$o" --tol "$TOL" || misses=$((misses + 1))
    rm -f "$o"
  done
done
echo "fixture logits: $runs runs, $errors failed to run, $misses outside the tolerance"
[ "$errors" -eq 0 ]
