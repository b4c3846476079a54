#!/usr/bin/env bash
# The expert-parallel layer over one rank on the GPU machine: the layers of
# scripts/inputs/build-ep-layers.sh (gpu-inputs/ep) and the unsplit benchmark layers of
# scripts/inputs/build-layers.sh (gpu-inputs/layers), linked with libmoe_runtime
# (scripts/gpu/layer-check.sh --only build), then bench/ep_staged.py with a NCCL group of one
# rank: the staged forward bitwise against the unsplit one, the gradients within tolerance,
# and the speed ratio.
#   bash scripts/gpu/ep-check.sh [--only CONFIG[,CONFIG...]]
# Output in $OUT (default /tmp/moe-gpu-out): ep_staged.json and the logs; the last line
# "N passed, M failed".
# shellcheck disable=SC2154 # parse_options (scripts/common.sh) sets the options' variables
set -u -o pipefail
# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
out=${OUT:-/tmp/moe-gpu-out}
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
args=(--ep-dir "$root/gpu-inputs/ep/layers" --dir "$root/gpu-inputs/layers" --out "$out")
[ -z "$only" ] || args+=(--only "$only")
"${PYTHON:-python3}" "$root/bench/ep_staged.py" "${args[@]}"
