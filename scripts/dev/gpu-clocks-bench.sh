#!/usr/bin/env bash
# bench.py on the docs/benchmarks.md layers with the sustained ceiling, under gpu-clocks.sh (the SM
# clock, power and power-cap share of each stretch), MOE_CLOCKS_RUNS times (default 2), and
# bench/bench.py's dry-run tests (CPU) first. Needs gpu-inputs/layers linked
# (gpu/layer-check.sh --only build does it). Output: $OUT/clocks-bench.tgz and the summaries.
#   bash scripts/dev/gpu-clocks-bench.sh
set -u -o pipefail
# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
case "${1:-}" in -h | --help) usage ;; "") ;; *) die "unknown option $1 (see --help)" ;; esac
out=${OUT:-/tmp/moe-clocks-bench}
mkdir -p "$out/runs"
status=0
PYTHONPATH="$root/python" timeout 120 python3 -m pytest -q -p no:cacheprovider \
  "$root/test/Python/test_bench.py" 2>&1 | tail -3 || status=1
L=$root/gpu-inputs/layers
for run in $(seq 1 "${MOE_CLOCKS_RUNS:-2}"); do
  echo "== run $run"
  OUT="$out/runs/$run" timeout 240 bash "$root/scripts/dev/gpu-clocks.sh" python3 -u "$root/bench/bench.py" \
    --layer "$L/mixtral-8x7b" --layer "$L/olmoe-1b-7b" --layer "$L/qwen3-30b-a3b" \
    --layer "$L/deepseek-v3" --layer "$L/deepseek-v3-routed" --sustained-ceiling 3 \
    --out "$out/runs/$run/bench" >/dev/null || status=1
  # the stretches of the ceilings and the timed layers, then bench.py's table
  grep -E "dense ceiling|ours: check|HF [A-Za-z0-9]+ \(" "$out/runs/$run/clocks.txt"
  tail -n 14 "$out/runs/$run/cmd.log" | cut -d' ' -f2-
done
tar -C "$out" -czf "$out/clocks-bench.tgz" runs && rm -rf "$out/runs"
exit $status
