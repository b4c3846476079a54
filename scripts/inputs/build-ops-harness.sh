#!/usr/bin/env bash
# Builds gpu-inputs/ops/ops.o (needs LLVM/MLIR 22 and ptxas): the GPU library with a
# C-interface wrapper per host function, for scripts/gpu/ops-check.sh on a GPU machine.
#   bash scripts/inputs/build-ops-harness.sh [DIR [GENERATOR]]
# DIR (default gpu-inputs/ops) and GENERATOR (default lib/.../gen_gpu_library.py) let a
# variant of the library (an older generator, other MOE_GEMM_* settings) be timed beside
# the current one in one GPU run (gpu/ops-check.sh --ops=DIR).
set -euo pipefail
# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
case "${1:-}" in -h | --help) usage ;; -*) die "unknown option $1 (see --help)" ;; esac
bin=/usr/lib/llvm-22/bin
dir=$(realpath -m "${1:-$root/gpu-inputs/ops}")
gen=${2:-$root/lib/Conversion/MoEToGPU/gen_gpu_library.py}
mkdir -p "$dir"
export PATH="$PATH:/usr/local/cuda/bin"
echo "generator: $gen $(env | grep -E '^MOE_(GEMM|GPU)_' | tr '\n' ' ')" >"$dir/VARIANT"
python3 "$gen" -o "$dir/library.mlir"
python3 "$root/test/GPU/gen_ops_harness.py" "$dir/library.mlir" >"$dir/ops.mlir"
"$bin/mlir-opt" "$dir/ops.mlir" --inline --gpu-lower-to-nvvm-pipeline="cubin-chip=sm_90a cubin-features=+ptx80 cubin-format=bin opt-level=3" -o "$dir/ops.llvm.mlir"
"$bin/mlir-translate" --mlir-to-llvmir "$dir/ops.llvm.mlir" -o "$dir/ops.ll"
"$bin/llc" -O2 -filetype=obj -relocation-model=pic "$dir/ops.ll" -o "$dir/ops.o"
rm -f "$dir/ops.llvm.mlir" "$dir/ops.ll" "$dir/library.mlir" "$dir/ops.mlir"
ls -la "$dir"
