#!/usr/bin/env bash
# The expert-parallel layer on 2 or 4 GPUs of one host (a machine of kind nvidia-h200-x2 or -x4;
# NCCL over NVLink, multicast left off): the layers of scripts/inputs/build-ep-layers.sh
# (mixtral-8x7b over 2 and 4 ranks) and the single-GPU reference of build-dynamic-layers.sh,
# linked with libmoe_runtime (scripts/gpu/layer-check.sh --only build), then
# `torchrun --standalone --nproc-per-node=N bench/ep_multi.py` for each N of --gpus that the
# machine has: correctness for random, skewed and empty-rank routing, step time, the
# all-to-alls' share, the scaling efficiency against one GPU and a Megatron-style torch layer,
# the peak memory a rank with and without a capacity.
#   bash scripts/gpu/ep-multi-gpu.sh [--gpus 2,4]
# Output in $OUT (default /tmp/moe-gpu-out): ep_multi_N.json and the logs; the last line
# "N passed, M failed".
# shellcheck disable=SC2154 # parse_options (scripts/common.sh) sets the options' variables
set -u -o pipefail
# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
out=${OUT:-/tmp/moe-gpu-out}
parse_options --gpus=gpus=2,4 -- "$@"
no_positional
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 # multicast off (the device notes)
for tree in ep dynamic; do
  inputs=$root/gpu-inputs/$tree
  [ -d "$inputs/layers" ] || die "$inputs/layers missing: run scripts/inputs/build-$tree-layers.sh and carry gpu-inputs"
  MOE_GPU_INPUTS=$inputs OUT="$out/build-$tree" bash "$root/scripts/gpu/layer-check.sh" \
    --only build --deadline 200 | tail -3 || die "linking the layers of $inputs failed (log: $out/build-$tree)"
done
have=$(nvidia-smi -L | wc -l)
status=0
IFS=, read -r -a counts <<<"$gpus"
for n in "${counts[@]}"; do
  if [ "$have" -lt "$n" ]; then
    echo "== $n GPUs: this machine has $have; skipped"
    continue
  fi
  echo "== $n GPUs"
  OUT=$out "${TORCHRUN:-torchrun}" --standalone --nproc-per-node="$n" "$root/bench/ep_multi.py" \
    --out "$out" 2>&1 | tee "$out/ep_multi_$n.log" | tail -40
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
exit $status
