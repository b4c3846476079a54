#!/usr/bin/env bash
# Times variants of the GPU library against each other in one GPU run, so their ratios
# come from the same machine state:
#   here:        bash scripts/inputs/build-ops-harness.sh gpu-inputs/ops-s2 down:stages=2
#                bash scripts/inputs/build-ops-harness.sh                 # gpu-inputs/ops
#   GPU machine: bash scripts/gpu/ops-compare.sh CONFIGS DIR...
# Runs every op check on each DIR (a variant that is timed must be right), then times the
# docs/benchmarks.md configurations CONFIGS (comma-separated) with each DIR in turn (MOE_PROFILE=1 adds
# per-kernel CUDA times).
# MOE_COMPARE_ROUNDS=N (default 1) repeats the timing N times, every other round in the
# reverse order, so a drift of the GPU's speed over the call (clocks, temperature) does not
# favour the variant that runs first; the summary then ends with each variant's mean step
# time per configuration over the rounds.
# Writes $OUT/summary.txt (the BENCH lines) and $OUT/compare.tgz (every log and JSON).
set -u -o pipefail
# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
out=${OUT:-/tmp/moe-gpu-out}
case "${1:-}" in -h | --help) usage ;; "" | -*) die "usage: $me CONFIGS DIR... (see --help)" ;; esac
configs=$1
shift
[ $# -gt 0 ] || die "no library folders to compare (see --help)"
mkdir -p "$out/compare"
rounds=${MOE_COMPARE_ROUNDS:-1}
case "$rounds" in '' | *[!0-9]* | 0) die "MOE_COMPARE_ROUNDS=$rounds: expected a positive integer" ;; esac
status=0
dirs=("$@")
for dir in "${dirs[@]}"; do
  name=$(basename "$dir")
  echo "== check $name"
  # a variant that hangs loses its own check, not the others' timing
  OUT="$out/compare/check-$name" timeout -k 5 "${MOE_COMPARE_CHECK_LIMIT:-150}" \
    bash "$root/scripts/gpu/ops-check.sh" --ops="$dir" | tail -3 || status=1
done
for ((r = 1; r <= rounds; r++)); do
  order=("${dirs[@]}")
  if [ $((r % 2)) = 0 ]; then
    order=()
    for ((i = ${#dirs[@]} - 1; i >= 0; i--)); do order+=("${dirs[i]}"); done
  fi
  for dir in "${order[@]}"; do
    name=$(basename "$dir")
    # round 1 keeps the folder names of a single round
    tag=$name
    [ "$rounds" = 1 ] || tag=$name-r$r
    OUT="$out/compare/bench-$tag" bash "$root/scripts/gpu/ops-check.sh" --ops="$dir" --bench="$configs" |
      grep -E "^BENCH|FAIL" || status=1
  done
done
{
  for f in "$out"/compare/bench-*/ops.log; do
    echo "== $f"
    grep -E "^BENCH|^library" "$f"
  done
  for dir in "${dirs[@]}"; do
    name=$(basename "$dir")
    echo "check $name: $(grep -hE "passed, .* failed" "$out/compare/check-$name/ops.log")"
    grep -hE "^FAIL" "$out/compare/check-$name/ops.log"
  done
  # the round logs of variant $1: bench-NAME-rN only, not a variant whose name extends
  # this one (ops and ops-rows; ops and ops-r80, which a glob -r[0-9]* took for rounds)
  round_logs() {
    local f rest
    for f in "$out"/compare/bench-"$1"-r*/ops.log; do
      rest=${f#"$out/compare/bench-$1-r"}
      rest=${rest%/ops.log}
      [[ -n $rest && $rest != *[!0-9]* ]] && echo "$f"
    done
  }
  if [ "$rounds" != 1 ]; then
    echo "== mean step (ms) over $rounds rounds, alternating order"
    for dir in "${dirs[@]}"; do
      name=$(basename "$dir")
      round_logs "$name" | xargs -r -d "\n" cat |
        awk -v v="$name" '/^BENCH/ { c = $2; sub(":", "", c); t[c] += $3; n[c]++ }
          END { for (c in t) printf "MEAN %s %s: %.2f ms over %d\n", v, c, t[c] / n[c], n[c] }' | sort
    done
  fi
  # MOE_PROFILE=1: each GEMM's CUDA time (ms, all its launches in a step), mean over the
  # rounds; a configuration's profile table comes before its BENCH line
  for dir in "${dirs[@]}"; do
    name=$(basename "$dir")
    { cat "$out"/compare/bench-"$name"/ops.log 2>/dev/null; round_logs "$name" | xargs -r -d "\n" cat; } |
      awk -v v="$name" '$1 ~ /^moe_gemm_/ { t = $(NF - 2); ms = t + 0; if (t ~ /us$/) ms /= 1000
            k[$1] += ms }
          /^BENCH/ { c = $2; sub(":", "", c); for (g in k) { s[c " " g] += k[g]; n[c " " g]++ }
            delete k }
          END { for (x in s) printf "KERNEL %s %s %.3f ms over %d\n", v, x, s[x] / n[x], n[x] }' | sort
  done
} >"$out/summary.txt"
tar -C "$out" -czf "$out/compare.tgz" compare && rm -rf "$out/compare"
cat "$out/summary.txt"
exit $status
