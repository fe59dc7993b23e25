#!/usr/bin/env bash
# Builds the libFuzzer targets (build-fuzz: clang-16, ASan+UBSan, CUDA off) and runs each for
# SECONDS (default 30) on its seed corpus, one after the other:
#   bash scripts/fuzz.sh [SECONDS] [TARGET...]      (targets: the fuzz/*.cpp names; default all)
# New inputs go to build-fuzz/corpus/<target>/ (the committed seeds in fuzz/corpus/ are only
# read); a crash leaves its input as build-fuzz/artifacts/<target>-crash-* and fails the script.
# Reproduce one:  build-fuzz/fuzz/fuzz_<target> build-fuzz/artifacts/<target>-crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in fuzz/*.cpp; do targets+=("$(basename "$f" .cpp)"); done
fi
bash scripts/deps_fuzz.sh
bash scripts/deps_xgrammar.sh
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-16 \
  -DCMAKE_CXX_COMPILER=clang++-16 -DCLAWMINE_CUDA=OFF -DCLAWMINE_TESTS=OFF -DCLAWMINE_FUZZ=ON >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]/#/fuzz_}"
mkdir -p build-fuzz/artifacts
failed=()
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t"
  dict=()
  [ -f "fuzz/dict/$t.dict" ] && dict=("-dict=fuzz/dict/$t.dict")
  log="build-fuzz/fuzz_$t.log"
  start=$(date +%s)
  if "build-fuzz/fuzz/fuzz_$t" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
      "${dict[@]}" -artifact_prefix="build-fuzz/artifacts/$t-" "build-fuzz/corpus/$t" "fuzz/corpus/$t" >"$log" 2>&1; then
    status=ok
  else
    status=FAILED
    failed+=("$t")
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -o 'cov: [0-9]*' || echo "cov: ?")
  echo "fuzz_$t: $status, $((  $(date +%s) - start )) s, $runs runs, $cov (log: $log)"
  [ "$status" = ok ] || grep -E 'ERROR|invariant|what\(\)|SUMMARY' "$log" | head -5
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz targets failed: ${failed[*]}"
  exit 1
fi
