#!/usr/bin/env bash
# Prebuilds, here (the LLVM machine), the moe_mlir compile-cache entries that
# scripts/gpu/torch-check.sh needs on the GPU machine (which has no LLVM): the sm_90a layers of
# bench/train_check.py's two training models (T = batch x seq, read from the models; also the
# layers of bench/train_fidelity.py, which trains the same models, in both precisions) and its
# --layer-check layers, compiled with build/bin/moe-compile into
#   gpu-inputs/torch-cache/sm_90a/<config key>/<compiler key>/   (NAME.o NAME.h NAME.json meta.json)
# (the MOE_MLIR_CACHE layout, docs/python.md); and, when gpu-inputs/layers exists
# (inputs/build-layers.sh), bench/long_context.py's plan and layers into gpu-inputs/long-context
# (the largest T of each benchmark layer in 4 GiB) and bench/offload_stack.py's layer into
# gpu-inputs/offload. Needs torch and transformers (the CPU build is
# enough) and ptxas (as scripts/inputs/build-layers.sh). What the torch checks carry (the
# cache, gpu-inputs/layers, mlir, long-context, offload) must stay under 60 MiB.
#
#   bash scripts/inputs/build-torch-cache.sh [--size full|tiny]
# Environment: MOE_BUILD_DIR (default build), PYTHON (default /usr/bin/python3).
# Last line: "N passed, M failed".
# shellcheck disable=SC2154 # parse_options (scripts/common.sh) sets the options' variables
set -u -o pipefail

# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
build=${MOE_BUILD_DIR:-$root/build}
python=${PYTHON:-/usr/bin/python3}
parse_options --size=size=full -- "$@"
no_positional
[ -x "$build/bin/moe-compile" ] || die "$build/bin/moe-compile not found: ninja -C $build moe-compile"
if ! command -v ptxas >/dev/null && [ ! -x /usr/local/cuda/bin/ptxas ]; then
  ptxas=$("$python" "$root/scripts/fetch-ptxas.py") || die "no ptxas"
  PATH="$(dirname "$ptxas"):$PATH"
  export PATH
fi
out=$root/gpu-inputs/torch-cache
# Fresh: only the entries of this compiler travel (the device picks the newest per layer).
rm -rf "$out"
mkdir -p "$out"
export MOE_COMPILE="$build/bin/moe-compile" MOE_BUILD_DIR="$build"
"$python" "$root/bench/train_check.py" --prebuild "$out" --size "$size"
rc=$?
# which kernels these entries hold, for gpu/torch-check.sh to hold against gpu-inputs/INPUTS.txt
# (a cache older than the layers would otherwise be checked without anyone knowing)
. "$root/scripts/inputs/stamp.sh"
inputs_stamp "$root" "$build" >"$out/INPUTS.txt"
if [ -d "$root/gpu-inputs/layers" ]; then
  rm -rf "$root/gpu-inputs/long-context"
  "$python" "$root/bench/long_context.py" --prebuild "$root/gpu-inputs/long-context" \
    --layers "$root/gpu-inputs/layers" || rc=1
  rm -rf "$root/gpu-inputs/offload"
  "$python" "$root/bench/offload_stack.py" --prebuild "$root/gpu-inputs/offload" \
    --layers "$root/gpu-inputs/layers" || rc=1
fi
# What scripts/gpu/torch-check.sh carries: the cache, the layers and the two prebuilt folders.
carried=()
for folder in "$out" "$root"/gpu-inputs/{layers,mlir,long-context,offload}; do
  [ -d "$folder" ] && carried+=("$folder")
done
total_kib=$(du -sk "${carried[@]}" | awk '{s += $1} END {print s}')
echo "the torch checks' inputs: $((total_kib / 1024)) MiB of 60 MiB (torch-cache: $(du -sh "$out" | cut -f1))"
if [ "$total_kib" -gt $((60 * 1024)) ]; then
  echo "FAIL the torch checks' inputs (${carried[*]}) are over 60 MiB"
  exit 1
fi
exit $rc
