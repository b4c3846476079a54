"""Hugging Face MoE blocks as moe-mlir layers (transformers 5; docs/python.md).

    from moe_mlir import hf
    names = hf.replace_moe_blocks(model)          # every supported block, in place
    layer = hf.from_hf_block(model.model.layers[0].mlp)

Supported blocks (transformers 5.x module classes):

| block | router | layer config |
|---|---|---|
| `MixtralSparseMoeBlock` | softmax, top-k, renormalised | `num_local_experts`, `num_experts_per_tok` |
| `Qwen3MoeSparseMoeBlock` | softmax, top-k, renormalised when `norm_topk_prob` | `num_experts`, `moe_intermediate_size` |
| `OlmoeSparseMoeBlock` | softmax, top-k, renormalised when `norm_topk_prob` (default no) | as Qwen3-MoE |
| `DeepseekV3MoE` | sigmoid + `e_score_correction_bias`, `n_group`/`topk_group`, `norm_topk_prob`, `routed_scaling_factor`; shared expert of width `moe_intermediate_size * n_shared_experts` | |

Experts must be SwiGLU (`hidden_act="silu"`). Weights:

- `weights="share"` (default): the new module holds the block's own `gate`, `experts` (and
  `shared_experts`) submodules, so the parameters, their names in `state_dict()`, and any
  optimizer already holding them stay the same. HF's shapes are transposed from the compiler's
  layout (`gate_up_proj` [E, 2n, d] against our [E, d, 2n]; `down_proj` [E, d, n] against
  [E, n, d]; the router [E, d] against [d, E]), so the block's experts and router weights are
  stored once, when the layer is made, in the compiler's layout: each keeps its HF shape and
  values as a transposed view (`gate_up_proj.stride()` is then `(2nd, 1, 2n)`). The layer reads
  them without a copy each step, and their gradients arrive in the same layout, uncopied.
  `save_pretrained` writes them contiguous, as always; code that needs HF's own strides calls
  `.contiguous()`. Activations are not copied.
- `weights="copy"`: a plain `MoELayer` whose parameters are copied once into the compiler's
  layout; no per-step weight copy, but `state_dict()` keys become `w_router`, `w_gate_up`, ...

What the swapped block does not do: record router logits for `output_router_logits=True` (the HF
router module's forward is not called; ask `layer(x, return_router_logits=True)`), Mixtral's
`router_jitter_noise` (refused when > 0).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from .config import LayerConfig
from .layer import MoELayer

__all__ = [
    "SUPPORTED_BLOCKS",
    "config_from_hf_block",
    "from_hf_block",
    "replace_moe_blocks",
    "HFMoELayer",
    "is_moe_block",
]

SUPPORTED_BLOCKS = (
    "MixtralSparseMoeBlock",
    "Qwen3MoeSparseMoeBlock",
    "OlmoeSparseMoeBlock",
    "DeepseekV3MoE",
)


def is_moe_block(module: nn.Module) -> bool:
    """A module that looks like a HF MoE block: it has a router `gate` and `experts`."""
    return (
        hasattr(module, "gate")
        and hasattr(module, "experts")
        and isinstance(module.experts, nn.Module)
    )


def _check_silu(block: nn.Module, what: str) -> None:
    act = getattr(block.experts, "act_fn", None)
    name = type(act).__name__
    if not (isinstance(act, nn.SiLU) or name in ("SiLUActivation", "SiLU")):
        raise NotImplementedError(
            f"{what}: experts use the activation {name}; moe_mlir builds SwiGLU experts from "
            f"HF blocks (hidden_act='silu')"
        )


def config_from_hf_block(block: nn.Module) -> LayerConfig:
    """The LayerConfig of a supported HF block (tokens=0: the token count comes at forward)."""
    kind = type(block).__name__
    if kind not in SUPPORTED_BLOCKS:
        raise NotImplementedError(
            f"{kind} is not a supported MoE block; supported: {', '.join(SUPPORTED_BLOCKS)}"
        )
    gate, experts = block.gate, block.experts
    _check_silu(block, kind)
    E, two_n, d = experts.gate_up_proj.shape
    if experts.down_proj.shape != (E, d, two_n // 2) or two_n % 2:
        raise ValueError(
            f"{kind}: gate_up_proj {tuple(experts.gate_up_proj.shape)} and "
            f"down_proj {tuple(experts.down_proj.shape)} are not [E, 2n, d] and "
            f"[E, d, n]"
        )
    if (
        getattr(experts, "has_bias", False)
        or getattr(experts, "gate_up_proj_bias", None) is not None
    ):
        raise NotImplementedError(f"{kind}: experts with biases are not supported")
    if getattr(experts, "is_transposed", False) or not getattr(experts, "is_concatenated", True):
        raise NotImplementedError(
            f"{kind}: transposed or interleaved expert weights are not supported"
        )
    n = two_n // 2
    top_k = int(getattr(gate, "top_k", getattr(block, "top_k", 0)))
    common = dict(
        tokens=0, hidden=int(d), ffn=int(n), experts=int(E), top_k=top_k, activation="swiglu"
    )
    if kind == "MixtralSparseMoeBlock":
        if float(getattr(block, "jitter_noise", 0.0) or 0.0) > 0.0:
            raise NotImplementedError(f"{kind}: router_jitter_noise > 0 is not supported")
        return LayerConfig(
            **common, scoring="softmax", renormalize=True, round_logits=True
        ).validate()
    if kind in ("Qwen3MoeSparseMoeBlock", "OlmoeSparseMoeBlock"):
        return LayerConfig(
            **common, scoring="softmax", renormalize=bool(gate.norm_topk_prob), round_logits=True
        ).validate()
    # DeepseekV3MoE
    shared = block.shared_experts
    if type(getattr(shared, "act_fn", None)).__name__ not in ("SiLUActivation", "SiLU"):
        raise NotImplementedError(f"{kind}: the shared expert's activation is not silu")
    m = shared.gate_proj.weight.shape[0]
    if shared.up_proj.weight.shape != (m, d) or shared.down_proj.weight.shape != (d, m):
        raise ValueError(f"{kind}: unexpected shared expert shapes")
    return LayerConfig(
        **common,
        scoring="sigmoid",
        renormalize=bool(gate.norm_topk_prob),
        num_groups=int(gate.num_group),
        topk_groups=int(gate.topk_group),
        scaling_factor=float(gate.routed_scaling_factor),
        router_bias=True,
        shared_ffn=int(m),
    ).validate()


class HFMoELayer(MoELayer):
    """A `MoELayer` over a HF block's own submodules (`weights="share"`): `gate`, `experts`
    and, for DeepSeek-V3, `shared_experts` keep their names, parameters and buffers."""

    def __init__(self, block: nn.Module, config: LayerConfig, **kwargs):
        super().__init__(config, _params=False, **kwargs)
        self.block_type = type(block).__name__
        self.gate = block.gate
        self.experts = block.experts
        # The compiler's layout in memory, HF's shape in the view: no copy of the weights,
        # nor of their gradients, each step.
        for p in (block.experts.gate_up_proj, block.experts.down_proj, block.gate.weight):
            _store_transposed(p)
        if config.has_shared:
            self.shared_experts = block.shared_experts
        self.top_k = config.top_k

    def extra_repr(self) -> str:
        return f"from={self.block_type}, " + super().extra_repr()

    def layer_weights(self) -> Dict[str, Optional[torch.Tensor]]:
        w = {
            "w_router": self.gate.weight.t(),
            "router_bias": None,
            "w_gate_up": self.experts.gate_up_proj.transpose(1, 2),
            "w_down": self.experts.down_proj.transpose(1, 2),
            "shared_gate_up": None,
            "shared_down": None,
        }
        if self.config.router_bias:
            w["router_bias"] = self.gate.e_score_correction_bias.float()
        if self.config.has_shared:
            s = self.shared_experts
            w["shared_gate_up"] = torch.cat([s.gate_proj.weight, s.up_proj.weight], 0).t()
            w["shared_down"] = s.down_proj.weight.t()
        return w


def _store_transposed(p: nn.Parameter) -> None:
    """Stores `p` (the last two dimensions swapped from the compiler's layout) so that its
    transpose is contiguous; its shape and values stay the same. Already so: nothing."""
    if p.dim() < 2 or p.transpose(-1, -2).is_contiguous():
        return
    with torch.no_grad():
        p.data = p.data.transpose(-1, -2).contiguous().transpose(-1, -2)


def from_hf_block(
    block: nn.Module,
    *,
    weights: str = "share",
    memory_budget: Optional[str] = None,
    policy: str = "auto",
    **layer_options,
) -> MoELayer:
    """A moe-mlir layer computing what `block` computes (see the module doc for the blocks and
    the two weight modes). Raises NotImplementedError for blocks or settings it cannot run.
    `layer_options` go to MoELayer; with `ep_group` (expert parallelism, docs/distributed.md)
    the weights are copied, this rank's experts alone."""
    config = config_from_hf_block(block)
    expert_parallel = layer_options.get("ep_group") is not None
    if weights == "share" and not expert_parallel:
        return HFMoELayer(
            block, config, memory_budget=memory_budget, policy=policy, **layer_options
        )
    if weights not in ("share", "copy"):
        raise ValueError(f"weights must be 'share' or 'copy', got {weights!r}")
    src = HFMoELayer(block, config)
    ref = block.experts.gate_up_proj
    layer = MoELayer(
        config,
        memory_budget=memory_budget,
        policy=policy,
        device=ref.device,
        dtype=ref.dtype,
        **layer_options,
    )
    local = config.experts // layer.ep_size
    with torch.no_grad():
        for name, value in src.layer_weights().items():
            if value is None:
                continue
            if name == "router_bias":
                layer.router_bias.copy_(value)
            elif name in ("w_gate_up", "w_down"):
                first = layer.ep_rank * local
                getattr(layer, name).copy_(value[first : first + local])
            else:
                getattr(layer, name).copy_(value)
    layer.train(block.training)
    return layer


def replace_moe_blocks(
    model: nn.Module,
    memory_budget: Optional[str] = None,
    *,
    weights: str = "share",
    policy: str = "auto",
    strict: bool = True,
    **layer_options,
) -> List[str]:
    """Swaps every supported MoE block of `model` (in place) for a moe-mlir layer; returns the
    qualified names swapped. A block that looks like an MoE block (`gate` and `experts`) but is
    not supported raises NotImplementedError naming it (with `strict=False` it is left as is).
    Raises ValueError when the model has no MoE block. `memory_budget` ("2GiB", bytes as an
    int): the activation plan of each layer (docs/memory.md), on CUDA and the CPU.
    `layer_options` go to each MoELayer: `ep_group=group, max_tokens=N` (and `ep_capacity`,
    `ep_overflow`, `ep_chunk_tokens`) make each layer expert-parallel, holding this rank's
    experts, on CUDA or the CPU as the model is (docs/distributed.md)."""
    found: List[Tuple[str, nn.Module]] = []
    unsupported: List[str] = []
    for name, module in model.named_modules():
        if type(module).__name__ in SUPPORTED_BLOCKS:
            found.append((name, module))
        elif is_moe_block(module) and not isinstance(module, MoELayer):
            unsupported.append(f"{name} ({type(module).__name__})")
    if unsupported and strict:
        raise NotImplementedError(
            f"unsupported MoE blocks: {', '.join(unsupported)}; supported: "
            f"{', '.join(SUPPORTED_BLOCKS)} (strict=False leaves them as they are)"
        )
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no supported MoE block ({', '.join(SUPPORTED_BLOCKS)})"
        )
    layers = [
        (
            name,
            from_hf_block(
                m, weights=weights, memory_budget=memory_budget, policy=policy, **layer_options
            ),
        )
        for name, m in found
    ]
    for (name, block), (_, layer) in zip(found, layers):
        layer.train(block.training)
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, layer)
    return [name for name, _ in found]
