"""Hugging Face MoE blocks as moe-mlir layers (transformers 5; docs/python.md).

    from moe_mlir import hf
    names = hf.replace_moe_blocks(model)          # every supported block, in place
    layer = hf.from_hf_block(model.model.layers[0].mlp)

Supported blocks (transformers 5.17 module classes; `SUPPORTED_BLOCKS`), each read against its
forward and tested against it (test/Python/test_hf_blocks.py):

| block | router | layer config |
|---|---|---|
| `MixtralSparseMoeBlock`, `MiniMaxSparseMoeBlock` | softmax, top-k, renormalised | `renormalize=True` |
| `GraniteMoeMoE`, `GraniteMoeHybridMoE`, `GraniteMoeSharedMoE`, `GraniteMoeSWAMoE` (`router`) | softmax of the top-k logits | `renormalize=True` |
| `Qwen3MoeSparseMoeBlock`, `OlmoeSparseMoeBlock`, `FlexOlmoSparseMoeBlock`, `MellumSparseMoeBlock`, `Qwen3VLMoeTextSparseMoeBlock`, `Qwen3OmniMoeThinkerTextSparseMoeBlock` | softmax, top-k, `norm_topk_prob` (Qwen3-VL: always) | `renormalize=norm_topk_prob` |
| `JambaSparseMoeBlock` (`router`) | softmax, top-k | `renormalize=False` |
| `HunYuanMoEV1Moe` (`gate.wg`, `shared_mlp`) | softmax, top-k, renormalised; shared expert | `shared_ffn` |
| `Cohere2MoeSparseMoeBlock` | softmax (renormalised) or sigmoid (`norm_topk_prob`) of the top-k logits; shared expert summed | `scoring=expert_selection_fn` |
| `Ernie4_5_MoeSparseMoeBlock` | softmax, selection bias `gate.moe_statics.e_score_correction_bias`, renormalised; shared expert | `router_bias` |
| `DeepseekV3MoE`, `DeepseekV32MoE`, `Dots1MoE`, `KimiLinearMoE`, `Glm4MoeMoE`, `Glm4MoeLiteMoE`, `Glm4vMoeTextMoE`, `GlmMoeDsaMoE`, `SolarOpenMoE`, `ExaoneMoeSparseMoEBlock`, `MiMoV2FlashMoE` (no shared expert), `AXK2MoE` (`n_group=None`) | sigmoid + `e_score_correction_bias`, `n_group`/`topk_group` (group score: sum of the two best), `norm_topk_prob`, `routed_scaling_factor`; shared expert | `scoring="sigmoid"`, `router_bias`, `num_groups`, `topk_groups`, `scaling_factor`, `shared_ffn` |
| `DeepseekV2Moe`, `DeepseekOcr2TextMoe` (`topk_method="greedy"`) | softmax, top-k, `routed_scaling_factor`; shared expert | `renormalize=False`, `scaling_factor` |
| `Mistral4MoE` (float32) | softmax, groups (sum of the two best), `norm_topk_prob`, scaling; shared expert | `num_groups`, `topk_groups` |
| `MiniMaxM2SparseMoeBlock` | sigmoid + the block's `e_score_correction_bias`, renormalised | `router_bias` |
| `Lfm2MoeSparseMoeBlock` (float32, `norm_topk_prob=False`) | sigmoid (+ `expert_bias` when `use_expert_bias`), top-k, `routed_scaling_factor` | `renormalize=False` |
| `LagunaSparseMoeBlock`, `AfmoeSparseMoeBlock`, `HYV3MoE` | sigmoid + selection bias, renormalised, scaled; shared expert | `router_bias`, `scaling_factor`, `shared_ffn` |

Refused with NotImplementedError naming what the layer lacks (`unsupported_features(block)`
lists it; `REFUSED_BLOCKS` has the reason of each refused class): a sigmoid gate on the shared
expert (Qwen2-MoE, Qwen3-Next, Qwen3.5-MoE, Qwen4-Exp, Qwen3-Omni talker), gpt-oss's clamped
SwiGLU (gpt-oss, OpenAI privacy filter, MiniMax-M3-VL; their expert biases alone are
`LayerConfig(expert_bias=True)`, which no other transformers block has), a top-1 sigmoid router scaling
the input (Llama 4), sparsemixer routing (PhiMoE), DBRX's w1/v1/w2 experts and p-norm weights,
clamped SwiGLU (`swiglu_limit`: DeepSeek-V4, GLM-5-Next, HY-V4, Step3p7; DeepSeek-V4's hash
routing too), an RMSNorm on the output (A.X-K1), A.X-K2's groups masked with 0, router-weighted
shared experts (Inkling), zero-compute experts (LongCat-Flash), relu2 experts in a latent space
(Nemotron-H), ZAYA's MLP router, capacity-limited token-order routing (NLLB-MoE, Switch),
Ernie-4.5-VL's block (returns its logits), Aria's and JetMoE's experts, Gemma 4's router; and
per instance: Mistral 4 and LFM2-MoE outside float32 (scores in the logits' dtype), DeepSeek-V2's
`group_limited_greedy`, Cohere2-MoE's averaged shared expert,
Laguna's logit softcapping, LFM2-MoE's renormalisation (1e-6 added to the sum), router jitter > 0, a router of another dtype than the experts,
non-SiLU experts (GELU-gated ones too, `gelu_pytorch_tanh` or `gelu_new`: the layer's gelu and
gelu_tanh experts are not gated). Another class with a router and `experts` is refused naming
its class.

Experts must be SwiGLU (`hidden_act="silu"`). Weights:

- `weights="share"` (default): the new module holds the block's own router (`gate` or
  `router`), `experts`, shared expert and selection bias under their names, so the parameters,
  their names in `state_dict()`, and any optimizer already holding them stay the same. HF's shapes are transposed from the compiler's
  layout (`gate_up_proj` [E, 2n, d] against our [E, d, 2n]; `down_proj` [E, d, n] against
  [E, n, d]; the router [E, d] against [d, E]), so the block's experts and router weights are
  stored once, when the layer is made, in the compiler's layout: each keeps its HF shape and
  values as a transposed view (`gate_up_proj.stride()` is then `(2nd, 1, 2n)`). The layer reads
  them without a copy each step, and their gradients arrive in the same layout, uncopied.
  `save_pretrained` writes them contiguous, as always; code that needs HF's own strides calls
  `.contiguous()`. Activations are not copied.
- `weights="copy"`: a plain `MoELayer` whose parameters are copied once into the compiler's
  layout; no per-step weight copy, but `state_dict()` keys become `w_router`, `w_gate_up`, ...

`router_logits_dtype="float32"` keeps the router logits in f32 for the blocks whose router, an
nn.Linear in the model's dtype, rounds them (`round_logits=False`; "auto", the default, rounds
them as the block does).

Router logits for `output_router_logits=True` (HF's auxiliary loss): the compiled layer routes
by itself, so the router module's forward is not called, but with `weights="share"` the layer
runs that module's forward hooks with its own logits (f32, differentiable into the router
weight) as the module's output: a tensor for an nn.Linear router, else the tuple
`(logits, None, None)` (Granite's order: `(None, None, logits)`). HF's OutputRecorder is such
a hook, so the model's `router_logits`, `aux_loss` and loss are the unswapped model's
(test/Python/test_hf_aux_loss.py). `weights="copy"` and expert-parallel layers hold no router
module and record nothing. `layer(x, return_aux_losses=True)` gives the compiler's own losses
(moe.aux_loss; docs/python.md).

What the swapped block does not do: router jitter (refused when > 0).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from typing import Dict, List, Optional, Tuple, Union

import torch
from torch import nn

from .config import LayerConfig
from .layer import MoELayer

__all__ = [
    "SUPPORTED_BLOCKS",
    "ROUTER_LOGITS_DTYPES",
    "REFUSED_BLOCKS",
    "config_from_hf_block",
    "from_hf_block",
    "replace_moe_blocks",
    "unsupported_features",
    "HFMoELayer",
    "is_moe_block",
]


@dataclasses.dataclass(frozen=True)
class _Spec:
    """How a block's router maps onto a LayerConfig. Strings are attribute paths in the block."""

    router: str = "gate"  # the module whose `weight` is the router [E, d]
    scoring: str = "softmax"  # or the path of the block's choice of the two
    renormalize: Union[bool, str] = True  # a flag, or the path of the block's flag
    bias: Optional[str] = None  # selection bias (added to the scores for the choice only)
    groups: bool = False  # group-limited: gate.num_group / gate.topk_group
    scaling: Optional[str] = None  # path of the routed weights' scaling factor
    shared: Optional[str] = None  # an ungated SwiGLU shared expert, added to the output
    # logits in the activations' type (a router GEMM in the model's dtype), not in f32
    round_logits: bool = True
    # the router scores the top-k logits: a softmax of them is the renormalised top-k of the
    # softmax, a sigmoid of them the top-k of the sigmoid
    scores_topk_logits: bool = False
    # the router selects on scores computed in the logits' dtype (bf16 rounding of the scores
    # makes ties that f32 scores do not have): only f32 blocks map
    scores_in_logits_dtype: bool = False


_MIXTRAL = _Spec()
_GRANITE = _Spec(router="router", scores_topk_logits=True)
_DEEPSEEK_V2 = _Spec(
    renormalize=False,
    scaling="gate.routed_scaling_factor",
    shared="shared_experts",
    round_logits=False,
)
_QWEN3 = _Spec(renormalize="gate.norm_topk_prob")
_DEEPSEEK_V3 = _Spec(
    scoring="sigmoid",
    renormalize="gate.norm_topk_prob",
    bias="gate.e_score_correction_bias",
    groups=True,
    scaling="gate.routed_scaling_factor",
    shared="shared_experts",
    round_logits=False,
)

# Block class -> its mapping. Each was read against its transformers 5.17 forward.
_SPECS: Dict[str, _Spec] = {
    # softmax, top-k, renormalised
    "MixtralSparseMoeBlock": _MIXTRAL,
    "MiniMaxSparseMoeBlock": _MIXTRAL,
    # softmax of the top-k logits = the renormalised top-k of the softmax
    "GraniteMoeMoE": _GRANITE,
    "GraniteMoeHybridMoE": _GRANITE,
    "GraniteMoeSharedMoE": _GRANITE,
    "GraniteMoeSWAMoE": _GRANITE,
    # softmax (renormalised) or sigmoid (renormalised when norm_topk_prob) of the top-k logits;
    # a shared expert summed (shared_expert_combination_strategy="sum")
    "Cohere2MoeSparseMoeBlock": _Spec(
        scoring="gate.expert_selection_fn",
        renormalize="gate.norm_topk_prob",
        shared="shared_experts",
        scores_topk_logits=True,
    ),
    # HunYuan-MoE: softmax, top-k, renormalised, shared expert `shared_mlp`
    "HunYuanMoEV1Moe": _Spec(router="gate.wg", shared="shared_mlp"),
    # softmax, top-k, renormalised when norm_topk_prob (always where the router has no flag)
    "Qwen3MoeSparseMoeBlock": _QWEN3,
    "OlmoeSparseMoeBlock": _QWEN3,
    "FlexOlmoSparseMoeBlock": _QWEN3,
    "MellumSparseMoeBlock": _QWEN3,
    "Qwen3VLMoeTextSparseMoeBlock": _QWEN3,
    "Qwen3OmniMoeThinkerTextSparseMoeBlock": _QWEN3,
    # softmax, top-k, not renormalised
    "JambaSparseMoeBlock": _Spec(router="router", renormalize=False),
    # DeepSeek-V3's router: sigmoid, selection bias, groups (sum of the two best), scaling
    "DeepseekV3MoE": _DEEPSEEK_V3,
    "DeepseekV32MoE": _DEEPSEEK_V3,
    "Dots1MoE": _DEEPSEEK_V3,
    "KimiLinearMoE": _DEEPSEEK_V3,
    "Glm4MoeMoE": _DEEPSEEK_V3,
    "Glm4MoeLiteMoE": _DEEPSEEK_V3,
    "Glm4vMoeTextMoE": _DEEPSEEK_V3,
    "GlmMoeDsaMoE": _DEEPSEEK_V3,
    "SolarOpenMoE": _DEEPSEEK_V3,
    "ExaoneMoeSparseMoEBlock": _DEEPSEEK_V3,
    "MiMoV2FlashMoE": dataclasses.replace(_DEEPSEEK_V3, shared=None),
    "AXK2MoE": _DEEPSEEK_V3,  # without groups (n_group=None): see unsupported_features
    # Ernie 4.5 MoE: softmax, the selection bias in moe_statics, renormalised (its norm_min
    # floor on the sum, 1e-12, is below any top-k sum of a softmax over < 1e12 experts)
    "Ernie4_5_MoeSparseMoeBlock": _Spec(
        bias="gate.moe_statics.e_score_correction_bias",
        shared="shared_experts",
        round_logits=False,
    ),
    # DeepSeek-V2: softmax, top-k (topk_method="greedy"), scaling, shared expert
    "DeepseekV2Moe": _DEEPSEEK_V2,
    "DeepseekOcr2TextMoe": _DEEPSEEK_V2,  # DeepSeek-V2's block, the same source
    # Mistral 4: DeepSeek-V3's groups over softmax scores, no selection bias
    "Mistral4MoE": _Spec(
        scores_in_logits_dtype=True,
        renormalize="gate.norm_topk_prob",
        groups=True,
        scaling="gate.routed_scaling_factor",
        shared="shared_experts",
    ),
    # sigmoid, selection bias, renormalised (no groups)
    "MiniMaxM2SparseMoeBlock": _Spec(scoring="sigmoid", bias="e_score_correction_bias"),
    # LFM2-MoE: sigmoid, optional selection bias `expert_bias`, scaled; its renormalisation adds
    # 1e-6 to the sum, so only norm_topk_prob=False maps (see unsupported_features)
    "Lfm2MoeSparseMoeBlock": _Spec(
        scores_in_logits_dtype=True,
        scoring="sigmoid",
        renormalize=False,
        bias="expert_bias",
        scaling="gate.routed_scaling_factor",
    ),
    "LagunaSparseMoeBlock": _Spec(
        scoring="sigmoid",
        bias="gate.e_score_correction_bias",
        scaling="routed_scaling_factor",
        shared="shared_experts",
    ),
    "AfmoeSparseMoeBlock": _Spec(
        router="router.gate",
        scoring="sigmoid",
        bias="expert_bias",
        scaling="router.route_scale",
        shared="shared_experts",
    ),
    "HYV3MoE": _Spec(
        scoring="sigmoid",
        bias="e_score_correction_bias",
        scaling="gate.router_scaling_factor",
        shared="shared_experts",
        round_logits=False,
    ),
}

SUPPORTED_BLOCKS = tuple(_SPECS)

_SHARED_GATE = "a sigmoid gate on the shared expert (shared_expert_gate)"
# The expert biases alone are LayerConfig(expert_bias=True); the activation is what is missing.
_GPT_OSS_EXPERTS = (
    "gpt-oss's clamped SwiGLU (gate * sigmoid(1.702 gate) * (up + 1), gate and up clamped at "
    "limit, their columns interleaved)"
)

# MoE blocks of transformers 5.17 that moe_mlir's layer cannot compute, and what it lacks.
REFUSED_BLOCKS: Dict[str, str] = {
    "Qwen2MoeSparseMoeBlock": _SHARED_GATE,
    "Qwen3NextSparseMoeBlock": _SHARED_GATE,
    "Qwen3_5MoeSparseMoeBlock": _SHARED_GATE,
    "Qwen4ExpTextSparseMoeBlock": _SHARED_GATE,
    "Qwen3OmniMoeTalkerTextSparseMoeBlock": _SHARED_GATE,
    "GptOssMLP": _GPT_OSS_EXPERTS + "; a bias on the router logits",
    "OpenAIPrivacyFilterMLP": _GPT_OSS_EXPERTS + "; a bias on the router logits",
    "MiniMaxM3VLSparseMoeBlock": "gpt-oss's clamped SwiGLU with alpha (swiglu_alpha, up + 1)",
    "Llama4TextMoe": "a top-1 sigmoid router scaling the input (Llama 4)",
    "PhimoeSparseMoeBlock": "sparsemixer routing (PhiMoE)",
    "DbrxFFN": "DBRX's expert layout (w1/v1/w2, [E*n, d] each) and its p-norm weight "
    "normalisation (moe_normalize_expert_weights)",
    "DeepseekV4SparseMoeBlock": "hash routing (tid2eid) and clamped SwiGLU (swiglu_limit)",
    "Glm5NextTextMoE": "clamped SwiGLU (swiglu_limit)",
    "HYV4MoE": "clamped SwiGLU (swiglu_limit)",
    "Step3p7SparseMoeBlock": "clamped SwiGLU (swiglu_limits) and Step3p7's shared expert",
    "AXK1MoE": "an RMSNorm on the block's output (post_mlp_layernorm)",
    "InklingMoE": "shared experts weighted by the router (shared_gammas)",
    "LongcatFlashMoE": "zero-compute (identity) experts (zero_expert_num)",
    "NemotronHMoE": "ungated relu2 experts (up_proj, down_proj) and latent projections "
    "around them (fc1_latent_proj, fc2_latent_proj)",
    "ZayaSparseMoeBlock": "an MLP router carrying state between layers (ZAYA)",
    "NllbMoeSparseMLP": "capacity-limited top-2 routing in token order (NLLB-MoE)",
    "SwitchTransformersSparseMLP": "capacity-limited top-1 routing in token order (Switch)",
    "Ernie4_5_VLMoeSparseMoeBlock": "a block returning its router logits beside the output "
    "(Ernie 4.5 VL)",
    "AriaTextMoELayer": "Aria's grouped-GEMM experts (fc1, fc2)",
    "JetMoeMoE": "JetMoE's parallel experts with a router bias",
    "Gemma4TextDecoderLayer": "Gemma 4's router (a norm and per-expert scales) and experts "
    "inside the decoder layer",
    "DiffusionGemmaEncoderTextLayer": "Gemma 4's router (a norm and per-expert scales) and "
    "experts inside the decoder layer",
    "DiffusionGemmaDecoderTextLayer": "Gemma 4's router (a norm and per-expert scales) and "
    "experts inside the decoder layer",
}


def is_moe_block(module: nn.Module) -> bool:
    """A HF MoE block: a class this module maps or refuses, or a module with `experts` and a
    router (`gate` or `router`)."""
    kind = type(module).__name__
    if kind in _SPECS or kind in REFUSED_BLOCKS:
        return True
    return isinstance(getattr(module, "experts", None), nn.Module) and (
        hasattr(module, "gate") or hasattr(module, "router")
    )


def _get(block: nn.Module, path: str, default=None):
    obj = block
    for part in path.split("."):
        if not hasattr(obj, part):
            return default
        obj = getattr(obj, part)
    return obj


def _is_silu(act) -> bool:
    return (
        isinstance(act, nn.SiLU)
        or type(act).__name__ in ("SiLUActivation", "SiLU")
        or (act is torch.nn.functional.silu)
    )


def _act_name(act) -> str:
    return getattr(act, "__name__", type(act).__name__)


# transformers' GELUs (ACT2FN "gelu", "gelu_pytorch_tanh", "gelu_new", "gelu_fast", ...)
_GELU_ACTS = (
    "GELU",
    "GELUActivation",
    "GELUTanh",
    "PytorchGELUTanh",
    "NewGELUActivation",
    "FastGELUActivation",
    "AccurateGELUActivation",
)


# down(act(gate(x)) * up(x)), whitespace removed, any argument name
_SWIGLU_FORWARD = re.compile(
    r"self\.down_proj\(self\.act_fn\(self\.gate_proj\((\w+)\)\)\*self\.up_proj\(\1\)\)"
)


def _plain_swiglu_mlp(mlp: nn.Module) -> List[str]:
    """What stops `mlp` from being our shared expert: down(silu(gate(x)) * up(x)), no biases."""
    for name in ("gate_proj", "up_proj", "down_proj"):
        if not isinstance(getattr(mlp, name, None), nn.Linear):
            return [f"a shared expert ({type(mlp).__name__}) without a {name} linear"]
    problems = []
    if any(getattr(mlp, n).bias is not None for n in ("gate_proj", "up_proj", "down_proj")):
        problems.append("a shared expert with biases")
    act = getattr(mlp, "act_fn", None)
    if not _is_silu(act):
        problems.append(f"a shared expert with the activation {_act_name(act)} (SwiGLU: silu)")
    try:
        body = re.sub(r"\s+", "", inspect.getsource(type(mlp).forward))
    except (OSError, TypeError):
        body = ""
    if not _SWIGLU_FORWARD.search(body):
        problems.append(f"a shared expert whose forward is not SwiGLU ({type(mlp).__name__})")
    return problems


def _expert_problems(experts: nn.Module) -> List[str]:
    problems = []
    gu, dp = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    if not isinstance(gu, torch.Tensor) or not isinstance(dp, torch.Tensor) or gu.dim() != 3:
        return [f"experts without fused gate_up_proj / down_proj ({type(experts).__name__})"]
    if (
        getattr(experts, "has_bias", False)
        or getattr(experts, "gate_up_proj_bias", None) is not None
    ):
        # LayerConfig(expert_bias=True) computes them; the swapped block does not carry them
        problems.append("experts with biases (a swapped HF block does not carry them)")
    if getattr(experts, "is_transposed", False) or not getattr(experts, "is_concatenated", True):
        problems.append("transposed or interleaved expert weights")
    act = getattr(experts, "act_fn", None)
    if not _is_silu(act):
        gelu = ""
        if type(act).__name__ in _GELU_ACTS or act is torch.nn.functional.gelu:
            # act(gate) * up: a GELU-gated FFN, which no moe activation is
            gelu = (
                "; the layer's gelu and gelu_tanh experts are not gated, these are act(gate) * up"
            )
        problems.append(
            f"experts with the activation {_act_name(act)} (moe_mlir builds SwiGLU experts from "
            f"HF blocks: hidden_act='silu'{gelu})"
        )
    for name in ("limit", "swiglu_limit"):
        limit = getattr(experts, name, None)
        if isinstance(limit, (int, float)) and math.isfinite(limit):
            problems.append(f"clamped SwiGLU ({name}={limit})")
    E, two_n, d = gu.shape
    if two_n % 2 or tuple(dp.shape) != (E, d, two_n // 2):
        problems.append(
            f"gate_up_proj {tuple(gu.shape)} and down_proj {tuple(dp.shape)} not [E, 2n, d] "
            f"and [E, d, n]"
        )
    return problems


def unsupported_features(block: nn.Module) -> List[str]:
    """What `block` (a HF MoE block) does that moe_mlir's layer does not; empty when the block
    maps onto a LayerConfig exactly (`from_hf_block` and `replace_moe_blocks` take it)."""
    kind = type(block).__name__
    spec = _SPECS.get(kind)
    if spec is None:
        if kind in REFUSED_BLOCKS:
            return [REFUSED_BLOCKS[kind]]
        found = []
        if hasattr(block, "shared_expert_gate"):
            found.append(_SHARED_GATE)
        experts = getattr(block, "experts", None)
        if isinstance(experts, nn.Module) and getattr(experts, "gate_up_proj", None) is not None:
            found += [p for p in _expert_problems(experts) if "activation" not in p]
        router = getattr(block, "gate", getattr(block, "router", None))
        if getattr(router, "bias", None) is not None:
            found.append("a bias on the router logits")
        return found or [f"{kind}'s routing (a block moe_mlir does not map)"]
    problems = _expert_problems(block.experts)
    router = _get(block, spec.router)
    weight = getattr(router, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        problems.append(f"a router without a [E, d] weight ({spec.router})")
    elif getattr(router, "bias", None) is not None:
        problems.append("a bias on the router logits")
    for holder in (block, router):
        jitter = getattr(holder, "jitter_noise", None) or getattr(holder, "router_jitter_noise", 0)
        if isinstance(jitter, (int, float)) and jitter > 0:
            problems.append(f"router jitter (router_jitter_noise={jitter})")
            break
    softcap = getattr(router, "router_logit_softcapping", 0.0) or 0.0
    if softcap > 0:
        problems.append(f"router logit softcapping (router_logit_softcapping={softcap})")
    method = getattr(router, "topk_method", None)
    if method not in (None, "greedy"):
        problems.append(
            f"topk_method={method!r} (group-limited selection by each group's best score; "
            f"moe_mlir's group score is the sum of the two best)"
        )
    if spec.shared is not None:
        shared = getattr(block, spec.shared, None)
        if shared is not None:
            problems += _plain_swiglu_mlp(shared)
    if hasattr(block, "shared_expert_gate"):
        problems.append(_SHARED_GATE)
    if spec.scores_in_logits_dtype and isinstance(weight, torch.Tensor):
        if weight.dtype != torch.float32:
            problems.append(
                f"routing on scores computed in {weight.dtype} (the block's softmax or sigmoid "
                f"runs in the logits' dtype; moe_mlir's in f32): only float32 blocks map"
            )
    if kind == "Lfm2MoeSparseMoeBlock" and getattr(router, "norm_topk_prob", False):
        problems.append(
            "a renormalisation adding 1e-6 to the sum (LFM2-MoE's norm_topk_prob; moe_mlir "
            "divides by the sum itself)"
        )
    if kind == "AXK2MoE" and (getattr(router, "num_group", None) or 1) > 1:
        problems.append(
            "group-limited selection that fills dropped groups with 0, not -inf (a dropped "
            "expert can win when biased scores are negative; n_group=None maps)"
        )
    strategy = getattr(block, "shared_expert_combination_strategy", "sum")
    if strategy != "sum" and getattr(block, spec.shared or "", None) is not None:
        problems.append(f"a shared expert averaged with the routed output ({strategy!r})")
    scoring = _scoring(block, spec)
    if scoring not in ("softmax", "sigmoid"):
        problems.append(f"the scoring function {scoring!r}")
    if isinstance(weight, torch.Tensor) and weight.dtype != block.experts.gate_up_proj.dtype:
        problems.append(
            f"a {weight.dtype} router beside {block.experts.gate_up_proj.dtype} experts (the "
            f"layer takes one dtype; cast the block to one)"
        )
    return problems


def _scoring(block: nn.Module, spec: _Spec) -> str:
    if spec.scoring in ("softmax", "sigmoid"):
        return spec.scoring
    return str(_get(block, spec.scoring, spec.scoring))


def _renormalize(block: nn.Module, spec: _Spec) -> bool:
    if spec.scores_topk_logits and _scoring(block, spec) == "softmax":
        return True
    if isinstance(spec.renormalize, bool):
        return spec.renormalize
    return bool(_get(block, spec.renormalize, True))


ROUTER_LOGITS_DTYPES = ("auto", "float32")


def _check_router_logits_dtype(router_logits_dtype) -> str:
    """`router_logits_dtype` as "auto" or "float32" (from torch.float32 too); ValueError for
    anything else."""
    if router_logits_dtype is torch.float32:
        return "float32"
    if not isinstance(router_logits_dtype, str) or router_logits_dtype not in ROUTER_LOGITS_DTYPES:
        raise ValueError(
            f"router_logits_dtype must be one of {ROUTER_LOGITS_DTYPES} (or torch.float32), "
            f"got {router_logits_dtype!r}"
        )
    return router_logits_dtype


def _round_logits(spec: _Spec, router_logits_dtype) -> bool:
    """round_logits for `router_logits_dtype`: "auto" as the block computes its logits (rounded
    to the model's dtype where its router is an nn.Linear in that dtype), "float32" kept in
    f32."""
    return spec.round_logits and _check_router_logits_dtype(router_logits_dtype) == "auto"


def config_from_hf_block(block: nn.Module, *, router_logits_dtype="auto") -> LayerConfig:
    """The LayerConfig of a supported HF block (tokens=0: the token count comes at forward).
    `router_logits_dtype="float32"` keeps the router logits in f32 where the block rounds them
    to the model's dtype (`round_logits=False`; "auto": as the block). Raises
    NotImplementedError naming what the block does that the layer does not, ValueError for a
    bad `router_logits_dtype`."""
    kind = type(block).__name__
    problems = unsupported_features(block)
    if problems:
        hint = "" if kind in _SPECS else f"; supported: {', '.join(SUPPORTED_BLOCKS)}"
        raise NotImplementedError(f"{kind}: not supported: {'; '.join(problems)}{hint}")
    spec = _SPECS[kind]
    round_logits = _round_logits(spec, router_logits_dtype)
    router = _get(block, spec.router)
    E, two_n, d = block.experts.gate_up_proj.shape
    owner = _get(block, spec.router.split(".")[0])  # Afmoe: router.top_k, router.gate
    top_k = int(getattr(router, "top_k", getattr(owner, "top_k", getattr(block, "top_k", 0))))
    groups = (1, 1)
    if spec.groups and (getattr(router, "num_group", None) or 1) > 1:
        groups = (int(router.num_group), int(router.topk_group))
    shared = getattr(block, spec.shared, None) if spec.shared else None
    scaling = float(_get(block, spec.scaling, 1.0)) if spec.scaling else 1.0
    return LayerConfig(
        tokens=0,
        hidden=int(d),
        ffn=int(two_n // 2),
        experts=int(E),
        top_k=top_k,
        activation="swiglu",
        scoring=_scoring(block, spec),
        renormalize=_renormalize(block, spec),
        num_groups=groups[0],
        topk_groups=groups[1],
        scaling_factor=scaling,
        router_bias=spec.bias is not None and _get(block, spec.bias) is not None,
        shared_ffn=0 if shared is None else int(shared.gate_proj.weight.shape[0]),
        round_logits=round_logits,
    ).validate()


class HFMoELayer(MoELayer):
    """A `MoELayer` over a HF block's own submodules and buffers (`weights="share"`): its
    router, `experts`, shared expert and selection bias keep their names, parameters and
    buffers."""

    def __init__(self, block: nn.Module, config: LayerConfig, **kwargs):
        super().__init__(config, _params=False, **kwargs)
        self.block_type = type(block).__name__
        self._spec = _SPECS[self.block_type]
        # The block's direct children and tensors that hold what the layer reads, under the
        # same names (state_dict and optimizers see the same parameters).
        tops = {self._spec.router.split(".")[0], "experts"}
        if config.has_shared:
            tops.add(self._spec.shared)
        if config.router_bias:
            tops.add(self._spec.bias.split(".")[0])
        for name in sorted(tops):
            value = getattr(block, name)
            if isinstance(value, nn.Module):
                setattr(self, name, value)
            elif isinstance(value, nn.Parameter):
                self.register_parameter(name, value)
            else:
                persistent = name not in block._non_persistent_buffers_set
                self.register_buffer(name, value, persistent=persistent)
        # The compiler's layout in memory, HF's shape in the view: no copy of the weights,
        # nor of their gradients, each step.
        for p in (self.experts.gate_up_proj, self.experts.down_proj, self._router().weight):
            _store_transposed(p)
        self.top_k = config.top_k

    def _router(self) -> nn.Module:
        return _get(self, self._spec.router)

    def forward(self, hidden_states: torch.Tensor, return_router_logits: bool = False, **kw):
        """MoELayer.forward; the router logits also reach the forward hooks of the block's
        router module (HF's OutputRecorder for `output_router_logits=True`)."""
        recorder = getattr(self, self._spec.router.split(".")[0])
        if not (recorder._forward_hooks or recorder._forward_hooks_with_kwargs):
            return super().forward(hidden_states, return_router_logits, **kw)
        result = super().forward(hidden_states, True, **kw)
        logits = result[1]
        _run_forward_hooks(recorder, hidden_states.reshape(-1, self.config.hidden), logits)
        if return_router_logits:
            return result
        rest = result[2:]
        return (result[0], *rest) if rest else result[0]

    def extra_repr(self) -> str:
        return f"from={self.block_type}, " + super().extra_repr()

    def layer_weights(self) -> Dict[str, Optional[torch.Tensor]]:
        w = {
            "w_router": self._router().weight.t(),
            "router_bias": None,
            "w_gate_up": self.experts.gate_up_proj.transpose(1, 2),
            "w_down": self.experts.down_proj.transpose(1, 2),
            "shared_gate_up": None,
            "shared_down": None,
        }
        if self.config.router_bias:
            w["router_bias"] = _get(self, self._spec.bias).detach().float().reshape(-1)
        if self.config.has_shared:
            s = getattr(self, self._spec.shared)
            w["shared_gate_up"] = torch.cat([s.gate_proj.weight, s.up_proj.weight], 0).t()
            w["shared_down"] = s.down_proj.weight.t()
        return w


# Where the router module's forward returns its logits: a tensor (an nn.Linear router), or a
# tuple with the logits at this index (the others None here: the layer routes by itself).
_LOGITS_INDEX = {"GraniteMoe": 2}  # (top_k_index, top_k_weights, router_logits)


def _router_output(module: nn.Module, logits: torch.Tensor):
    if isinstance(module, nn.Linear):
        return logits
    kind = type(module).__name__
    index = next((i for p, i in _LOGITS_INDEX.items() if kind.startswith(p)), 0)
    out = [None, None, None]
    out[index] = logits
    return tuple(out)


def _run_forward_hooks(module: nn.Module, x: torch.Tensor, logits: torch.Tensor) -> None:
    """Runs `module`'s forward hooks as if it had returned the layer's logits for input x
    (its forward is not called: the compiled layer routes). What a hook returns is not used."""
    output = _router_output(module, logits)
    for hook_id, hook in list(module._forward_hooks.items()):
        if hook_id in module._forward_hooks_with_kwargs:
            hook(module, (x,), {}, output)
        else:
            hook(module, (x,), output)


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
    router_logits_dtype="auto",
    **layer_options,
) -> MoELayer:
    """A moe-mlir layer computing what `block` computes (see the module doc for the blocks and
    the two weight modes). Raises NotImplementedError for blocks or settings it cannot run.
    `router_logits_dtype="float32"`: the router logits stay f32 where the block rounds them to
    the model's dtype ("auto", the default: as the block; see `config_from_hf_block`).
    `layer_options` go to MoELayer; with `ep_group` (expert parallelism, docs/distributed.md)
    the weights are copied, this rank's experts alone."""
    config = config_from_hf_block(block, router_logits_dtype=router_logits_dtype)
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
    router_logits_dtype="auto",
    **layer_options,
) -> List[str]:
    """Swaps every supported MoE block of `model` (in place) for a moe-mlir layer; returns the
    qualified names swapped. A block that looks like an MoE block (`gate` and `experts`) but is
    not supported raises NotImplementedError naming it (with `strict=False` it is left as is).
    Raises ValueError when the model has no MoE block. `memory_budget` ("2GiB", bytes as an
    int): the activation plan of each layer (docs/memory.md), on CUDA and the CPU.
    `router_logits_dtype="float32"` keeps every layer's router logits in f32 (see
    `config_from_hf_block`; "auto", the default, rounds them as each block does).
    `layer_options` go to each MoELayer: `ep_group=group, max_tokens=N` (and `ep_capacity`,
    `ep_overflow`, `ep_chunk_tokens`) make each layer expert-parallel, holding this rank's
    experts, on CUDA or the CPU as the model is (docs/distributed.md)."""
    router_logits_dtype = _check_router_logits_dtype(router_logits_dtype)
    found: List[Tuple[str, nn.Module]] = []
    unsupported: List[str] = []
    for name, module in model.named_modules():
        kind = type(module).__name__
        if isinstance(module, MoELayer) or not (kind in _SPECS or is_moe_block(module)):
            continue
        problems = unsupported_features(module)
        if problems:
            unsupported.append(f"{name} ({kind}: {'; '.join(problems)})")
        else:
            found.append((name, module))
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
                m,
                weights=weights,
                memory_budget=memory_budget,
                policy=policy,
                router_logits_dtype=router_logits_dtype,
                **layer_options,
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
