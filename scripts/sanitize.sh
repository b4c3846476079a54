#!/usr/bin/env bash
# The ASan + UBSan leg: configures build-asan with clang-22, lld and
# RelWithDebInfo, every moe-mlir target instrumented with AddressSanitizer and
# UndefinedBehaviorSanitizer (the MLIR and LLVM libraries they link are not),
# builds everything and runs the whole ctest suite under it: lit, its
# round-trip leg, GoogleTest, the Python suite (which runs the instrumented
# moe-opt as a subprocess), lints and docs checks.
#
#   scripts/sanitize.sh
#
# MOE_ASAN_BUILD_DIR overrides the build folder.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MOE_ASAN_BUILD_DIR:-$root/build-asan}

"$root/scripts/install-deps.sh"
# The sanitizer runtimes of clang-22.
if [[ ! -f $(clang++-22 -print-runtime-dir)/libclang_rt.asan-$(uname -m).a ]]; then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo=sudo
  echo "sanitize: installing libclang-rt-22-dev"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q \
    --no-install-recommends libclang-rt-22-dev
fi

# - allow_user_poisoning=0: llvm::BumpPtrAllocator poisons and unpoisons its
#   slabs in inline code; with only our code instrumented, an instrumented
#   copy can poison memory that an uninstrumented MLIR copy hands out, which
#   ASan then reports as use-after-poison. Heap, stack and global checks stay.
# - Leaks are checked (what LLVM and MLIR keep in globals stays reachable and
#   is not reported, so no suppressions are needed).
# - UBSan stops at the first report (-fno-sanitize-recover=all) and prints a
#   stack trace.
export ASAN_OPTIONS=allow_user_poisoning=0:detect_leaks=1:abort_on_error=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

if [[ ! -f $build/build.ninja ]]; then
  # LLVM_USE_SANITIZER alone gives ASan only: LLVM_UBSAN_FLAGS is defined in
  # LLVM's own top-level CMake, not in the installed HandleLLVMOptions.
  cmake -G Ninja -S "$root" -B "$build" \
    -DMLIR_DIR=/usr/lib/llvm-22/lib/cmake/mlir \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang-22 -DCMAKE_CXX_COMPILER=clang++-22 \
    -DLLVM_USE_LINKER=lld \
    -DPython3_EXECUTABLE=/usr/bin/python3 \
    -DLLVM_USE_SANITIZER="Address;Undefined" \
    -DLLVM_UBSAN_FLAGS="-fsanitize=undefined -fno-sanitize=vptr,function -fno-sanitize-recover=all"
fi
ninja -C "$build"
cd "$build"
ctest --output-on-failure -j "$(nproc)"
