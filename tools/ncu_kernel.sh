#!/usr/bin/env bash
# Nsight Compute's detailed sections (speed of light, memory, occupancy, warp
# stalls, source counters) for the launches of one kernel during a short
# batch-1 decode benchmark: the "why" behind a duration in
# tools/ncu_step_profile.py's table.
# Usage: tools/ncu_kernel.sh BIN NAME-REGEX OUT.txt [launch-skip] [launch-count]
#   NAME-REGEX matches the demangled name as ncu prints it, e.g.
#   'dense_mma_kernel<\(int\)1, \(int\)1, \(bool\)0>' (or just 'dense_mma_kernel').
# launch-skip counts only the matching kernel's launches: the benchmark's 256-token
# prefill and its context fill come first, so skip those to see decode ones.
set -euo pipefail
BIN=$1 NAME=$2 OUTF=$3 SKIP=${4:-0} COUNT=${5:-8}
ncu --kernel-name-base demangled --kernel-name "regex:$NAME" --launch-skip "$SKIP" --launch-count "$COUNT" \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
  --section WarpStateStats --section SchedulerStats --section SourceCounters \
  --clock-control none --cache-control all --print-units base \
  "$BIN" bench model --layers 6 --prefill 256 --batches 1 --contexts 4096 --repeats 1 --warmup 0 >"$OUTF" 2>&1
