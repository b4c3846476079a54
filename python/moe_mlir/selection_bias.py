"""moe.update_selection_bias on CUDA tensors: the sm_90a host function
__moe_gpu_update_selection_bias (docs/gpu-path.md) compiled by moe-compile, run on torch's
current stream without a host copy (`moe_mlir.layer.update_selection_bias` calls it).

moe-compile compiles a function holding the op alone at a token bound, as it compiles a layer
(`build_gpu_selection_bias`), into the compile cache beside the layers; a machine without
moe-compile uses a prebuilt entry (MOE_MLIR_PREBUILT). The op has no gradient, so the module
handed to moe-compile is already a training pair: `@<name>_forward` (the op, nothing saved)
and an empty `@<name>_backward`, which moe-generate-backward leaves as they are.
"""

from __future__ import annotations

import struct
import threading
from typing import Dict, Optional, Tuple

import torch

__all__ = ["build_gpu_selection_bias", "gpu_bound", "gpu_update", "selection_bias_gpu_mlir"]

_KERNELS: Dict[Tuple[int, int, float, str, int], object] = {}
_LOCK = threading.Lock()


def selection_bias_gpu_mlir(E: int, k: int, rate: float, rule: str, name: str, bound: int) -> str:
    """`@<name>_forward(bias [E] f32, experts [?, k] i32) -> bias [E]` with one
    moe.update_selection_bias (rate as its f64 bits) and its empty `@<name>_backward`, both
    bounded to `bound` tokens (moe.max_tokens)."""
    bits = struct.unpack(">Q", struct.pack(">d", float(rate)))[0]
    bt, et = f"tensor<{E}xf32>", f"tensor<?x{k}xi32>"
    bound_attr = f"moe.max_tokens = {int(bound)} : i64"
    return (
        f"func.func @{name}_forward(%b: {bt}, %e: {et}) -> {bt}\n"
        f"    attributes {{{bound_attr}, moe.num_saved = 0 : i64}} {{\n"
        f"  %r = moe.update_selection_bias %b, %e {{rate = 0x{bits:016X} : f64, "
        f"rule = #moe.bias_update<{rule}>}}\n"
        f"      : {bt}, {et} -> {bt}\n"
        f"  return %r : {bt}\n}}\n"
        f"func.func @{name}_backward(%d: {bt})\n"
        f"    attributes {{{bound_attr}, moe.gradient_args = array<i64>}} {{\n"
        f"  return\n}}\n"
    )


def _gpu_config(E: int, k: int, rate: float, rule: str, bound: int):
    """The cache's key config: hidden 1, ffn 2 (no sm_90a layer has them, the aux-loss
    function has hidden = ffn = 1), the rate as its scaling factor and the rule as
    renormalize, so each (E, k, rate, rule, bound) has its own key and function name."""
    from .config import LayerConfig  # noqa: PLC0415

    return LayerConfig(
        bound, 1, 2, E, k, scaling_factor=float(rate), renormalize=rule == "proportional"
    )


def build_gpu_selection_bias(E: int, k: int, rate: float, rule: str, max_tokens: int):
    """The compile-cache entry (sm_90a) of moe.update_selection_bias for a bias [E] and
    experts [T, k] with T up to `max_tokens`: built with moe-compile when there is one, else
    the newest prebuilt (MOE_MLIR_PREBUILT). Raises NoCompilerError when neither exists,
    NotImplementedError past the GPU path's expert limit."""
    from . import compile_cache as cc  # noqa: PLC0415
    from .layer import _check_bias_update, gpu_contract  # noqa: PLC0415

    rate = _check_bias_update(rate, rule)
    limit = gpu_contract()["limits"]["max_experts"]["value"]
    if E > limit:
        raise NotImplementedError(
            f"the CUDA path's selection-bias update takes at most {limit} experts, got {E}"
        )
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    return cc.gpu_function_entry(
        _gpu_config(E, k, rate, rule, max_tokens),
        cc.BuildOptions(max_tokens=max_tokens),
        lambda name: selection_bias_gpu_mlir(E, k, rate, rule, name, max_tokens),
        f"selection-bias update (E={E}, k={k}, rate={rate!r}, {rule}, max_tokens={max_tokens}",
        "moe_mlir.selection_bias.build_gpu_selection_bias",
    )


def _kernel(E: int, k: int, rate: float, rule: str, bound: int, entry=None):
    key = (E, k, rate, rule, bound)
    with _LOCK:
        kernel = _KERNELS.get(key)
        if kernel is None:
            from . import compile_cache as cc  # noqa: PLC0415
            from . import gpu  # noqa: PLC0415

            if entry is None:
                entry = build_gpu_selection_bias(E, k, rate, rule, bound)
            so, manifest = cc.link_gpu_layer(entry)
            kernel = _KERNELS[key] = gpu.CompiledLayer(so, manifest)
    return kernel


def gpu_bound(tokens: int, bound: Optional[int] = None) -> int:
    """The token bound the function serving `tokens` tokens is compiled at: `bound` (a
    layer's max_tokens) when it covers them, else `tokens` rounded up to a power of two."""
    from . import compile_cache as cc  # noqa: PLC0415

    if bound is not None and bound >= tokens:
        return int(bound)
    return cc.default_bound(max(int(tokens), 1))


def gpu_update(
    bias: torch.Tensor, experts: torch.Tensor, rate: float, rule: str, bound: int, entry=None
):
    """The moved bias [E] (a new f32 tensor on the bias' CUDA device) of a checked bias [E]
    and experts [T, k] (T >= 1, T <= bound) by the compiled op, on torch's current stream."""
    from .layer import _aligned  # noqa: PLC0415

    kernel = _kernel(bias.shape[0], experts.shape[1], rate, rule, bound, entry)
    args = {
        "arg0": _aligned(bias.detach().contiguous()),
        "arg1": _aligned(experts.detach().to(torch.int32).contiguous()),
    }
    return kernel.forward(args)["result0"]
