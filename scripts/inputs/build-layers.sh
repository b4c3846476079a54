#!/usr/bin/env bash
# Compiles the layers that scripts/gpu/layer-check.sh runs on the GPU machine (which has no
# LLVM), here, with build/bin/moe-compile (docs/gpu-path.md section 2):
#   gpu-inputs/layers/NAME.o NAME.h NAME.json   for
#   - the four benchmark layers of examples/ (mixtral-8x7b, olmoe-1b-7b, qwen3-30b-a3b,
#     deepseek-v3);
#   - small-t1, small-t37, small-t1000: d=1536, n=704, E=8, k=2, softmax, renormalised;
#   - sigmoid-groups-shared: T=37, d=256, n=128, E=16, sigmoid + bias, 4 groups / top-2,
#     k=4, scaling 2.5, shared expert m=128;
#   - tiny: T=37, d=128, n=128, E=4, k=2, softmax, renormalised (for compute-sanitizer);
#   - example: the same shape with T dynamic up to 64, the C++ example's layer (examples/cpp),
#     which it runs at T = 1, 37 and 64;
#   - NAME-recompute: the four benchmark layers with H recomputed in backward
#     (moe-compile --policy=recompute);
#   - NAME-offload: the same with H offloaded to pinned host memory (--policy=offload), and
#     sigmoid-groups-shared-offload (both H offloaded, a shared expert's too);
#   - the non-gated experts (docs/gpu-kernels.md section 2.2.1), W_gate_up [E, d, n]:
#     silu-t37 (T=37, d=256, n=192, E=6, k=2, softmax, renormalised), gelu-shared-t37 (T=37,
#     d=192, n=320, E=8, k=3, sigmoid + bias, renormalised, shared expert m=192, gelu (erf)),
#     silu-shared-dyn (d=128, n=128, E=4, k=2, shared expert m=128, T dynamic up to 64),
#     gelu-dyn (d=256, n=192, E=8, k=2, softmax, T dynamic up to 64) and gelu-tanh-t37 (T=37,
#     d=256, n=192, E=8, k=2, softmax, renormalised, shared expert m=128, gelu's tanh form);
#   - token dropping (capacity_factor 0.75, each expert keeping its first
#     ceil(0.75 * T * k / E) pairs): capacity-t37 (T=37, d=256, n=192, E=8, k=2, softmax,
#     SwiGLU) and capacity-dyn (the same sizes, T dynamic up to 64, sigmoid + bias,
#     renormalised, shared expert m=128, gelu's tanh form);
#   - experts with biases (b_gate_up, b_down, as gpt-oss has): bias-t37 (T=37, d=256, n=192,
#     E=8, k=2, softmax, renormalised, SwiGLU) and bias-gelu-shared-t37 (gelu-shared-t37's
#     sizes and routing, gelu (erf), its experts' dx added into the shared expert's).
# The generated .mlir files go to gpu-inputs/mlir/. What this script writes (layers/, mlir/)
# must stay under 32 MiB: a device call carries at most 64 MiB, these inputs and the folder of
# the session's other step beside them (ep/, dynamic/, ops/, ...; each built by its own
# script); the script fails when they do not.
#
#   bash scripts/inputs/build-layers.sh [--only NAME[,NAME...]] [--out DIR] [-- moe-compile args]
# Environment: MOE_BUILD_DIR (default build), MOE_COMPILE (default $MOE_BUILD_DIR/bin/moe-compile),
# PYTHON (default python3).
# Last line: "N passed, M failed"; exit code non-zero on any failure.
# shellcheck disable=SC2154 # parse_options (scripts/common.sh) sets the options' variables

set -u -o pipefail

# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
build=${MOE_BUILD_DIR:-$root/build}
compile=${MOE_COMPILE:-$build/bin/moe-compile}
limit_mib=32

parse_options --only=only --out=out="$root/gpu-inputs" -- "$@"
no_positional
extra=("${rest[@]}")

[ -x "$compile" ] || die "$compile not found: build it first (ninja -C $build moe-compile)"

layers=$out/layers
mlir=$out/mlir
mkdir -p "$layers" "$mlir"
log=$out/build-gpu-inputs.log
: >"$log"

# The generated layers (name T d n E k scoring renormalize bias groups topk_groups scaling m).
"$python" - "$mlir" "$root" <<'EOF' >>"$log" 2>&1 || { echo "FAIL writing the generated .mlir (log: $log)"; exit 1; }
import os, sys
sys.path.insert(0, os.path.join(sys.argv[2], "python"))
from moe_mlir.config import LayerConfig
from moe_mlir.mlir_text import layer_mlir

folder = sys.argv[1]
layers = {
    "small-t1": LayerConfig(1, 1536, 704, 8, 2, renormalize=True, dtype="bf16"),
    "small-t37": LayerConfig(37, 1536, 704, 8, 2, renormalize=True, dtype="bf16"),
    "small-t1000": LayerConfig(1000, 1536, 704, 8, 2, renormalize=True, dtype="bf16"),
    "sigmoid-groups-shared": LayerConfig(37, 256, 128, 16, 4, scoring="sigmoid",
                                         renormalize=True, router_bias=True, num_groups=4,
                                         topk_groups=2, scaling_factor=2.5, shared_ffn=128,
                                         dtype="bf16"),
    "tiny": LayerConfig(37, 128, 128, 4, 2, renormalize=True, dtype="bf16"),
    "example": LayerConfig(37, 128, 128, 4, 2, renormalize=True, dtype="bf16"),
    # deepseek-v3 without its shared expert: the work of docs/benchmarks.md's baseline for it (the
    # Mixtral block with E = 256, k = 8, which has no shared expert)
    "deepseek-v3-routed": LayerConfig(8192, 7168, 2048, 256, 8, scoring="sigmoid",
                                      renormalize=True, router_bias=True, num_groups=8,
                                      topk_groups=4, scaling_factor=2.5, dtype="bf16"),
    # non-gated experts: n-wide W_gate_up and H, A = act(H)
    "silu-t37": LayerConfig(37, 256, 192, 6, 2, renormalize=True, activation="silu",
                            dtype="bf16"),
    "gelu-shared-t37": LayerConfig(37, 192, 320, 8, 3, scoring="sigmoid", renormalize=True,
                                   router_bias=True, shared_ffn=192, activation="gelu",
                                   dtype="bf16"),
    "silu-shared-dyn": LayerConfig(37, 128, 128, 4, 2, renormalize=True, shared_ffn=128,
                                   activation="silu", dtype="bf16"),
    "gelu-dyn": LayerConfig(37, 256, 192, 8, 2, activation="gelu", dtype="bf16"),
    "gelu-tanh-t37": LayerConfig(37, 256, 192, 8, 2, renormalize=True, shared_ffn=128,
                                 activation="gelu_tanh", dtype="bf16"),
    # token dropping (scripts/gpu/layer-check.sh's capacity step gives the check 0.75)
    "capacity-t37": LayerConfig(37, 256, 192, 8, 2, capacity_factor=0.75, dtype="bf16"),
    "capacity-dyn": LayerConfig(37, 256, 192, 8, 2, scoring="sigmoid", renormalize=True,
                                router_bias=True, shared_ffn=128, activation="gelu_tanh",
                                capacity_factor=0.75, dtype="bf16"),
    # experts with biases (scripts/gpu/layer-check.sh's bias step)
    "bias-t37": LayerConfig(37, 256, 192, 8, 2, renormalize=True, expert_bias=True, dtype="bf16"),
    "bias-gelu-shared-t37": LayerConfig(37, 192, 320, 8, 3, scoring="sigmoid", renormalize=True,
                                        router_bias=True, shared_ffn=192, activation="gelu",
                                        expert_bias=True, dtype="bf16"),
}
# Layers of dynamic token count: the bound.
bounds = {"example": 64, "silu-shared-dyn": 64, "gelu-dyn": 64, "capacity-dyn": 64}
for name, cfg in layers.items():
    fn = name.replace("-", "_")
    with open(os.path.join(folder, name + ".mlir"), "w") as f:
        f.write(f"// Generated by scripts/inputs/build-layers.sh: {cfg}\n")
        f.write(layer_mlir(cfg, fn, bounds.get(name)))
    print("wrote", name)
EOF

sources=()
for example in mixtral-8x7b olmoe-1b-7b qwen3-30b-a3b deepseek-v3; do
  sources+=("$root/examples/$example.mlir")
done
for name in small-t1 small-t37 small-t1000 sigmoid-groups-shared tiny example deepseek-v3-routed \
  silu-t37 gelu-shared-t37 silu-shared-dyn gelu-dyn gelu-tanh-t37 capacity-t37 capacity-dyn \
  bias-t37 bias-gelu-shared-t37; do
  sources+=("$mlir/$name.mlir")
done

# compile_one SRC NAME [moe-compile options...]
compile_one() {
  local src=$1 name=$2
  shift 2
  if [ -n "$only" ] && ! [[ ",$only," == *",$name,"* ]]; then
    return
  fi
  rm -f "$layers/$name".{o,h,json}
  local start size
  start=$(date +%s)
  echo "== $compile $src -o $layers/$name $* ${extra[*]:-}" >>"$log"
  if (cd "$root" && timeout 900 "$compile" "$src" -o "$layers/$name" "$@" "${extra[@]}") \
    >>"$log" 2>&1 &&
    [ -s "$layers/$name.o" ] && [ -s "$layers/$name.h" ] && [ -s "$layers/$name.json" ]; then
    size=$(du -k "$layers/$name.o" | cut -f1)
    pass "$name ($(($(date +%s) - start)) s, $name.o ${size} KiB)"
  else
    fail "$name: moe-compile failed or wrote no .o/.h/.json (log: $log)"
    tail -5 "$log" | sed 's/^/    /'
  fi
}
for src in "${sources[@]}"; do
  compile_one "$src" "$(basename "$src" .mlir)"
done
# the benchmark layers again with H recomputed in backward (keep-H against recompute-H)
for example in mixtral-8x7b olmoe-1b-7b qwen3-30b-a3b deepseek-v3; do
  compile_one "$root/examples/$example.mlir" "$example-recompute" --policy=recompute
done
compile_one "$mlir/deepseek-v3-routed.mlir" deepseek-v3-routed-recompute --policy=recompute
# and with H offloaded to pinned host memory between forward and backward (offload-H
# through the compiled entry points), and a small one for the checks
for example in mixtral-8x7b olmoe-1b-7b qwen3-30b-a3b deepseek-v3; do
  compile_one "$root/examples/$example.mlir" "$example-offload" --policy=offload
done
compile_one "$mlir/sigmoid-groups-shared.mlir" sigmoid-groups-shared-offload --policy=offload

total_kib=$(du -sk "$layers" "$mlir" | awk '{s += $1} END {print s}')
. "$root/scripts/inputs/stamp.sh"
{
  inputs_stamp "$root" "$build"
  echo "compiler: $compile"
  (cd "$layers" && ls -l)
} >"$out/INPUTS.txt"
if [ "$total_kib" -gt $((limit_mib * 1024)) ]; then
  fail "$layers and $mlir hold $((total_kib / 1024)) MiB, over the ${limit_mib} MiB limit; biggest:"
  du -ak "$layers" | sort -rn | sed -n '2,8p' | sed 's/^/    /'
else
  echo "$layers, $mlir: $((total_kib / 1024)) MiB of ${limit_mib} MiB"
fi
finish
