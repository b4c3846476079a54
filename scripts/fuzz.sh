#!/usr/bin/env bash
# Fuzzes the moe-mlir parser and passes with libFuzzer for SECONDS (default
# 60): configures build-fuzz with -DMOE_ENABLE_FUZZER=ON (clang-22, ASan and
# coverage on our libraries), builds tools/moe-parser-fuzzer only, and runs it
# on seeds that test/Fuzz/make-corpus.py cuts from the lit tests and examples
# (made anew each run), with test/Fuzz/moe.dict. Exits non-zero on any crash,
# leak, timeout or out-of-memory, and prints the input that caused it.
#
#   scripts/fuzz.sh [SECONDS]
#
# MOE_FUZZ_BUILD_DIR overrides the build folder; the run's corpus, log and
# artifacts go to $MOE_FUZZ_BUILD_DIR/fuzz-run.
set -euo pipefail
# shellcheck source=common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
build=${MOE_FUZZ_BUILD_DIR:-$root/build-fuzz}
seconds=${1:-60}
case "$seconds" in -h | --help) usage ;; esac
if ! [[ $seconds =~ ^[0-9]+$ ]] || ((seconds < 1)); then
  die "usage: scripts/fuzz.sh [SECONDS]"
fi

# libFuzzer and the sanitizer runtimes of clang-22 come with libclang-rt-22-dev.
"$root/scripts/install-deps.sh" libclang-rt-22-dev
MOE_BUILD_DIR=$build MOE_BUILD_TARGET=moe-parser-fuzzer "$root/scripts/build.sh" \
  -DMOE_ENABLE_FUZZER=ON -DMOE_BUILD_TESTS=OFF

run=$build/fuzz-run
rm -rf "$run"
mkdir -p "$run/corpus" "$run/artifacts"
python3 "$root/test/Fuzz/make-corpus.py" --out "$run/corpus"
echo "fuzz: ${seconds} s, log in $run/fuzz.log"

status=0
"$build/bin/moe-parser-fuzzer" "$run/corpus" \
  -dict="$root/test/Fuzz/moe.dict" \
  -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
  -max_total_time="$seconds" -print_final_stats=1 \
  -artifact_prefix="$run/artifacts/" >"$run/fuzz.log" 2>&1 || status=$?

grep -E '^(#[0-9]+ +DONE|Done [0-9]+ runs|stat::)' "$run/fuzz.log" || true
shopt -s nullglob
artifacts=("$run"/artifacts/{crash,leak,timeout,oom}-*)
if ((status != 0 || ${#artifacts[@]} > 0)); then
  tail -n 60 "$run/fuzz.log"
  echo "fuzz: FAILED (libFuzzer exit status $status)"
  for artifact in "${artifacts[@]}"; do
    echo "fuzz: input: $artifact"
    echo "fuzz: replay: $build/bin/moe-parser-fuzzer $artifact"
  done
  exit 1
fi
echo "fuzz: no crash, leak, timeout or out-of-memory in ${seconds} s"
