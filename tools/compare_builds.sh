#!/usr/bin/env bash
# Are two builds the same function? Runs `clawmine logits` with both binaries on every committed
# golden fixture and on the embedded default model (300 tokens, or the model's context if shorter),
# whole and in chunks of 1 and 7 tokens, and compares the two logits files byte for byte. For a
# refactor that must not change a bit ("a move, not a rewrite"); tools/gpu_fixture_logits.sh is the
# check against transformers instead.
# Prints one line per run and a summary; exits 1 when any pair differs or a run fails.
# Usage: tools/compare_builds.sh BIN_A BIN_B [cpu|cuda] [OUTDIR]
set -uo pipefail
A=$1 B=$2 DEV=${3:-cpu} OUT=${4:-$(mktemp -d)}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
runs=0 diffs=0 errors=0
for d in "$ROOT"/tests/data/golden/* "$ROOT"/tests/data/golden_quant_* "$ROOT"/models/default; do
  [ -f "$d/config.json" ] || continue
  name=$(basename "$d")
  tokens=$(python3 - "$d/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
n = min(300, int(c.get("max_position_embeddings", 4096)) - 1)
print(",".join(str((i * 7919 + 13) % int(c["vocab_size"])) for i in range(n)))
PY
)
  for chunk in all 1 7; do
    args=()
    [ "$chunk" = all ] || args=(--chunk "$chunk")
    runs=$((runs + 1))
    ok=1
    for side in A B; do
      bin=$A
      [ $side = B ] && bin=$B
      if ! "$bin" logits --device "$DEV" -m "$d" --tokens "$tokens" "${args[@]}" -o "$OUT/$side.safetensors" \
        >"$OUT/$side.log" 2>&1; then
        echo "$name chunk $chunk: build $side failed: $(tail -1 "$OUT/$side.log")"
        ok=0
      fi
    done
    if [ $ok = 0 ]; then
      errors=$((errors + 1))
    elif cmp -s "$OUT/A.safetensors" "$OUT/B.safetensors"; then
      echo "same  $name chunk $chunk"
    else
      echo "DIFF  $name chunk $chunk"
      diffs=$((diffs + 1))
    fi
  done
done
rm -f "$OUT/A.safetensors" "$OUT/B.safetensors"
echo "compare_builds ($DEV): $runs runs, $diffs differ, $errors failed to run"
[ $diffs -eq 0 ] && [ $errors -eq 0 ]
