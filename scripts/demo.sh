#!/usr/bin/env bash
# The main job: installs what is missing (Debian 12), builds clawmine, and
# generates text on the CPU from the embedded default model (models/default:
# a small DeepSeek-V4 trained on the King James Bible, stored in NVFP4).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/deps_xgrammar.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target clawmine
./build/clawmine generate -p "${PROMPT:-And God said}" -n "${N:-128}"
