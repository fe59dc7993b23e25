#!/usr/bin/env bash
# Installs what the checking builds need besides scripts/deps.sh (Debian 12): clang-16 with its
# libFuzzer/sanitizer runtimes and OpenMP for the fuzz targets. Only scripts/test.sh and
# scripts/fuzz.sh call this; the demo does not need it.
set -euo pipefail
pkgs=(clang-16 libclang-rt-16-dev libomp-16-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
