#!/usr/bin/env bash
# Runs compute-sanitizer over the GPU test binary on the device machine:
# memcheck over every test, and racecheck over groups of test suites run side by
# side (racecheck is slow: one process per group keeps each under the limit).
# Writes one log per run to OUTDIR and prints each tool's summary line.
# Usage: tools/gpu_sanitize.sh BUILD_DIR OUTDIR [SECONDS_PER_RUN]   (from the repo root)
# Env: MEMCHECK_FILTER (gtest filter of one memcheck run; default: every test, in two runs);
#      SAN_RUNS (lines of "TOOL FILTER": run exactly these, side by side, instead of the default set).
set -uo pipefail
B=${1:?build dir}
O=${2:?output dir}
T=${3:-480}
mkdir -p "$O"
bin="$B/clawmine_gpu_tests"
san() {  # san NAME TOOL FILTER
  timeout "$T" compute-sanitizer --tool "$2" --print-limit 50 "$bin" --gtest_filter="$3" >"$O/$1.log" 2>&1
  echo "rc=$?" >>"$O/$1.log"
}
if [ -n "${SAN_RUNS:-}" ]; then
  # Chosen runs, all side by side: one "TOOL FILTER" per line (e.g. the slow whole-model suites one test each).
  while read -r tool filter; do
    [ -n "$tool" ] || continue
    san "${tool}_$(echo "$filter" | tr -c 'A-Za-z0-9\n' '_' | cut -c1-40)" "$tool" "$filter" &
  done <<<"$SAN_RUNS"
else
  # memcheck in two processes (the whole-model suites, then every other test): one was over 230 s.
  MODEL_SUITES='*Seam*:CudaGraphs.*:CudaStats.*:CudaMemory.*:BenchModelGpu.*'
  if [ -n "${MEMCHECK_FILTER:-}" ]; then
    san memcheck memcheck "$MEMCHECK_FILTER" &
  else
    san memcheck_model memcheck "$MODEL_SUITES" &
    san memcheck_ops memcheck "-$MODEL_SUITES" &
  fi
  for g in 'GpuNvfp4Linear.*' 'GpuFp8Linear.*:GpuMxfp4Linear.*' 'GpuNvfp4Moe.*:GpuNvfp4MoePrefill.Small*:GpuMxfp4Moe.*' 'GpuOps.*' \
    '*Seam*:GpuContext.*:NcclComm.*:CudaGraphs.*:CudaStats.*:CudaMemory.*:BenchModelGpu.*'; do
    name="racecheck_$(echo "$g" | tr -c 'A-Za-z0-9\n' '_' | cut -c1-40)"
    san "$name" racecheck "$g" &
  done
fi
wait
# One summary file (each run's result line and, per log, the code locations of its hazards and
# errors with their counts) and one archive of the logs: the device tool brings back few files.
{
  for f in "$O"/*.log; do
    echo "== $(basename "$f"): $(grep -E '^\[  PASSED|^\[  FAILED|ERROR SUMMARY|RACECHECK SUMMARY|^rc=' "$f" | tr '\n' ' ')"
    grep -oE '(access at|^=+ +at) .* in [^ ]+' "$f" | sed -E 's/^(.*access|=+ +) at //; s/\(.*\)\+0x[0-9a-f]+//' |
      sort | uniq -c | sort -rn | head -15
  done
} | tee "$O/summary.txt"
tar -czf "$O.logs.tgz" -C "$(dirname "$O")" "$(basename "$O")" && rm -f "$O"/*.log
