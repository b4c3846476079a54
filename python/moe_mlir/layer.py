"""`MoELayer`: a moe-mlir layer as a `torch.nn.Module` (docs/python.md).

    from moe_mlir import LayerConfig
    from moe_mlir.layer import MoELayer

    layer = MoELayer(LayerConfig(tokens=0, hidden=1024, ffn=1024, experts=8, top_k=2,
                                 renormalize=True)).cuda().bfloat16()
    y = layer(x)                      # x [..., hidden]; y has x's shape and dtype
    y, logits = layer(x, return_router_logits=True)

Forward and backward are the compiled kernels, reached through two `torch.library` custom ops,
`moe_mlir::layer_forward` and `moe_mlir::layer_backward`, each with a fake (meta) implementation
and joined by `register_autograd`, so autograd and `torch.compile` (fullgraph) see one opaque op.

- CUDA tensors run the sm_90a layer of `moe-compile` (`moe_mlir.gpu.CompiledLayer`), bf16 only,
  on torch's current stream: x and the weights are passed by pointer, outputs, saved tensors
  and gradients are allocated by torch; no activation is copied (x only when it is not
  contiguous or not 16-byte aligned).
- CPU tensors run the CPU reference path (`moe_mlir.cpu`), in f32: bf16 inputs are computed in
  f32 and the result rounded back to bf16 (the casts are ordinary autograd ops); the ctypes
  runner copies its inputs (it is a reference path, not a fast one).

One compiled layer serves every token count T = x.numel() // hidden up to a bound: the
`max_tokens` given to MoELayer, else the first T seen rounded up to a power of two; a larger T
compiles one layer at the next bound (each cached on disk, `moe_mlir.compile_cache`), never one
per T. `torch.compile(dynamic=True)` and `torch._dynamo.mark_dynamic` keep T symbolic: the fake
implementations give shapes in T. Everything a layer cannot run is raised as
TypeError/ValueError/NotImplementedError before any kernel or compiler runs.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import hashlib
import importlib.resources
import json
import math
import struct
import threading
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import nn

from . import compile_cache as cc
from .config import LayerConfig

__all__ = [
    "MoELayer",
    "update_selection_bias",
    "LayerSpec",
    "GPU_DTYPE",
    "check_gpu_config",
    "gpu_contract",
    "kernel_for",
]


@functools.lru_cache(maxsize=None)
def gpu_contract() -> Dict[str, object]:
    """gpu_contract.json, beside this module: the one declaration of what the sm_90a path runs
    (its limits, each with a reason, and the host functions of the GPU library). The compiler
    is built from the same file (docs/gpu-path.md section 1)."""
    text = importlib.resources.files(__package__).joinpath("gpu_contract.json").read_text()
    return json.loads(text)


CPU_DTYPE = torch.float32
_ELEMENT = {torch.float32: "f32", torch.bfloat16: "bf16"}
_NP_TO_TORCH = {
    "float32": torch.float32,
    "int32": torch.int32,
    "float64": torch.float64,
    "int64": torch.int64,
}
_GPU_TO_TORCH = {
    "bf16": torch.bfloat16,
    "f32": torch.float32,
    "i32": torch.int32,
    "f16": torch.float16,
}
GPU_DTYPE = _GPU_TO_TORCH[gpu_contract()["limits"]["data_dtype"]["value"]]
# Layer arguments in LayerConfig.arg_specs order; the custom op takes all nine (None if absent).
ARG_NAMES = (
    "x",
    "w_router",
    "router_bias",
    "w_gate_up",
    "w_down",
    "shared_gate_up",
    "shared_down",
    "b_gate_up",
    "b_down",
)


# The LayerConfig field of each size the contract's limits apply to (d, n and the shared
# expert's m; 0 = no shared expert).
_CONTRACT_SIZES = {"d": "hidden", "n": "ffn", "m": "shared_ffn"}


def check_gpu_config(config: LayerConfig) -> None:
    """Raises NotImplementedError naming each limit of the sm_90a path (gpu_contract.json) that
    `config` breaks, with the limit's reason. The data type is the tensors' (GPU_DTYPE)."""
    limits = gpu_contract()["limits"]
    problems = []

    def broken(what: str, limit: str) -> None:
        problems.append(f"{what} ({limit}: {limits[limit]['reason']})")

    activations = limits["activations"]["value"]
    if config.activation not in activations:
        broken(f"activation {config.activation!r} is not one of {activations}", "activations")
    if config.expert_bias and not limits["expert_bias_supported"]["value"]:
        broken("expert_bias (b_gate_up, b_down) is not supported", "expert_bias_supported")
    if config.capacity_factor is not None and not limits["capacity_factor_supported"]["value"]:
        broken(
            f"capacity_factor {config.capacity_factor} is not supported (only None, dropless)",
            "capacity_factor_supported",
        )
    tile = limits["tile_multiple"]["value"]
    width = limits["max_width"]["value"]
    for limit, bad, text in (
        ("tile_multiple", lambda v: v % tile, f"is not a multiple of {tile}"),
        ("max_width", lambda v: v > width, f"is over {width}"),
    ):
        for size in limits[limit]["applies_to"]:
            field = _CONTRACT_SIZES[size]
            value = getattr(config, field)
            if bad(value):  # a shared_ffn of 0 (no shared expert) passes both
                broken(f"{field} ({size}) = {value} {text}", limit)
    max_experts = limits["max_experts"]["value"]
    if config.experts > max_experts:
        broken(f"experts = {config.experts} is over {max_experts}", "max_experts")
    max_groups = limits["max_expert_groups"]["value"]
    if config.num_groups > max_groups:
        broken(f"num_groups = {config.num_groups} is over {max_groups}", "max_expert_groups")
    if problems:
        raise NotImplementedError(
            "the CUDA path of moe_mlir does not run this layer: "
            + "; ".join(problems)
            + f". It runs {limits['data_dtype']['value']} layers within the limits of "
            "moe_mlir/gpu_contract.json (the CPU path runs the rest, in f32)"
        )


# --------------------------------------------------------------------------- specs and kernels


@dataclasses.dataclass(frozen=True)
class LayerSpec:
    """A layer without its token count: what the custom op's `spec` string names."""

    config: LayerConfig  # tokens and dtype are ignored
    options: cc.BuildOptions  # max_tokens: the user's bound, None to choose from the first T

    def key(self) -> str:
        base = dataclasses.asdict(self.config)
        base.pop("tokens")
        base.pop("dtype")
        data = json.dumps({"config": base, "options": self.options.as_dict()}, sort_keys=True)
        return "moe_" + hashlib.sha256(data.encode()).hexdigest()[:20]

    def config_for(self, tokens: int, target: str) -> LayerConfig:
        return dataclasses.replace(
            self.config, tokens=int(tokens), dtype="f32" if target == "cpu" else "bf16"
        )

    def bound_for(self, tokens: int) -> int:
        """The bound a layer for `tokens` tokens is compiled at when no compiled one serves
        them: the user's max_tokens when it holds them, else `tokens` rounded up to a power of
        two."""
        if self.options.max_tokens is not None and tokens <= self.options.max_tokens:
            return self.options.max_tokens
        return cc.default_bound(tokens)


_SPECS: Dict[str, LayerSpec] = {}
# Compiled layers by (spec, bound, target): each serves every T up to its bound.
_KERNELS: Dict[Tuple[str, int, str], "_Kernel"] = {}
# The bounds of each (spec, target)'s compiled layers, ascending: kernel_for runs every step.
_BOUNDS: Dict[Tuple[str, str], List[int]] = {}
_LOCK = threading.RLock()


def register_spec(spec: LayerSpec) -> str:
    key = spec.key()
    with _LOCK:
        _SPECS.setdefault(key, spec)
    return key


class _Kernel:
    """One compiled layer: (spec, bound, target), for every T up to the bound. `out_specs`:
    (rows a token or None, shape, dtype) of out, logits and the saved tensors, in the order the
    forward op returns them; shape(T) gives them at T."""

    def __init__(self, spec: LayerSpec, bound: int, target: str):
        self.config = spec.config_for(bound, target)
        self.bound = bound
        self.target = target
        self.arg_names = self.config.arg_names()
        self.grad_names = [n for n in self.arg_names if n != "router_bias"]
        # indices (into the saved tensors) that moe_mlir.offload moves to the host (CUDA)
        self.offload, self.offloaded = False, []
        options = dataclasses.replace(spec.options, max_tokens=bound)
        if target == "cpu":
            self.cpu = cc.get_cpu_layer(self.config, options)
            fname = f"{self.cpu.name}_forward"
            sig = self.cpu.module.signatures[fname]
            self.out_specs = [
                (rows, tuple(t.shape), _NP_TO_TORCH[t.dtype.name])
                for rows, t in zip(self.cpu._rows[fname], sig.results)
            ]
            self.cpu_grad_names = list(self.cpu.gradient_names)
        else:
            from . import gpu  # noqa: PLC0415

            check_gpu_config(self.config)
            # policy="offload" on CUDA: the sm_90a layer keeps H and moe_mlir.offload moves it
            # to the host. The layer compiled with --policy=offload copies H itself, but its
            # backward can only start the copy back when it is called; moe_mlir.offload
            # starts it one layer ahead, under the backward of the layer after.
            self.offload = options.policy == "offload"
            if self.offload:
                if options.memory_budget is not None:
                    raise NotImplementedError(
                        "policy='offload' on CUDA offloads every H and takes no memory_budget "
                        "(give one with policy='auto', 'keep' or 'recompute')"
                    )
                options = dataclasses.replace(options, policy="keep")
            self.entry = cc.find_gpu_entry(self.config, options)
            self.manifest = gpu.Manifest.load(str(self.entry.path / f"{self.entry.name}.json"))
            fwd = self.manifest.forward
            outs = fwd.by_role("output")
            saved = fwd.by_role("saved")
            self.saved_params = [p.name for p in saved]
            from .offload import is_offloaded_name  # noqa: PLC0415

            self.offloaded = [
                i for i, n in enumerate(self.saved_params) if self.offload and is_offloaded_name(n)
            ]
            # The forward's inputs are the layer function's arguments, in order (arg0, ...).
            inputs = [p.name for p in fwd.by_role("input")]
            if len(inputs) != len(self.arg_names):
                raise ValueError(
                    f"{self.manifest.path}: {len(inputs)} inputs, expected "
                    f"{len(self.arg_names)} ({', '.join(self.arg_names)})"
                )
            self.param_of = dict(zip(self.arg_names, inputs))
            self.arg_of = dict(zip(inputs, self.arg_names))
            self.out_specs = [
                (p.rows_per_token or None, p.shape, _GPU_TO_TORCH[p.dtype]) for p in [*outs, *saved]
            ]
            self._gpu = None

    def out_shapes(self, tokens) -> List[Tuple[Tuple, torch.dtype]]:
        """(shape, dtype) of each forward result at `tokens` tokens (an int or a SymInt)."""
        return [
            ((shape if rows is None else (rows * tokens, *shape[1:])), dtype)
            for rows, shape, dtype in self.out_specs
        ]

    # ---------------------------------------------------------------- CUDA
    def gpu_layer(self):
        if self._gpu is None:
            from . import gpu  # noqa: PLC0415

            so, manifest = cc.link_gpu_layer(self.entry)
            self._gpu = gpu.CompiledLayer(so, manifest)
        return self._gpu

    def forward(self, args: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
        if self.target == "cpu":
            arrays = {n: args[n].detach().numpy() for n in self.arg_names}
            out, logits, saved = self.cpu.forward(arrays)
            return [torch.from_numpy(a) for a in (out, logits, *saved)]
        layer = self.gpu_layer()
        res = layer.forward({self.param_of[n]: args[n] for n in self.arg_names})
        outs = [p.name for p in self.manifest.forward.by_role("output")]
        return [res[n] for n in outs] + [res[n] for n in self.saved_params]

    def backward(
        self,
        args: Dict[str, torch.Tensor],
        saved: Sequence[torch.Tensor],
        d_out: torch.Tensor,
        d_logits: Optional[torch.Tensor],
    ) -> List[torch.Tensor]:
        if self.target == "cpu":
            if d_logits is None:
                d_logits = torch.zeros((d_out.shape[0], self.config.experts), dtype=torch.float32)
            grads = self.cpu.backward(
                [s.detach().numpy() for s in saved],
                d_out.detach().contiguous().numpy(),
                d_logits.detach().contiguous().numpy(),
            )
            return [
                torch.from_numpy(grads[n]) if n in grads else torch.zeros_like(args[n])
                for n in self.grad_names
            ]
        layer = self.gpu_layer()
        fwd = dict(zip(self.saved_params, saved))
        for n in self.arg_names:
            fwd[self.param_of[n]] = args[n]
        cot = {"result0": _aligned(d_out)}
        if d_logits is not None:
            cot["result1"] = _aligned(d_logits)
        grads = layer.backward(fwd, cot)
        by_name = {
            self.arg_of.get(p.of or "", p.name): grads[p.name]
            for p in self.manifest.entry("backward").by_role("gradient")
        }
        return [by_name[n] if n in by_name else torch.zeros_like(args[n]) for n in self.grad_names]


def _token_hint(tokens) -> Optional[int]:
    """An int token count; a SymInt's example value, read without a guard (which would
    specialise the graph on T); None for a SymInt without one."""
    if isinstance(tokens, int):
        return tokens
    node = getattr(tokens, "node", None)
    hint = getattr(node, "hint", None) if node is not None else None
    return int(hint) if hint is not None else None


def kernel_for(spec_key: str, tokens, device: torch.device) -> _Kernel:
    """The compiled layer of a registered spec that serves `tokens` tokens on `device`: the
    one of the smallest bound that holds them, else one compiled now at the spec's next bound
    (LayerSpec.bound_for; the compile cache makes later processes fast). A SymInt T without an
    example value takes the spec's max_tokens, or raises."""
    hint = _token_hint(tokens)
    if hint is None:
        with _LOCK:
            spec = _SPECS.get(spec_key)
        if spec is None or spec.options.max_tokens is None:
            raise NotImplementedError(
                "moe_mlir cannot choose a bound for a token count without an example value; "
                "give the MoELayer max_tokens="
            )
        hint = spec.options.max_tokens
    tokens = hint
    target = {"cpu": "cpu", "cuda": "sm_90a"}.get(device.type)
    if target is None:
        raise ValueError(
            f"moe_mlir runs layers on CUDA (sm_90a, bf16) or the CPU (f32), not on {device.type}"
        )
    with _LOCK:
        spec = _SPECS.get(spec_key)
        if spec is None:
            raise KeyError(
                f"unknown moe_mlir layer spec {spec_key!r} (build the MoELayer in "
                f"this process first)"
            )
        if tokens < 1:
            raise ValueError(f"moe_mlir layers need at least one token, got T = {tokens}")
        bounds = _BOUNDS.setdefault((spec_key, target), [])
        at = bisect.bisect_left(bounds, tokens)
        if at == len(bounds):
            bound = spec.bound_for(tokens)
            _KERNELS[(spec_key, bound, target)] = _Kernel(spec, bound, target)
            bisect.insort(bounds, bound)
            return _KERNELS[(spec_key, bound, target)]
        return _KERNELS[(spec_key, bounds[at], target)]


_OFFLOADS: Dict[str, bool] = {}


def _offloads(spec_key: str) -> bool:
    """Whether the registered spec offloads H on CUDA (policy="offload"). Specs never change
    once registered, so the answer is kept: the forward asks on every call."""
    known = _OFFLOADS.get(spec_key)
    if known is None:
        with _LOCK:
            spec = _SPECS.get(spec_key)
        if spec is None:
            return False  # kernel_for says it is unknown
        known = _OFFLOADS[spec_key] = spec.options.policy == "offload"
    return known


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """t itself when contiguous and 16-byte aligned (what the entry points need), else a copy."""
    if not t.is_contiguous() or t.data_ptr() % 16:
        t = t.contiguous()
        if t.data_ptr() % 16:
            t = t.clone()
    return t


# --------------------------------------------------------------------------- custom ops


def _args_dict(*values):
    return {n: v for n, v in zip(ARG_NAMES, values, strict=True) if v is not None}


@torch.library.custom_op("moe_mlir::layer_forward", mutates_args=())
def layer_forward(
    spec: str,
    x: torch.Tensor,
    w_router: torch.Tensor,
    router_bias: Optional[torch.Tensor],
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    shared_gate_up: Optional[torch.Tensor],
    shared_down: Optional[torch.Tensor],
    b_gate_up: Optional[torch.Tensor],
    b_down: Optional[torch.Tensor],
) -> List[torch.Tensor]:
    """[out [T,d], router logits [T,E] f32, saved tensors...] of the compiled forward."""
    args = _args_dict(
        x, w_router, router_bias, w_gate_up, w_down, shared_gate_up, shared_down, b_gate_up, b_down
    )
    kernel = kernel_for(spec, x.shape[0], x.device)
    if x.device.type == "cuda":
        args["x"] = _aligned(x)
    outs = kernel.forward(args)
    # No output may alias an input (custom-op rule); the runners never return their inputs.
    return outs


@layer_forward.register_fake
def _layer_forward_fake(
    spec,
    x,
    w_router,
    router_bias,
    w_gate_up,
    w_down,
    shared_gate_up,
    shared_down,
    b_gate_up,
    b_down,
):
    kernel = kernel_for(spec, x.shape[0], x.device)
    return [x.new_empty(shape, dtype=dtype) for shape, dtype in kernel.out_shapes(x.shape[0])]


@torch.library.custom_op("moe_mlir::layer_backward", mutates_args=())
def layer_backward(
    spec: str,
    inputs: List[torch.Tensor],
    saved: List[torch.Tensor],
    d_out: torch.Tensor,
    d_logits: Optional[torch.Tensor],
) -> List[torch.Tensor]:
    """Gradients of the layer's inputs but the router bias, in argument order. `inputs`: the
    present forward arguments in LayerConfig.arg_specs order; `saved`: what layer_forward
    returned after out and logits."""
    x = inputs[0]
    kernel = kernel_for(spec, x.shape[0], x.device)
    args = dict(zip(kernel.arg_names, inputs))
    if x.device.type == "cuda":
        args["x"] = _aligned(x)
    return kernel.backward(args, saved, d_out, d_logits)


@layer_backward.register_fake
def _layer_backward_fake(spec, inputs, saved, d_out, d_logits):
    kernel = kernel_for(spec, inputs[0].shape[0], inputs[0].device)
    args = dict(zip(kernel.arg_names, inputs))
    return [torch.empty_like(args[n]) for n in kernel.grad_names]


def _setup_context(ctx, inputs, output):
    spec, *args = inputs
    present = [a for a in args if a is not None]
    ctx.spec = spec
    ctx.present = [a is not None for a in args]
    ctx.n_inputs = len(present)
    ctx.out_meta = (output[0].shape, output[0].dtype)
    saved = list(output[2:])
    # policy="offload" on CUDA: H goes to pinned host memory until backward (moe_mlir.offload)
    ctx.offloaded = {}
    if present[0].device.type == "cuda" and _offloads(spec):
        kernel = kernel_for(spec, present[0].shape[0], present[0].device)
        if kernel.offloaded:
            if torch.compiler.is_compiling():
                raise NotImplementedError(
                    "policy='offload' runs in eager mode only: its copies "
                    "are side effects a compiled graph does not hold"
                )
            from .offload import offloader  # noqa: PLC0415

            mover = offloader(present[0].device)
            entries = mover.offload_layer([saved[i] for i in kernel.offloaded])
            ctx.offloaded = dict(zip(kernel.offloaded, entries))
            saved = [t for i, t in enumerate(saved) if i not in ctx.offloaded]
    ctx.n_saved = len(output) - 2
    ctx.save_for_backward(*present, *saved)
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(*output[2:])


def _backward(ctx, grads):
    d_out, d_logits = grads[0], grads[1]
    tensors = ctx.saved_tensors
    inputs, kept = list(tensors[: ctx.n_inputs]), iter(tensors[ctx.n_inputs :])
    fetched = {}
    if ctx.offloaded:
        from .offload import offloader  # noqa: PLC0415

        order = sorted(ctx.offloaded)
        back = offloader(inputs[0].device).fetch([ctx.offloaded[i] for i in order])
        fetched = dict(zip(order, back))
    saved = [fetched[i] if i in fetched else next(kept) for i in range(ctx.n_saved)]
    if d_out is None:
        if d_logits is None:
            return (None,) * (1 + len(ARG_NAMES))
        d_out = inputs[0].new_zeros(ctx.out_meta[0], dtype=ctx.out_meta[1])
    d_out = d_out.contiguous()
    if d_logits is not None:
        d_logits = d_logits.contiguous()
    g = layer_backward(ctx.spec, inputs, saved, d_out, d_logits)
    names = [n for n, p in zip(ARG_NAMES, ctx.present) if p and n != "router_bias"]
    by_name = dict(zip(names, g))
    return (None, *[by_name.get(n) for n in ARG_NAMES])


layer_forward.register_autograd(_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------- expert parallelism


def _ep_spec(
    config: LayerConfig,
    size: int,
    max_tokens: int,
    capacity: Optional[int],
    overflow: str,
    chunk_tokens: Optional[int],
):
    """The EPSpec of an expert-parallel MoELayer: the capacity defaults to the rows of a
    chunk (or of the step), `chunk_tokens * k`, which no routing exceeds."""
    from .distributed import EPSpec  # noqa: PLC0415

    if chunk_tokens is not None:
        if (
            isinstance(chunk_tokens, bool)
            or not isinstance(chunk_tokens, int)
            or not 1 <= chunk_tokens <= max_tokens
        ):
            raise ValueError(
                f"ep_chunk_tokens must be an integer in [1, max_tokens = {max_tokens}], "
                f"got {chunk_tokens!r}"
            )
        if "chunk_tokens" not in {f.name for f in dataclasses.fields(EPSpec)}:
            raise NotImplementedError(
                "ep_chunk_tokens needs moe_mlir.distributed.EPSpec.chunk_tokens, which this "
                "version of moe_mlir does not have"
            )
    if capacity is None:
        capacity = (chunk_tokens or max_tokens) * config.top_k
    fields = {"chunk_tokens": chunk_tokens} if chunk_tokens is not None else {}
    return EPSpec(size, capacity, overflow, **fields).validate(config)


class _EPKernel:
    """The sm_90a entry of one expert-parallel layer (config, EPSpec, bound), found or built
    when made; its GPUEPLayer (a CUDA driver needed) loaded at the first call."""

    def __init__(self, config: LayerConfig, options: cc.BuildOptions):
        self.config = dataclasses.replace(config, tokens=options.max_tokens, dtype="bf16")
        self.arg_names = self.config.arg_names()
        self.entry = cc.find_gpu_entry(self.config, options)
        self._layer = None

    def layer(self):
        if self._layer is None:
            layer = cc.load_gpu_ep_layer(self.entry)
            # The stages take the layer function's arguments in order (arg0, ...); the
            # manifest names them by their roles in the op.
            inputs = layer.layer.get("inputs", {})
            if inputs and len(inputs) != len(self.arg_names):
                raise ValueError(
                    f"{self.entry.path}: {len(inputs)} inputs, expected "
                    f"{len(self.arg_names)} ({', '.join(self.arg_names)})"
                )
            self._layer = layer
        return self._layer


_EP_KERNELS: Dict[str, _EPKernel] = {}


def gpu_ep_kernel(config: LayerConfig, options: cc.BuildOptions) -> _EPKernel:
    """The expert-parallel sm_90a layer of `config` and `options` (its `ep` and bound
    `max_tokens` set), one a process: compiled with moe-compile here, or the prebuilt entry of
    $MOE_MLIR_PREBUILT (moe_mlir.compile_cache)."""
    if options.ep is None or options.max_tokens is None:
        raise ValueError("an expert-parallel layer's options need ep and max_tokens")
    key = LayerSpec(config, options).key()
    with _LOCK:
        kernel = _EP_KERNELS.get(key)
        if kernel is None:
            kernel = _EP_KERNELS[key] = _EPKernel(config, options)
    return kernel


class _GPUEPFunction(torch.autograd.Function):
    """Forward and backward of a GPUEPLayer (or anything with its `forward(args, group)`,
    `backward(saved, d_out, d_logits, group)` and `gradient_args`): out and logits from x and
    this rank's weights, in the layer function's argument order. What forward returns after
    out and logits goes back to backward as it is."""

    @staticmethod
    def forward(ctx, runner, group, x, *weights):
        results = runner.forward([x, *weights], group)
        out, logits = results[0], results[1]
        ctx.runner, ctx.group, ctx.count = runner, group, 1 + len(weights)
        ctx.device = x.device
        ctx.state = results[2:]
        ctx.out_meta = (out.shape, out.dtype, logits.shape, logits.dtype)
        ctx.set_materialize_grads(False)
        return out, logits

    @staticmethod
    def backward(ctx, d_out, d_logits):
        # Every rank runs the backward's collectives, whichever cotangents it has.
        out_shape, out_dtype, logits_shape, logits_dtype = ctx.out_meta
        if d_out is None:
            d_out = torch.zeros(out_shape, dtype=out_dtype, device=ctx.device)
        if d_logits is None:
            d_logits = torch.zeros(logits_shape, dtype=logits_dtype, device=ctx.device)
        d_out = _aligned(d_out.to(out_dtype))
        d_logits = _aligned(d_logits.to(logits_dtype))
        grads = ctx.runner.backward(ctx.state, d_out, d_logits, ctx.group)
        by_arg = dict(zip(ctx.runner.gradient_args, grads))
        return (None, None, *[by_arg.get(i) for i in range(ctx.count)])


def gpu_ep_apply(runner, group, x: torch.Tensor, weights, arg_names: Sequence[str]):
    """out, logits of an expert-parallel layer's stages (`runner`, a GPUEPLayer) on x and
    this rank's weights ({name: tensor}), differentiable in each; `arg_names` the layer
    function's arguments ("x" first)."""
    if arg_names[0] != "x":
        raise ValueError(f"the layer's first argument is {arg_names[0]!r}, not x")
    missing = [n for n in arg_names[1:] if weights.get(n) is None]
    if missing:
        raise ValueError(f"missing layer arguments {missing}")
    return _GPUEPFunction.apply(runner, group, x, *[weights[n] for n in arg_names[1:]])


# --------------------------------------------------------------------------- the module


class MoELayer(nn.Module):
    """A moe-mlir layer with its own parameters, in the compiler's layout (docs/dialect.md):
    `w_router` [d, E], `w_gate_up` [E, d, 2n] (gate columns first, then up), `w_down`
    [E, n, d], the buffer `router_bias` [E] (f32, no gradient: DeepSeek-V3's
    e_score_correction_bias; it stays f32 when the layer moves to another dtype),
    `shared_gate_up` [d, 2m], `shared_down` [m, d], and with `config.expert_bias` the experts'
    biases `b_gate_up` [E, G] and `b_down` [E, d] (gpt-oss style; both paths, forward and
    backward).

    `config.tokens` and `config.dtype` are ignored: T comes from the input, the element type
    from the parameters (bf16 on CUDA; f32 or bf16 on the CPU). `memory_budget` / `policy`: the
    activation plan (`moe-plan-activations`, docs/memory.md), on both paths (CUDA: through
    moe-compile --policy / --memory-budget). `policy="offload"` on CUDA keeps H in pinned host
    memory from forward to backward, copied on a stream of its own and prefetched one layer
    ahead in backward (moe_mlir.offload; eager mode; no memory_budget); on the CPU, where the
    host is the device, it is the offload plan of moe-plan-activations, which keeps H.
    `num_sms` / `kernel_configs` (CUDA): the GPU's SM count (0: the chip's, 132) and GEMM
    kernel parameters ("[OP.]ROLE:KEY=VALUE", docs/dialect.md), moe-compile's --num-sms and
    --kernel-config. `max_tokens`: the bound on T of the first compiled layer, which serves
    every T up to it (default: the first T seen, rounded up to a power of two); a larger T
    compiles one more layer at the next bound.

    `ep_group` (a torch.distributed process group, or "default" for the default group):
    expert parallelism (docs/distributed.md). Of the E experts, rank r of the S ranks holds
    experts [r * E / S, (r + 1) * E / S): `w_gate_up` and `w_down` (and the state_dict) hold
    those alone; `moe_mlir.distributed.gather_experts` gives the whole layer's. Each rank's
    tokens are routed over all E experts, and their rows move to the experts' ranks and back
    through torch.distributed (`all_to_all_single`). `ep_capacity`: the rows one rank may
    send to one rank a step, or a chunk (default: (ep_chunk_tokens or max_tokens) * k, never
    exceeded); `ep_overflow`: "error" (the default: CapacityError on every rank) or "drop"
    past it (`last_dropped`: the rows each dispatch dropped for each rank). `ep_chunk_tokens`:
    the step is processed in chunks of at most that many tokens, each with its own dispatch.
    `max_tokens` is needed: every rank compiles the same bound, and a larger T raises. The
    router's and shared expert's gradients are this rank's tokens' alone: reduce them over
    the ranks with DDP/FSDP as for any parameter. CUDA tensors (bf16, or under
    torch.autocast) run the layer's sm_90a stages (`moe_mlir.distributed.GPUEPLayer`, from
    the compile cache like the layer above, keyed by the EPSpec too) on torch's current
    stream and device with NCCL between them, `last_dropped` a CUDA tensor; CPU tensors the
    CPU path in f32 (gloo), `last_dropped` a NumPy array. `policy="offload"` is refused on
    CUDA, and torch.compile does not trace the layer (the exchange is Python).

    With `config.capacity_factor` (token dropping, both paths) each expert keeps its first
    ceil(capacity_factor * T * k / E) (token, slot) pairs in token order and the rest add
    zero; after each forward `last_dropped` is the number of pairs dropped, a 0-d int64
    tensor on the input's device (read it with `.item()`; the forward does not)."""

    def __init__(
        self,
        config: LayerConfig,
        *,
        memory_budget: Optional[str] = None,
        policy: str = "auto",
        num_sms: int = 0,
        kernel_configs: Sequence[str] = (),
        max_tokens: Optional[int] = None,
        ep_group=None,
        ep_capacity: Optional[int] = None,
        ep_overflow: str = "error",
        ep_chunk_tokens: Optional[int] = None,
        init_std: float = 0.02,
        device=None,
        dtype: Optional[torch.dtype] = None,
        _params: bool = True,
    ):
        super().__init__()
        config = dataclasses.replace(config)
        if config.tokens < 0:
            config.tokens = 0
        config.validate()
        self.ep_group, self.ep_size, self.ep_rank = None, 1, 0
        self.ep_capacity, self.ep_overflow = ep_capacity, ep_overflow
        self.ep_chunk_tokens = ep_chunk_tokens
        self.ep_spec = None
        self.expert_parallel = ep_group is not None
        if not self.expert_parallel and (
            ep_capacity is not None or ep_chunk_tokens is not None or ep_overflow != "error"
        ):
            raise ValueError(
                "ep_capacity, ep_overflow and ep_chunk_tokens need ep_group (expert parallelism)"
            )
        if ep_group is not None and config.expert_bias:
            raise NotImplementedError(
                "MoELayer(ep_group=...): expert_bias is not supported on the expert-parallel "
                "path (its stages take no expert biases)"
            )
        if ep_group is not None:
            self._init_ep(config, ep_group)
        if policy not in ("auto", "keep", "recompute", "offload"):
            raise ValueError(
                f"policy must be 'auto', 'keep', 'recompute' or 'offload', got {policy!r}"
            )
        if memory_budget is not None and not isinstance(memory_budget, str):
            memory_budget = f"{int(memory_budget)}B"
        self.config = config
        self.options = cc.BuildOptions(
            memory_budget=memory_budget,
            policy=policy,
            num_sms=num_sms,
            kernel_configs=tuple(kernel_configs),
            max_tokens=max_tokens,
        )
        if self.expert_parallel:
            if max_tokens is None:
                raise ValueError(
                    "MoELayer(ep_group=...) needs max_tokens: every rank must compile the same "
                    "bound, whose rows travel between them in blocks of a fixed size"
                )
            self.ep_spec = _ep_spec(
                config, self.ep_size, max_tokens, ep_capacity, ep_overflow, ep_chunk_tokens
            )
        self.spec_key = register_spec(LayerSpec(config, self.options))
        # What the CUDA path refuses, decided here: the forward, which torch.compile traces,
        # then only reads it.
        try:
            check_gpu_config(config)
            self._gpu_refusal = None
        except NotImplementedError as e:
            self._gpu_refusal = str(e)
        if not _params:
            return
        c = config
        factory = {"device": device, "dtype": dtype or torch.float32}
        local = c.experts // self.ep_size
        self.w_router = nn.Parameter(torch.empty(c.hidden, c.experts, **factory))
        self.w_gate_up = nn.Parameter(torch.empty(local, c.hidden, c.gate_up_width, **factory))
        self.w_down = nn.Parameter(torch.empty(local, c.ffn, c.hidden, **factory))
        if c.router_bias:
            self.register_buffer(
                "router_bias", torch.zeros(c.experts, device=device, dtype=torch.float32)
            )
        else:
            self.router_bias = None
        if c.has_shared:
            self.shared_gate_up = nn.Parameter(
                torch.empty(c.hidden, c.shared_gate_up_width, **factory)
            )
            self.shared_down = nn.Parameter(torch.empty(c.shared_ffn, c.hidden, **factory))
        else:
            self.shared_gate_up = self.shared_down = None
        if c.expert_bias:
            self.b_gate_up = nn.Parameter(torch.empty(local, c.gate_up_width, **factory))
            self.b_down = nn.Parameter(torch.empty(local, c.hidden, **factory))
        else:
            self.b_gate_up = self.b_down = None
        with torch.no_grad():
            for p in self.parameters():
                p.normal_(0.0, init_std)

    def _init_ep(self, config: LayerConfig, group) -> None:
        import torch.distributed as dist  # noqa: PLC0415

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "MoELayer(ep_group=...) needs torch.distributed initialised "
                "(torch.distributed.init_process_group, or torchrun)"
            )
        self.ep_group = None if isinstance(group, str) and group == "default" else group
        self.ep_size = dist.get_world_size(self.ep_group)
        self.ep_rank = dist.get_rank(self.ep_group)

    def _apply(self, fn, recurse=True):
        # router_bias stays f32 through .to(dtype) / .bfloat16() (as HF keeps DeepSeek-V3's
        # e_score_correction_bias): the selection-bias update moves it by about 1e-3 a step,
        # below bf16's spacing at the bias's size, and update_selection_bias takes f32 alone.
        bias = self._buffers.get("router_bias")
        out = super()._apply(fn, recurse)
        moved = self._buffers.get("router_bias")
        if bias is not None and moved is not None and moved.dtype != torch.float32:
            self._buffers["router_bias"] = bias.to(device=moved.device, dtype=torch.float32)
        return out

    def extra_repr(self) -> str:
        c = self.config
        extra = f", shared_ffn={c.shared_ffn}" if c.has_shared else ""
        if self.expert_parallel:
            extra += f", ep_size={self.ep_size}, ep_rank={self.ep_rank}"
        return (
            f"hidden={c.hidden}, ffn={c.ffn}, experts={c.experts}, top_k={c.top_k}, "
            f"scoring={c.scoring}, renormalize={c.renormalize}{extra}"
        )

    # ---------------------------------------------------------------- selection bias
    def _remember_routing(self, logits, bias, saved) -> None:
        """What update_selection_bias needs of the step, for a layer with a router_bias: the
        saved dispatch results (offsets, rows) where the forward saves them, else the router
        logits and the bias they were routed with. Not under torch.compile (a side effect
        the graph does not hold): a compiled layer's update takes the experts."""
        if bias is None or torch.compiler.is_compiling():
            return
        dispatch = _saved_dispatch(saved, logits.shape[0], self.config)
        if dispatch is not None:
            self._last_routing = ("dispatch", *dispatch)
        else:
            self._last_routing = ("logits", logits.detach(), bias.detach().clone())

    def last_experts(self) -> torch.Tensor:
        """The experts [T, k] (int32) the last forward routed its tokens to, on its device:
        from the forward's saved dispatch results (exact, -1 for a pair a capacity factor
        dropped), else (policy recompute, expert parallelism: this rank's tokens) the
        reference selection on the step's router logits and bias, which can differ from
        the compiled router's choice only where two selection scores tie within rounding."""
        routing = getattr(self, "_last_routing", None)
        if routing is None:
            raise RuntimeError(
                "MoELayer.last_experts: no forward of this layer recorded its routing (a layer "
                "with router_bias records it in eager mode; under torch.compile pass experts=)"
            )
        if routing[0] == "dispatch":
            return _experts_of_rows(routing[1], routing[2])
        from . import torch_reference as tr  # noqa: PLC0415

        c = self.config
        logits, bias = routing[1], routing[2]
        scores = tr.scores(logits.float(), c.scoring) + bias.float()[None, :]
        picks = tr.select_experts(scores, c.top_k, c.num_groups, c.topk_groups)
        return picks.to(torch.int32)

    def update_selection_bias(
        self, rate: float = 1e-3, rule: str = "sign", experts: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Auxiliary-loss-free balancing after the optimizer step: moves `router_bias` in
        place by the loads of `experts` (default: last_experts(), the last forward's routing)
        with moe.update_selection_bias (`update_selection_bias`). Returns router_bias."""
        return update_selection_bias(self, experts, rate=rate, rule=rule)

    # ---------------------------------------------------------------- inputs
    def layer_weights(self) -> Dict[str, Optional[torch.Tensor]]:
        """The layer's weights in the compiler's layout (subclasses transform theirs)."""
        # .to(dtype) casts buffers too; the bias is f32 for the kernels whatever the module's.
        bias = None if self.router_bias is None else self.router_bias.float()
        return {
            "w_router": self.w_router,
            "router_bias": bias,
            "w_gate_up": self.w_gate_up,
            "w_down": self.w_down,
            "shared_gate_up": self.shared_gate_up,
            "shared_down": self.shared_down,
            "b_gate_up": self.b_gate_up,
            "b_down": self.b_down,
        }

    def _check(
        self, x: torch.Tensor, weights: Dict[str, Optional[torch.Tensor]], autocast: bool = False
    ) -> None:
        """Raises for inputs the layer cannot run. `autocast`: the weights and x are about to
        be cast to the autocast dtype, so only their devices and shapes must match."""
        c = self.config
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"MoELayer expects a torch.Tensor, got {type(x).__name__}")
        if x.dim() < 1 or x.shape[-1] != c.hidden:
            raise ValueError(
                f"MoELayer: input of shape {tuple(x.shape)}; expected [..., "
                f"{c.hidden}] (hidden = {c.hidden})"
            )
        if x.numel() == 0:
            raise ValueError("MoELayer: the input holds no tokens; layers need T >= 1")
        dev = x.device.type
        if dev not in ("cuda", "cpu"):
            raise ValueError(
                f"MoELayer: input on {x.device}; supported devices: cuda "
                f"(bf16, the sm_90a kernels) and cpu (f32 reference path)"
            )
        if dev == "cuda":
            if x.dtype != GPU_DTYPE and not autocast:
                raise TypeError(
                    f"MoELayer: input dtype {x.dtype} on CUDA; the CUDA path runs "
                    f"torch.bfloat16 only (cast the model with .bfloat16(), or "
                    f"run it under torch.autocast('cuda', dtype=torch.bfloat16))"
                )
            if self._gpu_refusal is not None:
                raise NotImplementedError(self._gpu_refusal)
        elif x.dtype not in (torch.float32, torch.bfloat16):
            raise TypeError(
                f"MoELayer: input dtype {x.dtype} on the CPU; the CPU path runs "
                f"torch.float32 (and torch.bfloat16, computed in float32)"
            )
        shapes = {n: s for n, s, _ in c.arg_specs()}
        for name in ("w_gate_up", "w_down", "b_gate_up", "b_down"):  # this rank's experts
            if name not in shapes:
                continue
            shapes[name] = (c.experts // self.ep_size, *shapes[name][1:])
        for name, w in weights.items():
            if w is None:
                continue
            if w.device != x.device:
                raise ValueError(
                    f"MoELayer: {name} is on {w.device} but the input is on "
                    f"{x.device}; move the layer with .to(device)"
                )
            if tuple(w.shape) != tuple(shapes[name]):
                raise ValueError(
                    f"MoELayer: {name} has shape {tuple(w.shape)}, expected {tuple(shapes[name])}"
                )
            if autocast and name != "router_bias":
                if not w.is_floating_point():
                    raise TypeError(
                        f"MoELayer: {name} is {w.dtype}; weights must be floating point"
                    )
                continue
            want = torch.float32 if name == "router_bias" else x.dtype
            if w.dtype != want:
                raise TypeError(
                    f"MoELayer: {name} is {w.dtype} but the input is {x.dtype}; "
                    f"parameters and input must share a dtype (the router bias is "
                    f"float32)"
                )

    def forward(
        self,
        hidden_states: torch.Tensor,
        return_router_logits: bool = False,
        return_aux_losses: bool = False,
    ):
        """y (x's shape and dtype), and the router logits [T, E] (f32) when asked.

        `return_aux_losses=True` adds the step's load-balancing loss and router z-loss,
        moe.aux_loss of the router logits and the router's choices (0-d f32 tensors,
        `moe_mlir.aux_losses`): `y, lb, z` (or `y, logits, lb, z`). Their gradients
        (moe.aux_loss_grad) join the logits' gradient in the layer's backward, so
        `(loss + a * lb + b * z).backward()` reaches the router weight.


        Under `torch.autocast` (mixed precision: f32 parameters, the layer computed in the
        autocast dtype) x and the weights are cast to bf16 on CUDA, to f32 on the CPU, with
        autograd casts, so the f32 parameters get f32 gradients; y comes back in x's dtype.
        CUDA autocast to another dtype than bf16 raises TypeError."""
        weights = self.layer_weights()
        if not isinstance(hidden_states, torch.Tensor):
            raise TypeError(f"MoELayer expects a torch.Tensor, got {type(hidden_states).__name__}")
        autocast = _autocast_dtype(hidden_states.device) is not None
        self._check(hidden_states, weights, autocast)
        if self.expert_parallel:
            if return_aux_losses:
                raise NotImplementedError(
                    "MoELayer(ep_group=...): return_aux_losses is not supported (the stages "
                    "keep no router choices); apply moe_mlir.aux_losses.aux_losses to the "
                    "router logits and experts"
                )
            return self._ep_forward(hidden_states, weights, return_router_logits)
        shape, dtype = hidden_states.shape, hidden_states.dtype
        x = hidden_states.reshape(-1, self.config.hidden)
        compute = (
            GPU_DTYPE
            if x.device.type == "cuda"
            else (CPU_DTYPE if autocast or dtype != CPU_DTYPE else None)
        )
        if compute is not None:
            # Outside autocast's own region, so the casts are not themselves autocast.
            with torch.autocast(x.device.type, enabled=False):
                x = x.to(compute)
                # One copy per weight: the cast writes the contiguous layout the kernels read
                # (HF-shared weights arrive as transposed views).
                weights = {
                    n: (
                        w
                        if w is None or n == "router_bias"
                        else w.to(compute, memory_format=torch.contiguous_format)
                    )
                    for n, w in weights.items()
                }
        outs = layer_forward(
            self.spec_key,
            x.contiguous(),
            weights["w_router"].contiguous(),
            weights["router_bias"],
            weights["w_gate_up"].contiguous(),
            weights["w_down"].contiguous(),
            _contig(weights["shared_gate_up"]),
            _contig(weights["shared_down"]),
            _contig(weights.get("b_gate_up")),
            _contig(weights.get("b_down")),
        )
        if self.config.capacity_factor is not None:
            self.last_dropped = _dropped_pairs(outs[2:], x.shape[0], self.config)
        self._remember_routing(outs[1], weights["router_bias"], outs[2:])
        out = outs[0].to(dtype).reshape(shape)
        if return_aux_losses:
            lb, z = self._aux_losses(outs[1], weights["router_bias"], outs[2:])
            return (out, outs[1], lb, z) if return_router_logits else (out, lb, z)
        if return_router_logits:
            return out, outs[1]
        return out

    def _aux_losses(self, logits, bias, saved):
        """moe.aux_loss of the step: the router's choices from the forward's saved tensors."""
        from .aux_losses import layer_aux_losses  # noqa: PLC0415

        experts = _saved_router_experts(saved, logits.shape[0], self.config)
        if experts is None:
            from . import torch_reference as tr  # noqa: PLC0415

            c = self.config
            scores = tr.scores(logits.detach().float(), c.scoring)
            if bias is not None:
                scores = scores + bias.detach().float()[None, :]
            experts = tr.select_experts(scores, c.top_k, c.num_groups, c.topk_groups)
        return layer_aux_losses(logits, experts, self.config.scoring, self.spec_key)

    def _ep_forward(self, hidden_states, weights, return_router_logits: bool):
        """The expert-parallel layer: its stages on this rank, the rows moved between them by
        torch.distributed. CUDA: the sm_90a stages in bf16 (GPUEPLayer, NCCL); the CPU: the
        CPU path in f32 (EPLayer, gloo)."""
        from .cpu import tokens_within  # noqa: PLC0415

        shape, dtype = hidden_states.shape, hidden_states.dtype
        x = hidden_states.reshape(-1, self.config.hidden)
        bound = self.options.max_tokens
        tokens_within(x, bound)  # before anything compiles
        if x.device.type == "cuda":
            out, logits = self._ep_forward_cuda(x, weights)
        else:
            from .distributed import (  # noqa: PLC0415
                TorchExchange,
                ep_layer_apply,
                ep_layer_for,
            )

            layer = ep_layer_for(self.config, self.ep_spec, bound)
            x = x.float().contiguous()
            weights = {n: None if w is None else w.float().contiguous() for n, w in weights.items()}
            out, logits = ep_layer_apply(layer, TorchExchange(self.ep_group), x, weights)
            self.last_dropped = layer.dropped
        self._remember_routing(logits, weights["router_bias"], ())
        out = out.to(dtype).reshape(shape)
        return (out, logits) if return_router_logits else out

    def _ep_forward_cuda(self, x: torch.Tensor, weights):
        """The sm_90a stages of this rank (bf16) on torch's current stream, NCCL between them;
        `self.last_dropped` a CUDA int32 tensor [dispatches, ep_size] (no host read)."""
        if self.options.policy == "offload":
            raise NotImplementedError(
                "MoELayer(ep_group=...) on CUDA does not offload (policy='offload'): "
                "moe-compile offloads no tensor of an expert-parallel layer's stages; use "
                "policy='auto', 'keep' or 'recompute'"
            )
        kernel = gpu_ep_kernel(self.config, self.gpu_ep_options())
        current = torch.cuda.current_device()
        if x.device.index is not None and x.device.index != current:
            raise ValueError(
                f"MoELayer(ep_group=...): the input is on {x.device} but the current CUDA "
                f"device is cuda:{current}; the stages and NCCL run on the current device "
                f"(torch.cuda.set_device({x.device.index}))"
            )
        runner = kernel.layer()
        # Outside autocast's own region, so the casts are not themselves autocast.
        with torch.autocast("cuda", enabled=False):
            x = _aligned(x.to(GPU_DTYPE).contiguous())
            weights = {
                n: (
                    w
                    if w is None
                    else _aligned(w if n == "router_bias" else w.to(GPU_DTYPE).contiguous())
                )
                for n, w in weights.items()
            }
        out, logits = gpu_ep_apply(runner, self.ep_group, x, weights, kernel.arg_names)
        dropped = runner.dropped
        if isinstance(dropped, (list, tuple)):
            dropped = (
                torch.stack([d.reshape(-1) for d in dropped])
                if dropped
                else torch.zeros((0, self.ep_size), dtype=torch.int32, device=x.device)
            )
        self.last_dropped = dropped
        return out, logits

    def gpu_ep_options(self) -> cc.BuildOptions:
        """The build options of this expert-parallel layer's sm_90a entry (its EPSpec and
        bound): with `dataclasses.replace(config, tokens=max_tokens, dtype="bf16")` what the
        compile cache keys it by."""
        return dataclasses.replace(self.options, ep=self.ep_spec)

    def memory_plan(self, tokens: int, gpu_tflops: float = 780.0):
        """The activation memory plan of this layer for `tokens` tokens in bf16 (the GPU
        layer's types), as `moe-plan-activations` reports it: a `memory.ActivationPlan`
        (`.report()` for text)."""
        from .memory import plan_activations  # noqa: PLC0415

        cfg = dataclasses.replace(self.config, tokens=int(tokens), dtype="bf16")
        return plan_activations(cfg, self.options.memory_budget, self.options.policy, gpu_tflops)

    def compile_for(self, tokens: int, device="cpu") -> int:
        """Compiles (or loads from the cache) the layer that serves `tokens` tokens on
        `device` now, rather than at the first forward; returns its bound. On "cuda" it needs
        no GPU (the kernels are loaded at the first forward): the LLVM machine prebuilds the
        GPU machine's cache entries with it."""
        device = torch.device(device)
        if not self.expert_parallel:
            bound = kernel_for(self.spec_key, int(tokens), device).bound
            if device.type == "cuda" and cc.find_moe_compile() is not None:
                # return_aux_losses' function, at the layer's bound
                from .aux_losses import build_gpu_aux  # noqa: PLC0415

                c = self.config
                build_gpu_aux(c.experts, c.top_k, c.scoring, bound)
            return bound
        from .cpu import tokens_within  # noqa: PLC0415

        bound = self.options.max_tokens
        tokens_within(torch.empty(int(tokens), 0), bound)
        if device.type == "cuda":
            check_gpu_config(self.config)
            gpu_ep_kernel(self.config, self.gpu_ep_options())
        elif device.type == "cpu":
            from .distributed import ep_layer_for  # noqa: PLC0415

            ep_layer_for(self.config, self.ep_spec, bound)
        else:
            raise ValueError(f"moe_mlir runs layers on CUDA or the CPU, not on {device.type}")
        return bound


def _dropped_pairs(saved: Sequence[torch.Tensor], tokens, config: LayerConfig) -> torch.Tensor:
    """The (token, slot) pairs the capacity factor dropped: T * k - offsets[E], the pairs
    outside every expert's queue, from the saved dispatch results (token_ids [T * k],
    offsets [E + 1], rows [T, k], consecutive in both paths' saved tensors). A 0-d int64
    tensor on the layer's device (no host read)."""
    k, experts = config.top_k, config.experts
    for ids, offsets, rows in zip(saved, saved[1:], saved[2:]):
        if (
            ids.dtype == offsets.dtype == rows.dtype == torch.int32
            and tuple(ids.shape) == (tokens * k,)
            and tuple(offsets.shape) == (experts + 1,)
            and tuple(rows.shape) == (tokens, k)
        ):
            return tokens * k - offsets[experts].to(torch.int64)
    raise RuntimeError("moe_mlir: the layer's saved tensors hold no dispatch results")


def _saved_router_experts(saved: Sequence[torch.Tensor], tokens, config: LayerConfig):
    """The router's experts [T, k] (i32) among the forward's saved tensors: moe.router's
    weights [T, k] f32, experts [T, k] i32 and logits [T, E] f32, consecutive in both paths'
    saved sets; None where the forward did not save them."""
    k, experts = config.top_k, config.experts
    saved = list(saved)
    for w, e, logits in zip(saved, saved[1:], saved[2:]):
        if (
            w.dtype == torch.float32
            and e.dtype == torch.int32
            and logits.dtype == torch.float32
            and tuple(w.shape) == tuple(e.shape) == (tokens, k)
            and tuple(logits.shape) == (tokens, experts)
        ):
            return e.detach()
    return None


def _autocast_dtype(device: torch.device) -> Optional[torch.dtype]:
    """The autocast dtype of `device`'s type when autocast is on there, else None. CUDA
    autocast to another dtype than bf16 raises TypeError (the kernels are bf16)."""
    kind = device.type
    if kind not in ("cuda", "cpu") or not torch.is_autocast_enabled(kind):
        return None
    dtype = torch.get_autocast_dtype(kind)
    if kind == "cuda" and dtype != GPU_DTYPE:
        raise TypeError(
            f"MoELayer: torch.autocast('cuda', dtype={dtype}); the CUDA path runs "
            f"torch.bfloat16 only (use dtype=torch.bfloat16)"
        )
    return dtype


def _contig(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.contiguous()


# --------------------------------------------------------------------------- selection bias

BIAS_UPDATE_RULES = ("sign", "proportional")
_bias_update_functions: Dict[Tuple[int, int, float, str], object] = {}
_bias_update_lock = threading.Lock()


def _saved_dispatch(saved: Sequence[torch.Tensor], tokens, config: LayerConfig):
    """(offsets [E + 1], rows [T, k]) of the saved dispatch results (token_ids [T * k],
    offsets, rows: consecutive in both paths' saved tensors), or None where the forward did
    not save them."""
    k, experts = config.top_k, config.experts
    saved = list(saved)
    for ids, offsets, rows in zip(saved, saved[1:], saved[2:]):
        if (
            ids.dtype == offsets.dtype == rows.dtype == torch.int32
            and tuple(ids.shape) == (tokens * k,)
            and tuple(offsets.shape) == (experts + 1,)
            and tuple(rows.shape) == (tokens, k)
        ):
            return offsets.detach(), rows.detach()
    return None


def _experts_of_rows(offsets: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Each pair's expert from its expert-ordered row: e with offsets[e] <= row <
    offsets[e + 1]; -1 where the row is -1 (a dropped pair). int32 [T, k]."""
    flat = rows.reshape(-1).to(torch.int64)
    bounds = offsets[1:].to(torch.int64).contiguous()
    e = torch.searchsorted(bounds, flat, right=True)
    e = torch.where(flat >= 0, e, torch.full_like(e, -1))
    return e.to(torch.int32).reshape(rows.shape)


def _check_bias_update(rate, rule) -> float:
    if rule not in BIAS_UPDATE_RULES:
        raise ValueError(f"rule must be one of {BIAS_UPDATE_RULES}, got {rule!r}")
    if isinstance(rate, bool) or not isinstance(rate, (int, float)):
        raise ValueError(f"rate must be a positive finite number, got {rate!r}")
    rate = float(rate)
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a positive finite number, got {rate!r}")
    return rate


def _bias_update_mlir(E: int, k: int, rate: float, rule: str) -> str:
    """moe.update_selection_bias on a bias [E] and experts [?, k]; rate as its f64 bits."""
    bits = struct.unpack(">Q", struct.pack(">d", rate))[0]
    return (
        f"func.func @update_selection_bias(%b: tensor<{E}xf32>, %e: tensor<?x{k}xi32>)\n"
        f"    -> tensor<{E}xf32> {{\n"
        f"  %r = moe.update_selection_bias %b, %e {{rate = 0x{bits:016X} : f64, "
        f"rule = #moe.bias_update<{rule}>}}\n"
        f"      : tensor<{E}xf32>, tensor<?x{k}xi32> -> tensor<{E}xf32>\n"
        f"  return %r : tensor<{E}xf32>\n}}\n"
    )


def _compiled_bias_update(E: int, k: int, rate: float, rule: str):
    """The op through the CPU path (moe-opt, clang), compiled once per (E, k, rate, rule)."""
    key = (E, k, rate, rule)
    with _bias_update_lock:
        fn = _bias_update_functions.get(key)
        if fn is None:
            from . import cpu  # noqa: PLC0415

            fn = cpu.compile_function(_bias_update_mlir(E, k, rate, rule))
            _bias_update_functions[key] = fn
    return fn


def _torch_bias_update(bias: torch.Tensor, experts: torch.Tensor, rate: float, rule: str):
    """The op's rule in torch on the tensors' device: integer loads, then f32 arithmetic in
    the op's order (each step one IEEE operation, so it matches the op bitwise)."""
    E = bias.shape[0]
    flat = experts.reshape(-1).to(torch.int64)
    counted = flat[(flat >= 0) & (flat < E)]
    loads = torch.bincount(counted, minlength=E)[:E]
    total = loads.sum()
    diff = total - E * loads
    if rule == "sign":
        step = torch.sign(diff).to(torch.float32)
    else:
        step = diff.to(torch.float32) / total.to(torch.float32)
    moved = bias + step * float(np.float32(rate))
    return torch.where(total > 0, moved, bias)


_bias_update_warned = set()


def _cuda_bias_update(bias, experts, rate: float, rule: str, bound: Optional[int]):
    """The op on CUDA: the compiled sm_90a function, else (no compiled entry on this
    machine, or E past the contract's limit) the rule in torch, warning once per shape."""
    from . import selection_bias as sb  # noqa: PLC0415

    E, (T, k) = bias.shape[0], experts.shape
    if T == 0:  # nothing counted: the bias as it is (the entry points take T >= 1)
        return bias.clone()
    bound = sb.gpu_bound(T, bound)
    why = None
    try:
        entry = sb.build_gpu_selection_bias(E, k, rate, rule, bound)
    except (cc.NoCompilerError, NotImplementedError) as e:
        entry, why = None, str(e)
    if entry is not None:
        return sb.gpu_update(bias, experts, rate, rule, bound, entry)
    key = (E, k, rate, rule, bound)
    if key not in _bias_update_warned:
        _bias_update_warned.add(key)
        import warnings  # noqa: PLC0415

        warnings.warn(
            f"update_selection_bias: the compiled CUDA op is not available ({why}); running "
            f"the same rule in torch on the device",
            RuntimeWarning,
            stacklevel=3,
        )
    return _torch_bias_update(bias, experts, rate, rule)


def update_selection_bias(
    layer_or_bias,
    experts: Optional[torch.Tensor] = None,
    *,
    rate: float = 1e-3,
    rule: str = "sign",
) -> torch.Tensor:
    """Auxiliary-loss-free balancing (DeepSeek-V3): the selection bias moved by one step's
    expert loads, moe.update_selection_bias (docs/dialect.md). With load_e the entries of
    `experts` [T, k] equal to e (-1: none) and mean their sum / E, `rule="sign"` adds
    rate * sign(mean - load_e), `rule="proportional"` rate * (mean - load_e) / mean; no
    counted entry leaves the bias as it is.

    `layer_or_bias`: a MoELayer with router_bias, whose buffer is updated in place (and
    returned), `experts` defaulting to the layer's last_experts(); or a bias tensor [E]
    (f32), for which a new tensor is returned. CPU tensors run the op compiled through the
    CPU path; CUDA tensors the sm_90a op (moe_mlir.selection_bias: compiled by moe-compile at
    the layer's max_tokens, or T rounded up to a power of two, or found prebuilt), on torch's
    current stream. Where neither moe-compile nor a prebuilt entry exists (or E is past the
    GPU path's expert limit), CUDA tensors run the same rule in torch on the device (equal to
    the op bitwise) with a warning naming what to build."""
    rate = _check_bias_update(rate, rule)
    layer = layer_or_bias if isinstance(layer_or_bias, MoELayer) else None
    if layer is not None:
        bias = layer.router_bias
        if bias is None:
            raise ValueError(
                "update_selection_bias: the layer has no router_bias "
                "(LayerConfig(router_bias=True) gives one)"
            )
        if experts is None:
            experts = layer.last_experts()
    else:
        bias = layer_or_bias
        if experts is None:
            raise ValueError("update_selection_bias: pass the step's experts [T, k] with a bias")
    if not isinstance(bias, torch.Tensor) or bias.dim() != 1 or bias.dtype != torch.float32:
        raise ValueError(
            f"update_selection_bias: the bias must be a float32 tensor [E], got "
            f"{getattr(bias, 'dtype', type(bias).__name__)} {tuple(getattr(bias, 'shape', ()))}"
        )
    integers = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
    if not isinstance(experts, torch.Tensor) or experts.dim() != 2 or experts.dtype not in integers:
        raise ValueError(
            "update_selection_bias: experts must be an integer tensor [T, k], got "
            f"{getattr(experts, 'dtype', type(experts).__name__)} "
            f"{tuple(getattr(experts, 'shape', ()))}"
        )
    E, k = bias.shape[0], experts.shape[1]
    if E == 0 or k == 0:
        raise ValueError(f"update_selection_bias: needs E >= 1 and k >= 1, got E={E}, k={k}")
    if experts.device != bias.device:
        raise ValueError(
            f"update_selection_bias: experts on {experts.device}, the bias on {bias.device}"
        )
    if experts.numel() and (int(experts.min()) < -1 or int(experts.max()) >= E):
        raise ValueError(f"update_selection_bias: experts holds values outside [-1, {E})")
    with torch.no_grad():
        if bias.device.type == "cpu":
            fn = _compiled_bias_update(E, k, rate, rule)
            arrays = (bias.detach().contiguous().numpy(), experts.to(torch.int32).numpy())
            new = torch.from_numpy(fn(*arrays)[0])
        else:
            bound = None if layer is None else layer.options.max_tokens
            new = _cuda_bias_update(bias.detach(), experts, rate, rule, bound)
        if layer is None:
            return new
        bias.copy_(new)
    return bias
