#!/usr/bin/env bash
# Checks libmoe_runtime on a GPU machine (an H200 with CUDA 13, CMake and
# ninja; LLVM/MLIR not needed):
#   1. configures runtime/ standalone with nvcc and builds it,
#   2. runs MoERuntimeTests (skipped, and said so, without GoogleTest) and the
#      export check,
#   3. runs moe-runtime-smoke, then again under compute-sanitizer's memcheck,
#   4. when $MOE_GOLDEN_PTX names a PTX file (made here beforehand by
#      `moe-opt test/Target/NVPTX/Inputs/gemm-tile-sm90a.mlir
#      --moe-lower-to-nvvm-pipeline` + extract_ptx.py; GPU machines have no
#      moe-opt), runs the golden wgmma kernel against the host reference,
#      plain and under memcheck, racecheck and synccheck.
# Logs go to $OUT (default /tmp/moe-gpu-out); the last line is
# "N passed, M failed" over the steps; the exit code is non-zero on failure.
#
#   bash scripts/gpu/runtime-check.sh
# Environment: OUT, MOE_RUNTIME_BUILD_DIR (default /tmp/moe-runtime-build).

set -u -o pipefail

# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
case "${1:-}" in -h | --help) usage ;; "") ;; *) die "unknown option $1 (see --help)" ;; esac
out=${OUT:-/tmp/moe-gpu-out}
build=${MOE_RUNTIME_BUILD_DIR:-/tmp/moe-runtime-build}
mkdir -p "$out"
gpu_path_setup
summary_init "$out/summary.txt"
gpu_environment "$out/environment.txt"

if cmake -G Ninja -S "$root/runtime" -B "$build" -DCMAKE_BUILD_TYPE=Release \
  >"$out/configure.log" 2>&1; then
  pass "configure runtime/ standalone (log: configure.log)"
else
  fail "configure runtime/ standalone (log: configure.log)"
  finish
fi
if ninja -C "$build" >"$out/build.log" 2>&1; then
  pass "build (log: build.log)"
else
  fail "build (log: build.log)"
  finish
fi

if [ -x "$build/unittests/MoERuntimeTests" ]; then
  if "$build/unittests/MoERuntimeTests" >"$out/unit-tests.log" 2>&1; then
    pass "MoERuntimeTests: $(grep -E '^\[  PASSED  \]' "$out/unit-tests.log")"
  else
    fail "MoERuntimeTests (log: unit-tests.log)"
  fi
else
  note "SKIP MoERuntimeTests: GoogleTest was not found on this machine," \
    "so runtime/ built without its unit tests (they run on the CPU machines)"
fi
if (cd "$build" && ctest -R moe-runtime-exports --output-on-failure) \
  >"$out/exports.log" 2>&1; then
  pass "only moe*/mgpu* symbols exported (log: exports.log)"
else
  fail "export check (log: exports.log)"
fi

smoke="$build/bin/moe-runtime-smoke"
if [ ! -x "$smoke" ]; then
  fail "moe-runtime-smoke was not built (nvcc missing?)"
  finish
fi
if MOE_RUNTIME_VERBOSE=1 "$smoke" >"$out/smoke.log" 2>&1; then
  pass "moe-runtime-smoke: $(tail -1 "$out/smoke.log") (log: smoke.log)"
else
  fail "moe-runtime-smoke: $(tail -1 "$out/smoke.log") (log: smoke.log)"
fi

if command -v compute-sanitizer >/dev/null 2>&1; then
  # The smoke test provokes driver errors on purpose (bad PTX, 1 PiB
  # allocation) and checks each one itself, so API errors are not reported.
  if compute-sanitizer --tool memcheck --error-exitcode 1 \
    --report-api-errors no "$smoke" >"$out/smoke-memcheck.log" 2>&1; then
    pass "moe-runtime-smoke under compute-sanitizer memcheck:" \
      "$(grep -E 'ERROR SUMMARY' "$out/smoke-memcheck.log" | tail -1)" \
      "(log: smoke-memcheck.log)"
  else
    fail "moe-runtime-smoke under compute-sanitizer memcheck" \
      "(log: smoke-memcheck.log)"
  fi
else
  note "SKIP compute-sanitizer: not on PATH"
fi

golden="$build/bin/moe-golden-gemm-tile"
if [ -n "${MOE_GOLDEN_PTX:-}" ]; then
  if "$golden" "$MOE_GOLDEN_PTX" >"$out/golden.log" 2>&1; then
    pass "golden wgmma kernel: $(tail -1 "$out/golden.log") (log: golden.log)"
  else
    fail "golden wgmma kernel: $(tail -1 "$out/golden.log") (log: golden.log)"
  fi
  if command -v compute-sanitizer >/dev/null 2>&1; then
    for tool in memcheck racecheck synccheck; do
      if compute-sanitizer --tool "$tool" --error-exitcode 1 "$golden" \
        "$MOE_GOLDEN_PTX" >"$out/golden-$tool.log" 2>&1; then
        pass "golden kernel under $tool:" \
          "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/golden-$tool.log" | tail -1)"
      else
        fail "golden kernel under $tool (log: golden-$tool.log)"
      fi
    done
  fi
else
  note "SKIP golden wgmma kernel: MOE_GOLDEN_PTX not set"
fi

finish
