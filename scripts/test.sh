#!/usr/bin/env bash
# Installs what is missing (Debian 12), builds, and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCLAWMINE_PYTHON="$PWD/.venv/bin/python3" >/dev/null
cmake --build build -j"$(nproc)"
# Idle OpenMP threads sleep instead of spinning, so parallel tests do not starve each other.
export OMP_WAIT_POLICY=passive
cd build && ctest --output-on-failure -j"$(nproc)"
