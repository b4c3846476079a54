"""fp32 PyTorch reference of one MoE layer forward, differentiable with autograd.

The semantics are docs/cpu-path.md §2 (the NumPy reference, reference.py, implements the same):
router (softmax or sigmoid scores, selection bias, group-limited selection, top-k with its tie
rule, renormalisation, scaling), the dispatch (dropless, or with `capacity_factor` each expert
keeping its first `config.capacity` pairs in token order), the experts' FFN (SwiGLU; GELU, its tanh
form and SiLU too), the combine, and the shared expert added. It runs on whatever device its
inputs are on (the GPU checks use CUDA), always in float32.

Gradients: the expert choice is discrete; gradients flow through the scores of the chosen
experts, into x, w_router, w_gate_up, w_down, the expert biases b_gate_up and b_down (with
`expert_bias`) and the shared expert's weights (the selection bias gets none). `experts=` forces the routing decisions (docs/benchmarks.md: compare with the
same routing, so that a near-tie in bf16 does not flip a choice).

    ref = forward(config, {"x": x, "w_router": wr, "w_gate_up": wgu, "w_down": wd},
                  experts=ours_experts)
    ref.out, ref.logits, ref.experts, ref.weights

`forward_backward` also runs autograd for given cotangents and returns the gradients.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional

import torch
import torch.nn.functional as F

from .config import LayerConfig

__all__ = [
    "INPUT_ALIASES",
    "config_from_manifest",
    "canonical_inputs",
    "scores",
    "select_experts",
    "group_scores",
    "router",
    "activation",
    "ReferenceOutput",
    "forward",
    "forward_backward",
]

# Other names the layer's arguments go by (the manifest's "inputs", the brief's names).
INPUT_ALIASES = {
    "bias": "router_bias",
    "w_bias": "router_bias",
    "shared_w_gate_up": "shared_gate_up",
    "shared_w_down": "shared_down",
}


def config_from_manifest(layer: Mapping[str, Any]) -> LayerConfig:
    """The LayerConfig of a manifest's "layer" object (moe-compile's NAME.json)."""

    def get(key, default=None):
        if key in layer:
            return layer[key]
        if default is None:
            raise ValueError(f"manifest layer has no {key!r}")
        return default

    return LayerConfig(
        tokens=int(get("T")),
        hidden=int(get("d")),
        ffn=int(get("n")),
        experts=int(get("E")),
        top_k=int(get("k")),
        scoring=str(get("scoring", "softmax")),
        renormalize=bool(get("renormalize", False)),
        num_groups=int(get("num_groups", 1)),
        topk_groups=int(get("topk_groups", 1)),
        scaling_factor=float(get("scaling_factor", 1.0)),
        round_logits=bool(get("round_logits", False)),
        router_bias=bool(get("has_bias", False)),
        shared_ffn=int(get("shared_n", 0)),
        # A manifest without "expert_bias" (an older moe-compile's): the layer has expert
        # biases when its inputs name them.
        expert_bias=bool(layer.get("expert_bias", "b_gate_up" in (layer.get("inputs") or {}))),
        activation=str(get("activation", "swiglu")),
        dtype="bf16",
    ).validate()


def canonical_inputs(inputs: Mapping[str, Any]) -> Dict[str, Any]:
    """Renames aliases (bias, shared_w_gate_up, ...) to LayerConfig.arg_specs names."""
    out: Dict[str, Any] = {}
    for key, value in inputs.items():
        name = INPUT_ALIASES.get(key, key)
        if name in out:
            raise ValueError(f"{name} given twice (as {key!r} too)")
        out[name] = value
    return out


# --------------------------------------------------------------------------- router


def scores(logits: torch.Tensor, scoring: str) -> torch.Tensor:
    if scoring == "softmax":
        return torch.softmax(logits, dim=-1)
    if scoring == "sigmoid":
        return torch.sigmoid(logits)
    raise ValueError(f"scoring must be softmax or sigmoid, got {scoring!r}")


def _argbest(values: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Per row, the best candidate under docs/cpu-path.md's order: the first index of the
    maximum among non-NaN candidates; the first candidate when all are NaN."""
    width = values.shape[1]
    index = torch.arange(width, device=values.device).expand_as(values)
    valid = candidates & ~torch.isnan(values)
    masked = torch.where(valid, values, torch.full_like(values, float("-inf")))
    best = masked.max(dim=1, keepdim=True).values
    is_best = valid & (masked == best)
    first_best = torch.where(is_best, index, width).min(dim=1).values
    first_candidate = torch.where(candidates, index, width).min(dim=1).values
    return torch.where(valid.any(dim=1), first_best, first_candidate)


def group_scores(c: torch.Tensor, num_groups: int) -> torch.Tensor:
    """[T, G]: the sum of each group's two best selection scores (its best when E/G = 1)."""
    T, E = c.shape
    size = E // num_groups
    rows = torch.arange(T, device=c.device)
    out = []
    for g in range(num_groups):
        vals = c[:, g * size : (g + 1) * size]
        avail = torch.ones_like(vals, dtype=torch.bool)
        b1 = _argbest(vals, avail)
        score = vals[rows, b1]
        if size > 1:
            avail[rows, b1] = False
            score = score + vals[rows, _argbest(vals, avail)]
        out.append(score)
    return torch.stack(out, dim=1)


@torch.no_grad()
def select_experts(
    c: torch.Tensor, top_k: int, num_groups: int = 1, topk_groups: int = 1
) -> torch.Tensor:
    """[T, k] int64: k rounds of the best remaining candidate (group-limited when
    num_groups > 1); experts[t, j] is the j-th pick."""
    T, E = c.shape
    rows = torch.arange(T, device=c.device)
    candidates = torch.ones((T, E), dtype=torch.bool, device=c.device)
    if num_groups > 1:
        size = E // num_groups
        gs = group_scores(c, num_groups)
        gavail = torch.ones((T, num_groups), dtype=torch.bool, device=c.device)
        kept = torch.zeros_like(gavail)
        for _ in range(topk_groups):
            g = _argbest(gs, gavail)
            gavail[rows, g] = False
            kept[rows, g] = True
        candidates = kept.repeat_interleave(size, dim=1)
    picks = []
    for _ in range(top_k):
        e = _argbest(c, candidates)
        picks.append(e)
        candidates[rows, e] = False
    return (
        torch.stack(picks, dim=1)
        if picks
        else torch.zeros((T, 0), dtype=torch.long, device=c.device)
    )


def router(
    config: LayerConfig,
    x: torch.Tensor,
    w_router: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    experts: Optional[torch.Tensor] = None,
):
    """Returns (weights [T,k], experts [T,k] int64, logits [T,E], selection scores c)."""
    logits = x @ w_router
    if config.round_logits and config.dtype == "bf16":
        # the bf16 values a bf16 nn.Linear router holds; the gradient passes through
        logits = logits + (logits.to(torch.bfloat16).float() - logits).detach()
    s = scores(logits, config.scoring)
    c = s.detach() if bias is None else s.detach() + bias.detach().float()[None, :]
    if experts is None:
        experts = select_experts(c, config.top_k, config.num_groups, config.topk_groups)
    else:
        experts = experts.to(device=x.device, dtype=torch.long)
        if tuple(experts.shape) != (x.shape[0], config.top_k):
            raise ValueError(
                f"experts has shape {tuple(experts.shape)}, expected {(x.shape[0], config.top_k)}"
            )
        if experts.numel() and (int(experts.min()) < 0 or int(experts.max()) >= config.experts):
            raise ValueError(f"experts holds values outside [0, {config.experts})")
    u = s.gather(1, experts)
    w = u
    if config.renormalize:
        total = u.sum(dim=1, keepdim=True)
        w = torch.where(total != 0, u / torch.where(total != 0, total, torch.ones_like(total)), u)
    w = w * float(config.scaling_factor)
    return w, experts, logits, c


# --------------------------------------------------------------------------- experts


def activation(h: torch.Tensor, act: str) -> torch.Tensor:
    if act == "swiglu":
        n = h.shape[-1] // 2
        return F.silu(h[..., :n]) * h[..., n:]
    if act == "gelu":
        return F.gelu(h)  # exact (erf)
    if act == "silu":
        return F.silu(h)
    if act == "gelu_tanh":
        return F.gelu(h, approximate="tanh")
    raise ValueError(f"activation must be swiglu, gelu, silu or gelu_tanh, got {act!r}")


@dataclasses.dataclass
class ReferenceOutput:
    out: torch.Tensor  # [T, d] f32
    logits: torch.Tensor  # [T, E] f32
    experts: torch.Tensor  # [T, k] int64 (given or selected)
    weights: torch.Tensor  # [T, k] f32
    selection_scores: torch.Tensor  # [T, E] f32, s + bias (detached)
    inputs: Dict[str, torch.Tensor]  # the f32 leaves the gradients are taken for


def _leaf(t: Optional[torch.Tensor], grad: bool) -> Optional[torch.Tensor]:
    if t is None:
        return None
    f = t.detach().float().clone()
    return f.requires_grad_(grad)


def forward(
    config: LayerConfig,
    inputs: Mapping[str, torch.Tensor],
    *,
    experts: Optional[torch.Tensor] = None,
    requires_grad: bool = True,
) -> ReferenceOutput:
    """The layer forward in fp32 on f32 copies of `inputs` (names of LayerConfig.arg_specs or
    INPUT_ALIASES). `experts`: force the routing decisions ([T,k] integers)."""
    config.validate()
    named = canonical_inputs(inputs)
    for name, shape, _ in config.arg_specs():
        if name not in named or named[name] is None:
            raise ValueError(f"the layer needs {name} (shape {shape})")
        if tuple(named[name].shape) != tuple(shape):
            raise ValueError(f"{name} has shape {tuple(named[name].shape)}, expected {shape}")
    leaves = {
        name: _leaf(named[name], requires_grad and name != "router_bias")
        for name, _, _ in config.arg_specs()
    }
    x = leaves["x"]
    weights, experts, logits, c = router(
        config, x, leaves["w_router"], leaves.get("router_bias"), experts
    )
    wgu, wd = leaves["w_gate_up"], leaves["w_down"]
    T, d = x.shape
    out = torch.zeros((T, d), dtype=torch.float32, device=x.device)
    # config.tokens is the call's T: the capacity a dynamic layer computes from it.
    capacity = None if config.capacity_factor is None else config.capacity
    for e in range(config.experts):
        # Pairs in (t, j) order, as the dispatch visits them; a capacity drops the later ones.
        tt, jj = torch.nonzero(experts == e, as_tuple=True)
        if capacity is not None:
            tt, jj = tt[:capacity], jj[:capacity]
        if tt.numel() == 0:
            continue
        h = x[tt] @ wgu[e]
        if config.expert_bias:
            h = h + leaves["b_gate_up"][e]
        y = activation(h, config.activation) @ wd[e]
        if config.expert_bias:
            y = y + leaves["b_down"][e]
        out = out.index_add(0, tt, weights[tt, jj][:, None] * y)
    if config.has_shared:
        h = x @ leaves["shared_gate_up"]
        out = out + activation(h, config.activation) @ leaves["shared_down"]
    return ReferenceOutput(
        out=out, logits=logits, experts=experts, weights=weights, selection_scores=c, inputs=leaves
    )


def forward_backward(
    config: LayerConfig,
    inputs: Mapping[str, torch.Tensor],
    d_out: torch.Tensor,
    d_logits: Optional[torch.Tensor] = None,
    *,
    experts: Optional[torch.Tensor] = None,
):
    """forward, then autograd for the cotangents d_out [T,d] and d_logits [T,E] (None = 0).
    Returns (ReferenceOutput, {argument name: f32 gradient}); the router bias has none."""
    ref = forward(config, inputs, experts=experts, requires_grad=True)
    outputs = [ref.out]
    grads_out = [d_out.detach().float()]
    if d_logits is not None:
        outputs.append(ref.logits)
        grads_out.append(d_logits.detach().float())
    names = [n for n, t in ref.inputs.items() if t is not None and t.requires_grad]
    grads = torch.autograd.grad(
        outputs, [ref.inputs[n] for n in names], grads_out, allow_unused=True
    )
    result = {}
    for name, g in zip(names, grads):
        result[name] = g if g is not None else torch.zeros_like(ref.inputs[name])
    return ref, result
