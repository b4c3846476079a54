#!/usr/bin/env bash
# One device call of a session: the GPU checks and benchmarks that belong together, each
# step with its own time limit and the whole within --deadline seconds, so that one run of
# the device tool (10 minutes a command) brings back everything as a few files.
#   bash scripts/gpu/session.sh [--deadline S] STEP[,STEP...]
# Steps (gpu-inputs/ built here by inputs/build-ops-harness.sh, inputs/build-layers.sh and
# inputs/build-torch-cache.sh; carry gpu-inputs, and .whl for liger):
#   ops       every op check on gpu-inputs/ops, then the op sequence of each docs/benchmarks.md step
#             timed with gpu-inputs/ops and each other gpu-inputs/ops-* variant in turn
#             (MOE_PROFILE=1: per kernel; MOE_COMPARE_ROUNDS=N: N rounds, every other one in
#             reverse order, and each variant's mean) (gpu/ops-compare.sh);
#   sanitize  the quick op checks under compute-sanitizer (MOE_SANITIZE_TOOLS, default
#             "memcheck racecheck") on gpu-inputs/ops (MOE_SANITIZE_OPS: another variant;
#             MOE_SANITIZE_LIMIT: the step's seconds, default 200; MOE_SANITIZE_TOOL_LIMIT:
#             each tool's, default 200);
#   layer     gpu/layer-check.sh --only build,example,check,bench,recompute;
#   nongated  the non-gated (SiLU, GELU) experts: gpu/ops-check.sh --nongated (their host
#             functions against PyTorch, on gpu-inputs/ops/{silu,gelu_erf,gelu_tanh}, built by
#             inputs/build-ops-harness.sh --nongated), then gpu/layer-check.sh --only
#             build,nongated (their small layers against the torch reference);
#   parity    the op checks of the features that made the GPU path match the CPU path's
#             (MOE_PARITY_CHECKS, default capacity,aux,selection_bias,bias-grad: capacity
#             factor, auxiliary losses standalone and inside the router's kernels, selection-bias
#             update, the expert biases' backward) on gpu-inputs/ops with memcheck over their
#             --quick shapes, the expert-bias forward and backward (ops-check.sh --bias), the
#             non-gated experts' op checks at --quick shapes, then the layers: the non-gated
#             ones, the capacity-factor ones and those with expert biases (layer-check.sh
#             --only build,nongated,capacity,bias); one call holds all of it (carry
#             gpu-inputs/ops, layers and mlir);
#   variants  after layer: the layers of each variant tree gpu-inputs-NAME/ (compiled with
#             other kernel configs: inputs/build-layers.sh --out gpu-inputs-NAME --
#             --kernel-config=ROLE:KEY=VALUE, or against another library file with
#             --gpu-library=FILE; carry the tree too), built and timed as
#             the layer step's (gpu/layer-check.sh --only build,bench,recompute), NAME's
#             lines in session.txt as layer-NAME;
#   dynamic   gpu/dynamic-check.sh: the layers of dynamic token count (inputs/build-dynamic-
#             layers.sh) bitwise against those compiled for exactly T, the sweep, T outside
#             the bound refused, a CUDA graph of a step, the speed ratios;
#   ep        gpu/ep-check.sh: the expert-parallel benchmark layers over one rank (inputs/
#             build-ep-layers.sh), their stages run with NCCL between them, against the same
#             layers unsplit: forward bitwise, gradients within tolerance, the speed ratio;
#   torch     gpu/torch-check.sh (MoELayer, torch.compile, autocast, 50 AdamW steps against
#             HF in bf16 and mixed precision, with the f32 model as the reference);
#   fidelity  gpu/torch-check.sh --only build,fidelity: bench/train_fidelity.py, ours and HF
#             against the model all in f32 over 5 seeds, bf16 and mixed precision (MOE_FIDELITY:
#             the models, MODEL@SEEDS for some seeds, default mixtral,qwen3; about 10 minutes
#             for all, so two calls: MOE_FIDELITY=mixtral,qwen3@3-4, then qwen3@0-2; then
#             bench/train_fidelity.py --merge over the calls' session.tgz here);
#   long      gpu/torch-check.sh --only build,long: the largest T in 4 GiB of activations,
#             ours against HF (bench/long_context.py; gpu-inputs/long-context);
#   offload   gpu/torch-check.sh --only build,offload: H offloaded in a stack of deepseek-v3
#             layers, the copy time hidden (bench/offload_stack.py; gpu-inputs/offload);
#   gaps      where a step's time goes besides kernels (MOE_GAPS_CONFIGS, default mixtral-8x7b
#             and deepseek-v3): the op sequence with MOE_PROFILE=1 (and the runtime's calls
#             over MOE_RUNTIME_TRACE us, default 100), then the layers with
#             bench.py --gaps (host time, GPU idle stretches and the API calls meanwhile);
#   offload-compiled  gpu/layer-check.sh --only build,offload: layers compiled with H
#             offloaded, checked and timed as stacks against the kept ones;
#   energy    each op of the step (MOE_ENERGY_CONFIGS, default the four) MOE_ENERGY seconds
#             (default 2) back to back under NVML's energy counter: joules a call, and per
#             TFLOP beside a dense matmul's (the H200 runs long work at its power cap);
#   ncu       Nsight Compute on one step's GEMMs of MOE_NCU_CONFIG (default mixtral-8x7b;
#             the library of MOE_NCU_OPS, default gpu-inputs/ops)
#             matching MOE_NCU_REGEX (default: the gathered ones, dSwiGLU's and dX's), with
#             the sampled stalls per SASS instruction of dW_gate_up's and dSwiGLU's
#             GEMMs (gpu/ops-check.sh --ncu);
#   tensor    the tensor pipe alone (test/GPU/wgmma_warpgroups.cu): m64n256k16 wgmma back to
#             back from two warpgroups a CTA and from one, on random operands and on zero
#             rows, MOE_TENSOR_SECONDS a case (default 3), with NVML's power, J/TFLOP and SM
#             clock for each; and how many clusters of 1, 2 and
#             4 CTAs of the GEMMs' shape fit at once (test/GPU/cluster_occupancy.cu);
#   floor     what the power cap leaves a step (bench/power_floor.py, MOE_FLOOR_SECONDS a part,
#             default 3): idle power, the dense matmul, a DRAM and an L2 copy, the matmul and
#             the DRAM copy at once, the linear power model and each configuration's floor;
#             after the layer step, each layer's time and its best peer's against it;
#   liger     .whl/liger_kernel*.whl installed, then gpu/layer-check.sh --only build,bench
#             with bench.py --peer liger: Liger-Kernel's fused MoE beside ours and HF in one
#             run, on MOE_LIGER_LAYERS (default qwen3-30b-a3b,olmoe-1b-7b: its Triton
#             autotuning takes 2-4 minutes a configuration; not MOE_BENCH_LAYERS, which is
#             the layer step's);
#   sonic     SonicMoE (sonic-moe) beside ours and HF in one bench.py run (bench.py --peer sonic:
#             checked against the fp32 reference before it is timed), on MOE_SONIC_LAYERS
#             (default the four; SonicMoE's own shapes by name, bench/sonic.py SHAPES) of
#             gpu-inputs/sonic (scripts/dev/build-sonic-inputs.sh), its wheels from .whl/
#             (scripts/dev/fetch-peer-wheels.sh) installed into /tmp/site; carry gpu-inputs/sonic
#             and .whl, not the whole gpu-inputs (64 MiB a call);
#   megablocks  MegaBlocks' dMoE beside ours (bench/megablocks_peer.py): megablocks,
#             stanford-stk and grouped_gemm built from .whl/megablocks (scripts/dev/
#             build-megablocks.sh; skipped when /tmp/site already imports them, as on a warm
#             machine), the layers of gpu-inputs/megablocks linked (scripts/inputs/
#             build-megablocks-inputs.sh), then one process a MegaBlocks implementation
#             (MOE_MEGABLOCKS_IMPLS, default "grouped sparse": a fault in the patched sparse
#             path cannot take the grouped numbers with it), each timing ours beside it on
#             MOE_MEGABLOCKS_CONFIGS (default the four and the grid at MOE_MEGABLOCKS_TOKENS,
#             default 32768), within MOE_MEGABLOCKS_LIMIT seconds (default 560); carry
#             .whl/megablocks and gpu-inputs/megablocks;
#   user-path moe_mlir.hf.from_hf_block (weights shared and copied) against the bare compiled
#             layer it runs, on MOE_USER_PATH_CONFIGS (default the four): the ratios, bitwise
#             equality and the profiler's extra kernels and calls (bench/user_path.py, its layers
#             from gpu-inputs/sonic/torch-cache).
# After a step that runs out of its time (a hang, most likely) the rest are skipped.
# Output in $OUT: session.txt (each step's summary lines and time) and session.tgz (every
# log and JSON).
# shellcheck disable=SC2154 # parse_options (scripts/common.sh) sets the options' variables
set -u -o pipefail
# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
out=${OUT:-/tmp/moe-session-out}
parse_options --deadline=deadline=570 -- "$@"
[ ${#positional[@]} -le 1 ] || die "one comma-separated list of steps (see --help)"
steps=${positional[0]:-}
[ -n "$steps" ] || die "no steps (see --help)"
check_steps "$steps" ops sanitize layer nongated parity variants torch fidelity long offload gaps \
  offload-compiled energy ncu tensor floor liger dynamic ep sonic megablocks user-path
mkdir -p "$out/session"
deadline_start "$deadline"
report=$out/session.txt
: >"$report"
status=0

# run_step NAME LIMIT CMD...: CMD with OUT=$out/session/NAME, at most LIMIT seconds (and never past
# the deadline); its last lines go to session.txt.
run_step() {
  local name=$1 limit=$2 rc t0
  shift 2
  local budget
  budget=$(seconds_left)
  [ "$limit" -lt "$budget" ] || limit=$budget
  if [ "$limit" -le 10 ]; then
    echo "== $name: skipped, deadline reached" | tee -a "$report"
    status=1
    return
  fi
  mkdir -p "$out/session/$name"
  t0=$(date +%s)
  echo "== $name (limit $limit s)" | tee -a "$report"
  OUT="$out/session/$name" timeout -k 10 "$limit" "$@" >"$out/session/$name/stdout.log" 2>&1
  rc=$?
  [ $rc = 0 ] || status=1
  # a step that ran out of time most likely hung on the GPU: the others would too
  case $rc in 124 | 137) timed_out=1 ;; esac
  tail -n "${MOE_SESSION_TAIL:-25}" "$out/session/$name/stdout.log" | tee -a "$report"
  echo "-- $name: exit $rc after $(($(date +%s) - t0)) s" | tee -a "$report"
}

variants() {
  local d
  echo "$root/gpu-inputs/ops"
  for d in "$root"/gpu-inputs/ops-*; do [ -d "$d" ] && echo "$d"; done
}

configs=mixtral-8x7b,olmoe-1b-7b,qwen3-30b-a3b,deepseek-v3
timed_out=0
for step in ${steps//,/ }; do
  if [ $timed_out = 1 ]; then
    echo "== $step: skipped after a step that timed out" | tee -a "$report"
    continue
  fi
  case "$step" in
  ops)
    # shellcheck disable=SC2046
    MOE_PROFILE=1 run_step ops 330 bash "$root/scripts/gpu/ops-compare.sh" "$configs" $(variants) ;;
  sanitize)
    MOE_SANITIZE_TOOLS=${MOE_SANITIZE_TOOLS:-memcheck racecheck} \
      run_step sanitize "${MOE_SANITIZE_LIMIT:-200}" bash "$root/scripts/gpu/ops-check.sh" --quick --sanitize \
      --ops="$root/${MOE_SANITIZE_OPS:-gpu-inputs/ops}" ;;
  layer)
    run_step layer 300 bash "$root/scripts/gpu/layer-check.sh" --only build,example,check,bench,recompute \
      --deadline $(($(seconds_left) - 20)) ;;
  nongated)
    run_step nongated-ops 360 bash "$root/scripts/gpu/ops-check.sh" --nongated
    run_step nongated-layers 200 bash "$root/scripts/gpu/layer-check.sh" --only build,nongated \
      --deadline $(($(seconds_left) - 20)) ;;
  parity)
    MOE_SANITIZE_TOOLS=memcheck MOE_SANITIZE_TOOL_LIMIT=120 run_step parity-ops 270 \
      bash "$root/scripts/gpu/ops-check.sh" --sanitize \
      --only="${MOE_PARITY_CHECKS:-capacity,aux,selection_bias,bias-grad}"
    run_step parity-bias-ops 120 bash "$root/scripts/gpu/ops-check.sh" --bias --quick
    run_step parity-nongated-ops 200 bash "$root/scripts/gpu/ops-check.sh" --nongated --quick
    run_step parity-layers 180 bash "$root/scripts/gpu/layer-check.sh" --only build,nongated,capacity,bias \
      --deadline $(($(seconds_left) - 20)) ;;
  variants)
    found=0
    for tree in "$root"/gpu-inputs-*/; do
      [ -d "$tree/layers" ] || continue
      found=1
      name=$(basename "$tree")
      name=${name#gpu-inputs-}
      MOE_GPU_INPUTS=${tree%/} MOE_LAYER_BUILD_DIR=/tmp/moe-layer-build-$name \
        run_step "layer-$name" 240 bash "$root/scripts/gpu/layer-check.sh" --only build,bench,recompute \
        --deadline $(($(seconds_left) - 20))
    done
    [ $found = 1 ] || echo "== variants: no gpu-inputs-*/layers to run" | tee -a "$report" ;;
  dynamic)
    run_step dynamic "${MOE_DYNAMIC_LIMIT:-300}" bash "$root/scripts/gpu/dynamic-check.sh" ;;
  ep)
    run_step ep "${MOE_EP_LIMIT:-540}" bash "$root/scripts/gpu/ep-check.sh" ;;
  torch)
    run_step torch 330 bash "$root/scripts/gpu/torch-check.sh" --deadline $(($(seconds_left) - 20)) ;;
  fidelity)
    run_step fidelity "${MOE_FIDELITY_STEP_LIMIT:-560}" bash "$root/scripts/gpu/torch-check.sh" \
      --only build,fidelity --deadline $(($(seconds_left) - 20)) ;;
  long)
    run_step long 300 bash "$root/scripts/gpu/torch-check.sh" --only build,long \
      --deadline $(($(seconds_left) - 20)) ;;
  offload)
    run_step offload 300 bash "$root/scripts/gpu/torch-check.sh" --only build,offload \
      --deadline $(($(seconds_left) - 20)) ;;
  gaps)
    # where the step's time goes besides kernels: the op sequence (ops_check.py GAPS lines)
    # and the layers (bench.py --gaps), host time and GPU idle stretches with the API calls
    MOE_PROFILE=1 MOE_RUNTIME_TRACE=${MOE_RUNTIME_TRACE:-100} run_step gaps-ops 150 \
      bash "$root/scripts/gpu/ops-check.sh" \
      --bench="${MOE_GAPS_CONFIGS:-mixtral-8x7b,deepseek-v3}"
    MOE_BENCH_GAPS=1 MOE_BENCH_LAYERS=${MOE_GAPS_CONFIGS:-mixtral-8x7b,deepseek-v3} \
      run_step gaps-layer 300 bash "$root/scripts/gpu/layer-check.sh" --only build,bench \
      --deadline $(($(seconds_left) - 20)) ;;
  offload-compiled)
    # layers compiled with --policy=offload: the reference check, then stacks against keep
    run_step offload-compiled 330 bash "$root/scripts/gpu/layer-check.sh" --only build,offload \
      --deadline $(($(seconds_left) - 20)) ;;
  energy)
    # joules a call of each op and per TFLOP against a dense matmul's, each op MOE_ENERGY
    # seconds (default 2) back to back after as long of whole steps (bench/energy.py)
    MOE_ENERGY=${MOE_ENERGY:-2} run_step energy 300 bash "$root/scripts/gpu/ops-check.sh" \
      --bench="${MOE_ENERGY_CONFIGS:-$configs}" ;;
  ncu)
    MOE_NCU_SOURCE=${MOE_NCU_SOURCE:-wgrad_gather_a dact_gather} \
      run_step ncu 400 bash "$root/scripts/gpu/ops-check.sh" --bench="${MOE_NCU_CONFIG:-mixtral-8x7b}" \
      --ops="$root/${MOE_NCU_OPS:-gpu-inputs/ops}" \
      --ncu="${MOE_NCU_REGEX:-moe_gemm_(wgrad_gather|dact_gather|up_gather|rows_k)}" ;;
  tensor)
    run_step tensor 120 bash -c "export PATH=\"\$PATH:/usr/local/cuda/bin\";
      nvcc -gencode arch=compute_90a,code=sm_90a -O3 -o /tmp/moe-clusters '$root/test/GPU/cluster_occupancy.cu' &&
      nvcc -gencode arch=compute_90a,code=sm_90a -O3 -o /tmp/moe-wgmma '$root/test/GPU/wgmma_warpgroups.cu' &&
      /tmp/moe-clusters && /tmp/moe-wgmma ${MOE_TENSOR_SECONDS:-3}" ;;
  floor)
    # (the layer step's JSON, when it ran first in this call)
    floor_bench=()
    [ -f "$out/session/layer/bench.json" ] && floor_bench=(--bench-json "$out/session/layer/bench.json")
    run_step floor 150 bash -c "python3 '$root/bench/power_floor.py' --seconds ${MOE_FLOOR_SECONDS:-3} \
      --json \"\$OUT/floor.json\" ${floor_bench[*]}" ;;
  liger)
    # the peer in the same bench.py run as ours and HF (gpu/layer-check.sh's bench step)
    run_step liger 480 bash -c "python3 -m pip install -q --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade --target /tmp/site '$root'/.whl/liger_kernel*.whl &&
      PYTHONPATH=/tmp/site MOE_BENCH_PEERS=liger \
      MOE_BENCH_LAYERS=\${MOE_LIGER_LAYERS:-qwen3-30b-a3b,olmoe-1b-7b} bash '$root/scripts/gpu/layer-check.sh' \
      --only build,bench --deadline $(($(seconds_left) - 20))" ;;
  sonic)
    # the wheels (the big libs recompressed: fetch-peer-wheels.sh), then the bench step
    run_step sonic "${MOE_SONIC_LIMIT:-480}" bash -c "set -e; site=/tmp/site; mkdir -p \$site
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target \$site '$root'/.whl/{sonic_moe,quack_kernels,nvidia_cutlass_dsl-,apache_tvm_ffi,torch_c_dlpack_ext,einops}*.whl
      [ -d \$site/nvidia_cutlass_dsl/python_packages ] ||
        xz -dc '$root/.whl/cutlass-dsl-libs.tar.xz' | tar -xf - -C \$site
      export PYTHONPATH=\$site:\$site/nvidia_cutlass_dsl/python_packages
      python3 -c 'import sonicmoe, cutlass; print(\"sonicmoe\", sonicmoe.__version__, \"cutlass\", cutlass.__version__)'
      MOE_GPU_INPUTS='$root/gpu-inputs/sonic' MOE_BENCH_PEERS=sonic \
        MOE_BENCH_LAYERS=\${MOE_SONIC_LAYERS:-mixtral-8x7b,olmoe-1b-7b,qwen3-30b-a3b,deepseek-v3} \
        bash '$root/scripts/gpu/layer-check.sh' --only build,bench --deadline $(($(seconds_left) - 20))" ;;
  megablocks)
    # build (or reuse /tmp/site), link, then each implementation in its own process, each
    # with an even share of what is left as bench/megablocks_peer.py's --deadline
    mb_limit=${MOE_MEGABLOCKS_LIMIT:-560}
    [ "$mb_limit" -lt "$(seconds_left)" ] || mb_limit=$(seconds_left)
    MOE_STEP_LIMIT=$mb_limit run_step megablocks "$mb_limit" bash -c "set -e; site=/tmp/site
      if ! PYTHONPATH=\$site python3 -c 'import torch, megablocks_ops, grouped_gemm, megablocks.layers.dmoe' \
        2>/dev/null; then
        bash '$root/scripts/dev/build-megablocks.sh' \$site
      fi
      MOE_GPU_INPUTS='$root/gpu-inputs/megablocks' bash '$root/scripts/gpu/layer-check.sh' --only build \
        --deadline 240 || echo 'layer-check.sh --only build failed: the bench skips what did not link'
      export PYTHONPATH=\$site
      impls=(\${MOE_MEGABLOCKS_IMPLS:-grouped sparse})
      i=\${#impls[@]}
      rc=0
      for impl in \${impls[@]}; do
        share=\$(( (MOE_STEP_LIMIT - SECONDS - 20) / i - 45 ))
        i=\$((i - 1))
        python3 '$root/bench/megablocks_peer.py' --impl \$impl --layers-dir '$root/gpu-inputs/megablocks/layers' \
          --tokens \${MOE_MEGABLOCKS_TOKENS:-32768} --configs \"\${MOE_MEGABLOCKS_CONFIGS:-}\" \
          --deadline \$(( share > 30 ? share : 30 )) --json-name megablocks-\$impl.json || rc=1
      done
      exit \$rc" ;;
  user-path)
    run_step user-path "${MOE_USER_PATH_LIMIT:-360}" bash -c "set -e; . '$root/scripts/common.sh'
      lib=\${MOE_LAYER_BUILD_DIR:-/tmp/moe-layer-build}/runtime/lib
      [ -f \$lib/libmoe_runtime.so ] || gpu_build_runtime \$(dirname \$lib) /dev/stdout \
        -DMOE_RUNTIME_BUILD_SMOKE=OFF -- moe_runtime
      MOE_RUNTIME_LIB=\$lib/libmoe_runtime.so MOE_MLIR_PREBUILT='$root/gpu-inputs/sonic/torch-cache' \
        MOE_MLIR_CACHE=/tmp/moe-user-path-cache python3 '$root/bench/user_path.py' \
        --configs \${MOE_USER_PATH_CONFIGS:-mixtral-8x7b,olmoe-1b-7b,qwen3-30b-a3b,deepseek-v3}" ;;
  *) echo "gpu/session.sh: unknown step $step" | tee -a "$report"; status=1 ;;
  esac
done
tar -C "$out" -czf "$out/session.tgz" session && rm -rf "$out/session"
echo "session: exit $status after $(($(date +%s) - start)) s" | tee -a "$report"
exit $status
