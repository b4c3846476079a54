#!/usr/bin/env bash
# Op-level checks of the GPU library on an H200 (CUDA 13, CMake, ninja, torch; no LLVM).
#   Here (LLVM 22 machine):  bash scripts/inputs/build-ops-harness.sh      -> gpu-inputs/ops/ops.o
#   GPU machine:             bash scripts/gpu/ops-check.sh [--quick] [--sanitize] [--bench=CONFIGS]
#                              [--ops=DIR] [--nongated | --bias] [--only=NAMES]
# Builds runtime/ standalone, links DIR/ops.o (default gpu-inputs/ops; another DIR holds a
# variant of the library, built by inputs/build-ops-harness.sh DIR CONFIG...) into a shared library,
# runs test/GPU/ops_check.py (every host function against fp32 PyTorch), and with
# --sanitize the quick checks under compute-sanitizer memcheck, racecheck and synccheck
# (MOE_SANITIZE_TOOLS: a subset; MOE_SANITIZE_TOOL_LIMIT: seconds a tool, default 200);
# --bench=mixtral-8x7b,... times the op sequence of a step (MOE_PROFILE=1: per kernel, and
#            GAPS lines from bench/step_gaps.py: each op's host time, GPU timeline and idle
#            stretches; MOE_ENERGY=S: ENERGY lines, each op S seconds back to back under
#            NVML's energy counter, joules a call and per TFLOP beside a dense matmul's);
# with --ncu=REGEX, Nsight Compute profiles the launches (MOE_NCU_LAUNCHES, 12) matching REGEX
# in one untimed step instead (speed of light, warp states, scheduler, memory, sampled
# stalls) into ncu.txt and ncu-raw.csv, and for each REGEX2 in MOE_NCU_SOURCE the SASS
# with its stall samples into source-REGEX2.csv.
# With --nongated, the libraries of the non-gated experts instead, DIR/silu, DIR/gelu_erf and
# DIR/gelu_tanh (inputs/build-ops-harness.sh --nongated): their expert host functions, forward
# and backward, against torch's silu and gelu (erf, tanh), each within 240 s, and with
# --sanitize under the tools too (--quick shapes). A DIR's VARIANT file says its activation
# (ops_check.py --variant), so --ops=DIR/silu checks one of them alone.
# With --bias, the libraries whose expert_ffn adds the expert biases, DIR/bias-swiglu and
# DIR/bias-gelu_erf (inputs/build-ops-harness.sh --bias), alike: their bias-ffn checks.
# --only=NAMES (comma-separated substrings of check names, e.g. capacity,aux) runs those checks
# alone, with --sanitize, --nongated and --bias too.
# Logs to $OUT (default /tmp/moe-gpu-out).
# shellcheck disable=SC2154 # parse_options (scripts/common.sh) sets the options' variables
set -u -o pipefail
# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
out=${OUT:-/tmp/moe-gpu-out}
build=${MOE_RUNTIME_BUILD_DIR:-/tmp/moe-runtime-build}
mkdir -p "$out"
gpu_path_setup
export PYTHONUNBUFFERED=1
parse_options --quick:quick=--quick --sanitize:sanitize=1 --bench=bench \
  --ops=ops="$root/gpu-inputs/ops" --ncu=ncu --nongated:nongated=1 --bias:bias=1 \
  --only=only -- "$@"
no_positional
log="$out/ops.log"
{
  echo "date: $(date -u +%FT%TZ) commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null) ops: $ops"
  cat "$ops/VARIANT" 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
} >"$log"
if [ ! -f "$build/lib/libmoe_runtime.so" ]; then
  if ! cmake -G Ninja -S "${MOE_RUNTIME_SRC:-$root/runtime}" -B "$build" \
    -DCMAKE_BUILD_TYPE=Release >>"$log" 2>&1 ||
    ! ninja -C "$build" moe_runtime >>"$log" 2>&1; then
    echo "FAIL runtime build" | tee -a "$log"
    exit 1
  fi
fi
# link DIR: DIR/ops.o with the runtime into $build/ops-NAME.so
link() {
  so="$build/ops-$(basename "$1").so"
  g++ -shared -o "$so" "$1/ops.o" -L"$build/lib" -lmoe_runtime \
    -Wl,-rpath,"$build/lib" >>"$log" 2>&1 || { echo "FAIL link $1/ops.o" | tee -a "$log"; return 1; }
}
# the activation that DIR's library was built with (ops_check.py reads its VARIANT)
variant=()
[ -f "$ops/VARIANT" ] && variant=(--variant "$ops/VARIANT")
status=0
if [ "$nongated" = 1 ] || [ "$bias" = 1 ]; then
  [ "$nongated" = 1 ] && [ "$bias" = 1 ] && die "--nongated or --bias, not both"
  [ -z "$bench" ] && [ -z "$ncu" ] || die "--nongated and --bias check; they time nothing (no --bench, --ncu)"
  found=0
  libs="silu gelu_erf gelu_tanh"
  flag=--nongated
  [ "$bias" = 1 ] && libs="bias-swiglu bias-gelu_erf" && flag=--bias
  for act in $libs; do
    dir=$ops/$act
    if [ ! -f "$dir/ops.o" ]; then
      echo "FAIL $act: no $dir/ops.o (inputs/build-ops-harness.sh $flag)" | tee -a "$log"
      status=1
      continue
    fi
    found=1
    { echo "== $act: $(cat "$dir/VARIANT" 2>/dev/null)"; } | tee -a "$log"
    link "$dir" || { status=1; continue; }
    timeout 240 python3 "$root/test/GPU/ops_check.py" --lib "$so" --variant "$dir/VARIANT" \
      ${quick:+"$quick"} ${only:+--only "$only"} --json "$out/ops-$act.json" 2>&1 | tee -a "$log" || status=1
    [ "$sanitize" = 1 ] || continue
    for tool in ${MOE_SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
      echo "== compute-sanitizer $tool on $act (--quick)" | tee -a "$log"
      timeout "${MOE_SANITIZE_TOOL_LIMIT:-200}" compute-sanitizer --tool "$tool" --error-exitcode 9 \
        python3 -u "$root/test/GPU/ops_check.py" --lib "$so" --variant "$dir/VARIANT" --quick ${only:+--only "$only"} \
        >"$out/sanitize-$act-$tool.log" 2>&1
      rc=$?
      tail -3 "$out/sanitize-$act-$tool.log" | tee -a "$log"
      [ $rc -eq 0 ] || { echo "FAIL $act $tool rc=$rc" | tee -a "$log"; status=1; }
    done
  done
  [ $found = 1 ] || status=1
  exit $status
fi
link "$ops" || exit 1
if [ -n "$bench" ] && [ -n "$ncu" ]; then
  # every launch matching REGEX in one untimed step of each config; the report keeps
  # the sampled stalls per SASS instruction (source-REGEX2.csv: the first launch of each
  # kernel matching a MOE_NCU_SOURCE entry)
  timeout 500 ncu --kernel-name "regex:$ncu" --launch-count "${MOE_NCU_LAUNCHES:-12}" \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --section SourceCounters --export "$out/ncu" --force-overwrite \
    python3 "$root/test/GPU/ops_check.py" --lib "$so" "${variant[@]}" --bench "$bench" --reps 0 \
    >"$out/ncu-run.txt" 2>&1
  rc=$?
  ncu --import "$out/ncu.ncu-rep" --page details --print-details all >"$out/ncu.txt" 2>&1
  ncu --import "$out/ncu.ncu-rep" --page raw --csv >"$out/ncu-raw.csv" 2>&1
  for k in ${MOE_NCU_SOURCE:-}; do
    ncu --import "$out/ncu.ncu-rep" --kernel-name "regex:$k" --launch-count 1 --page source \
      --csv --print-source sass >"$out/source-$k.csv" 2>&1
  done
  grep -E "moe_gemm|Duration|Throughput|Stall|Issued|Eligible|Registers|Warp Cycles" \
    "$out/ncu.txt" | head -120 | tee -a "$log"
  exit $rc
fi
if [ -n "$bench" ]; then
  timeout 500 python3 "$root/test/GPU/ops_check.py" --lib "$so" "${variant[@]}" --bench "$bench" ${MOE_PROFILE:+--profile} \
    ${MOE_ENERGY:+--energy "$MOE_ENERGY"} \
    --json "$out/bench.json" 2>&1 | tee -a "$log"
  exit $?
fi
timeout 420 python3 "$root/test/GPU/ops_check.py" --lib "$so" "${variant[@]}" ${quick:+"$quick"} \
  ${only:+--only "$only"} --json "$out/ops.json" \
  2>&1 | tee -a "$log" || status=1
if [ "$sanitize" = 1 ]; then
  # every op at the small shapes of --quick (every kernel runs)
  for tool in ${MOE_SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
    echo "== compute-sanitizer $tool (--quick: every op at small shapes)" | tee -a "$log"
    # -u: after a timeout the log ends at the check that was running
    timeout "${MOE_SANITIZE_TOOL_LIMIT:-200}" compute-sanitizer --tool "$tool" --error-exitcode 9 \
      python3 -u "$root/test/GPU/ops_check.py" --lib "$so" "${variant[@]}" --quick ${only:+--only "$only"} \
      >"$out/sanitize-$tool.log" 2>&1
    rc=$?
    tail -3 "$out/sanitize-$tool.log" | tee -a "$log"
    [ $rc -eq 0 ] || { echo "FAIL $tool rc=$rc" | tee -a "$log"; status=1; }
  done
fi
exit $status
