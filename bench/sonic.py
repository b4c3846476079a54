"""SonicMoE (PyPI `sonic-moe`, CuTe-DSL kernels for Hopper) as a peer of bench/bench.py.

SonicMoE's layer (sonicmoe.MoE, its functional `moe_TC_softmax_topk_layer`):

- router: `logits = F.linear(x, router.weight)` ([E, d] weight), then either a softmax over the
  top-k logits (`is_softmax_over_topk=True`, its default: the same weights as a softmax over all
  E renormalised over the chosen k) or the top-k of a softmax over all E
  (`is_softmax_over_topk=False`), renormalised when `norm_topk_probs`;
- experts: `h = F.linear(x_t, c_fc.weight[e])` with c_fc.weight [E, 2n, d], gate and up rows
  interleaved (gate at even rows), `a = h[..., 1::2] * silu(h[..., 0::2])`,
  `y = F.linear(a, c_proj.weight[e])` with c_proj.weight [E, d, n]; out = sum of w * y.

Ours: w_router [d, E], w_gate_up [E, d, 2n] (gate columns first), w_down [E, n, d].
`to_sonic` and `from_sonic` convert between the two; `reference` is SonicMoE's semantics in
plain torch (its own torch backend's), which the CPU tests hold against our fp32 reference.

SonicMoE has no sigmoid router, selection bias, group-limited selection, scaling or shared
expert: `applies` says why a configuration (deepseek-v3) is skipped.

On the GPU, `SonicBlock` holds a `sonicmoe.MoE` with our weights in its layout and calls its
functional layer with the routing of the configuration; `check` runs one step (which also
JIT-compiles its kernels) and holds its output and every gradient against an fp32 reference
given SonicMoE's own routing (docs/benchmarks.md's tolerances), before any timing.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Tuple

# docs/benchmarks.md: relative Frobenius error against fp32, bf16 data
OUT_TOL = 1e-2
GRAD_TOL = 2e-2

# SonicMoE's own benchmark shapes (T, d, n, E, k): its README's and benchmarks/moe-cute.py's
# default (TC top-k routing, softmax over the top-k), and two of its tests' largest.
SHAPES = {
    "sonic-t32768-d4096-n1024-e128-k8": (32768, 4096, 1024, 128, 8),
    "sonic-t8192-d4096-n512-e256-k16": (8192, 4096, 512, 256, 16),
    "sonic-t8192-d1536-n256-e128-k8": (8192, 1536, 256, 128, 8),
}


def applies(cfg) -> Optional[str]:
    """None when SonicMoE computes this layer, else why not."""
    if cfg.activation != "swiglu":
        return f"SonicMoE's fused kernels run GLU activations; the layer's is {cfg.activation}"
    if (
        cfg.scoring != "softmax"
        or cfg.num_groups > 1
        or cfg.router_bias
        or cfg.has_shared
        or float(cfg.scaling_factor) != 1.0
    ):
        return (
            "SonicMoE's router is a softmax top-k: no sigmoid scores, selection bias, "
            "group-limited selection, scaling or shared expert"
        )
    return None


def routing_flags(cfg) -> Tuple[bool, bool]:
    """(is_softmax_over_topk, norm_topk_probs) of SonicMoE's layer that computes cfg's router:
    renormalised top-k of a softmax is a softmax over the top-k logits (SonicMoE's default);
    without renormalisation, the top-k of a softmax over all experts."""
    return (True, False) if cfg.renormalize else (False, False)


def to_sonic(torch, w_router, w_gate_up, w_down) -> Dict[str, Any]:
    """Our weights in SonicMoE's layout (new contiguous tensors): router [E, d], c_fc [E, 2n, d]
    with gate row i at 2i and up row i at 2i + 1, c_proj [E, d, n]."""
    E, d, two_n = w_gate_up.shape
    n = two_n // 2
    gate, up = w_gate_up[..., :n], w_gate_up[..., n:]
    c_fc = torch.stack([gate, up], dim=3).reshape(E, d, two_n).transpose(1, 2).contiguous()
    return {
        "router": w_router.t().contiguous(),
        "c_fc": c_fc,
        "c_proj": w_down.transpose(1, 2).contiguous(),
    }


def from_sonic(torch, router, c_fc, c_proj) -> Dict[str, Any]:
    """SonicMoE's layout (or its gradients) back in ours: w_router [d, E], w_gate_up [E, d, 2n]
    (gate columns first), w_down [E, n, d]."""
    t = c_fc.transpose(1, 2)  # [E, d, 2n], interleaved columns
    return {
        "w_router": router.t().contiguous(),
        "w_gate_up": torch.cat([t[..., 0::2], t[..., 1::2]], dim=-1).contiguous(),
        "w_down": c_proj.transpose(1, 2).contiguous(),
    }


def reference(
    torch, x, router, c_fc, c_proj, k: int, softmax_over_topk: bool, norm_topk_probs: bool
):
    """SonicMoE's layer in plain torch (the semantics of its torch backend, sonicmoe/moe.py),
    in the inputs' dtype: (out [T, d], experts [T, k], weights [T, k])."""
    import torch.nn.functional as F

    logits = F.linear(x, router)
    if softmax_over_topk:
        top, experts = logits.topk(k, dim=-1)
        weights = F.softmax(top.float(), dim=-1)
    else:
        weights, experts = F.softmax(logits.float(), dim=-1).topk(k, dim=-1)
        if norm_topk_probs:
            weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights.to(x.dtype)
    out = torch.zeros_like(x)
    for e in range(c_fc.shape[0]):
        tt, jj = torch.nonzero(experts == e, as_tuple=True)
        if tt.numel() == 0:
            continue
        h = F.linear(x[tt], c_fc[e])
        a = h[..., 1::2] * F.silu(h[..., 0::2])
        out = out.index_add(0, tt, weights[tt, jj][:, None] * F.linear(a, c_proj[e]))
    return out, experts, weights


# --------------------------------------------------------------------------- the check


def rel(torch, got, want) -> float:
    """‖got − want‖ / ‖want‖ in float64; NaN when got is not finite (NaN never passes)."""
    got = got.double()
    if not bool(torch.isfinite(got).all()):
        return float("nan")
    den = float(torch.linalg.vector_norm(want.double()))
    return float(torch.linalg.vector_norm(got - want.double())) / (den or 1.0)


def reference_errors(
    torch, cfg, args, experts, d_out, got: Dict[str, Any], expert_grads
) -> Dict[str, float]:
    """Relative errors of `got` (out [T, d], and the gradients x and w_router in our layout)
    and of `expert_grads(e)` (expert e's gradients of w_gate_up [d, 2n] and w_down [n, d], in
    our layout) against an fp32 reference of cfg's layer on `args` (our layout) given the
    routing `experts` [T, k], for the cotangent d_out. Expert by expert, each expert's weights
    cast to fp32 on the fly: no fp32 or converted copy of all the weights exists."""
    from moe_mlir import torch_reference as TR

    T, d = args["x"].shape
    x32 = args["x"].detach().float()
    x_leaf = x32.clone().requires_grad_(True)
    wr = args["w_router"].detach().float().requires_grad_(True)
    w, ex, _, _ = TR.router(cfg, x_leaf, wr, None, experts)
    w_const = w.detach()
    d_out32 = d_out.float()
    out = torch.zeros((T, d), device=x32.device)
    dx = torch.zeros_like(x32)
    dw = torch.zeros_like(w_const)
    sq = {"w_gate_up": [0.0, 0.0], "w_down": [0.0, 0.0]}  # ‖diff‖², ‖ref‖²
    finite = True
    for e in range(cfg.experts):
        tt, jj = torch.nonzero(ex == e, as_tuple=True)
        mine = dict(zip(("w_gate_up", "w_down"), (t.double() for t in expert_grads(e))))
        finite = finite and all(bool(torch.isfinite(t).all()) for t in mine.values())
        if tt.numel() == 0:
            for name, t in mine.items():
                sq[name][0] += float(t.square().sum())
            continue
        xe = x32[tt].requires_grad_(True)
        wgu = args["w_gate_up"][e].detach().float().requires_grad_(True)
        wd = args["w_down"][e].detach().float().requires_grad_(True)
        we = w_const[tt, jj].requires_grad_(True)
        oe = we[:, None] * (TR.activation(xe @ wgu, cfg.activation) @ wd)
        out.index_add_(0, tt, oe.detach())
        gx, ggu, gd, gw = torch.autograd.grad(oe, [xe, wgu, wd, we], d_out32[tt])
        dx.index_add_(0, tt, gx)
        dw[tt, jj] = gw
        for name, ref in (("w_gate_up", ggu), ("w_down", gd)):
            sq[name][0] += float((mine[name] - ref.double()).square().sum())
            sq[name][1] += float(ref.double().square().sum())
    gx_router, gwr = torch.autograd.grad(w, [x_leaf, wr], dw)
    dx += gx_router
    res = {
        "out": rel(torch, got["out"], out),
        "x": rel(torch, got["x"], dx),
        "w_router": rel(torch, got["w_router"], gwr),
    }
    for name, (diff, ref) in sq.items():
        res[name] = (diff**0.5) / ((ref**0.5) or 1.0) if finite else float("nan")
    return res


def verdict(errors: Dict[str, float]) -> bool:
    """docs/benchmarks.md's bar: out within 1e-2, every gradient within 2e-2, NaN fails."""
    return all(
        v <= (OUT_TOL if name == "out" else GRAD_TOL)  # NaN compares false
        for name, v in errors.items()
    )


# --------------------------------------------------------------------------- the block (GPU)


class _RoutingRecorder:
    """Stands in for sonicmoe.functional.TC_Softmax_Topk_Router_Function during the check and
    keeps the experts SonicMoE chose, for the reference to use the same routing."""

    def __init__(self, fn):
        self.fn = fn
        self.experts = None

    def apply(self, *a):
        scores, experts = self.fn.apply(*a)
        self.experts = experts.detach().clone()
        return scores, experts


class SonicBlock:
    """A sonicmoe.MoE with our weights in its layout, called through its functional layer with
    the configuration's routing (the module's forward always takes the softmax over the top-k,
    and adds a switch auxiliary loss that ours does not compute)."""

    def __init__(self, torch, cfg, args):
        import sonicmoe
        from sonicmoe.enums import ActivationType

        self.torch, self.cfg = torch, cfg
        self.activation = ActivationType.SWIGLU
        device = args["x"].device
        with torch.device("meta"):  # no init of weights overwritten below
            moe = sonicmoe.MoE(
                cfg.experts,
                cfg.top_k,
                cfg.hidden,
                cfg.ffn,
                ActivationType.SWIGLU,
                add_bias=False,
                std=0.02,
            )
        moe = moe.to_empty(device=device).to(torch.bfloat16)
        w = to_sonic(torch, args["w_router"], args["w_gate_up"], args["w_down"])
        with torch.no_grad():
            moe.router.weight.copy_(w["router"])
            moe.c_fc.weight.copy_(w["c_fc"])
            moe.c_proj.weight.copy_(w["c_proj"])
        moe.train()
        self.moe = moe
        self.stream_id = torch.cuda.current_stream().cuda_stream
        self.softmax_over_topk, self.norm_topk_probs = routing_flags(cfg)

    def parameters(self):
        return [self.moe.router.weight, self.moe.c_fc.weight, self.moe.c_proj.weight]

    def __call__(self, x):
        from sonicmoe.functional import moe_TC_softmax_topk_layer

        m = self.moe
        out, _, _ = moe_TC_softmax_topk_layer(
            x,
            m.router.weight,
            m.c_fc.weight.permute(1, 2, 0),
            None,
            m.c_proj.weight.permute(1, 2, 0),
            None,
            self.cfg.top_k,
            self.stream_id,
            self.activation,
            False,
            is_softmax_over_topk=self.softmax_over_topk,
            norm_topk_probs=self.norm_topk_probs,
        )
        return out

    def check(self, x, d_out, args) -> Dict[str, Any]:
        """One forward + backward (its first: the JIT compile happens here) with SonicMoE's
        routing recorded, then its output and gradients against the fp32 reference on `args`
        (bench.py's inputs, our layout, from which the block's weights were copied)."""
        torch = self.torch
        functional = sys.modules["sonicmoe.functional"]
        recorder = _RoutingRecorder(functional.TC_Softmax_Topk_Router_Function)
        functional.TC_Softmax_Topk_Router_Function = recorder
        try:
            for p in self.parameters():
                p.grad = None
            x.grad = None
            out = self(x)
            out.backward(d_out)
        finally:
            functional.TC_Softmax_Topk_Router_Function = recorder.fn
        if recorder.experts is None:
            raise RuntimeError("SonicMoE's router did not run: its routing was not recorded")
        m = self.moe
        n = self.cfg.ffn
        g_fc, g_proj = m.c_fc.weight.grad, m.c_proj.weight.grad

        def expert_grads(e):
            t = g_fc[e].t()  # [d, 2n], interleaved columns
            return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1), g_proj[e].t()

        got = {"out": out.detach(), "x": x.grad, "w_router": m.router.weight.grad.t()}
        assert g_fc.shape[1] == 2 * n
        # the reference reads our layout: the weights SonicMoE's were copied from
        errors = reference_errors(
            torch, self.cfg, {**args, "x": x.detach()}, recorder.experts, d_out, got, expert_grads
        )
        for p in self.parameters():
            p.grad = None
        x.grad = None
        return {**errors, "ok": verdict(errors), "routing": "SonicMoE's own choice"}
