#!/usr/bin/env bash
# Times variants of the GPU library against each other in one GPU run, so their ratios
# come from the same machine state:
#   here:        bash scripts/build-ops-harness.sh gpu-inputs/ops-base /tmp/old_generator.py
#                bash scripts/build-ops-harness.sh                 # gpu-inputs/ops
#   GPU machine: bash scripts/gpu-ops-compare.sh CONFIGS DIR...
# Runs every op check on the first DIR, then times the BENCH.md configurations CONFIGS
# (comma-separated) with each DIR in turn (MOE_PROFILE=1 adds per-kernel CUDA times).
# Writes $OUT/summary.txt (the BENCH lines) and $OUT/compare.tgz (every log and JSON).
set -u -o pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${OUT:-/tmp/moe-gpu-out}
configs=$1
shift
mkdir -p "$out/compare"
status=0
first=1
for dir in "$@"; do
  name=$(basename "$dir")
  if [ $first = 1 ]; then
    OUT="$out/compare/check-$name" bash "$root/scripts/gpu-ops-check.sh" --ops="$dir" | tail -3 || status=1
    first=0
  fi
  OUT="$out/compare/bench-$name" bash "$root/scripts/gpu-ops-check.sh" --ops="$dir" --bench="$configs" |
    grep -E "^BENCH|FAIL" || status=1
done
{
  for f in "$out"/compare/bench-*/ops.log; do
    echo "== $f"
    grep -E "^BENCH|^generator" "$f"
  done
  grep -hE "passed, .* failed|^FAIL" "$out"/compare/check-*/ops.log
} >"$out/summary.txt"
tar -C "$out" -czf "$out/compare.tgz" compare && rm -rf "$out/compare"
cat "$out/summary.txt"
exit $status
