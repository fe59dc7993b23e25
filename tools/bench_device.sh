#!/usr/bin/env bash
# The speed benchmarks of docs/performance.md in one device call: clawmine on a
# synthetic V4-Flash (`clawmine bench model`, as many layers as fit) and then
# transformers in the same configuration (tools/bench_transformers.py, BF16,
# eager, Flash's first 4 layers: the first two are window-only, so 4 is the
# least that has CSA and HCA), on the same GPU. Each has a time guard; each
# writes its JSON as it goes, so a run cut short still leaves what it measured.
# Usage (from the repo root, after tools/gpu_device_build.sh build-dev):
#   tools/bench_device.sh [out-dir]      (default: $OUT, else /tmp/clawmine-bench)
# Env: BIN (default build-dev/clawmine), PY (default python3), CM_SECONDS (340),
#      HF_SECONDS (170), HF_LAYERS (4). The defaults total under 9 minutes (one
#      10-minute device call).
set -uo pipefail
DIR=${1:-${OUT:-/tmp/clawmine-bench}}
BIN=${BIN:-build-dev/clawmine}
PY=${PY:-python3}
CM_SECONDS=${CM_SECONDS:-340}
HF_SECONDS=${HF_SECONDS:-170}
HF_LAYERS=${HF_LAYERS:-4}
mkdir -p "$DIR"
{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  cat COMMIT 2>/dev/null || git rev-parse --short=12 HEAD 2>/dev/null || echo "no git"  # COMMIT: tools/gpu_sync.sh
  nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.max.sm,clocks.max.mem,driver_version --format=csv
} >"$DIR/env.txt" 2>&1
cat "$DIR/env.txt"

# clawmine: stop starting new points 40 s before the guard, so the tables get printed.
echo "== clawmine bench model (guard ${CM_SECONDS} s)"
timeout -k 10 "$CM_SECONDS" "$BIN" bench model --max-seconds $((CM_SECONDS - 40)) \
  --prefill 2048,8192 --batches 1,8,64,256 --contexts 4096,32768 --repeats 10 --warmup 2 \
  --json-file "$DIR/bench_model.json" >"$DIR/bench_model.txt" 2>"$DIR/bench_model.log"
rc=$?
echo "clawmine bench model: exit $rc"
cat "$DIR/bench_model.txt"
[ $rc = 0 ] || tail -n 30 "$DIR/bench_model.log"

echo "== transformers (guard ${HF_SECONDS} s)"
timeout -k 10 "$HF_SECONDS" "$PY" tools/bench_transformers.py --layers "$HF_LAYERS" --prefill 2048,8192 \
  --batches 1,8 --decode-context 4096 --decode-steps 8 --repeats 2 --warmup 1 \
  --json-file "$DIR/bench_transformers.json" >"$DIR/bench_transformers.txt" 2>"$DIR/bench_transformers.log"
rc=$?
echo "bench_transformers: exit $rc"
cat "$DIR/bench_transformers.txt"
[ $rc = 0 ] || tail -n 30 "$DIR/bench_transformers.log"
ls -la "$DIR"
