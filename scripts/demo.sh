#!/usr/bin/env bash
# The main job: installs what is missing (Debian 12), builds clawmine, and
# generates from the embedded default model on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target clawmine
MODEL=${MODEL:-tests/data/golden/release_real_ratios}
echo "model: $MODEL"
echo "prompt token ids: 0,17,42,99"
echo -n "generated ids:    "
./build/clawmine generate -m "$MODEL" --tokens 0,17,42,99 -n 32
