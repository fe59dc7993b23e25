#!/usr/bin/env bash
# Copies this worktree into the main checkout's .gpuwork/ (the folder the
# device tool carries) together with the header-only dependencies and the
# GoogleTest sources that the device machine lacks.
# Usage: tools/gpu_sync.sh [dest]   (default /work/main/.gpuwork)
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
DST=${1:-/work/main/.gpuwork}
rm -rf "$DST"
mkdir -p "$DST/third_party/include" "$DST/third_party/googletest"
(cd "$SRC" && tar --exclude='./build*' --exclude=./.git --exclude=./third_party --exclude=./.gpuwork --exclude=./.venv -cf - .) | (cd "$DST" && tar -xf -)
cp -a /usr/include/fmt /usr/include/CLI /usr/include/nlohmann "$DST/third_party/include/"
cp -a /usr/src/googletest/googletest/. "$DST/third_party/googletest/"
# The clawmine binary also needs PCRE2 (header + x86-64 shared library).
mkdir -p "$DST/third_party/lib"
cp -a /usr/include/pcre2.h "$DST/third_party/include/"
cp -aL /usr/lib/x86_64-linux-gnu/libpcre2-8.so.0 "$DST/third_party/lib/"
ln -sf libpcre2-8.so.0 "$DST/third_party/lib/libpcre2-8.so"
# The commit the copy was made from (the copy has no .git; bench_device.sh records it).
git -C "$SRC" rev-parse --short=12 HEAD >"$DST/COMMIT" 2>/dev/null || true
du -sh "$DST"
