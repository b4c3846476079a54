#!/usr/bin/env bash
# Builds gpu-inputs/ops/ops.o (needs LLVM/MLIR 22 and ptxas): the GPU library with a
# C-interface wrapper per host function, for scripts/gpu/ops-check.sh on a GPU machine.
#   bash scripts/inputs/build-ops-harness.sh [DIR [CONFIG...]]
# DIR (default gpu-inputs/ops). The library is the compiler's (moe-opt
# --moe-gpu-emit-library, from MOE_BUILD_DIR, default build/); CONFIGs
# ([OP.]ROLE:KEY=VALUE[:...], e.g. expert_ffn.down:stages=2, docs/dialect.md) build its
# host functions with those GEMM configs under the library's names, so that a variant is
# timed beside the default library in one GPU run (gpu/ops-check.sh --ops=DIR).
#   bash scripts/inputs/build-ops-harness.sh --nongated [DIR]
# builds the libraries of the non-gated experts (docs/gpu-kernels.md section 2.2.1) into
# DIR/silu, DIR/gelu_erf and DIR/gelu_tanh (DIR default gpu-inputs/ops), each with its
# activation's up and dact GEMMs (CONFIGs up:b=w_mn:activation=ACT dact:activation=ACT), which
# gpu/ops-check.sh --nongated checks.
#   bash scripts/inputs/build-ops-harness.sh --bias [DIR]
# builds the libraries whose expert_ffn adds the expert biases (its up and down GEMMs with
# bias=true, b_gate_up and b_down after the weights) into DIR/bias-swiglu and DIR/bias-gelu_erf
# (DIR default gpu-inputs/ops), which gpu/ops-check.sh --bias checks (the bias-ffn and
# bias-grad checks).
set -euo pipefail
# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
if [ "${1:-}" = --nongated ]; then
  [ $# -le 2 ] || die "--nongated takes one DIR at most (see --help)"
  base=$(realpath -m "${2:-$root/gpu-inputs/ops}")
  for act in silu gelu_erf gelu_tanh; do
    bash "${BASH_SOURCE[0]}" "$base/$act" "up:b=w_mn:activation=$act" "dact:activation=$act"
  done
  du -sk "$base"/silu "$base"/gelu_erf "$base"/gelu_tanh
  exit 0
fi
if [ "${1:-}" = --bias ]; then
  [ $# -le 2 ] || die "--bias takes one DIR at most (see --help)"
  base=$(realpath -m "${2:-$root/gpu-inputs/ops}")
  bash "${BASH_SOURCE[0]}" "$base/bias-swiglu" expert_ffn.up:bias=true expert_ffn.down:bias=true
  bash "${BASH_SOURCE[0]}" "$base/bias-gelu_erf" up:b=w_mn:activation=gelu_erf \
    dact:activation=gelu_erf expert_ffn.up:bias=true expert_ffn.down:bias=true
  du -sk "$base"/bias-swiglu "$base"/bias-gelu_erf
  exit 0
fi
case "${1:-}" in -h | --help) usage ;; -*) die "unknown option $1 (see --help)" ;; esac
bin=/usr/lib/llvm-22/bin
dir=$(realpath -m "${1:-$root/gpu-inputs/ops}")
shift || true
configs=("$@")
mkdir -p "$dir"
export PATH="$PATH:/usr/local/cuda/bin"
moe_opt=${MOE_BUILD_DIR:-$root/build}/bin/moe-opt
[ -x "$moe_opt" ] || die "$moe_opt not found: build it first (ninja -C build moe-opt)"
option=--moe-gpu-emit-library
if [ ${#configs[@]} -gt 0 ]; then
  option="--moe-gpu-emit-library=configs=$(
    IFS=,
    echo "${configs[*]}"
  )"
fi
echo "library: moe-opt $option" >"$dir/VARIANT"
echo 'module {}' | "$moe_opt" "$option" -o "$dir/library.mlir"
python3 "$root/test/GPU/gen_ops_harness.py" "$dir/library.mlir" >"$dir/ops.mlir"
"$bin/mlir-opt" "$dir/ops.mlir" --inline --gpu-lower-to-nvvm-pipeline="cubin-chip=sm_90a cubin-features=+ptx80 cubin-format=bin opt-level=3" -o "$dir/ops.llvm.mlir"
"$bin/mlir-translate" --mlir-to-llvmir "$dir/ops.llvm.mlir" -o "$dir/ops.ll"
"$bin/llc" -O2 -filetype=obj -relocation-model=pic "$dir/ops.ll" -o "$dir/ops.o"
rm -f "$dir/ops.llvm.mlir" "$dir/ops.ll" "$dir/library.mlir" "$dir/ops.mlir"
ls -la "$dir"
