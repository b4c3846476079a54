#!/usr/bin/env python3
"""Benchmark compiled layers against the Hugging Face Mixtral block, as docs/benchmarks.md says.

In one process:
1. the dense ceiling: an 8192^3 bf16 matmul through PyTorch, TFLOP/s (a short run, at the
   boost clock; with --sustained-ceiling S also the same matmul after S seconds of it, the
   rate the GPU holds under its power cap, and each layer's fraction of that);
2. for each compiled layer (DIR/NAME for NAME.so + NAME.json; a missing .so is skipped, and
   said so): a check of our forward output and router logits on a sample of tokens against an
   fp32 recomputation with our routing (numbers before timings), then our forward + backward
   step timed with CUDA events (warm-up, median of >= 5), then the same for
   `transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock` built from
   MixtralConfig(hidden_size=d, intermediate_size=n, num_local_experts=E,
   num_experts_per_tok=k) with `config._experts_implementation = "grouped_mm"` (for
   deepseek-v3, which it cannot express, the Mixtral block with E=256, k=8, the baseline of
   docs/benchmarks.md;
   and for a layer with a sigmoid group router and a shared expert also transformers'
   `DeepseekV3MoE`, the real block of that configuration, reported beside it);
3. ratio ours / HF time, TFLOP/s of the useful FLOPs 18·T·k·d·n + 18·T·d·m + 6·T·d·E (m: the
   shared expert's width; the Mixtral block's rate without it, as it has none) and their fraction
   of the ceiling, saved activation bytes (ours: the manifest's saved tensors that are not
   inputs, and what torch saw allocated after forward; HF: allocated after forward minus
   before) against the floor 2·T·d + 4·T·k·n + 12·T·k.

With --recompute each layer DIR/NAME is followed, in the same process and right after it, by
DIR/NAME-recompute (the same layer compiled with H recomputed in backward): its check and its
step timed the same way, its time over the kept layer's and the best peer's time over it, so
that the recompute target (at most 1.25x the kept layer, still faster than the best peer) is
read from one GPU state instead of two processes minutes apart.

With --peer liger (the pip package liger-kernel, pure Python and Triton) the same step also
runs through Liger-Kernel's fused MoE (`LigerFusedMoEFunction`: gather fused into its grouped
GEMM, SwiGLU in the epilogue) behind the Mixtral block's own router, for the softmax layers;
its Triton autotuning runs in a first, untimed step.

With --peer sonic (the pip package sonic-moe, CuTe-DSL kernels; bench/sonic.py) a sonicmoe.MoE
given our weights in its layout (gate/up rows interleaved) runs the softmax layers; its first step
(the JIT compile) is untimed and checks its output and every gradient against an fp32 reference
with its own routing (docs/benchmarks.md's tolerances); a peer that fails it is not timed.
--sonic-shapes also runs SonicMoE's own benchmark shapes (DIR/sonic-..., built by
scripts/dev/build-sonic-inputs.sh), ours, HF and SonicMoE on each.

Prints a short table last and writes JSON to $OUT (or --out). Exit 1 when a layer failed to run
or its sample check failed, 2 on bad usage.

    python3 bench/bench.py --layer gpu-inputs/layers/mixtral-8x7b --layer ...
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

DEFAULT_LAYERS = ["mixtral-8x7b", "olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-v3"]
# deepseek-v3 without its shared expert: the same work as the baseline for deepseek-v3 (the
# Mixtral block with E = 256, k = 8; docs/benchmarks.md); scripts/inputs/build-layers.sh builds it.
ROUTED_LAYERS = ["deepseek-v3-routed"]
GIB = float(1 << 30)


def log(msg: str) -> None:
    print(msg, flush=True)


class Timer:
    """CUDA events around a step on the GPU, perf_counter on the CPU (dry runs)."""

    def __init__(self, torch, device):
        self.torch = torch
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def time_ms(self, step: Callable[[], Any], before: Optional[Callable[[], Any]] = None) -> float:
        if before is not None:
            before()
        if self.cuda:
            start = self.torch.cuda.Event(enable_timing=True)
            end = self.torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end))
        t0 = time.perf_counter()
        step()
        return (time.perf_counter() - t0) * 1e3

    def measure(
        self,
        step,
        warmup: int,
        iters: int,
        budget_s: float,
        before: Optional[Callable[[], Any]] = None,
    ) -> Dict[str, Any]:
        """Warm-up, then `iters` timed steps (at least 5; fewer warm-ups when one step is
        slow, so the budget holds)."""
        first = self.time_ms(step, before)
        times: List[float] = []
        n_warm = 1
        if first * (warmup + iters) / 1e3 > budget_s:
            warmup = 1
            iters = 5
        for _ in range(warmup - 1):
            self.time_ms(step, before)
            n_warm += 1
        for _ in range(iters):
            times.append(self.time_ms(step, before))
        return {
            "median_ms": statistics.median(times),
            "min_ms": min(times),
            "max_ms": max(times),
            "times_ms": times,
            "warmup": n_warm,
            "first_ms": first,
        }


def useful_flops(
    T: int, d: int, n: int, E: int, k: int, shared: int = 0, gated: bool = True
) -> float:
    """Forward + backward FLOPs of the layer: the routed experts, a shared expert of width
    `shared` (every token, 18 T d m) and the router. A gated FFN (SwiGLU) has three GEMMs of
    d x n a row, forward and backward 18 T d n; a non-gated one (SiLU, GELU) two, 12 T d n."""
    per_row = 18.0 if gated else 12.0
    return per_row * T * k * d * n + per_row * T * d * shared + 6.0 * T * d * E


def tflops(flops: float, median_ms: float) -> float:
    """The rate of `flops` done in `median_ms`, TFLOP/s."""
    return flops / (median_ms * 1e-3) / 1e12


def floor_bytes(T: int, d: int, n: int, k: int) -> int:
    return 2 * T * d + 4 * T * k * n + 12 * T * k


def dense_ceiling(
    torch, device, timer: Timer, size: int, iters: int, after_s: float = 0.0
) -> Dict[str, Any]:
    """A size^3 bf16 matmul's rate. The ceiling of docs/benchmarks.md is a short run, at the
    boost clock; with `after_s` the matmul first runs that long back to back, and the rate is the
    one a long run holds under the GPU's power cap, as a layer's timed loop (0.4 s and more)
    does, ours and the peers alike (docs/results.md, "The power cap")."""
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < after_s:
        for _ in range(10):
            a @ b
        timer.sync()
    m = timer.measure(lambda: a @ b, 1 if after_s > 0 else 3, iters, 60.0)
    m["size"] = size
    if after_s > 0:
        m["after_s"] = after_s
    m["tflops"] = 2.0 * size**3 / (m["median_ms"] * 1e-3) / 1e12
    a = b = None  # frees the matrices (a closure above still names them)
    return m


def trim_runtime_pool() -> None:
    """Returns what the runtime's stream-ordered pool keeps (its release threshold is the
    maximum), so the next configuration and the HF block see the memory."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        dev = ctypes.c_int(0)
        pool = ctypes.c_void_p()
        if (
            cuda.cuCtxGetDevice(ctypes.byref(dev)) == 0
            and cuda.cuDeviceGetDefaultMemPool(ctypes.byref(pool), dev) == 0
        ):
            cuda.cuMemPoolTrimTo(pool, ctypes.c_size_t(0))
    except OSError:
        pass


# --------------------------------------------------------------------------- ours


def make_args(torch, cfg, device, gen) -> Dict[str, Any]:
    def normal(shape, std):
        return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std).to(
            torch.bfloat16
        )

    args = {
        "x": normal((cfg.tokens, cfg.hidden), 1.0),
        "w_router": normal((cfg.hidden, cfg.experts), 0.02),
    }
    if cfg.router_bias:
        args["router_bias"] = torch.randn((cfg.experts,), generator=gen, device=device) * 0.01
    args["w_gate_up"] = normal((cfg.experts, cfg.hidden, cfg.gate_up_width), 0.02)
    args["w_down"] = normal((cfg.experts, cfg.ffn, cfg.hidden), 0.02)
    if cfg.has_shared:
        args["shared_gate_up"] = normal((cfg.hidden, cfg.shared_gate_up_width), 0.02)
        args["shared_down"] = normal((cfg.shared_ffn, cfg.hidden), 0.02)
    return args


def sample_check(torch, cfg, args, fwd, experts, tokens: int) -> Dict[str, Any]:
    """fp32 recomputation of out and the logits for the first `tokens` tokens with our
    routing; per-expert weights are cast on the fly, so no fp32 copy of a weight exists."""
    from moe_mlir import torch_reference as TR

    S = min(tokens, cfg.tokens)
    x = args["x"][:S].float()
    logits = x @ args["w_router"].float()
    s = TR.scores(logits, cfg.scoring)
    ex = experts[:S].long()
    u = s.gather(1, ex)
    w = u
    if cfg.renormalize:
        tot = u.sum(1, keepdim=True)
        w = torch.where(tot != 0, u / torch.where(tot != 0, tot, torch.ones_like(tot)), u)
    w = w * float(cfg.scaling_factor)
    out = torch.zeros((S, cfg.hidden), device=x.device)
    for e in torch.unique(ex).tolist():
        tt, jj = torch.nonzero(ex == e, as_tuple=True)
        h = x[tt] @ args["w_gate_up"][e].float()
        y = TR.activation(h, cfg.activation) @ args["w_down"][e].float()
        out.index_add_(0, tt, w[tt, jj][:, None] * y)
    if cfg.has_shared:
        h = x @ args["shared_gate_up"].float()
        out += TR.activation(h, cfg.activation) @ args["shared_down"].float()

    def rel(a, b):
        a = a.double()
        b = b.double()
        if not bool(torch.isfinite(a).all()):
            return float("nan")
        return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))

    res = {"tokens": S, "out": rel(fwd["result0"][:S], out)}
    if "result1" in fwd:
        res["router_logits"] = rel(fwd["result1"][:S], logits)
    res["ok"] = all(v <= 1e-2 for k, v in res.items() if k in ("out", "router_logits"))
    return res


def bench_ours(torch, layer, cfg, args, device, timer: Timer, opts) -> Dict[str, Any]:
    from check_layer import find_saved, forward_param_names

    params = forward_param_names(layer, cfg)
    inputs = {params[a]: t for a, t in args.items()}
    gen = torch.Generator(device=device)
    gen.manual_seed(opts.seed + 1)
    cots = {}
    for spec in layer.manifest.backward.by_role("cotangent"):
        from moe_mlir.gpu import torch_dtype

        if spec.of in (None, "result0"):
            cots[spec.name] = torch.randn(tuple(spec.shape), generator=gen, device=device).to(
                torch_dtype(spec.dtype)
            )
        else:  # no loss on the router logits: zeros, allocated once
            cots[spec.name] = torch.zeros(
                tuple(spec.shape), device=device, dtype=torch_dtype(spec.dtype)
            )
    res: Dict[str, Any] = {
        "saved_bytes_manifest": layer.manifest.saved_bytes(),
        "workspace_bytes": {
            "forward": layer.workspace_bytes("forward"),
            "backward": layer.workspace_bytes("backward"),
        },
    }
    # Numbers first: one step, a sample of tokens against fp32.
    timer.sync()
    base = torch.cuda.memory_allocated() if timer.cuda else 0
    fwd = layer.forward(inputs)
    timer.sync()
    res["saved_bytes_torch"] = (torch.cuda.memory_allocated() - base) if timer.cuda else None
    experts_name = find_saved(layer, contains="expert", dtype="i32", shape=(cfg.tokens, cfg.top_k))
    grads = layer.backward(fwd, cots)
    timer.sync()
    if experts_name:
        res["check"] = sample_check(torch, cfg, args, fwd, fwd[experts_name], opts.check_tokens)
    else:
        res["check"] = {"ok": True, "note": "no experts saved: not checked"}
    bad = [
        n
        for n, t in list(fwd.items()) + list(grads.items())
        if n not in inputs and t.is_floating_point() and not bool(torch.isfinite(t).all())
    ]
    if bad:
        res["check"]["ok"] = False
        res["check"]["non_finite"] = bad
    del fwd, grads

    def step():
        f = layer.forward(inputs)
        layer.backward(f, cots)

    if timer.cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    res.update(timer.measure(step, opts.warmup, opts.iters, opts.budget))
    if timer.cuda:
        res["peak_bytes_torch"] = torch.cuda.max_memory_allocated() - base
    if timer.cuda and opts.gaps:
        import step_gaps

        held = {}
        res["gaps"] = step_gaps.report(
            torch,
            layer.name,
            [
                ("forward", lambda: held.update(f=layer.forward(inputs))),
                ("backward", lambda: layer.backward(held.pop("f"), cots)),
            ],
        )
    return res


# --------------------------------------------------------------------------- HF


def bench_recompute(
    torch, path: str, cfg, args, device, timer: Timer, opts, entry: Dict[str, Any]
) -> None:
    """--recompute, after entry["ours"]: PATH-recompute timed as bench_ours times PATH, into
    entry["ours_recompute"] (or entry["recompute_skipped"] / entry["recompute_error"]); the
    ratio to the kept layer in entry["recompute_over_kept"]. The caller frees the layer's
    memory afterwards, as after the kept one."""
    from moe_mlir import torch_reference as TR

    rpath = path + "-recompute"
    needed = rpath + (".json" if opts.emulate else ".so")
    if not os.path.exists(needed):
        entry["recompute_skipped"] = f"{needed} missing"
        log(f"  H recomputed: skipped, {needed} missing")
        return
    log("  ours, H recomputed: check, then forward + backward ...")
    try:
        layer = open_layer(rpath, opts)
        rcfg = TR.config_from_manifest(layer.layer)
        if rcfg != cfg:
            raise ValueError(
                f"{os.path.basename(rpath)} is not the same layer as "
                f"{os.path.basename(path)}: {rcfg} against {cfg}"
            )
        rec = bench_ours(torch, layer, cfg, args, device, timer, opts)
    except Exception as e:  # noqa: BLE001 - the peers still run
        entry["recompute_error"] = f"{type(e).__name__}: {e}"
        log(f"  H recomputed FAILED: {entry['recompute_error']}")
        return
    rec["tflops"] = tflops(entry["useful_flops"], rec["median_ms"])
    entry["ours_recompute"] = rec
    entry["recompute_over_kept"] = rec["median_ms"] / entry["ours"]["median_ms"]
    log(
        f"  H recomputed: {rec['median_ms']:.2f} ms, "
        f"{entry['recompute_over_kept']:.2f}x the kept layer; sample check "
        f"{'ok' if rec['check']['ok'] else 'FAILED'}"
    )


def best_peer_ms(entry: Dict[str, Any]) -> Optional[float]:
    """The fastest step time of the peers that do a configuration's work, None if none ran:
    Liger, SonicMoE and the HF block, which is DeepseekV3MoE (hf_full) where it ran beside the Mixtral
    block without a shared expert or group router (hf)."""
    names = ("hf_full" if "hf_full" in entry else "hf", "liger", "sonic")
    times = [
        entry[p]["median_ms"]
        for p in names
        if isinstance(entry.get(p), dict) and "median_ms" in entry[p]
    ]
    return min(times) if times else None


def hf_mixtral_block(torch, cfg, args, device, opts):
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    hc = MixtralConfig(
        hidden_size=cfg.hidden,
        intermediate_size=cfg.ffn,
        num_local_experts=cfg.experts,
        num_experts_per_tok=cfg.top_k,
    )
    hc._experts_implementation = opts.hf_implementation
    block = MixtralSparseMoeBlock(hc).to(device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        # Our weights in HF's layout: gate [E, d]; gate_up [E, 2n, d]; down [E, d, n].
        block.gate.weight.copy_(args["w_router"].t())
        block.experts.gate_up_proj.copy_(args["w_gate_up"].transpose(1, 2))
        block.experts.down_proj.copy_(args["w_down"].transpose(1, 2))
    return block


def hf_deepseek_block(torch, cfg, args, device, opts):
    """transformers' DeepseekV3MoE: the whole layer of the deepseek-v3 configuration (sigmoid
    router in fp32 with the correction bias, group-limited top-k, scaling, one shared
    expert), with our weights."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    m = cfg.shared_ffn
    hc = DeepseekV3Config(
        hidden_size=cfg.hidden,
        moe_intermediate_size=cfg.ffn,
        n_routed_experts=cfg.experts,
        num_experts_per_tok=cfg.top_k,
        n_group=cfg.num_groups,
        topk_group=cfg.topk_groups,
        routed_scaling_factor=cfg.scaling_factor,
        norm_topk_prob=cfg.renormalize,
        n_shared_experts=m // cfg.ffn,
    )
    hc._experts_implementation = opts.hf_implementation
    block = DeepseekV3MoE(hc).to(device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        block.gate.weight.copy_(args["w_router"].t())
        block.gate.e_score_correction_bias.copy_(args["router_bias"])
        block.experts.gate_up_proj.copy_(args["w_gate_up"].transpose(1, 2))
        block.experts.down_proj.copy_(args["w_down"].transpose(1, 2))
        block.shared_experts.gate_proj.weight.copy_(args["shared_gate_up"][:, :m].t())
        block.shared_experts.up_proj.weight.copy_(args["shared_gate_up"][:, m:].t())
        block.shared_experts.down_proj.weight.copy_(args["shared_down"].t())
    return block


def hf_full_block_applies(cfg) -> bool:
    """The Mixtral block cannot express a sigmoid group router or a shared expert."""
    return cfg.has_shared and cfg.router_bias and cfg.num_groups > 1


def bench_hf(torch, cfg, args, device, timer: Timer, opts, make_block=None) -> Dict[str, Any]:
    T, d = cfg.tokens, cfg.hidden
    block = (make_block or hf_mixtral_block)(torch, cfg, args, device, opts)
    x = args["x"].detach().clone().view(1, T, d).requires_grad_(True)
    gen = torch.Generator(device=device)
    gen.manual_seed(opts.seed + 1)
    d_out = torch.randn((1, T, d), generator=gen, device=device).to(torch.bfloat16)
    res: Dict[str, Any] = {"implementation": opts.hf_implementation}

    def clear():
        block.zero_grad(set_to_none=True)
        x.grad = None

    def forward():
        out = block(x)
        return out[0] if isinstance(out, tuple) else out  # Mixtral: (out, router logits)

    measure_peer(torch, timer, opts, forward, clear, d_out, res)
    block = x = d_out = None  # frees them; the closures above name them
    return res


def measure_peer(torch, timer: Timer, opts, forward, clear, d_out, res: Dict[str, Any]) -> None:
    """A peer's forward + backward: one untimed step for the saved bytes (allocated after
    forward minus before), then the timed steps and their peak, into `res`."""
    clear()
    timer.sync()
    base = torch.cuda.memory_allocated() if timer.cuda else 0
    out = forward()
    timer.sync()
    if timer.cuda:
        res["saved_bytes_torch"] = torch.cuda.memory_allocated() - base
    out.backward(d_out)
    del out
    clear()

    def step():
        forward().backward(d_out)

    if timer.cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    res.update(timer.measure(step, opts.warmup, opts.iters, opts.budget, before=clear))
    if timer.cuda:
        res["peak_bytes_torch"] = torch.cuda.max_memory_allocated() - base


# --------------------------------------------------------------------------- Liger


class LigerBlock:
    """The Mixtral block's router (linear, softmax, top-k, renormalised) in torch, then
    Liger-Kernel's fused experts with our weights in its layout."""

    def __init__(self, torch, cfg, args):
        from liger_kernel.ops.fused_moe import LigerFusedMoEFunction

        self.torch, self.cfg, self.fn = torch, cfg, LigerFusedMoEFunction
        n = cfg.ffn
        self.w_router = args["w_router"].detach().clone().requires_grad_(True)  # [d, E]
        # gate_up [E, 2n, d] (gate rows first), down [E, d, n]
        self.gate_up = args["w_gate_up"].transpose(1, 2).contiguous().requires_grad_(True)
        self.down = args["w_down"].transpose(1, 2).contiguous().requires_grad_(True)
        assert self.gate_up.shape[1] == 2 * n

    def parameters(self):
        return [self.w_router, self.gate_up, self.down]

    def __call__(self, x):
        torch = self.torch
        logits = x @ self.w_router
        probs = torch.softmax(logits.float(), dim=-1)
        weights, experts = torch.topk(probs, self.cfg.top_k, dim=-1)
        if self.cfg.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return self.fn.apply(
            x, self.gate_up, self.down, experts.to(torch.int32), weights.to(x.dtype)
        )


def liger_applies(cfg) -> bool:
    """Liger's fused experts behind a softmax router; the group-limited sigmoid router and
    the shared expert of deepseek-v3 have no Liger block."""
    return cfg.scoring == "softmax" and cfg.num_groups <= 1 and not cfg.has_shared


def bench_liger(torch, cfg, args, device, timer: Timer, opts) -> Dict[str, Any]:
    T, d = cfg.tokens, cfg.hidden
    block = LigerBlock(torch, cfg, args)
    x = args["x"].detach().clone().requires_grad_(True)
    gen = torch.Generator(device=device)
    gen.manual_seed(opts.seed + 1)
    d_out = torch.randn((T, d), generator=gen, device=device).to(torch.bfloat16)
    res: Dict[str, Any] = {"implementation": "liger-kernel LigerFusedMoEFunction"}

    def clear():
        for w in block.parameters():
            w.grad = None
        x.grad = None

    # The first step autotunes every Triton kernel, untimed.
    started = time.time()
    block(x).backward(d_out)
    timer.sync()
    res["autotune_s"] = time.time() - started
    measure_peer(torch, timer, opts, lambda: block(x), clear, d_out, res)
    block = x = d_out = None  # frees them; the closures above name them
    return res


def time_peer(
    entry: Dict[str, Any], key: str, label: str, run, flops: Optional[float] = None
) -> Optional[Dict[str, Any]]:
    """entry[key] = run() (a peer's timing, median_ms), with its TFLOP/s (of `flops`, by
    default the layer's) and ours / peer time as entry["ours_over_<key>_time"]; a failure is
    entry["<key>_error"], logged, and the other peers still run."""
    try:
        res = run()
    except Exception as e:  # noqa: BLE001
        entry[f"{key}_error"] = f"{type(e).__name__}: {e}"
        log(f"  {label} failed: {entry[key + '_error']}")
        return None
    entry[key] = res
    if "median_ms" not in res:  # not timed: a peer whose check failed
        return None
    res["tflops"] = tflops(flops or entry["useful_flops"], res["median_ms"])
    if "ours" in entry:
        entry[f"ours_over_{key}_time"] = entry["ours"]["median_ms"] / res["median_ms"]
    return res


# --------------------------------------------------------------------------- SonicMoE


def bench_sonic(torch, cfg, args, device, timer: Timer, opts) -> Dict[str, Any]:
    """SonicMoE's step (bench/sonic.py): the first, untimed, JIT-compiles and is checked against
    the fp32 reference; timed only when the check passes (else res has no median_ms)."""
    import sonic

    T, d = cfg.tokens, cfg.hidden
    block = sonic.SonicBlock(torch, cfg, args)
    x = args["x"].detach().clone().requires_grad_(True)
    gen = torch.Generator(device=device)
    gen.manual_seed(opts.seed + 1)
    d_out = torch.randn((T, d), generator=gen, device=device).to(torch.bfloat16)
    flags = sonic.routing_flags(cfg)
    res: Dict[str, Any] = {
        "implementation": "sonic-moe moe_TC_softmax_topk_layer (sonicmoe.MoE's weights)",
        "is_softmax_over_topk": flags[0],
        "norm_topk_probs": flags[1],
    }
    started = time.time()
    res["check"] = block.check(x, d_out, args)
    timer.sync()
    res["jit_and_check_s"] = time.time() - started
    if not res["check"]["ok"]:
        block = x = d_out = None
        return res

    def clear():
        for w in block.parameters():
            w.grad = None
        x.grad = None

    measure_peer(torch, timer, opts, lambda: block(x), clear, d_out, res)
    block = x = d_out = None  # frees them; the closures above name them
    return res


# --------------------------------------------------------------------------- main


def open_layer(path: str, opts):
    if opts.emulate:
        from emulate import EmulatedLayer

        return EmulatedLayer(path + ".so", path + ".json", require_cuda=opts.device == "cuda")
    from moe_mlir.gpu import CompiledLayer

    return CompiledLayer(path + ".so", path + ".json")


def fmt_gib(b: Optional[float]) -> str:
    return "-" if b is None else f"{b / GIB:.2f}"


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--layer",
        action="append",
        help="DIR/NAME of NAME.so + NAME.json (repeatable; default the four "
        "docs/benchmarks.md configs in gpu-inputs/layers)",
    )
    p.add_argument("--layers-dir", default=os.path.join(ROOT, "gpu-inputs", "layers"))
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=7)
    p.add_argument(
        "--budget",
        type=float,
        default=40.0,
        help="seconds one measurement may take before it drops to 1 warm-up + 5",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=0.0,
        help="skip the configurations left after this many seconds (0: none)",
    )
    p.add_argument("--ceiling-size", type=int, default=8192)
    p.add_argument(
        "--sustained-ceiling",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="also time the ceiling's matmul after SECONDS of it back to back "
        "(0: not), and print each layer's fraction of that",
    )
    p.add_argument("--check-tokens", type=int, default=256)
    p.add_argument("--no-hf", action="store_true")
    p.add_argument(
        "--recompute",
        action="store_true",
        help="also time DIR/NAME-recompute (H recomputed in backward) right after "
        "each layer, and its ratio to it",
    )
    p.add_argument("--hf-implementation", default="grouped_mm")
    p.add_argument(
        "--peer",
        action="append",
        default=[],
        choices=["liger", "sonic"],
        help="also time this peer (liger: liger-kernel's fused MoE; sonic: sonic-moe, "
        "checked against the fp32 reference first)",
    )
    p.add_argument(
        "--sonic-shapes",
        action="store_true",
        help="also run SonicMoE's own benchmark shapes (DIR/sonic-*, bench/sonic.py SHAPES; "
        "built by scripts/dev/build-sonic-inputs.sh)",
    )
    p.add_argument(
        "--gaps",
        action="store_true",
        help="after timing ours, one step under the profiler: host time, GPU span "
        "and idle stretches of forward and backward (bench/step_gaps.py)",
    )
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/moe-bench-out"))
    p.add_argument("--json-name", default="bench.json")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    p.add_argument(
        "--emulate",
        action="store_true",
        help="dry run on bench/emulate.py's stand-in (reads NAME.json only)",
    )
    opts = p.parse_args(argv)
    if opts.iters < 5:
        p.error("--iters must be at least 5 (docs/benchmarks.md: median of at least 5)")
    if not opts.sustained_ceiling >= 0:  # also refuses nan
        p.error(f"--sustained-ceiling must be 0 or more seconds, not {opts.sustained_ceiling}")
    layers = opts.layer or [
        os.path.join(opts.layers_dir, n) for n in DEFAULT_LAYERS + ROUTED_LAYERS
    ]
    if opts.sonic_shapes:
        import sonic

        layers += [os.path.join(opts.layers_dir, n) for n in sonic.SHAPES]
    layers = [path[:-3] if path.endswith(".so") else path for path in layers]

    from check_layer import import_torch

    torch = import_torch(opts.device)
    if torch is None:
        return 2
    from moe_mlir import torch_reference as TR

    device = torch.device(opts.device)
    timer = Timer(torch, device)
    started = time.time()
    report: Dict[str, Any] = {
        "device": torch.cuda.get_device_name() if timer.cuda else opts.device,
        "torch": torch.__version__,
        "emulated": opts.emulate,
        "configs": [],
    }
    try:
        import transformers

        report["transformers"] = transformers.__version__
    except Exception as e:  # noqa: BLE001
        report["transformers"] = None
        if not opts.no_hf:
            log(f"note: transformers unavailable ({type(e).__name__}: {e}); no HF baseline")
            opts.no_hf = True

    log(f"dense ceiling: {opts.ceiling_size}^3 bf16 matmul ...")
    ceiling = dense_ceiling(torch, device, timer, opts.ceiling_size, max(opts.iters, 5))
    report["ceiling"] = ceiling
    log(f"  {ceiling['tflops']:.0f} TFLOP/s ({ceiling['median_ms']:.2f} ms)")
    sustained = None
    if opts.sustained_ceiling > 0:
        log(
            f"dense ceiling sustained: the same matmul after {opts.sustained_ceiling:g} s of it ..."
        )
        sustained = dense_ceiling(
            torch,
            device,
            timer,
            opts.ceiling_size,
            max(opts.iters, 5),
            after_s=opts.sustained_ceiling,
        )
        report["sustained_ceiling"] = sustained
        log(f"  {sustained['tflops']:.0f} TFLOP/s ({sustained['median_ms']:.2f} ms)")

    failures = 0
    for path in layers:
        name = os.path.basename(path)
        entry: Dict[str, Any] = {"name": name, "path": path}
        report["configs"].append(entry)
        needed = path + (".json" if opts.emulate else ".so")
        if not os.path.exists(needed):
            entry["skipped"] = f"{needed} missing"
            log(f"SKIP {name}: {needed} missing")
            continue
        if opts.deadline and time.time() - started > opts.deadline:
            entry["skipped"] = f"deadline of {opts.deadline:.0f} s reached"
            log(f"SKIP {name}: deadline of {opts.deadline:.0f} s reached")
            continue
        log(f"== {name}")
        args = None
        try:
            layer = open_layer(path, opts)
            cfg = TR.config_from_manifest(layer.layer)
            T, d, n, E, k = cfg.tokens, cfg.hidden, cfg.ffn, cfg.experts, cfg.top_k
            entry["config"] = dict(
                T=T,
                d=d,
                n=n,
                E=E,
                k=k,
                scoring=cfg.scoring,
                groups=cfg.num_groups,
                shared_n=cfg.shared_ffn,
            )
            entry["useful_flops"] = useful_flops(T, d, n, E, k, cfg.shared_ffn, cfg.gated)
            # what the Mixtral block computes: no shared expert
            entry["useful_flops_routed"] = useful_flops(T, d, n, E, k, gated=cfg.gated)
            entry["floor_saved_bytes"] = floor_bytes(T, d, n, k)
            gen = torch.Generator(device=device)
            gen.manual_seed(opts.seed)
            args = make_args(torch, cfg, device, gen)
            log("  ours: check, then forward + backward ...")
            ours = bench_ours(torch, layer, cfg, args, device, timer, opts)
            entry["ours"] = ours
            ours["tflops"] = tflops(entry["useful_flops"], ours["median_ms"])
            ours["fraction_of_ceiling"] = ours["tflops"] / ceiling["tflops"]
            if sustained is not None:
                ours["fraction_of_sustained_ceiling"] = ours["tflops"] / sustained["tflops"]
            log(
                f"  ours: {ours['median_ms']:.2f} ms, {ours['tflops']:.0f} TFLOP/s; sample "
                f"check out {ours['check'].get('out', float('nan')):.2e} "
                f"{'ok' if ours['check']['ok'] else 'FAILED'}"
            )
            if not ours["check"]["ok"]:
                failures += 1
            if opts.recompute:
                layer = None
                gc.collect()
                bench_recompute(torch, path, cfg, args, device, timer, opts, entry)
                rec = entry.get("ours_recompute")
                if "recompute_error" in entry or (rec and not rec["check"]["ok"]):
                    failures += 1
        except Exception as e:  # noqa: BLE001 - the other configurations still run
            entry["error"] = f"{type(e).__name__}: {e}"
            log(f"  ours FAILED: {entry['error']}")
            log(traceback.format_exc())
            failures += 1
            if "CUDA error" in str(e) or "KERNEL_FAULT" in str(e) or "illegal" in str(e):
                log("  the CUDA context is unusable now; stopping")
                break
        layer = None
        gc.collect()
        if timer.cuda:
            torch.cuda.empty_cache()
            trim_runtime_pool()
        if not opts.no_hf and args is not None:
            log(f"  HF MixtralSparseMoeBlock ({opts.hf_implementation}) ...")
            hf = time_peer(
                entry,
                "hf",
                "HF",
                lambda cfg=cfg, args=args: bench_hf(torch, cfg, args, device, timer, opts),
                entry["useful_flops_routed"],
            )
            if hf:
                hf["fraction_of_ceiling"] = hf["tflops"] / ceiling["tflops"]
                log(f"  HF: {hf['median_ms']:.2f} ms, {hf['tflops']:.0f} TFLOP/s")
            if hf_full_block_applies(cfg):
                # The baseline times the Mixtral block for deepseek-v3 (no group router, no
                # shared expert, which ours runs); the real DeepseekV3MoE is the fair one
                log(f"  HF DeepseekV3MoE ({opts.hf_implementation}) ...")
                full = time_peer(
                    entry,
                    "hf_full",
                    "HF DeepseekV3MoE",
                    lambda cfg=cfg, args=args: bench_hf(
                        torch, cfg, args, device, timer, opts, hf_deepseek_block
                    ),
                )
                if full:
                    log(f"  HF DeepseekV3MoE: {full['median_ms']:.2f} ms")
        if "liger" in opts.peer and args is not None:
            if not liger_applies(cfg):
                entry["liger_skipped"] = (
                    "no Liger block for a sigmoid group router or a shared expert"
                )
            elif opts.deadline and time.time() - started > opts.deadline:
                entry["liger_skipped"] = f"deadline of {opts.deadline:.0f} s reached"
            else:
                log("  Liger fused MoE (autotunes first) ...")
                lg = time_peer(
                    entry,
                    "liger",
                    "Liger",
                    lambda cfg=cfg, args=args: bench_liger(torch, cfg, args, device, timer, opts),
                )
                if lg:
                    log(
                        f"  Liger: {lg['median_ms']:.2f} ms, {lg['tflops']:.0f} TFLOP/s "
                        f"(autotuning {lg['autotune_s']:.0f} s)"
                    )
            if "liger_skipped" in entry:
                log(f"  Liger skipped: {entry['liger_skipped']}")
        if "sonic" in opts.peer and args is not None:
            import sonic

            why = sonic.applies(cfg)
            if why:
                entry["sonic_skipped"] = why
            elif opts.deadline and time.time() - started > opts.deadline:
                entry["sonic_skipped"] = f"deadline of {opts.deadline:.0f} s reached"
            else:
                log("  SonicMoE (JIT compile and check first) ...")
                sm = time_peer(
                    entry,
                    "sonic",
                    "SonicMoE",
                    lambda cfg=cfg, args=args: bench_sonic(torch, cfg, args, device, timer, opts),
                )
                chk = entry.get("sonic", {}).get("check", {})
                if chk:
                    log(
                        "  SonicMoE check "
                        + ("ok" if chk["ok"] else "FAILED, not timed")
                        + ": "
                        + ", ".join(f"{k} {v:.2e}" for k, v in chk.items() if isinstance(v, float))
                    )
                if sm:
                    log(
                        f"  SonicMoE: {sm['median_ms']:.2f} ms, {sm['tflops']:.0f} TFLOP/s "
                        f"(JIT and check {sm['jit_and_check_s']:.0f} s)"
                    )
            if "sonic_skipped" in entry:
                log(f"  SonicMoE skipped: {entry['sonic_skipped']}")
        best = best_peer_ms(entry)
        if "ours_recompute" in entry and best is not None:
            entry["best_peer_over_recompute_time"] = best / entry["ours_recompute"]["median_ms"]
        args = None
        gc.collect()
        if timer.cuda:
            torch.cuda.empty_cache()

    os.makedirs(opts.out, exist_ok=True)
    path = os.path.join(opts.out, opts.json_name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, default=str)

    log("")
    log(f"dense ceiling {ceiling['tflops']:.0f} TFLOP/s; saved in GiB; floor = 2Td + 4Tkn + 12Tk")
    head = (
        f"{'config':<16} {'ours ms':>8} {'HF ms':>8} {'ours/HF':>7} {'ours TF/s':>9} "
        f"{'of ceil':>7} {'HF TF/s':>8} {'saved':>6} {'HF sav':>6} {'floor':>6} "
        f"{'check':>6}"
    )
    log(head)
    log("-" * len(head))
    for e in report["configs"]:
        if "skipped" in e:
            log(f"{e['name']:<16} skipped: {e['skipped']}")
            continue
        o, h = e.get("ours", {}), e.get("hf", {})
        ratio = e.get("ours_over_hf_time")
        row = (
            f"{e['name'][:16]:<16} {o.get('median_ms', math.nan):>8.2f} "
            f"{h.get('median_ms', math.nan):>8.2f} "
            f"{(ratio if ratio is not None else math.nan):>7.2f} "
            f"{o.get('tflops', math.nan):>9.0f} "
            f"{o.get('fraction_of_ceiling', math.nan):>7.2f} "
            f"{h.get('tflops', math.nan):>8.0f} "
            f"{fmt_gib(o.get('saved_bytes_manifest')):>6} "
            f"{fmt_gib(h.get('saved_bytes_torch')):>6} "
            f"{fmt_gib(e.get('floor_saved_bytes')):>6} "
            f"{('ok' if o.get('check', {}).get('ok') else 'FAIL') if o else 'error':>6}"
        )
        log(row)
    if sustained is not None:
        fractions = ", ".join(
            f"{e['name']} {e['ours']['fraction_of_sustained_ceiling']:.2f}"
            for e in report["configs"]
            if "fraction_of_sustained_ceiling" in e.get("ours", {})
        )
        log(
            f"of the sustained ceiling ({sustained['tflops']:.0f} TFLOP/s after "
            f"{sustained['after_s']:g} s of matmuls): {fractions}"
        )
    for e in report["configs"]:
        if "hf_full" in e:
            log(
                f"{e['name']}: the full HF block (DeepseekV3MoE, shared expert and group "
                f"router included) {e['hf_full']['median_ms']:.2f} ms, ours/HF "
                f"{e.get('ours_over_hf_full_time', math.nan):.2f}; saved "
                f"{fmt_gib(e['hf_full'].get('saved_bytes_torch'))} GiB"
            )
    for e in report["configs"]:
        rec = e.get("ours_recompute")
        if rec:
            log(
                f"{e['name']}: H recomputed {rec['median_ms']:.2f} ms, "
                f"{e.get('recompute_over_kept', math.nan):.2f}x the kept layer (target <= 1.25), "
                f"best peer / recomputed {e.get('best_peer_over_recompute_time', math.nan):.2f}x "
                f"(target > 1); saved {fmt_gib(rec.get('saved_bytes_manifest'))} GiB"
            )
        elif "recompute_skipped" in e or "recompute_error" in e:
            log(
                f"{e['name']}: H recomputed not timed: "
                f"{e.get('recompute_skipped') or e.get('recompute_error')}"
            )
    for e in report["configs"]:
        if "liger" in e:
            best = best_peer_ms(e)
            log(
                f"{e['name']}: Liger {e['liger']['median_ms']:.2f} ms "
                f"({e['liger']['tflops']:.0f} TFLOP/s), ours/Liger "
                f"{e.get('ours_over_liger_time', math.nan):.2f}, best peer / ours "
                f"{best / e.get('ours', {}).get('median_ms', math.nan):.2f}x; saved "
                f"{fmt_gib(e['liger'].get('saved_bytes_torch'))} GiB"
            )
    for e in report["configs"]:
        if "sonic" in e and "median_ms" in e["sonic"]:
            best = best_peer_ms(e)
            log(
                f"{e['name']}: SonicMoE {e['sonic']['median_ms']:.2f} ms "
                f"({e['sonic']['tflops']:.0f} TFLOP/s), ours/SonicMoE "
                f"{e.get('ours_over_sonic_time', math.nan):.2f}, best peer / ours "
                f"{best / e.get('ours', {}).get('median_ms', math.nan):.2f}x; saved "
                f"{fmt_gib(e['sonic'].get('saved_bytes_torch'))} GiB"
            )
        elif "sonic" in e:
            log(f"{e['name']}: SonicMoE not timed: its check failed ({e['sonic']['check']})")
        elif "sonic_skipped" in e or "sonic_error" in e:
            log(f"{e['name']}: SonicMoE not run: {e.get('sonic_skipped') or e['sonic_error']}")
    log(f"json: {path}")
    ran = sum(1 for e in report["configs"] if "skipped" not in e)
    log(f"{ran - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
