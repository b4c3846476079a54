#!/usr/bin/env bash
# Fuzzes the moe-mlir parser and passes with libFuzzer for SECONDS (default
# 60): configures build-fuzz with -DMOE_ENABLE_FUZZER=ON (clang-22, ASan and
# coverage on our libraries), builds tools/moe-parser-fuzzer only, and runs it
# twice: on seeds that test/Fuzz/make-corpus.py cuts from the lit tests and
# examples (made anew each run), with test/Fuzz/moe.dict; then in its
# structure-aware mode (MOE_FUZZ_LAYERS=1), where the fuzzer's bytes choose
# layers built with the op builders. Exits non-zero on any crash, leak,
# timeout or out-of-memory, and prints the input that caused it.
#
#   scripts/fuzz.sh [SECONDS]    # SECONDS for each mode
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
mkdir -p "$run/corpus" "$run/layers" "$run/artifacts"
python3 "$root/test/Fuzz/make-corpus.py" --out "$run/corpus"

# fuzz NAME CORPUS ARGS...: the harness for SECONDS on CORPUS, its log in
# $run/NAME.log; a crash, leak, timeout or out-of-memory fails the script.
status=0
fuzz() {
  local name=$1 corpus=$2 rc=0
  shift 2
  echo "fuzz: $name, ${seconds} s, log in $run/$name.log"
  "$build/bin/moe-parser-fuzzer" "$corpus" "$@" \
    -timeout=10 -rss_limit_mb=2048 -max_total_time="$seconds" \
    -print_final_stats=1 -artifact_prefix="$run/artifacts/$name-" \
    >"$run/$name.log" 2>&1 || rc=$?
  grep -E '^(#[0-9]+ +DONE|Done [0-9]+ runs|stat::)' "$run/$name.log" || true
  if ((rc != 0)); then
    tail -n 60 "$run/$name.log"
    echo "fuzz: $name: FAILED (libFuzzer exit status $rc)"
    status=1
  fi
}
# The text of the lit tests, mutated; then layers built from the fuzzer's
# bytes (the harness's structure-aware mode).
fuzz parser "$run/corpus" -dict="$root/test/Fuzz/moe.dict" -max_len=8192
MOE_FUZZ_LAYERS=1 fuzz layers "$run/layers" -max_len=128

shopt -s nullglob
artifacts=("$run"/artifacts/*-{crash,leak,timeout,oom}-*)
if ((status != 0 || ${#artifacts[@]} > 0)); then
  for artifact in "${artifacts[@]}"; do
    echo "fuzz: input: $artifact"
    case "$artifact" in
    */layers-*) echo "fuzz: replay: MOE_FUZZ_LAYERS=1 $build/bin/moe-parser-fuzzer $artifact" ;;
    *) echo "fuzz: replay: $build/bin/moe-parser-fuzzer $artifact" ;;
    esac
  done
  echo "fuzz: FAILED"
  exit 1
fi
echo "fuzz: no crash, leak, timeout or out-of-memory in either mode, ${seconds} s each"
