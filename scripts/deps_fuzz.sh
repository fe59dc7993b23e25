#!/usr/bin/env bash
# Installs what the checking builds need besides scripts/deps.sh (Debian 12): clang-16 with its
# libFuzzer/sanitizer runtimes and OpenMP for the fuzz targets. Only scripts/test.sh and
# scripts/fuzz.sh call this; the demo does not need it.
set -euo pipefail
pkgs=(clang-16 libclang-rt-16-dev libomp-16-dev)
bash "$(dirname "$0")/apt_install.sh" "${pkgs[@]}"
