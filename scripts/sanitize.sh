#!/usr/bin/env bash
# The ASan + UBSan leg: configures build-asan with clang-22, lld and
# RelWithDebInfo, every moe-mlir target instrumented with AddressSanitizer and
# UndefinedBehaviorSanitizer (the MLIR and LLVM libraries they link are not),
# builds everything and runs the ctest suite under it: lit (but the PTX
# checks), GoogleTest, the Python suite's compiler and runtime tests (which run
# the instrumented moe-opt as a subprocess) and the docs check. Not the guards
# (moe-lint), which run no code of ours, nor lit's round-trip leg, whose parsing
# and printing lit itself already runs under the sanitizers (scripts/test.sh
# runs it on the plain build).
#
#   scripts/sanitize.sh
#
# MOE_ASAN_BUILD_DIR overrides the build folder. MOE_SANITIZE_LAYER_FUZZ=S
# then runs test/Fuzz/layer_fuzz.py on the instrumented tools for S seconds.
set -euo pipefail
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
build=${MOE_ASAN_BUILD_DIR:-$root/build-asan}

# The sanitizer runtimes of clang-22 come with libclang-rt-22-dev.
"$root/scripts/install-deps.sh" libclang-rt-22-dev

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

# LLVM_USE_SANITIZER alone gives ASan only: LLVM_UBSAN_FLAGS is defined in
# LLVM's own top-level CMake, not in the installed HandleLLVMOptions. The build
# has the libFuzzer harness too (MOE_ENABLE_FUZZER: coverage instrumentation on
# our libraries), so that scripts/fuzz.sh can run in it
# (MOE_FUZZ_BUILD_DIR=build-asan) instead of building everything again.
# Line tables are all a sanitizer report needs, and full debug info of MLIR's templates costs
# about a fifth of the build's compile time and most of its link time.
MOE_BUILD_DIR=$build "$root/scripts/build.sh" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -gline-tables-only -DNDEBUG" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -gline-tables-only -DNDEBUG" \
  -DLLVM_USE_SANITIZER="Address;Undefined" \
  -DLLVM_UBSAN_FLAGS="-fsanitize=undefined -fno-sanitize=vptr,function -fno-sanitize-recover=all" \
  -DMOE_ENABLE_FUZZER=ON
cd "$build"
# The Python suite's tests that drive the compiler and the runtime over whole layers, their
# command lines and their error paths; the rest (the benchmark and GPU-session scripts, the
# Hugging Face blocks, multi-process expert parallelism, the NumPy references) compile the same
# kinds of layers again or run none of our C++, and scripts/test.sh runs them.
keep=(test_cli test_cpu_runner test_cpu_kernels test_cpu_layer test_cpu_dynamic_tokens
  test_cpu_ep_ops test_cpu_fold_adds test_plan_activations test_memory_plan test_torch_layer
  test_aux_losses test_selection_bias test_selection_bias_gpu test_expert_bias
  test_gpu_nongated_layers)
for name in "${keep[@]}"; do
  [ -f "$root/test/Python/$name.py" ] || die "sanitize.sh: no test/Python/$name.py to run"
done
for file in "$root"/test/Python/test_*.py; do
  [[ " ${keep[*]} " == *" $(basename "$file" .py) "* ]] ||
    PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} --ignore=$file"
done
export PYTEST_ADDOPTS
# lit but Target/NVPTX, whose time is mlir-opt's NVVM lowering and ptxas (neither ours nor
# instrumented) on kernels that the Conversion tests build under the sanitizers too.
export LIT_FILTER_OUT="Target/NVPTX/"
ctest --output-on-failure -j "$(nproc)" -E '^(moe-lint|moe-lit-roundtrip)$'
if [ -n "${MOE_SANITIZE_LAYER_FUZZ:-}" ]; then
  python3 "$root/test/Fuzz/layer_fuzz.py" --build "$build" \
    --seconds "$MOE_SANITIZE_LAYER_FUZZ" --out "$build/layer-fuzz"
fi
