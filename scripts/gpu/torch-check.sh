#!/usr/bin/env bash
# The PyTorch side (moe_mlir) on the GPU machine (CUDA 13, torch 2.11, transformers 5.17; no
# LLVM). gpu-inputs/torch-cache comes from scripts/inputs/build-torch-cache.sh on the LLVM machine
# (carry gpu-inputs). Steps, each with a time limit:
#   build   runtime/ standalone (libmoe_runtime.so), which moe_mlir links the prebuilt layers
#           with (MOE_RUNTIME_LIB);
#   layer   bench/train_check.py --layer-check: MoELayer on CUDA, eager and torch.compile
#           (fullgraph), forward + backward against the fp32 torch reference (docs/benchmarks.md
#           tolerances), a softmax layer and a DeepSeek-V3-like one (sigmoid + bias, groups,
#           scaling, shared expert);
#   train   bench/train_check.py: small Mixtral-style and Qwen3-MoE-style models from config,
#           50 AdamW steps with moe_mlir layers against HF grouped_mm experts; losses step by
#           step (max |diff| <= 1e-2), tokens/s, peak memory; train_check.json, train_check.png;
#           with HF's eager experts as a control (max |grouped_mm - eager|: the noise floor)
#           and the model all in f32 as the reference each run's distance is measured to;
#           twice: bf16 parameters (train-bf16) and mixed precision, f32 parameters under
#           torch.autocast(bf16) (train-amp);
#   long    bench/long_context.py --run gpu-inputs/long-context (not in the default steps):
#           the largest T whose layer holds at most 4 GiB from forward to backward, ours
#           (H kept, H recomputed; planned and compiled on the LLVM machine with
#           long_context.py --prebuild) against HF grouped_mm (measured), long_context.json;
#   offload bench/offload_stack.py --run gpu-inputs/offload (not in the default steps): a
#           stack of deepseek-v3 layers with H kept and with H offloaded (policy="offload"),
#           the share of the copy time hidden, bitwise equality; offload_stack.json;
#   fidelity bench/train_fidelity.py (not in the default steps; the train step's models and
#           layers): ours, HF grouped_mm and HF eager against the model all in f32, 5 seeds,
#           bf16 and mixed precision; one process an item of MOE_FIDELITY (MODEL or
#           MODEL@SEEDS, comma-separated; default mixtral,qwen3), precisions
#           MOE_FIDELITY_PRECISIONS (default bf16,amp); each writes its parts after every seed
#           to $OUT/fidelity (fidelity-MODEL-PRECISION.json; MOE_FIDELITY_ARGS: more
#           train_fidelity.py options, such as --drift-seed 3 --drift-step 35 for the gradient
#           comparison at another step), then a merge of them there
#           (train_fidelity.json, train_fidelity.png). The whole run is about 10 minutes on an
#           H200 (train_fidelity.py --estimate), so it takes two calls (MOE_FIDELITY=
#           mixtral,qwen3@3-4, then qwen3@0-2) and bench/train_fidelity.py --merge here over
#           their session.tgz files.
# Output in $OUT (default /tmp/moe-torch-out): gpu-torch-check.log, summary.txt ("N passed,
# M failed" last), {bf16,amp}/train_check.json and train_check.png.
#
#   bash scripts/gpu/torch-check.sh [--only STEP[,STEP...]] [--steps N] [--deadline SECONDS]
# Environment: OUT, MOE_LAYER_BUILD_DIR (default /tmp/moe-torch-build), PYTHON (python3),
# MOE_GPU_INPUTS (default gpu-inputs).
# shellcheck disable=SC2154 # parse_options (scripts/common.sh) sets the options' variables
set -u -o pipefail
# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
out=${OUT:-/tmp/moe-torch-out}
work=${MOE_LAYER_BUILD_DIR:-/tmp/moe-torch-build}
parse_options --only=only=build,layer,train --steps=steps=50 --deadline=deadline=560 -- "$@"
no_positional
check_steps "$only" build layer train long offload fidelity

mkdir -p "$work"
gpu_check_start gpu-torch-check.log
{
  echo "options: only=$only steps=$steps deadline=$deadline"
  find "$gpu_inputs/torch-cache" -name meta.json 2>&1
} >>"$log" 2>&1

deadline_start "$deadline"
if [ ! -d "$gpu_inputs/torch-cache/sm_90a" ]; then
  fail "no $gpu_inputs/torch-cache/sm_90a: run scripts/inputs/build-torch-cache.sh on the LLVM machine and carry gpu-inputs"
  finish
fi
# The cache is built apart from the layers (inputs/build-torch-cache.sh): checks that ran another
# build's kernels than gpu-inputs/layers would say nothing about these.
cache_kernels=$(sed -n 's/^kernel library: //p' "$gpu_inputs/torch-cache/INPUTS.txt" 2>/dev/null)
layer_kernels=$(sed -n 's/^kernel library: //p' "$gpu_inputs/INPUTS.txt" 2>/dev/null)
if [ -z "$cache_kernels" ] || [ "$cache_kernels" != "$layer_kernels" ]; then
  fail "torch-cache holds kernel library '${cache_kernels:-unknown}', gpu-inputs/layers '${layer_kernels:-unknown}': run scripts/inputs/build-torch-cache.sh after inputs/build-layers.sh"
fi
lib=$work/runtime/lib
if wants build || [ ! -f "$lib/libmoe_runtime.so" ]; then
  run 240 "build runtime/ standalone" bash -c ". '$root/scripts/common.sh';
    gpu_build_runtime '$work/runtime' /dev/stdout -DMOE_RUNTIME_BUILD_SMOKE=OFF -- moe_runtime"
  if [ -f "$lib/libmoe_runtime.so" ]; then
    pass "libmoe_runtime.so built ($lib)"
  else
    fail "runtime build (log: gpu-torch-check.log)"
    finish
  fi
fi
export MOE_RUNTIME_LIB=$lib/libmoe_runtime.so
export MOE_MLIR_PREBUILT=$gpu_inputs/torch-cache
export MOE_MLIR_CACHE=$work/cache

if wants layer; then
  mark=$(lines)
  run 200 "train_check.py --layer-check" "$python" "$root/bench/train_check.py" --layer-check \
    --device cuda
  verdict "layer check" "$mark" $? "log: gpu-torch-check.log"
fi

for precision in bf16 amp; do
  wants train || wants "train-$precision" || continue
  mark=$(lines)
  run 300 "train_check.py --precision $precision" "$python" "$root/bench/train_check.py" \
    --device cuda --steps "$steps" --precision "$precision" --control --reference \
    --out "$out/$precision"
  rc=$?
  # The tables (last lines) into the summary too.
  since "$mark" | grep -A12 '^model    max' | grep -v '^model    max' | \
    grep -vE '^[0-9]+ passed' | sed "s/^/  $precision /" | tee -a "$out/summary.txt"
  verdict "training check ($precision)" "$mark" $rc "log: gpu-torch-check.log"
done
# prebuilt_step TITLE SCRIPT FOLDER MARKER FILTER: bench/SCRIPT --run on gpu-inputs/FOLDER (whose
# MARKER file the LLVM machine's SCRIPT --prebuild wrote); the log lines FILTER (grep -E) picks
# go to the summary.
prebuilt_step() {
  local title=$1 script=$2 folder=$3 marker=$4 filter=$5 mark rc
  mark=$(lines)
  if [ ! -f "$gpu_inputs/$folder/$marker" ]; then
    fail "no $gpu_inputs/$folder/$marker: run bench/$script --prebuild on the LLVM machine"
    return
  fi
  run 300 "$script --run" "$python" "$root/bench/$script" --run "$gpu_inputs/$folder" --out "$out"
  rc=$?
  since "$mark" | grep -E "$filter" | sed 's/^/  /' | tee -a "$out/summary.txt"
  verdict "$title" "$mark" $rc "log: gpu-torch-check.log"
}
if wants long; then
  prebuilt_step "long context" long_context.py long-context plan.json \
    '^largest T|^layer |^[a-z0-9.-]+ +[0-9]+ +[0-9]+ +[0-9]+ '
fi
if wants offload; then
  prebuilt_step "offload stack" offload_stack.py offload stack.json 'layers; keep'
fi
if wants fidelity; then
  items=${MOE_FIDELITY:-mixtral,qwen3}
  for item in ${items//,/ }; do
    model=${item%%@*}
    seeds=0-4
    [[ $item == *@* ]] && seeds=${item#*@}
    mark=$(lines)
    read -r -a extra_args <<<"${MOE_FIDELITY_ARGS:-}"
    # each seed's parts are written as it ends: a process cut off keeps the seeds it finished
    run "${MOE_FIDELITY_LIMIT:-540}" "train_fidelity.py --model $model --seeds $seeds" \
      "$python" "$root/bench/train_fidelity.py" --device cuda --model "$model" \
      --precision "${MOE_FIDELITY_PRECISIONS:-bf16,amp}" --seeds "$seeds" --steps "$steps" \
      "${extra_args[@]}" --out "$out/fidelity"
    rc=$?
    since "$mark" | grep -E '^estimate |^(mixtral|qwen3) +(bf16|amp) ' | sed 's/^/  /' |
      tee -a "$out/summary.txt"
    verdict "training fidelity ($model, seeds $seeds)" "$mark" $rc "log: gpu-torch-check.log"
  done
  # every part in the folder together (the table and train_fidelity.png); the verdicts are the
  # runs' above, each over its own seeds
  mark=$(lines)
  run 120 "train_fidelity.py --merge" "$python" "$root/bench/train_fidelity.py" \
    --merge "$out/fidelity" --out "$out/fidelity"
  since "$mark" | grep -E '^(mixtral|qwen3) +(bf16|amp) |^furthest|^(grouped_mm|moe_mlir)\+' |
    sed 's/^/  /' |
    tee -a "$out/summary.txt"
fi
note "elapsed $(($(date +%s) - start)) s; log: $log"
finish
