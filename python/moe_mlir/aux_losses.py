"""The auxiliary losses of a router: moe.aux_loss and moe.aux_loss_grad (docs/dialect.md) as
differentiable torch ops (docs/python.md).

    from moe_mlir.aux_losses import aux_losses

    lb, z = aux_losses(logits, experts, scoring="softmax")   # logits [T, E] f32, experts [T, k]
    (a * lb + b * z).backward()                              # d_logits by moe.aux_loss_grad

`load_balance = E * sum_e f_e P_e` (f_e: the fraction of the T * k selections that went to
expert e; P_e: the mean over tokens of the softmax, or of the sigmoids normalised per token)
and `z_loss = mean_t logsumexp(logits[t])^2`, 0-d f32 tensors on the logits' device.

CPU tensors run the CPU path's kernels, compiled once per (E, k, scoring) from a module holding
the two ops (`mlir_text.aux_loss_mlir`, moe-opt and clang). CUDA tensors run the sm_90a host
functions __moe_gpu_aux_loss and __moe_gpu_aux_loss_grad (docs/gpu-path.md) on torch's current
stream, without a host copy: moe-compile compiles the function of moe.aux_loss alone (its
backward, moe.aux_loss_grad, derived by moe-generate-backward) at a token bound, as it compiles
a layer, cached in the compile cache beside the layers (`build_gpu_aux`; a machine without
moe-compile uses a prebuilt entry). `MoELayer(x, return_aux_losses=True)` applies them to the
layer's router logits and choices.
"""

from __future__ import annotations

import threading
from typing import Dict, List, Tuple

import numpy as np
import torch

from .config import SCORINGS

__all__ = ["aux_losses", "build_gpu_aux"]

_MODULES: Dict[Tuple[int, int, str], object] = {}
_LOCK = threading.Lock()


def _compiled(experts: int, top_k: int, scoring: str):
    """The compiled module of @aux_loss and @aux_loss_grad for (E, k, scoring)."""
    key = (experts, top_k, scoring)
    with _LOCK:
        module = _MODULES.get(key)
        if module is None:
            from . import cpu  # noqa: PLC0415
            from .mlir_text import aux_loss_mlir  # noqa: PLC0415

            module = _MODULES[key] = cpu.compile_mlir(aux_loss_mlir(experts, top_k, scoring))
    return module


# Cached beside the layers, keyed by a config of hidden = ffn = 1 (no sm_90a layer has one:
# its sizes are multiples of 64) with the aux function's E, k, scoring and bound.
_GPU_KERNELS: Dict[Tuple[int, int, str, int], object] = {}


def _gpu_config(experts: int, top_k: int, scoring: str, bound: int):
    from .config import LayerConfig  # noqa: PLC0415

    return LayerConfig(bound, 1, 1, experts, top_k, scoring=scoring)


def build_gpu_aux(experts: int, top_k: int, scoring: str, max_tokens: int):
    """The compile-cache entry (sm_90a) of the aux-loss function of (E, k, scoring) for T up to
    `max_tokens`: built with moe-compile when there is one (the LLVM machine prebuilds the
    GPU machine's entries so), else the newest prebuilt (MOE_MLIR_PREBUILT). Raises
    NoCompilerError when neither exists, NotImplementedError past the GPU path's expert
    limit."""
    from . import compile_cache as cc  # noqa: PLC0415
    from .layer import gpu_contract  # noqa: PLC0415
    from .mlir_text import aux_loss_mlir  # noqa: PLC0415

    limit = gpu_contract()["limits"]["max_experts"]["value"]
    if experts > limit:
        raise NotImplementedError(
            f"the CUDA path's auxiliary losses take at most {limit} experts, got {experts}"
        )
    return cc.gpu_function_entry(
        _gpu_config(experts, top_k, scoring, max_tokens),
        cc.BuildOptions(max_tokens=max_tokens),
        lambda name: aux_loss_mlir(experts, top_k, scoring, name, max_tokens, grad=False),
        f"aux-loss function (E={experts}, k={top_k}, {scoring}, max_tokens={max_tokens}",
        "MoELayer.compile_for(T, 'cuda') or moe_mlir.aux_losses.build_gpu_aux",
    )


def _gpu_kernel(experts: int, top_k: int, scoring: str, tokens: int, bound: int):
    """The loaded sm_90a aux-loss function serving `tokens` tokens: compiled at `bound` (a
    layer's: the aux losses of its calls share its bound), or at the next power of two when
    `bound` is 0 or below `tokens`."""
    from . import compile_cache as cc  # noqa: PLC0415

    if bound < tokens:
        bound = cc.default_bound(max(int(tokens), 1))
    key = (experts, top_k, scoring, bound)
    with _LOCK:
        kernel = _GPU_KERNELS.get(key)
        if kernel is None:
            from . import gpu  # noqa: PLC0415

            so, manifest = cc.link_gpu_layer(build_gpu_aux(experts, top_k, scoring, bound))
            kernel = _GPU_KERNELS[key] = gpu.CompiledLayer(so, manifest)
    return kernel


def _device_args(logits: torch.Tensor, experts: torch.Tensor) -> Dict[str, torch.Tensor]:
    from .layer import _aligned  # noqa: PLC0415

    return {
        "arg0": _aligned(logits.detach().contiguous()),
        "arg1": _aligned(experts.detach().to(torch.int32).contiguous()),
    }


def _host(t: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    return t.detach().to("cpu", dtype).contiguous().numpy()


def _layer_bound(spec_key: str, logits: torch.Tensor, bound: int) -> int:
    """The token bound of the layer `spec_key` serving these logits (its aux losses compile at
    the layer's bound), else `bound`. Looked up here, inside the ops, where torch.compile does
    not trace: the layer's kernel table is behind a lock, which Dynamo cannot enter."""
    if not spec_key:
        return bound
    from .layer import kernel_for  # noqa: PLC0415

    return kernel_for(spec_key, logits.shape[0], logits.device).bound


@torch.library.custom_op("moe_mlir::aux_loss", mutates_args=())
def aux_loss_op(
    logits: torch.Tensor, experts: torch.Tensor, scoring: str, bound: int, spec_key: str
) -> List[torch.Tensor]:
    """[load_balance, z_loss] (0-d f32, on the logits' device) of moe.aux_loss. On CUDA the
    function compiled at `bound`, or at the bound of the layer `spec_key` when one is named."""
    if logits.device.type == "cuda":
        if logits.shape[0] == 0:
            return [logits.new_zeros(()), logits.new_zeros(())]
        bound = _layer_bound(spec_key, logits, bound)
        kernel = _gpu_kernel(logits.shape[1], experts.shape[1], scoring, logits.shape[0], bound)
        res = kernel.forward(_device_args(logits, experts))
        return [res["result0"], res["result1"]]
    module = _compiled(logits.shape[1], experts.shape[1], scoring)
    lb, z = module["aux_loss"](_host(logits, torch.float32), _host(experts, torch.int32))
    return [torch.from_numpy(np.array(v)).to(logits.device) for v in (lb, z)]


@aux_loss_op.register_fake
def _aux_loss_fake(logits, experts, scoring, bound, spec_key):
    return [logits.new_empty((), dtype=torch.float32) for _ in range(2)]


@torch.library.custom_op("moe_mlir::aux_loss_grad", mutates_args=())
def aux_loss_grad_op(
    logits: torch.Tensor,
    experts: torch.Tensor,
    d_load_balance: torch.Tensor,
    d_z_loss: torch.Tensor,
    scoring: str,
    bound: int,
    spec_key: str,
) -> torch.Tensor:
    """d_logits [T, E] (f32, on the logits' device) of moe.aux_loss_grad."""
    T, E = logits.shape
    if logits.device.type == "cuda":
        if T == 0:
            return torch.zeros_like(logits)
        bound = _layer_bound(spec_key, logits, bound)
        kernel = _gpu_kernel(E, experts.shape[1], scoring, T, bound)
        cot = {
            "d_result0": _aligned_scalar(d_load_balance),
            "d_result1": _aligned_scalar(d_z_loss),
        }
        return kernel.backward(_device_args(logits, experts), cot)["d_arg0"]
    module = _compiled(E, experts.shape[1], scoring)
    scalars = [_host(g.reshape(()), torch.float32) for g in (d_load_balance, d_z_loss)]
    (d,) = module["aux_loss_grad"](
        _host(logits, torch.float32),
        _host(experts, torch.int32),
        *scalars,
        result_shapes=[(T, E)],
    )
    return torch.from_numpy(d).to(logits.device)


def _aligned_scalar(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(()).to(torch.float32).clone()


@aux_loss_grad_op.register_fake
def _aux_loss_grad_fake(logits, experts, d_load_balance, d_z_loss, scoring, bound, spec_key):
    return torch.empty_like(logits, dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    logits, experts, scoring, bound, spec_key = inputs
    ctx.scoring, ctx.bound, ctx.spec_key = scoring, bound, spec_key
    ctx.save_for_backward(logits, experts)


def _backward(ctx, grads):
    logits, experts = ctx.saved_tensors
    d_lb, d_z = grads
    d = aux_loss_grad_op(logits, experts, d_lb, d_z, ctx.scoring, ctx.bound, ctx.spec_key)
    return d.to(logits.dtype), None, None, None, None


aux_loss_op.register_autograd(_backward, setup_context=_setup_context)


def aux_losses(
    logits: torch.Tensor, experts: torch.Tensor, scoring: str = "softmax"
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(load_balance, z_loss) of router `logits` [T, E] (f32) and its choices `experts`
    [T, k] (an integer tensor of values in [0, E), as the CPU path's runner checks them):
    0-d f32 tensors on the logits' device, differentiable in the logits (moe.aux_loss_grad).
    T = 0 gives 0 and 0. Raises ValueError for other shapes, dtypes or devices."""
    if scoring not in SCORINGS:
        raise ValueError(f"aux_losses: scoring must be one of {SCORINGS}, got {scoring!r}")
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(
            "aux_losses: logits must be a float32 tensor [T, E], got "
            f"{getattr(logits, 'dtype', type(logits).__name__)} "
            f"{tuple(getattr(logits, 'shape', ()))}"
        )
    integers = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
    if not isinstance(experts, torch.Tensor) or experts.dim() != 2 or experts.dtype not in integers:
        raise ValueError(
            "aux_losses: experts must be an integer tensor [T, k], got "
            f"{getattr(experts, 'dtype', type(experts).__name__)} "
            f"{tuple(getattr(experts, 'shape', ()))}"
        )
    T, E = logits.shape
    if experts.shape[0] != T or experts.shape[1] < 1 or E < 1:
        raise ValueError(
            f"aux_losses: experts {tuple(experts.shape)} against logits {tuple(logits.shape)}; "
            f"expected [T, k] with k >= 1 and E >= 1"
        )
    if experts.shape[1] > E:
        raise ValueError(f"aux_losses: k = {experts.shape[1]} is more than E = {E}")
    if experts.device != logits.device:
        raise ValueError(f"aux_losses: experts on {experts.device}, logits on {logits.device}")
    if experts.numel() and (int(experts.min()) < 0 or int(experts.max()) >= E):
        raise ValueError(f"aux_losses: experts holds values outside [0, {E})")
    return layer_aux_losses(logits, experts, scoring)


def layer_aux_losses(logits: torch.Tensor, experts: torch.Tensor, scoring: str, spec_key: str = ""):
    """aux_losses without its checks, for a layer's own logits and router choices (no value
    is read on the host here, so torch.compile traces it); `spec_key`: the layer's, whose
    token bound the CUDA path compiles the function at."""
    lb, z = aux_loss_op(logits, experts.to(torch.int32), scoring, 0, spec_key)
    return lb, z
