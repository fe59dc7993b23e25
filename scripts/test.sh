#!/usr/bin/env bash
# Installs what is missing (Debian 12), builds, and runs every test:
#   1. the Release build and its full ctest suite (build/);
#   2. the CPU suite again built with ASan+UBSan (build-asan/, CUDA off; any report fails it);
#   3. every libFuzzer target for FUZZ_SECONDS (default 30) on its seed corpus (build-fuzz/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/deps_xgrammar.sh
bash scripts/deps_fuzz.sh
jobs="$(nproc)"
# Idle OpenMP threads sleep instead of spinning, so parallel tests do not starve each other.
export OMP_WAIT_POLICY=passive
stage() { echo "== $1 ($(date -u +%H:%M:%S))"; }

stage "release build + tests"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCLAWMINE_PYTHON="$PWD/.venv/bin/python3" >/dev/null
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure -j"$jobs")

stage "ASan+UBSan build + CPU tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release -DCLAWMINE_CUDA=OFF -DCLAWMINE_SANITIZE=ON \
  -DCLAWMINE_PYTHON="$PWD/.venv/bin/python3" >/dev/null
cmake --build build-asan -j"$jobs"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j"$jobs" -L cpu)

stage "fuzz smoke test"
bash scripts/fuzz.sh "${FUZZ_SECONDS:-30}"
stage "done"
