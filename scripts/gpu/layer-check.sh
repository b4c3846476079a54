#!/usr/bin/env bash
# Runs the compiled layers on the GPU machine (CUDA 13, CMake, ninja, torch, transformers; no
# LLVM). gpu-inputs/ comes from scripts/inputs/build-layers.sh on the LLVM machine (carry it).
# Steps, each with a time limit, the whole within --deadline seconds (default 530):
#   build     runtime/ standalone (libmoe_runtime.so), then each gpu-inputs/layers/NAME.o
#             linked with it into NAME.so (g++ -shared, rpath to the runtime);
#   example   examples/cpp built against the "example" layer and run;
#   check     bench/check_layer.py on the small and odd layers, with the routing variants;
#   bench     bench/bench.py on the four docs/benchmarks.md configurations;
#   recompute the same layers compiled with H recomputed in backward (NAME-recompute): with
#             the bench step, in its bench.py run (--recompute: each right after its kept
#             layer, the ratio from one GPU state); alone, bench.py on them without the HF
#             baseline (JSON in $OUT/recompute/bench.json);
#   offload   check_layer.py on layers compiled with H offloaded (--policy=offload), then
#             bench/offload_compiled.py: stacks of them against the kept layers (JSON in
#             $OUT/offload/);
#   nongated  the non-gated experts' layers (silu-t37, gelu-shared-t37, gelu-tanh-t37:
#             bench/check_layer.py with every routing; silu-shared-dyn, gelu-dyn:
#             test/GPU/dynamic_layer_check.py at T = 1, 37 and 64, every routing) against the
#             torch reference, forward and backward (not among the default steps);
#   capacity  the token-dropping layers (capacity-t37, capacity-dyn at T = 1, 37 and 64;
#             capacity factor 0.75): test/GPU/capacity_layer_check.py with every routing
#             against the torch reference applying the same drops, forward and backward, and
#             the dropped pairs against the reference dispatch's (not among the default steps);
#   bias      the layers with expert biases (bias-t37, bias-gelu-shared-t37: b_gate_up and
#             b_down, gpt-oss style): bench/check_layer.py with every routing against the torch
#             reference, forward and backward, the biases' gradients too (not among the default
#             steps);
#   sanitize  compute-sanitizer memcheck and racecheck on the tiny layer's forward + backward
#             (last: the slowest and least predictable step).
# Output in $OUT (default /tmp/moe-gpu-out): gpu-layer-check.log (every step's output, with the
# environment first), summary.txt (one line per step, "N passed, M failed" last),
# check_layer.json, bench.json.
#
#   bash scripts/gpu/layer-check.sh [--only STEP[,STEP...]] [--quick] [--deadline SECONDS]
# --quick: random routing only on small-t37, sigmoid-groups-shared and tiny; memcheck only;
# bench with 1 warm-up and 5 steps.
# Environment: OUT, MOE_LAYER_BUILD_DIR (default /tmp/moe-layer-build), PYTHON (python3),
# MOE_GPU_INPUTS (default gpu-inputs), MOE_BENCH_PEERS (bench.py --peer for each, e.g. liger),
# MOE_BENCH_LAYERS (the bench step's layers, comma-separated; default the four of docs/benchmarks.md and
# deepseek-v3-routed, deepseek-v3 without its shared expert as docs/benchmarks.md's baseline has it),
# MOE_BENCH_GAPS (1: bench.py --gaps, where our step's time goes besides kernels),
# MOE_BENCH_SUSTAINED (bench.py --sustained-ceiling, default 3 seconds; 0: not).
# shellcheck disable=SC2154 # parse_options (scripts/common.sh) sets the options' variables

set -u -o pipefail
# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
out=${OUT:-/tmp/moe-gpu-out}
work=${MOE_LAYER_BUILD_DIR:-/tmp/moe-layer-build}
parse_options --only=only=build,example,check,sanitize,bench --quick:quick=1 \
  --deadline=deadline=530 -- "$@"
no_positional
check_steps "$only" build example check sanitize bench recompute offload nongated capacity bias

mkdir -p "$work"
gpu_check_start gpu-layer-check.log
{
  echo "options: only=$only quick=$quick deadline=$deadline"
  echo "inputs: $gpu_inputs"
  cat "$gpu_inputs/INPUTS.txt" 2>/dev/null || ls -l "$gpu_inputs/layers" 2>&1
} >>"$log" 2>&1
# layers compiled from a tree with uncommitted kernel builder or compiler changes are not the
# commit's, and a timing of them must not pass for the commit's: say so in the summary
uncommitted=$(sed -n 's/^uncommitted in lib\/ include\/ tools\/: //p' "$gpu_inputs/INPUTS.txt" 2>/dev/null)
if [ -n "$uncommitted" ] && [ "$uncommitted" != "none" ]; then
  note "NOTE: the layers were compiled with uncommitted changes in: $uncommitted"
fi

deadline_start "$deadline"
layers_dir=$gpu_inputs/layers
small_layers=(small-t1 small-t37 small-t1000 sigmoid-groups-shared tiny)
# MOE_BENCH_LAYERS: another order or subset (comma-separated)
bench_list=${MOE_BENCH_LAYERS:-mixtral-8x7b,olmoe-1b-7b,qwen3-30b-a3b,deepseek-v3,deepseek-v3-routed}
read -r -a bench_layers <<<"${bench_list//,/ }"
lib=$work/runtime/lib

# ---------------------------------------------------------------- build
if wants build || wants example || wants check || wants sanitize || wants bench || wants offload ||
  wants nongated || wants capacity || wants bias; then
  if [ ! -d "$layers_dir" ]; then
    fail "no $layers_dir: run scripts/inputs/build-layers.sh on the LLVM machine and carry gpu-inputs"
    finish
  fi
  # A child shell: timeout runs commands, not functions.
  run 240 "build runtime/ standalone" bash -c ". '$root/scripts/common.sh';
    gpu_build_runtime '$work/runtime' /dev/stdout -DMOE_RUNTIME_BUILD_SMOKE=OFF -- moe_runtime"
  rc=$?
  if [ $rc -eq 0 ] && [ -f "$lib/libmoe_runtime.so" ]; then
    pass "libmoe_runtime.so built ($lib)"
  else
    fail "runtime build: $(why $rc) (log: gpu-layer-check.log)"
    finish
  fi
  linked=()
  for o in "$layers_dir"/*.o; do
    [ -e "$o" ] || continue
    name=$(basename "$o" .o)
    # -z defs: a symbol the runtime lacks fails here, not at dlopen.
    mark=$(lines)
    if run 60 "link $name.so" g++ -shared -o "$layers_dir/$name.so" "$o" -L"$lib" \
      -lmoe_runtime -Wl,-rpath,"$lib" -Wl,-z,defs; then
      linked+=("$name")
    else
      if since "$mark" | grep -q "recompile with -fPIC"; then
        fail "link $name.so: $name.o is not position-independent (moe-compile must emit PIC)"
      else
        fail "link $name.so (log: gpu-layer-check.log)"
      fi
    fi
  done
  note "linked ${#linked[@]} layer(s): ${linked[*]:-none}"
fi

have() { [ -f "$layers_dir/$1.so" ] && [ -f "$layers_dir/$1.json" ]; }

# ---------------------------------------------------------------- example
if wants example; then
  if [ -f "$layers_dir/example.o" ] && [ -f "$layers_dir/example.h" ]; then
    ex=$work/example
    if run 120 "configure + build examples/cpp" bash -c "cmake -G Ninja -S '$root/examples/cpp' \
        -B '$ex' -DCMAKE_BUILD_TYPE=Release -DMOE_LAYER='$layers_dir/example' \
        -DMOE_RUNTIME_DIR='$work/runtime' && ninja -C '$ex'"; then
      mark=$(lines)
      run 60 "run the C++ example" "$ex/moe_layer_example"
      rc=$?
      if [ $rc -eq 0 ]; then
        pass "C++ example: $(tally "$mark")"
      else
        first=$(since "$mark" | grep -E '^FAIL' | head -1)
        fail "C++ example: ${first:-$(why $rc)}; $(tally "$mark") (log: gpu-layer-check.log)"
      fi
    else
      fail "C++ example build (log: gpu-layer-check.log)"
    fi
  else
    fail "C++ example: no $layers_dir/example.o/.h"
  fi
fi

# ---------------------------------------------------------------- check
# check_layers LIMIT WHAT DETAIL NAME... -- OPTIONS...: bench/check_layer.py on the layers NAME
# (each built one; a missing one fails), then WHAT passes or fails with its tally.
check_layers() {
  local limit=$1 what=$2 detail=$3 mark
  shift 3
  local args=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    if have "$1"; then
      args+=(--layer "$layers_dir/$1")
    else
      fail "$what $1: $1.so or $1.json missing"
    fi
    shift
  done
  [ $# -gt 0 ] && shift
  [ ${#args[@]} -gt 0 ] || return 0
  mark=$(lines)
  run "$limit" "$what" "$python" "$root/bench/check_layer.py" "${args[@]}" "$@"
  verdict "$what" "$mark" $? "$detail"
}

if wants check; then
  if [ "$quick" = 1 ]; then
    check_layers 240 check_layer.py "table in gpu-layer-check.log, check_layer.json" \
      small-t37 sigmoid-groups-shared tiny -- --routing random --out "$out"
  else
    check_layers 240 check_layer.py "table in gpu-layer-check.log, check_layer.json" \
      "${small_layers[@]}" -- --routing all --out "$out"
  fi
fi

# ---------------------------------------------------------------- bench
# bench_step TITLE SUFFIX SUBDIR LIMIT [bench.py options...]: bench.py on the four docs/benchmarks.md
# layers (NAME$SUFFIX), JSON into $out/SUBDIR.
bench_step() {
  local title=$1 suffix=$2 sub=$3 limit=$4 name mark
  shift 4
  local layer_args=()
  for name in "${bench_layers[@]}"; do
    layer_args+=(--layer "$layers_dir/$name$suffix")
    have "$name$suffix" || note "$title: $name$suffix.so missing, bench.py will skip it"
  done
  mark=$(lines)
  # bench.py starts no configuration after --deadline; one takes up to about 100 s.
  run "$limit" "$title" "$python" "$root/bench/bench.py" "${layer_args[@]}" \
    --deadline $((limit - 100)) "$@" --out "$out/$sub"
  verdict "$title" "$mark" $? "table in gpu-layer-check.log, ${sub}bench.json"
}

if wants bench; then
  remaining=$(($(seconds_left) - 10))
  # Leave the sanitizers about 3 minutes when they are to run.
  reserve=45
  if wants sanitize; then
    reserve=200
    [ "$quick" = 1 ] && reserve=120
  fi
  bench_limit=$((remaining - reserve > 150 ? remaining - reserve : 150))
  bench_opts=()
  [ "$quick" = 1 ] && bench_opts+=(--warmup 1 --iters 5)
  # MOE_BENCH_PEERS=liger: Liger-Kernel's fused MoE too (bench.py --peer)
  peers=${MOE_BENCH_PEERS:-}
  for peer in ${peers//,/ }; do bench_opts+=(--peer "$peer"); done
  # MOE_BENCH_GAPS=1: one more step of ours under the profiler (bench.py --gaps)
  [ -n "${MOE_BENCH_GAPS:-}" ] && bench_opts+=(--gaps)
  # the ceiling's matmul also after MOE_BENCH_SUSTAINED seconds of it (default 3; 0: not):
  # the rate under the power cap that a timed loop as long as ours runs at
  bench_opts+=(--sustained-ceiling "${MOE_BENCH_SUSTAINED:-3}")
  # H recomputed: each NAME-recompute timed right after NAME in the same run
  wants recompute && bench_opts+=(--recompute)
  bench_step "bench.py" "" "" "$bench_limit" "${bench_opts[@]}"
fi

# ---------------------------------------------------------------- recompute
if wants recompute && ! wants bench; then
  remaining=$(($(seconds_left) - 10))
  bench_step "bench.py recompute" -recompute recompute/ \
    $((remaining > 150 ? remaining - 30 : 120)) --no-hf
fi

# ---------------------------------------------------------------- offload
# Layers compiled with --policy=offload (H in pinned host memory between forward and
# backward, copied by the entry points): checked against the reference, then as stacks
# against the kept layers, bitwise and in time (bench/offload_compiled.py).
if wants offload; then
  check_layers 150 "check_layer.py offload" "log: gpu-layer-check.log" \
    sigmoid-groups-shared-offload olmoe-1b-7b-offload -- \
    --routing random --out "$out/offload" --json-name check_layer_offload.json
  remaining=$(($(seconds_left) - 10))
  mark=$(lines)
  run $((remaining > 150 ? remaining - 30 : 120)) "offload_compiled.py" "$python" \
    "$root/bench/offload_compiled.py" --layers "$layers_dir" --out "$out/offload"
  verdict "offload_compiled.py" "$mark" $? "log: gpu-layer-check.log"
fi

# ---------------------------------------------------------------- nongated
# SiLU and GELU (erf and tanh) experts, W_gate_up [E, d, n] (docs/gpu-kernels.md section
# 2.2.1): the static layers by check_layer.py, the dynamic-T ones at several T by
# dynamic_layer_check.py
if wants nongated; then
  routing=all
  [ "$quick" = 1 ] && routing=random
  mkdir -p "$out/nongated"
  check_layers 150 "check_layer.py nongated" "log: gpu-layer-check.log" \
    silu-t37 gelu-shared-t37 gelu-tanh-t37 -- --routing "$routing" --out "$out/nongated" \
    --json-name check_layer_nongated.json
  dyn=()
  for name in silu-shared-dyn gelu-dyn; do
    if have "$name"; then
      dyn+=(--layer "$layers_dir/$name")
    else
      fail "dynamic_layer_check.py $name: $name.so or $name.json missing"
    fi
  done
  if [ ${#dyn[@]} -gt 0 ]; then
    mark=$(lines)
    run 150 "dynamic_layer_check.py nongated" "$python" "$root/test/GPU/dynamic_layer_check.py" \
      "${dyn[@]}" --routing "$routing" --json "$out/nongated/dynamic_layer_check.json"
    verdict "dynamic_layer_check.py nongated" "$mark" $? "log: gpu-layer-check.log"
  fi
fi

# ---------------------------------------------------------------- capacity
# Token dropping (capacity_factor 0.75, the layers' own: the manifest does not carry it)
if wants capacity; then
  routing=all
  [ "$quick" = 1 ] && routing=skewed
  mkdir -p "$out/capacity"
  cap=()
  for name in capacity-t37 capacity-dyn; do
    if have "$name"; then
      cap+=(--layer "$layers_dir/$name")
    else
      fail "capacity_layer_check.py $name: $name.so or $name.json missing"
    fi
  done
  if [ ${#cap[@]} -gt 0 ]; then
    mark=$(lines)
    run 150 "capacity_layer_check.py" "$python" "$root/test/GPU/capacity_layer_check.py" \
      "${cap[@]}" --capacity-factor 0.75 --routing "$routing" \
      --json "$out/capacity/capacity_layer_check.json"
    verdict "capacity_layer_check.py" "$mark" $? "log: gpu-layer-check.log"
  fi
fi

# ---------------------------------------------------------------- bias
# Experts with biases: H = x W_gate_up[e] + b_gate_up[e], y = act(H) W_down[e] + b_down[e]
# (no transformers comparison: Mixtral's experts have none)
if wants bias; then
  routing=all
  [ "$quick" = 1 ] && routing=random
  mkdir -p "$out/bias"
  check_layers 150 "check_layer.py bias" "log: gpu-layer-check.log" \
    bias-t37 bias-gelu-shared-t37 -- --routing "$routing" --out "$out/bias" \
    --json-name check_layer_bias.json
fi

# ---------------------------------------------------------------- sanitize
if wants sanitize; then
  tools=(memcheck racecheck)
  [ "$quick" = 1 ] && tools=(memcheck)
  if ! command -v compute-sanitizer >/dev/null 2>&1; then
    fail "compute-sanitizer not on PATH"
  elif ! have tiny; then
    fail "sanitize: tiny.so or tiny.json missing"
  else
    for tool in "${tools[@]}"; do
      # The tiny layer (T=37) keeps it to minutes; our forward + backward only (--ours-only),
      # so that torch's own kernels are few. API errors are our runtime's business (statuses).
      mark=$(lines)
      run 150 "compute-sanitizer $tool" compute-sanitizer --tool "$tool" --error-exitcode 9 \
        --report-api-errors no --target-processes all \
        "$python" "$root/bench/check_layer.py" --layer "$layers_dir/tiny" --ours-only \
        --no-hf --out "$work/sanitize-$tool" --json-name "sanitize-$tool.json"
      rc=$?
      summary_line=$(since "$mark" | grep -E "ERROR SUMMARY|RACECHECK SUMMARY" | tail -1)
      if [ $rc -eq 0 ]; then
        pass "compute-sanitizer $tool on tiny: ${summary_line:-no summary line}"
      else
        fail "compute-sanitizer $tool on tiny: ${summary_line:-$(why $rc)}"
      fi
    done
  fi
fi

note "elapsed $(($(date +%s) - start)) s; log: $log"
finish
