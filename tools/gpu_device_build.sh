#!/usr/bin/env bash
# Builds the GPU test binary and clawmine (every command but serve) on the device machine,
# which has nvcc and cuBLAS but none of the Debian dev packages: fmt (header-
# only), CLI11, nlohmann-json and GoogleTest sources travel in third_party/
# (made by tools/gpu_sync.sh), with PCRE2 (header + library) and cpp-httplib.
# The GPU test binary runs the seam suite (tests/seam_suite.h) on the CUDA backend.
# Usage: tools/gpu_device_build.sh [build-dir]   (run from the repo root)
set -euo pipefail
B=${1:-build-dev}
mkdir -p "$B/obj"
TP=third_party
INC="-Isrc -I. -I$TP/include -I$TP/googletest/include -I$TP/googletest -DFMT_HEADER_ONLY -DCLAWMINE_HAVE_CUDA=1"
INC="$INC -DCLAWMINE_TEST_DATA=\"$PWD/tests/data\""
mkdir -p "$B/generated"
echo "#define CLAWMINE_GIT_COMMIT \"$(git rev-parse --short=12 HEAD 2>/dev/null || echo device-build)\"" >"$B/generated/clawmine_build_info.h"
CLI_DEFS="-I$B/generated -DCLAWMINE_VERSION=\"0.1.0\" -DCLAWMINE_BUILD_TYPE=\"Release\" -DCLAWMINE_CUDA_ARCHS=\"90a\""
NVCC="nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -lineinfo --expt-relaxed-constexpr -Xcompiler=-fopenmp,-Wall"
CUDA_INC=$(dirname "$(dirname "$(command -v nvcc)")")/include
# NCCL (the multi-GPU communicator and its one-rank tests): the toolkit's, else the one PyTorch's wheels
# ship (nvidia-nccl: include/ and lib/ next to each other); built without it when neither is there.
NCCL_LINK=""
NCCL_DIR=""
CUDA_LIB=$(dirname "$CUDA_INC")/lib64
if [ -f "$CUDA_INC/nccl.h" ] && ls "$CUDA_LIB"/libnccl.so* >/dev/null 2>&1; then
  NCCL_LINK="-L$CUDA_LIB -lnccl"
  INC="$INC -DCLAWMINE_HAVE_NCCL=1"
else
  NCCL_DIR=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
  if [ -n "$NCCL_DIR" ] && [ -f "$NCCL_DIR/include/nccl.h" ] && ls "$NCCL_DIR"/lib/libnccl.so* >/dev/null 2>&1; then
    NCCL_LIB=$(ls "$NCCL_DIR"/lib/libnccl.so* | head -1)
    INC="$INC -I$NCCL_DIR/include -DCLAWMINE_HAVE_NCCL=1"
    NCCL_LINK="-Xlinker $NCCL_LIB -Xlinker -rpath=$NCCL_DIR/lib"
  fi
fi
echo "NCCL: ${NCCL_LINK:-not found (built without the NCCL communicator)}"
# The toolkit's include dir goes last: a toolkit nccl.h must not shadow the wheel's when the wheel's library is linked.
CXX="g++ -std=c++20 -O3 -fopenmp -Wall -Wextra -Wno-unused-parameter"
compile() {  # compile SRC OBJ
  local src=$1 obj=$2
  case "$src" in
    *.cu) $NVCC $INC -c "$src" -o "$obj" ;;
    *) $CXX $INC $CLI_DEFS -I"$CUDA_INC" -c "$src" -o "$obj" ;;
  esac
}
obj() { echo "$B/obj/$(echo "$1" | tr '/' '_').o"; }
# Every room of src/ but the CLI, the HTTP server, grammar/ and runtime/grammar_gate.cpp (both backends behind the seam, the
# CUDA kernels in their family folders, the runtime), and the benchmarks of bench/. grammar/ needs
# XGrammar (scripts/deps_xgrammar.sh) and the server's log setup needs spdlog; the device has
# neither, and no room this build compiles includes them.
CORE=($(find src -path src/cli -prune -o -path src/serve -prune -o -path src/grammar -prune -o -path src/runtime/grammar_gate.cpp -prune \
             -o -path src/common/log.cpp -prune -o \( -name '*.cpp' -o -name '*.cu' \) -print | sort)
      $(find bench \( -name '*.cpp' -o -name '*.cu' \) -print | sort))
TESTS=(tests/gpu/*.cpp tests/gpu/*.cu "$TP/googletest/src/gtest-all.cc" "$TP/googletest/src/gtest_main.cc")
# Every command but `serve` (Debian's cpp-httplib is a compiled library with TLS dependencies the device lacks).
CLI=($(ls src/cli/*.cpp | grep -v cmd_serve.cpp))
pids=()
for f in "${CORE[@]}" "${TESTS[@]}" "${CLI[@]}"; do
  compile "$f" "$(obj "$f")" &
  pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
[ $fail = 0 ] || { echo "compile failed"; exit 1; }
core_objs=(); test_objs=(); cli_objs=()
for f in "${CORE[@]}"; do core_objs+=("$(obj "$f")"); done
for f in "${TESTS[@]}"; do test_objs+=("$(obj "$f")"); done
for f in "${CLI[@]}"; do cli_objs+=("$(obj "$f")"); done
LINK="nvcc -gencode=arch=compute_90a,code=sm_90a -Xcompiler=-fopenmp -lcublas -lpthread -ldl -L$TP/lib -lpcre2-8 -Xlinker -rpath=$PWD/$TP/lib $NCCL_LINK"
$LINK "${core_objs[@]}" "${test_objs[@]}" -o "$B/clawmine_gpu_tests"
$LINK "${core_objs[@]}" "${cli_objs[@]}" -o "$B/clawmine"
echo "built $B/clawmine_gpu_tests $B/clawmine"
