#!/usr/bin/env bash
# The expert-parallel layer over one rank on the GPU machine: the layers of
# scripts/inputs/build-ep-layers.sh (gpu-inputs/ep) and the unsplit benchmark layers of
# scripts/inputs/build-layers.sh (gpu-inputs/layers), linked with libmoe_runtime
# (scripts/gpu/layer-check.sh --only build), then
#   cpp   the C++ example examples/cpp/ep_example.cpp (moe_ep_example), built against
#         example-ep1 and the unsplit example layer with NCCL (the Python package nvidia.nccl
#         of $PYTHON, else the CUDA toolkit's) and run: its stages with NCCL all-to-alls
#         between them, out and the logits bitwise against the unsplit layer, the gradients
#         within tolerance, at T = 1, 37 and 64;
#   bench/ep_staged.py with a NCCL group of one rank on the benchmark layers: the staged
#         forward bitwise against the unsplit one, the gradients within tolerance, and the
#         speed ratio;
#   torch bench/ep_layer_check.py: MoELayer(ep_group=NCCL group of one rank, max_tokens=...)
#         on CUDA in bf16 against the non-EP MoELayer with the same weights (out and logits
#         bitwise, gradients within 2e-2): a small layer (T = 256 and 100, autocast, in 4
#         chunks, a capacity met, exceeded with "error" and "drop"), a DeepSeek-V3-like one,
#         mixtral-8x7b at T = 16384, and a two-layer Mixtral through replace_moe_blocks;
#         its layers come prebuilt in
#         gpu-inputs/ep/torch-cache.tar.xz, unpacked into $MOE_LAYER_BUILD_DIR/ep-torch-cache.
#   bash scripts/gpu/ep-check.sh [--only NAME[,NAME...]]
# NAME: cpp, torch, or a configuration of ep_staged.py (default: all of them).
# Output in $OUT (default /tmp/moe-gpu-out): ep_staged.json, ep_layer_check.json and the logs;
# the last line "N passed, M failed", the sum of all.
# Environment: MOE_LAYER_BUILD_DIR (default /tmp/moe-layer-build), PYTHON (default python3).
# shellcheck disable=SC2154 # parse_options (scripts/common.sh) sets the options' variables
set -u -o pipefail
# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
out=${OUT:-/tmp/moe-gpu-out}
work=${MOE_LAYER_BUILD_DIR:-/tmp/moe-layer-build}
parse_options --only=only -- "$@"
no_positional
for tree in "$root/gpu-inputs/ep" "$root/gpu-inputs"; do
  [ -d "$tree/layers" ] || die "$tree/layers missing: run scripts/inputs/build-ep-layers.sh and build-layers.sh, and carry gpu-inputs"
done
mkdir -p "$out"
for tree in ep main; do
  inputs=$root/gpu-inputs
  [ "$tree" = main ] || inputs=$root/gpu-inputs/$tree
  MOE_GPU_INPUTS=$inputs OUT="$out/build-$tree" bash "$root/scripts/gpu/layer-check.sh" \
    --only build --deadline 200 | tail -3 || die "linking the layers of $inputs failed (log: $out/build-$tree)"
done

configs=()
for name in ${only//,/ }; do
  [ "$name" = cpp ] || [ "$name" = torch ] || configs+=("$name")
done
total_passed=0
total_failed=0
# count LOG STATUS: adds the "N passed, M failed" line of LOG to the totals; a program that
# printed none, or exited non-zero with no failure, counts as one failure.
count() {
  local line p f
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$1" | tail -1)
  read -r p _ f _ <<<"${line:-0 passed, 0 failed}"
  [ "$2" -eq 0 ] || [ "$f" -gt 0 ] || f=1
  total_passed=$((total_passed + p))
  total_failed=$((total_failed + f))
}

if [ -z "$only" ] || wants cpp; then
  ex=$work/ep-example
  build_log=$out/ep-example-build.log
  # The wheel's NCCL where this Python has one (PyTorch installs it); else CMake searches.
  nccl_dir=$("$python" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
  echo "== C++ example: examples/cpp with example-ep1 and NCCL from ${nccl_dir:-the CUDA toolkit}"
  if cmake -G Ninja -S "$root/examples/cpp" -B "$ex" -DCMAKE_BUILD_TYPE=Release \
    -DMOE_LAYER="$root/gpu-inputs/layers/example" \
    -DMOE_EP_LAYER="$root/gpu-inputs/ep/layers/example-ep1" \
    -DMOE_RUNTIME_DIR="$work/runtime" ${nccl_dir:+-DMOE_NCCL_DIR="$nccl_dir"} \
    >"$build_log" 2>&1 && ninja -C "$ex" moe_ep_example >>"$build_log" 2>&1; then
    timeout -k 10 120 "$ex/moe_ep_example" 2>&1 | tee "$out/ep-example.log"
    count "$out/ep-example.log" "${PIPESTATUS[0]}"
  else
    tail -20 "$build_log"
    echo "FAIL C++ example build (log: $build_log)"
    total_failed=$((total_failed + 1))
  fi
fi

if [ -z "$only" ] || [ ${#configs[@]} -gt 0 ]; then
  args=(--ep-dir "$root/gpu-inputs/ep/layers" --dir "$root/gpu-inputs/layers" --out "$out")
  [ ${#configs[@]} -eq 0 ] || args+=(--only "$(
    IFS=,
    echo "${configs[*]}"
  )")
  echo "== bench/ep_staged.py"
  "$python" "$root/bench/ep_staged.py" "${args[@]}" 2>&1 | tee "$out/ep_staged.log"
  count "$out/ep_staged.log" "${PIPESTATUS[0]}"
fi
if [ -z "$only" ] || wants torch; then
  tarball=$root/gpu-inputs/ep/torch-cache.tar.xz
  cache=$work/ep-torch-cache
  echo "== bench/ep_layer_check.py: MoELayer(ep_group=...) on CUDA against MoELayer"
  rm -rf "$cache"
  # tarfile, not tar -J: the machine may have no xz.
  if [ -f "$tarball" ] && "$python" -c 'import sys, tarfile
kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
tarfile.open(sys.argv[1]).extractall(sys.argv[2], **kw)' "$tarball" "$cache/prebuilt"; then
    # No compiler here: every layer from the prebuilt entries, linked into $cache/run.
    MOE_COMPILE=none MOE_MLIR_PREBUILT="$cache/prebuilt" MOE_MLIR_CACHE="$cache/run" \
      MOE_RUNTIME_LIB="$work/runtime/lib/libmoe_runtime.so" MOE_MLIR_QUIET=1 \
      timeout -k 10 400 "$python" "$root/bench/ep_layer_check.py" --out "$out" 2>&1 |
      tee "$out/ep_layer_check.log"
    count "$out/ep_layer_check.log" "${PIPESTATUS[0]}"
  else
    echo "FAIL no $tarball (or it did not unpack): run scripts/inputs/build-ep-layers.sh"
    total_failed=$((total_failed + 1))
  fi
fi
echo "$total_passed passed, $total_failed failed"
[ "$total_failed" -eq 0 ]
