#!/usr/bin/env python3
"""MegaBlocks' dMoE beside moe-mlir, in one process: time, saved activation bytes and peak
memory of a forward + backward step, each as ours over MegaBlocks'.

MegaBlocks (PyPI `megablocks` 0.10.0; scripts/dev/build-megablocks.sh builds it) is the
baseline MoEBlaze reports against. (This file is not bench/megablocks.py: with bench/ on
sys.path that name would hide the package.) Its dropless layer `megablocks.layers.dmoe.dMoE(Arguments)`:

- router (`layers/router.py`): `logits = x @ router.weight.T` ([E, d] weight, no bias), then a
  softmax over all E in the activations' dtype (bf16), the top k (`max` when k = 1), divided by
  their p-norm when `moe_normalize_expert_weights = p` (p = 1: the sum, so renormalised; None,
  the default: not);
- experts (`layers/mlp.py`, `layers/glu.py`): `w1`, `v1` (GLU only) and `w2` of shape
  [E * n, d], expert e's rows e*n .. e*n + n - 1: `h = x_t @ w1[e].T`,
  `a = act(h)` ('mlp') or `act(h) * (x_t @ v1[e].T)` ('glu'), `y = a @ w2[e]`;
  out = sum over the k picks of weight * y;
- `mlp_impl = 'grouped'`: gather, grouped_gemm's GEMMs (cuBLAS, one a group), scatter;
  `'sparse'`: rows padded to 128 per expert, stk's block-sparse Triton matmuls. MegaBlocks
  0.10.0 refuses 'sparse' with Triton >= 3.2 (an int16 overflow in stk's kernels, which
  build-megablocks.sh patches); `MegaBlocksBlock` passes that refusal and says so
  (`forced_past_triton_check`), and the check below decides whether its numbers count.

Ours: w_router [d, E], w_gate_up [E, d, G] (G = 2n, gate columns first, for SwiGLU; n
otherwise), w_down [E, n, d]. SwiGLU is MegaBlocks' 'glu' with activation F.silu; SiLU is
'mlp' with F.silu. `to_megablocks` / `from_megablocks` convert; `reference` is MegaBlocks'
semantics in plain torch, which the CPU tests hold against our fp32 reference.

Configurations: the four of docs/benchmarks.md (deepseek-v3 is skipped: MegaBlocks has no
sigmoid router, selection bias, group-limited selection or scaling) and MoEBlaze's kind
(`grid`): d in {512, 1024, 2048}, n = 4d, E in {8, 16}, k in {1, 2}, SiLU and SwiGLU, softmax
top-k not renormalised (MegaBlocks' default), T long (--tokens, default 32768). A
configuration our sm_90a path does not run (moe_mlir.layer.check_gpu_config) runs MegaBlocks
alone and reports "not run by moe-mlir: <why>"; every one of the grid runs today, SiLU
(non-gated, `activation="silu"`) and SwiGLU alike.

Before timing, MegaBlocks' first step (which also autotunes Triton) is checked: its output and
the gradients of x, the router and every expert weight against an fp32 reference given
MegaBlocks' own routing (docs/benchmarks.md's tolerances); a failing implementation is not
timed. Our layer is checked as bench.py checks it. Measurements as bench.py's: CUDA events,
median of --iters after --warmup; saved = allocated after forward minus before (torch's
allocator, both sides; ours also the manifest's saved tensors); peak = torch's peak over the
timed steps (ours plus its runtime workspace, which torch does not see).

    python3 bench/megablocks_peer.py --layers-dir gpu-inputs/megablocks/layers --impl grouped
    python3 bench/megablocks_peer.py --merge megablocks-grouped.json megablocks-sparse.json

--merge prints docs/results.md's table from the JSON reports of runs (one an implementation,
as scripts/gpu/session.sh megablocks makes them).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import re
import sys
import time
import traceback
from typing import Any, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from moe_mlir.config import LayerConfig  # noqa: E402

BENCH_CONFIGS = ("mixtral-8x7b", "olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-v3")
GRID_D = (512, 1024, 2048)
GRID_E = (8, 16)
GRID_K = (1, 2)
GRID_ACTIVATIONS = ("silu", "swiglu")
GRID_TOKENS = (32768,)
FFN_PER_HIDDEN = 4  # n = 4d, MegaBlocks' and the usual transformer FFN width
IMPLS = ("grouped", "sparse")
SPARSE_BLOCK = 128  # stk's block: MegaBlocks' sparse path needs n % 128 == 0
GIB = float(1 << 30)
_GRID_NAME = re.compile(r"^mb-t(\d+)-d(\d+)-n(\d+)-e(\d+)-k(\d+)-(silu|swiglu)$")


def log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------- configurations


def grid_name(cfg: LayerConfig) -> str:
    return f"mb-t{cfg.tokens}-d{cfg.hidden}-n{cfg.ffn}-e{cfg.experts}-k{cfg.top_k}-{cfg.activation}"


def grid(tokens=GRID_TOKENS) -> Dict[str, LayerConfig]:
    """MoEBlaze's kind of configurations by name (mb-tT-dD-nN-eE-kK-ACT)."""
    out = {}
    for T in tokens:
        for d in GRID_D:
            for E in GRID_E:
                for k in GRID_K:
                    for act in GRID_ACTIVATIONS:
                        cfg = LayerConfig(
                            T, d, FFN_PER_HIDDEN * d, E, k, activation=act, dtype="bf16"
                        ).validate()
                        out[grid_name(cfg)] = cfg
    return out


def config_from_name(name: str) -> Optional[LayerConfig]:
    """The grid configuration a name stands for, None for another name."""
    m = _GRID_NAME.match(name)
    if not m:
        return None
    T, d, n, E, k = (int(v) for v in m.groups()[:5])
    return LayerConfig(T, d, n, E, k, activation=m.group(6), dtype="bf16").validate()


def applies(cfg: LayerConfig, impl: str) -> Optional[str]:
    """None when MegaBlocks' dMoE with `impl` computes cfg's layer, else why not."""
    if impl not in IMPLS:
        return f"unknown MegaBlocks implementation {impl!r} (one of {IMPLS})"
    if (
        cfg.scoring != "softmax"
        or cfg.router_bias
        or cfg.num_groups > 1
        or float(cfg.scaling_factor) != 1.0
        or cfg.has_shared
    ):
        return (
            "MegaBlocks' router is a softmax top-k: no sigmoid scores, selection bias, "
            "group-limited selection, scaling or shared expert of this kind"
        )
    if cfg.capacity_factor is not None:
        return "MegaBlocks' dMoE is dropless: no capacity factor"
    if cfg.activation not in ("silu", "swiglu", "gelu"):
        return f"no MegaBlocks activation for {cfg.activation}"
    if impl == "sparse" and cfg.ffn % SPARSE_BLOCK:
        return f"MegaBlocks' sparse dMoE needs n % {SPARSE_BLOCK} == 0 (n = {cfg.ffn})"
    return None


def ours_applies(cfg: LayerConfig) -> Optional[str]:
    """None when our sm_90a path runs cfg, else "not run by moe-mlir: <why>"."""
    from moe_mlir.layer import check_gpu_config

    try:
        check_gpu_config(cfg)
    except NotImplementedError as e:
        return f"not run by moe-mlir: {e}"
    return None


def normalize_p(cfg: LayerConfig) -> Optional[int]:
    """MegaBlocks' moe_normalize_expert_weights for cfg: 1 (divide by the sum of the positive
    top-k weights) when cfg renormalises, else None."""
    return 1 if cfg.renormalize else None


# --------------------------------------------------------------------------- layouts


def to_megablocks(torch, w_router, w_gate_up, w_down, gated: bool) -> Dict[str, Any]:
    """Our weights in MegaBlocks' layout (new contiguous tensors): router [E, d]; w1, v1 (GLU:
    the up half; None otherwise) and w2 [E * n, d]."""
    E, d, G = w_gate_up.shape
    n = w_down.shape[1]
    if G != (2 * n if gated else n):
        raise ValueError(f"w_gate_up [E, d, {G}] does not match n = {n} (gated: {gated})")
    out = {"router": w_router.t().contiguous(), "v1": None}
    out["w1"] = w_gate_up[..., :n].transpose(1, 2).reshape(E * n, d).contiguous()
    if gated:
        out["v1"] = w_gate_up[..., n:].transpose(1, 2).reshape(E * n, d).contiguous()
    out["w2"] = w_down.reshape(E * n, d).contiguous()
    return out


def from_megablocks(torch, router, w1, v1, w2, experts: int) -> Dict[str, Any]:
    """MegaBlocks' layout (or its gradients) back in ours."""
    d = w1.shape[1]
    n = w1.shape[0] // experts
    gate = w1.view(experts, n, d).transpose(1, 2)
    parts = [gate] if v1 is None else [gate, v1.view(experts, n, d).transpose(1, 2)]
    return {
        "w_router": router.t().contiguous(),
        "w_gate_up": torch.cat(parts, dim=-1).contiguous(),
        "w_down": w2.view(experts, n, d).contiguous(),
    }


def expert_slices(torch, experts: int, w1g, v1g, w2g):
    """expert_grads(e) for sonic.reference_errors: expert e's gradients of w_gate_up [d, G] and
    w_down [n, d] in our layout, from MegaBlocks' [E * n, d] gradients."""
    n = w1g.shape[0] // experts

    def get(e):
        rows = slice(e * n, (e + 1) * n)
        gu = w1g[rows].t() if v1g is None else torch.cat([w1g[rows].t(), v1g[rows].t()], dim=1)
        return gu, w2g[rows]

    return get


def reference(torch, x, router, w1, v1, w2, k: int, normalize: Optional[int], act: str):
    """MegaBlocks' dMoE in plain torch, in the inputs' dtype (its softmax too): (out [T, d],
    experts [T, k], weights [T, k]). `act` is the elementwise function (silu or gelu); v1
    None is the 'mlp' layer, else 'glu'."""
    import torch.nn.functional as F

    fn = {"silu": F.silu, "gelu": F.gelu}[act]
    E = router.shape[0]
    n = w1.shape[0] // E
    scores = F.linear(x, router).softmax(dim=-1)
    if k == 1:
        weights, experts = scores.max(dim=-1, keepdim=True)
    else:
        weights, experts = torch.topk(scores, k, dim=-1)
    if normalize:
        weights = weights / torch.norm(weights, p=normalize, dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    for e in range(E):
        tt, jj = torch.nonzero(experts == e, as_tuple=True)
        if tt.numel() == 0:
            continue
        rows = slice(e * n, (e + 1) * n)
        a = fn(F.linear(x[tt], w1[rows]))
        if v1 is not None:
            a = a * F.linear(x[tt], v1[rows])
        out = out.index_add(0, tt, weights[tt, jj][:, None] * (a @ w2[rows]))
    return out, experts, weights


# --------------------------------------------------------------------------- the block (GPU)


def _arguments(cfg: LayerConfig, impl: str, device):
    """megablocks Arguments for cfg; (args, forced): forced when 'sparse' passed MegaBlocks'
    refusal of Triton >= 3.2 (stk patched by build-megablocks.sh; the check decides)."""
    import torch.nn.functional as F
    from megablocks.layers.arguments import Arguments

    @dataclasses.dataclass
    class _Unchecked(Arguments):
        def __post_init__(self):
            impl, self.mlp_impl = self.mlp_impl, "unchecked"
            super().__post_init__()
            self.mlp_impl = impl

    def no_init(w):  # the weights are copied from ours
        return None

    kwargs = dict(
        hidden_size=cfg.hidden,
        ffn_hidden_size=cfg.ffn,
        moe_num_experts=cfg.experts,
        moe_top_k=cfg.top_k,
        moe_normalize_expert_weights=normalize_p(cfg),
        moe_loss_weight=0.0,  # else each step appends to a global list of losses
        bias=False,
        return_bias=False,
        activation_fn=F.gelu if cfg.activation == "gelu" else F.silu,
        mlp_type="glu" if cfg.gated else "mlp",
        mlp_impl=impl,
        memory_optimized_mlp=False,
        fp16=False,
        bf16=True,
        device=device,
        init_method=no_init,
        output_layer_init_method=no_init,
    )
    try:
        return Arguments(**kwargs), False
    except ValueError as e:
        if impl != "sparse" or "triton" not in str(e):
            raise
        return _Unchecked(**kwargs), True


class MegaBlocksBlock:
    """A megablocks dMoE with our weights in its layout."""

    def __init__(self, torch, cfg: LayerConfig, args: Dict[str, Any], impl: str):
        from megablocks.layers.dmoe import dMoE

        self.torch, self.cfg, self.impl = torch, cfg, impl
        margs, self.forced = _arguments(cfg, impl, args["x"].device)
        moe = dMoE(margs)
        w = to_megablocks(torch, args["w_router"], args["w_gate_up"], args["w_down"], cfg.gated)
        mlp = moe.experts.mlp
        with torch.no_grad():
            moe.router.layer.weight.copy_(w["router"])
            mlp.w1.copy_(w["w1"])
            mlp.w2.copy_(w["w2"])
            if cfg.gated:
                mlp.v1.copy_(w["v1"])
        moe.train()
        self.moe = moe

    def parameters(self):
        mlp = self.moe.experts.mlp
        ps = [self.moe.router.layer.weight, mlp.w1, mlp.w2]
        return ps + ([mlp.v1] if self.cfg.gated else [])

    def __call__(self, x):
        T, d = x.shape
        return self.moe(x.view(T, 1, d)).view(T, d)

    def check(self, x, d_out, args) -> Dict[str, Any]:
        """One forward + backward (Triton autotunes here) with MegaBlocks' routing recorded,
        then its output and gradients against the fp32 reference on `args` (our layout)."""
        import sonic

        torch = self.torch
        seen = {}

        def record(module, inputs, output):
            seen["experts"] = output[2].detach().clone()

        hook = self.moe.router.register_forward_hook(record)
        try:
            for p in self.parameters():
                p.grad = None
            x.grad = None
            out = self(x)
            out.backward(d_out)
        finally:
            hook.remove()
        if "experts" not in seen:
            raise RuntimeError("MegaBlocks' router did not run: its routing was not recorded")
        mlp = self.moe.experts.mlp
        got = {"out": out.detach(), "x": x.grad, "w_router": self.moe.router.layer.weight.grad.t()}
        grads = expert_slices(
            torch,
            self.cfg.experts,
            mlp.w1.grad,
            mlp.v1.grad if self.cfg.gated else None,
            mlp.w2.grad,
        )
        errors = sonic.reference_errors(
            torch, self.cfg, {**args, "x": x.detach()}, seen["experts"], d_out, got, grads
        )
        for p in self.parameters():
            p.grad = None
        x.grad = None
        return {**errors, "ok": sonic.verdict(errors), "routing": "MegaBlocks' own choice"}


def bench_megablocks(torch, cfg, args, device, timer, opts, impl: str) -> Dict[str, Any]:
    """MegaBlocks' step: the first, untimed, is the check; timed only when it passes."""
    from bench import measure_peer

    T, d = cfg.tokens, cfg.hidden
    block = MegaBlocksBlock(torch, cfg, args, impl)
    x = args["x"].detach().clone().requires_grad_(True)
    gen = torch.Generator(device=device)
    gen.manual_seed(opts.seed + 1)
    d_out = torch.randn((T, d), generator=gen, device=device).to(torch.bfloat16)
    res: Dict[str, Any] = {
        "implementation": f"megablocks dMoE mlp_impl={impl} mlp_type="
        + ("glu" if cfg.gated else "mlp"),
        "moe_normalize_expert_weights": normalize_p(cfg),
        "forced_past_triton_check": block.forced,
    }
    started = time.time()
    res["check"] = block.check(x, d_out, args)
    timer.sync()
    res["tune_and_check_s"] = time.time() - started
    if not res["check"]["ok"]:
        return res

    def clear():
        for w in block.parameters():
            w.grad = None
        x.grad = None

    measure_peer(torch, timer, opts, lambda: block(x), clear, d_out, res)
    block = x = d_out = None  # frees them; the closures above name them
    return res


# --------------------------------------------------------------------------- the run


def ours_peak(ours: Dict[str, Any]) -> Optional[int]:
    """Our step's peak: torch's, plus the runtime's larger workspace (its pool, which torch's
    allocator does not see)."""
    if ours.get("peak_bytes_torch") is None:
        return None
    ws = ours.get("workspace_bytes") or {}
    return ours["peak_bytes_torch"] + max([v or 0 for v in ws.values()] + [0])


def ratios(entry: Dict[str, Any], impl: str) -> None:
    """entry["ours_over_megablocks_<impl>"]: time, saved and peak, ours over MegaBlocks'."""
    ours, mb = entry.get("ours"), entry.get(f"megablocks_{impl}")
    if not ours or not mb or "median_ms" not in mb or "median_ms" not in ours:
        return
    r = {"time": ours["median_ms"] / mb["median_ms"]}
    if mb.get("saved_bytes_torch") and ours.get("saved_bytes_torch") is not None:
        r["saved"] = ours["saved_bytes_torch"] / mb["saved_bytes_torch"]
    if mb.get("saved_bytes_torch") and ours.get("saved_bytes_manifest") is not None:
        r["saved_manifest"] = ours["saved_bytes_manifest"] / mb["saved_bytes_torch"]
    peak = ours_peak(ours)
    if mb.get("peak_bytes_torch") and peak is not None:
        r["peak"] = peak / mb["peak_bytes_torch"]
    entry[f"ours_over_megablocks_{impl}"] = r


def select(opts) -> List[str]:
    if opts.configs:
        return [c for c in opts.configs.split(",") if c]
    tokens = [int(t) for t in opts.tokens.split(",") if t]
    return list(BENCH_CONFIGS) + list(grid(tokens))


def run_config(torch, name: str, opts, device, timer, entry: Dict[str, Any]) -> int:
    """One configuration into entry; returns the number of failures."""
    import bench
    from moe_mlir import torch_reference as TR

    path = os.path.join(opts.layers_dir, name)
    have = os.path.exists(path + (".json" if opts.emulate else ".so"))
    layer = None
    if have or os.path.exists(path + ".json"):
        layer = bench.open_layer(path, opts) if have else None
        if layer is not None:
            manifest = layer.layer
        else:
            with open(path + ".json", encoding="utf-8") as f:
                manifest = json.load(f)["layer"]
        cfg = TR.config_from_manifest(manifest)
    else:
        cfg = config_from_name(name)
        if cfg is None:
            entry["skipped"] = f"{path}.json missing and {name} is no grid name"
            log(f"SKIP {name}: {entry['skipped']}")
            return 0
    entry["config"] = dict(
        T=cfg.tokens,
        d=cfg.hidden,
        n=cfg.ffn,
        E=cfg.experts,
        k=cfg.top_k,
        activation=cfg.activation,
        scoring=cfg.scoring,
        renormalize=cfg.renormalize,
    )
    entry["useful_flops"] = bench.useful_flops(
        cfg.tokens, cfg.hidden, cfg.ffn, cfg.experts, cfg.top_k, cfg.shared_ffn, cfg.gated
    )
    failures = 0
    log(f"== {name}")
    gen = torch.Generator(device=device)
    gen.manual_seed(opts.seed)
    args = bench.make_args(torch, cfg, device, gen)
    if layer is not None:
        log("  ours: check, then forward + backward ...")
        try:
            ours = bench.bench_ours(torch, layer, cfg, args, device, timer, opts)
            ours["tflops"] = bench.tflops(entry["useful_flops"], ours["median_ms"])
            entry["ours"] = ours
            log(
                f"  ours: {ours['median_ms']:.2f} ms, {ours['tflops']:.0f} TFLOP/s; sample check "
                f"{'ok' if ours['check']['ok'] else 'FAILED'}"
            )
            failures += 0 if ours["check"]["ok"] else 1
        except Exception as e:  # noqa: BLE001 - MegaBlocks still runs
            entry["ours_error"] = f"{type(e).__name__}: {e}"
            log(f"  ours FAILED: {entry['ours_error']}")
            failures += 1
    else:
        entry["ours_skipped"] = ours_applies(cfg) or f"{path}.so missing"
        log(f"  ours: {entry['ours_skipped']}")
    layer = None
    gc.collect()
    if timer.cuda:
        torch.cuda.empty_cache()
        bench.trim_runtime_pool()
    for impl in opts.impl:
        key = f"megablocks_{impl}"
        why = applies(cfg, impl)
        if why:
            entry[key + "_skipped"] = why
            log(f"  MegaBlocks {impl}: skipped, {why}")
            continue
        log(f"  MegaBlocks {impl} (check first) ...")
        res = bench.time_peer(
            entry,
            key,
            f"MegaBlocks {impl}",
            lambda impl=impl: bench_megablocks(torch, cfg, args, device, timer, opts, impl),
        )
        chk = entry.get(key, {}).get("check")
        if chk:
            log(
                f"  MegaBlocks {impl} check "
                + ("ok" if chk["ok"] else "FAILED, not timed")
                + ": "
                + ", ".join(f"{k} {v:.2e}" for k, v in chk.items() if isinstance(v, float))
            )
            failures += 0 if chk["ok"] else 1
        if res:
            ratios(entry, impl)
            log(
                f"  MegaBlocks {impl}: {res['median_ms']:.2f} ms, {res['tflops']:.0f} TFLOP/s "
                f"(tuning and check {res['tune_and_check_s']:.0f} s)"
            )
        if key + "_error" in entry:
            failures += 1
        gc.collect()
        if timer.cuda:
            torch.cuda.empty_cache()
    return failures


def fmt(v: Optional[float], spec: str = ".2f") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def table(report: Dict[str, Any], impls) -> None:
    log("")
    log(
        "ratios are ours / MegaBlocks (time, saved bytes after forward, peak during the steps); "
        "< 1: ours faster or smaller"
    )
    width = max([len("config")] + [len(e["name"]) for e in report["configs"]])
    head = f"{'config':<{width}} {'ours ms':>8}"
    for impl in impls:
        head += f" {impl[:7] + ' ms':>10} {'time':>5} {'saved':>5} {'peak':>5}"
    log(head)
    log("-" * len(head))
    for e in report["configs"]:
        if "skipped" in e:
            log(f"{e['name']:<{width}} skipped: {e['skipped']}")
            continue
        row = f"{e['name']:<{width}} {fmt(e.get('ours', {}).get('median_ms')):>8}"
        for impl in impls:
            mb = e.get(f"megablocks_{impl}", {})
            r = e.get(f"ours_over_megablocks_{impl}", {})
            row += (
                f" {fmt(mb.get('median_ms')):>10} {fmt(r.get('time')):>5} "
                f"{fmt(r.get('saved')):>5} {fmt(r.get('peak')):>5}"
            )
        log(row)
    for e in report["configs"]:
        for key in ("ours_skipped", "ours_error"):
            if key in e and not e[key].endswith(".so missing"):
                log(f"{e['name']}: ours {e[key]}")
        for impl in impls:
            for suffix in ("_skipped", "_error"):
                if f"megablocks_{impl}{suffix}" in e:
                    log(f"{e['name']}: MegaBlocks {impl} {e[f'megablocks_{impl}{suffix}']}")
            mb = e.get(f"megablocks_{impl}", {})
            if mb.get("check") and not mb["check"]["ok"]:
                log(f"{e['name']}: MegaBlocks {impl} not timed, its check failed: {mb['check']}")


def label(name: str) -> str:
    """A grid name as docs/results.md writes it ("d 512, E 8, k 1, SiLU"), another as it is."""
    cfg = config_from_name(name)
    if cfg is None:
        return name
    act = {"silu": "SiLU", "swiglu": "SwiGLU"}[cfg.activation]
    return f"d {cfg.hidden}, E {cfg.experts}, k {cfg.top_k}, {act}"


def markdown(reports: List[Dict[str, Any]]) -> List[str]:
    """docs/results.md's table from the JSON reports of one or more runs (one an
    implementation, as scripts/gpu/session.sh runs them): each implementation's time with ours
    measured in its own process, each ratio ours / MegaBlocks, "grouped / sparse"."""
    impls: List[str] = []
    rows: Dict[str, Dict[str, Any]] = {}
    for report in reports:
        for impl in report["impls"]:
            if impl not in impls:
                impls.append(impl)
        for e in report["configs"]:
            rows.setdefault(e["name"], {"name": e["name"]}).update(
                {k: v for k, v in e.items() if k != "name"}
                | {f"ours_{impl}": e.get("ours") for impl in report["impls"]}
            )
    impls = [i for i in IMPLS if i in impls]
    both = " / ".join(impls)
    out = [
        f"| config | ours ms ({both} run) | {' | '.join(i + ' ms' for i in impls)} "
        f"| time ({both}) | saved activations ({both}) | peak ({both}) |",
        "|---" * (2 + len(impls) + 3) + "|",
    ]
    for name, e in rows.items():
        why = [
            e.get(f"megablocks_{i}_skipped") or e.get("skipped")
            for i in impls
            if f"megablocks_{i}" not in e
        ]
        if len(why) == len(impls) and why[0]:
            out.append(f"| {label(name)} | {why[0]} |" + " |" * (len(impls) + 3))
            continue
        ours = " / ".join(fmt((e.get(f"ours_{i}") or {}).get("median_ms")) for i in impls)
        cells = [label(name), ours]
        cells += [fmt(e.get(f"megablocks_{i}", {}).get("median_ms")) for i in impls]
        for key in ("time", "saved", "peak"):
            cells.append(
                " / ".join(fmt(e.get(f"ours_over_megablocks_{i}", {}).get(key)) for i in impls)
            )
        out.append("| " + " | ".join(cells) + " |")
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--layers-dir", default=os.path.join(ROOT, "gpu-inputs", "megablocks", "layers"))
    p.add_argument(
        "--configs",
        default="",
        help="comma-separated names (default: the four of docs/benchmarks.md and the grid)",
    )
    p.add_argument(
        "--tokens", default=",".join(map(str, GRID_TOKENS)), help="the grid's T (comma-separated)"
    )
    p.add_argument(
        "--impl",
        default=",".join(IMPLS),
        help="MegaBlocks' mlp_impl values to time, comma-separated (grouped, sparse)",
    )
    p.add_argument("--list", action="store_true", help="print the configurations and exit")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=7)
    p.add_argument("--budget", type=float, default=40.0)
    p.add_argument("--deadline", type=float, default=0.0)
    p.add_argument("--check-tokens", type=int, default=256)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/moe-megablocks-out"))
    p.add_argument("--json-name", default="megablocks.json")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    p.add_argument("--emulate", action="store_true", help="dry run on bench/emulate.py's stand-in")
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        help="print docs/results.md's table from the JSON files of earlier runs and exit",
    )
    opts = p.parse_args(argv)
    if opts.merge:
        reports = []
        for path in opts.merge:
            try:
                with open(path, encoding="utf-8") as f:
                    reports.append(json.load(f))
            except (OSError, ValueError) as e:
                p.error(f"--merge: cannot read {path}: {e}")
            if not isinstance(reports[-1], dict) or "configs" not in reports[-1]:
                p.error(f"--merge: {path} is not a megablocks_peer.py report")
        for line in markdown(reports):
            log(line)
        return 0
    opts.gaps = False
    opts.impl = [i for i in opts.impl.split(",") if i]
    bad = [i for i in opts.impl if i not in IMPLS]
    if bad:
        p.error(f"--impl: unknown {bad} (one of {IMPLS})")
    if opts.iters < 5:
        p.error("--iters must be at least 5 (docs/benchmarks.md: median of at least 5)")
    names = select(opts)
    if opts.list:
        for name in names:
            log(name)
        return 0

    from check_layer import import_torch

    import bench

    torch = import_torch(opts.device)
    if torch is None:
        return 2
    device = torch.device(opts.device)
    timer = bench.Timer(torch, device)
    report: Dict[str, Any] = {
        "device": torch.cuda.get_device_name() if timer.cuda else opts.device,
        "torch": torch.__version__,
        "emulated": opts.emulate,
        "impls": opts.impl,
        "configs": [],
    }
    try:
        import megablocks._version
        import triton

        report["megablocks"] = megablocks._version.__version__
        report["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001 - each configuration says so again
        report["megablocks"] = None
        log(f"note: megablocks unavailable ({type(e).__name__}: {e})")
    started = time.time()
    failures = 0
    for name in names:
        entry: Dict[str, Any] = {"name": name}
        report["configs"].append(entry)
        if opts.deadline and time.time() - started > opts.deadline:
            entry["skipped"] = f"deadline of {opts.deadline:.0f} s reached"
            log(f"SKIP {name}: {entry['skipped']}")
            continue
        try:
            failures += run_config(torch, name, opts, device, timer, entry)
        except Exception as e:  # noqa: BLE001 - the other configurations still run
            entry["error"] = f"{type(e).__name__}: {e}"
            log(f"  FAILED: {entry['error']}")
            log(traceback.format_exc())
            failures += 1
        text = json.dumps({k: v for k, v in entry.items() if k.endswith("error")})
        if "CUDA error" in text or "illegal memory" in text:
            log("  the CUDA context is unusable now; stopping")
            break
    os.makedirs(opts.out, exist_ok=True)
    path = os.path.join(opts.out, opts.json_name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, default=str)
    table(report, opts.impl)
    log(f"json: {path}")
    ran = sum(1 for e in report["configs"] if "skipped" not in e)
    log(f"{ran - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
