#!/usr/bin/env python3
"""The user path against the bare layer: what `moe_mlir.hf.from_hf_block` costs over the compiled
layer it runs, on the docs/benchmarks.md configurations (issue: at most 3%).

In one process, for each configuration, the Hugging Face block of that configuration (bf16,
random N(0, 0.02²) weights) and, on the same inputs (x ~ N(0, 1), a random cotangent):
- bare: the compiled layer the module runs (`moe_mlir.layer.kernel_for(...).gpu_layer()`, the
  same cache entry: T dynamic up to its bound, the logits rounded to bf16 as HF's are), called
  directly as bench/bench.py calls a layer: forward then backward, the weights already in the
  compiler's layout, a zero cotangent for the logits allocated once;
- share: `from_hf_block(block)` (weights="share", the default: the HF parameters themselves);
- copy: `from_hf_block(block, weights="copy")` (its own parameters, in the compiler's layout);
each forward + backward timed with CUDA events (median of --iters after --warmup; gradients set
to None between steps, untimed), bare timed again last; the ratios share / bare and copy / bare;
whether the three give the same output and gradients bit for bit; and one step of each under
torch.profiler: the kernels, copies, fills, allocations and synchronisations the module runs
beyond the bare layer's (EXTRA lines).

    python3 bench/user_path.py --prebuild gpu-inputs/sonic/torch-cache   # here: the layers
    MOE_MLIR_PREBUILT=... MOE_RUNTIME_LIB=... python3 bench/user_path.py  # on the GPU machine

Prints a short table last, JSON to $OUT/user_path.json (or --out), "N passed, M failed" (a
configuration passes when all three ran and agree bit for bit; the 3% target is reported beside
it). Exit 1 on a failure, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

TARGET = 1.03  # the user path's time over the bare layer's, at most

# name: (T, block kind, block config) as docs/benchmarks.md's table
CONFIGS: Dict[str, Any] = {
    "mixtral-8x7b": (16384, "mixtral", dict(hidden_size=4096, intermediate_size=14336,
                                            num_local_experts=8, num_experts_per_tok=2)),
    "olmoe-1b-7b": (16384, "olmoe", dict(hidden_size=2048, intermediate_size=1024, num_experts=64,
                                         num_experts_per_tok=8, norm_topk_prob=False)),
    "qwen3-30b-a3b": (16384, "qwen3", dict(hidden_size=2048, moe_intermediate_size=768,
                                           num_experts=128, num_experts_per_tok=8,
                                           norm_topk_prob=True)),
    "deepseek-v3": (8192, "deepseek", dict(hidden_size=7168, moe_intermediate_size=2048,
                                           n_routed_experts=256, num_experts_per_tok=8, n_group=8,
                                           topk_group=4, routed_scaling_factor=2.5,
                                           norm_topk_prob=True, n_shared_experts=1)),
}  # fmt: skip


def log(msg: str) -> None:
    print(msg, flush=True)


def make_block(torch, kind: str, kw: Dict[str, Any]):
    """The HF block of a configuration on the current default device (meta for --prebuild)."""
    if kind == "mixtral":
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as B

        return B(MixtralConfig(**kw))
    if kind == "olmoe":
        from transformers import OlmoeConfig
        from transformers.models.olmoe.modeling_olmoe import OlmoeSparseMoeBlock as B

        return B(OlmoeConfig(**kw))
    if kind == "qwen3":
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock as B

        return B(Qwen3MoeConfig(**kw))
    if kind == "deepseek":
        from transformers import DeepseekV3Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE as B

        return B(DeepseekV3Config(**kw))
    raise ValueError(f"unknown block kind {kind!r}")


def layer_entry_config(cfg, tokens: int):
    """The (config, options) of the cache entry MoELayer runs for `tokens` tokens on CUDA:
    the bound T rounds to (moe_mlir.layer.LayerSpec.bound_for without max_tokens)."""
    from moe_mlir import compile_cache as cc

    bound = cc.default_bound(tokens)
    return dataclasses.replace(cfg, tokens=bound, dtype="bf16"), cc.BuildOptions(max_tokens=bound)


def prebuild(folder: str, names: List[str]) -> int:
    """Compiles, with moe-compile, the sm_90a cache entries of the configurations' HF blocks into
    `folder` (MOE_MLIR_CACHE layout) for the GPU machine, which has no LLVM."""
    import torch

    from moe_mlir import compile_cache as cc
    from moe_mlir import hf

    os.environ["MOE_MLIR_CACHE"] = os.path.abspath(folder)
    failed = 0
    for name in names:
        T, kind, kw = CONFIGS[name]
        t0 = time.time()
        try:
            with torch.device("meta"):  # shapes only: deepseek-v3's weights are 45 GB in f32
                block = make_block(torch, kind, kw)
            cfg, options = layer_entry_config(hf.config_from_hf_block(block), T)
            entry = cc.build_gpu_entry(cfg, options)
            log(f"PASS {name}: {entry.path} ({time.time() - t0:.1f} s)")
        except Exception as e:  # noqa: BLE001
            failed += 1
            log(f"FAIL {name}: {type(e).__name__}: {e}")
    log(f"{len(names) - failed} passed, {failed} failed")
    return 1 if failed else 0


# --------------------------------------------------------------------------- timing


def measure(torch, step: Callable[[], Any], clear: Callable[[], Any], warmup: int, iters: int):
    times: List[float] = []
    for i in range(warmup + iters):
        clear()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(float(start.elapsed_time(end)))
    return {"median_ms": statistics.median(times), "times_ms": times}


# Host-side operations a step may add to the bare layer's (torch.profiler names).
WATCHED_OPS = (
    "aten::copy_", "aten::clone", "aten::_to_copy", "aten::contiguous", "aten::cat",
    "aten::zeros", "aten::zero_", "aten::fill_", "aten::empty", "aten::empty_strided",
    "aten::add_", "aten::index_put_",
)  # fmt: skip
SYNC_CALLS = (
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
    "cudaMemcpyAsync", "cudaMemsetAsync", "cudaMalloc", "cudaFree", "cudaHostAlloc",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2",
    "cuMemAlloc_v2", "cuMemFree_v2", "cuMemAllocAsync", "cuMemFreeAsync",
)  # fmt: skip


def profile_step(torch, step: Callable[[], Any], clear: Callable[[], Any]) -> Dict[str, Any]:
    """One step under torch.profiler: each GPU kernel (calls, µs), the watched host ops and
    runtime/driver calls (calls)."""
    from torch.profiler import ProfilerActivity, profile

    clear()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels: Dict[str, List[float]] = {}
    host: Dict[str, int] = {}
    for e in prof.key_averages():
        device_us = getattr(e, "self_device_time_total", None)
        if device_us is None:
            device_us = getattr(e, "self_cuda_time_total", 0.0)
        on_gpu = str(getattr(e, "device_type", "")).endswith("CUDA")
        if on_gpu and device_us > 0:
            kernels[e.key] = [e.count, float(device_us)]
        elif e.key in WATCHED_OPS or e.key in SYNC_CALLS:
            host[e.key] = e.count
    return {"kernels": kernels, "host": host}


def extras(bare: Dict[str, Any], user: Dict[str, Any]) -> Dict[str, Any]:
    """What `user` ran beyond `bare`: kernels (calls and µs beyond bare's of the same name) and
    host calls (beyond bare's count), largest first."""
    kern = []
    for name, (count, us) in user["kernels"].items():
        b_count, b_us = bare["kernels"].get(name, [0, 0.0])
        if count > b_count or name not in bare["kernels"]:
            kern.append((name, count - b_count, us - b_us))
    kern.sort(key=lambda r: -r[2])
    host = {
        name: count - bare["host"].get(name, 0)
        for name, count in user["host"].items()
        if count > bare["host"].get(name, 0)
    }
    return {
        "kernels": [{"name": n, "calls": c, "us": round(us, 1)} for n, c, us in kern],
        "kernel_us": round(sum(us for _, _, us in kern), 1),
        "host_calls": host,
    }


# --------------------------------------------------------------------------- one configuration


def run_config(torch, name: str, opts) -> Dict[str, Any]:
    from moe_mlir import hf
    from moe_mlir.layer import kernel_for

    T, kind, kw = CONFIGS[name]
    device = torch.device("cuda")
    res: Dict[str, Any] = {"name": name, "T": T}
    gen = torch.Generator(device=device).manual_seed(opts.seed)
    with torch.device(device):
        block = make_block(torch, kind, kw).to(torch.bfloat16)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, device=device) * 0.02)
        for b_name, b in block.named_buffers():
            if "bias" in b_name and b.is_floating_point():
                b.copy_(torch.randn(b.shape, generator=gen, device=device) * 0.01)
    block.train()
    d = block.experts.gate_up_proj.shape[-1]
    x = torch.randn((T, d), generator=gen, device=device).to(torch.bfloat16).requires_grad_(True)
    d_out = torch.randn((T, d), generator=gen, device=device).to(torch.bfloat16)

    share = hf.from_hf_block(block)
    copy = hf.from_hf_block(block, weights="copy")
    res["config"] = dataclasses.asdict(share.config)
    kernel = kernel_for(share.spec_key, T, device)
    compiled = kernel.gpu_layer()
    res["bound"] = kernel.bound
    # the bare layer's inputs: the copy layer's parameters are the weights in the compiler's
    # layout, made once
    weights = copy.layer_weights()
    inputs = {kernel.param_of["x"]: x.detach()}
    for n in kernel.arg_names:
        if n != "x":
            inputs[kernel.param_of[n]] = weights[n].detach()
    cots = {"result0": d_out}
    logits_spec = [p for p in compiled.manifest.backward.by_role("cotangent") if p.of == "result1"]
    if logits_spec:  # a loss on the logits is none: zeros, allocated once (as bench.py)
        cots["result1"] = torch.zeros((T, share.config.experts), device=device)

    def bare_step():
        f = compiled.forward(inputs)
        return f, compiled.backward(f, cots)

    def module_step(layer):
        def step():
            out = layer(x)
            out.backward(d_out)
            return out

        return step

    def clear_of(layer):
        def clear():
            for p in layer.parameters():
                p.grad = None
            x.grad = None

        return clear

    steps = {
        "bare": (bare_step, lambda: None),
        "share": (module_step(share), clear_of(share)),
        "copy": (module_step(copy), clear_of(copy)),
    }
    order = ["bare", "share", "copy", "bare"]
    timings: Dict[str, List[float]] = {}
    for what in order:
        step, clear = steps[what]
        try:
            m = measure(torch, step, clear, opts.warmup, opts.iters)
            timings.setdefault(what, []).append(m["median_ms"])
            res.setdefault(what, {"runs": []})["runs"].append(m)
            log(f"  {what}: {m['median_ms']:.2f} ms")
        except torch.cuda.OutOfMemoryError as e:
            res.setdefault(what, {})["error"] = f"out of memory: {str(e).splitlines()[0]}"
            log(f"  {what}: out of memory")
        clear()
        torch.cuda.empty_cache()
    if "bare" in timings:
        bare_ms = statistics.mean(timings["bare"])
        res["bare_ms"] = bare_ms
        res["bare_drift"] = max(timings["bare"]) / min(timings["bare"])
        for what in ("share", "copy"):
            if what in timings:
                res[f"{what}_ms"] = timings[what][0]
                res[f"{what}_over_bare"] = timings[what][0] / bare_ms

    # the same bits: out and every gradient (share's HF-layout gradients transposed back)
    try:
        f, g = bare_step()
        want = {"out": f["result0"]}
        for p, arg in compiled.gradient_names().items():
            want[arg] = g[p]
        same = {}
        for what, layer in (("share", share), ("copy", copy)):
            clear_of(layer)()
            out = module_step(layer)()
            got = {"out": out.detach(), "x": x.grad, **grads_in_layout(layer)}
            same[what] = all(
                got.get(n) is not None and torch.equal(got[n].contiguous(), t)
                for n, t in want.items()
            )
        res["bitwise_equal"] = same
        del f, g, want
    except torch.cuda.OutOfMemoryError as e:
        res["bitwise_equal_error"] = f"out of memory: {str(e).splitlines()[0]}"
    for layer in (share, copy):
        clear_of(layer)()
    torch.cuda.empty_cache()

    if opts.profile:
        prof = {}
        for what in ("bare", "share", "copy"):
            step, clear = steps[what]
            try:
                prof[what] = profile_step(torch, step, clear)
            except torch.cuda.OutOfMemoryError:
                pass
            clear()
            torch.cuda.empty_cache()
        if "bare" in prof:
            for what in ("share", "copy"):
                if what in prof:
                    res[f"{what}_extras"] = extras(prof["bare"], prof[what])
        res["profile"] = prof
    return res


def grads_in_layout(layer) -> Dict[str, Any]:
    """The layer's weight gradients in the compiler's layout (w_router [d, E], w_gate_up
    [E, d, 2n], ...): a copy layer's own, or a shared HF block's read back through the views
    that HFMoELayer.layer_weights makes of its parameters."""
    import torch

    from moe_mlir.hf import HFMoELayer

    if not isinstance(layer, HFMoELayer):
        return {
            n: getattr(layer, n).grad
            for n in layer.layer_weights()
            if n != "router_bias" and getattr(layer, n) is not None
        }
    ex = layer.experts
    g = {
        "w_router": layer.gate.weight.grad.t(),
        "w_gate_up": ex.gate_up_proj.grad.transpose(1, 2),
        "w_down": ex.down_proj.grad.transpose(1, 2),
    }
    if layer.config.has_shared:
        s = layer.shared_experts
        g["shared_gate_up"] = torch.cat([s.gate_proj.weight.grad, s.up_proj.weight.grad], 0).t()
        g["shared_down"] = s.down_proj.weight.grad.t()
    return g


# --------------------------------------------------------------------------- main


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--prebuild", metavar="DIR", help="compile the layers into DIR and stop")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=7)
    p.add_argument("--no-profile", dest="profile", action="store_false")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/moe-user-path-out"))
    opts = p.parse_args(argv)
    names = [n for n in opts.configs.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        p.error(f"unknown configuration(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    if opts.iters < 5:
        p.error("--iters must be at least 5 (docs/benchmarks.md: median of at least 5)")
    if opts.prebuild:
        return prebuild(opts.prebuild, names)

    import torch

    if not torch.cuda.is_available():
        log("user_path.py needs a CUDA GPU (the bare layer is the sm_90a one)")
        return 2
    report: Dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    report["configs"] = []
    failed = 0
    for name in names:
        log(f"== {name}")
        try:
            res = run_config(torch, name, opts)
        except Exception as e:  # noqa: BLE001 - the others still run
            res = {"name": name, "error": f"{type(e).__name__}: {e}"}
            log(f"  FAILED: {res['error']}")
        report["configs"].append(res)
        ok = "error" not in res and all(res.get("bitwise_equal", {"-": False}).values())
        ok = ok and len(res.get("bitwise_equal", {})) == 2
        res["ok"] = ok
        failed += not ok
        torch.cuda.empty_cache()
    os.makedirs(opts.out, exist_ok=True)
    path = os.path.join(opts.out, "user_path.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, default=str)

    log("")
    for r in report["configs"]:
        for what in ("share", "copy"):
            ex = r.get(f"{what}_extras")
            if not ex:
                continue
            for k in ex["kernels"][:8]:
                log(f"EXTRA {r['name']} {what}: {k['calls']} x {k['name'][:80]}, {k['us']:.0f} us")
            if ex["host_calls"]:
                calls = ", ".join(f"{n} +{c}" for n, c in sorted(ex["host_calls"].items()))
                log(f"EXTRA {r['name']} {what}: host calls {calls}")
    head = (
        f"{'config':<15} {'bare ms':>8} {'share ms':>9} {'share/bare':>10} {'copy ms':>8} "
        f"{'copy/bare':>9} {'extra kern ms':>13} {'bitwise':>8}"
    )
    log(head)
    log("-" * len(head))
    nan = float("nan")
    for r in report["configs"]:
        extra_ms = r.get("share_extras", {}).get("kernel_us", nan) / 1e3
        log(
            f"{r['name']:<15} {r.get('bare_ms', nan):>8.2f} {r.get('share_ms', nan):>9.2f} "
            f"{r.get('share_over_bare', nan):>10.3f} {r.get('copy_ms', nan):>8.2f} "
            f"{r.get('copy_over_bare', nan):>9.3f} {extra_ms:>13.2f} "
            f"{'yes' if r['ok'] else 'NO':>8}"
        )
    met = [
        f"{r['name']} {w} {'met' if r[f'{w}_over_bare'] <= TARGET else 'MISSED'}"
        for r in report["configs"]
        for w in ("share", "copy")
        if f"{w}_over_bare" in r
    ]
    log(f"target user path / bare <= {TARGET}: {', '.join(met) or 'none measured'}")
    log(f"json: {path}")
    log(f"{len(names) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
