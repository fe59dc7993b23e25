#!/usr/bin/env bash
# Fetches and builds the one vendored dependency of src/grammar: XGrammar's C++ core (structured
# output: token masks from JSON schemas, regexes and EBNF grammars), pinned to the 0.2.9 sdist of
# PyPI by its sha256. Installs the static library and headers under .deps/xgrammar-0.2.9/
# (lib/libxgrammar.a, include/xgrammar/, include/dlpack/), which CMake finds through
# CLAWMINE_XGRAMMAR_DIR. Does nothing when that install is already there.
#   bash scripts/deps_xgrammar.sh
# XGRAMMAR_TARBALL=/path/xgrammar-0.2.9.tar.gz uses a local copy (still checked against the pin).
set -euo pipefail
cd "$(dirname "$0")/.."
ver=0.2.9
url="https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-$ver.tar.gz"
sha=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
deps="$PWD/.deps"
prefix="$deps/xgrammar-$ver"
stamp="$prefix/.built-$sha"
[ -f "$stamp" ] && [ -f "$prefix/lib/libxgrammar.a" ] && exit 0

bash scripts/apt_install.sh curl ca-certificates build-essential cmake ninja-build
mkdir -p "$deps"
tarball="$deps/xgrammar-$ver.tar.gz"
if [ -n "${XGRAMMAR_TARBALL:-}" ]; then
  cp "$XGRAMMAR_TARBALL" "$tarball.part"
elif [ ! -f "$tarball" ]; then
  curl -fsSL --retry 3 -o "$tarball.part" "$url"
fi
[ -f "$tarball.part" ] && mv "$tarball.part" "$tarball"
got="$(sha256sum "$tarball" | cut -d' ' -f1)"
if [ "$got" != "$sha" ]; then
  echo "deps_xgrammar.sh: $tarball has sha256 $got, the pin is $sha; refusing to build it" >&2
  rm -f "$tarball"
  exit 1
fi

src="$deps/xgrammar-$ver-src"
rm -rf "$src" "$prefix"
mkdir -p "$src"
tar -xzf "$tarball" -C "$src" --strip-components=1
# Only the C++ core (no Python bindings, no tests). Its own flags add -Werror and -flto=auto:
# the flags given here come after them and win, so a newer warning of the system compiler does not
# stop the build, and the archive holds plain objects that g++, clang (the fuzz build) and the
# sanitizer builds all link (GCC LTO objects link only through GCC's plugin).
# XGrammar reads a config.cmake from its build directory before its own cmake/config.cmake, which
# turns the Python bindings on with a plain set() that a -D cannot override.
mkdir -p "$src/build"
cat >"$src/build/config.cmake" <<'CFG'
set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)
set(XGRAMMAR_BUILD_CXX_TESTS OFF)
set(XGRAMMAR_ENABLE_COVERAGE OFF)
set(XGRAMMAR_ENABLE_CPPTRACE OFF)
set(XGRAMMAR_ENABLE_INTERNAL_CHECK OFF)
CFG
echo "deps_xgrammar.sh: building XGrammar $ver (C++ core) into $prefix"
start=$(date +%s)
cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DCMAKE_INSTALL_LIBDIR=lib \
  -DCMAKE_CXX_FLAGS="-Wno-error -fno-lto" >/dev/null
cmake --build "$src/build" -j"$(nproc)"
cmake --install "$src/build" >/dev/null
cp "$src/LICENSE" "$prefix/LICENSE"
touch "$stamp"
echo "deps_xgrammar.sh: XGrammar $ver built in $(( $(date +%s) - start )) s"
