#!/usr/bin/env bash
# One compiled layer for every token count up to its bound, on the GPU machine: the layers of
# scripts/inputs/build-dynamic-layers.sh (carry gpu-inputs) linked with libmoe_runtime
# (scripts/gpu/layer-check.sh --only build on gpu-inputs/dynamic), then bench/dynamic_tokens.py:
# the dynamic layer bitwise against the layers compiled for exactly T, the sweep, the refusals
# of T outside the bound, a CUDA graph of a step, and the speed ratios.
#   bash scripts/gpu/dynamic-check.sh [--only CONFIG[,CONFIG...]] [--profile]
# --profile: where each pair's time goes at its smallest T (kernels, host time to issue a step).
# Output in $OUT (default /tmp/moe-gpu-out): dynamic_tokens.json and the logs; the last line
# "N passed, M failed".
# shellcheck disable=SC2154 # parse_options (scripts/common.sh) sets the options' variables
set -u -o pipefail
# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
out=${OUT:-/tmp/moe-gpu-out}
parse_options --only=only --profile:profile=1 -- "$@"
no_positional
inputs=$root/gpu-inputs/dynamic
[ -d "$inputs/layers" ] || die "$inputs/layers missing: run scripts/inputs/build-dynamic-layers.sh and carry gpu-inputs"
mkdir -p "$out"
MOE_GPU_INPUTS=$inputs OUT="$out/build" bash "$root/scripts/gpu/layer-check.sh" --only build \
  --deadline 200 | tail -3 || die "linking the dynamic layers failed (log: $out/build)"
args=(--dir "$inputs/layers" --out "$out")
[ -z "$only" ] || args+=(--only "$only")
[ -z "$profile" ] || args+=(--profile)
"${PYTHON:-python3}" "$root/bench/dynamic_tokens.py" "${args[@]}"
