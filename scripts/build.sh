#!/usr/bin/env bash
# Configures (once) and builds moe-mlir with clang-22, lld and Ninja.
#   scripts/build.sh [CMAKE_ARG...]   # extra configure arguments; later ones
#                                     # win (-DCMAKE_BUILD_TYPE=RelWithDebInfo)
# MOE_BUILD_DIR: the build folder (default build); MOE_BUILD_TARGET: what
# ninja builds (default everything).
set -euo pipefail
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
build=${MOE_BUILD_DIR:-$root/build}

if [[ ! -f $build/build.ninja ]]; then
  cmake -G Ninja -S "$root" -B "$build" \
    -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER=clang-22 -DCMAKE_CXX_COMPILER=clang++-22 \
    -DLLVM_USE_LINKER=lld \
    -DPython3_EXECUTABLE=/usr/bin/python3 \
    "$@"
fi
ninja -C "$build" ${MOE_BUILD_TARGET:+"$MOE_BUILD_TARGET"}
