"""MLIR text of one MoE layer: a `func.func` with static shapes holding one `moe.layer`.

The syntax is that of examples/deepseek-v3.mlir and test/Dialect/MoE/ops.mlir.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Iterable, Optional, Sequence, Tuple

from .config import LayerConfig

if TYPE_CHECKING:
    from .distributed import EPSpec

__all__ = ["mlir_float", "tensor_type", "routing_attr", "layer_mlir", "aux_loss_mlir"]

# The arguments that hold one rank's experts in an expert-parallel layer.
_EXPERT_ARGS = ("w_gate_up", "w_down", "b_gate_up", "b_down")

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$.]*$")


def mlir_float(value: float) -> str:
    """A float literal MLIR parses: always with a decimal point (`2.5`, `1.0`, `1.0e-05`)."""
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"cannot write the non-finite float {value!r} as an MLIR literal")
    text = repr(v)  # shortest round-trip form
    mantissa, sep, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + (sep + exponent if sep else "")


def tensor_type(shape: Sequence[int], element: str) -> str:
    """`tensor<AxBxT>`; a negative size is dynamic (`?`)."""
    dims = "".join("?x" if int(s) < 0 else f"{int(s)}x" for s in shape)
    return f"tensor<{dims}{element}>"


def routing_attr(config: LayerConfig) -> str:
    """`#moe.routing<...>`, defaults elided as moe-opt prints it."""
    parts = [f"scoring = {config.scoring}", f"top_k = {config.top_k}"]
    if config.renormalize:
        parts.append("renormalize = true")
    if config.num_groups != 1:
        parts.append(f"num_groups = {config.num_groups}")
    if config.topk_groups != 1:
        parts.append(f"topk_groups = {config.topk_groups}")
    if float(config.scaling_factor) != 1.0:
        parts.append(f"scaling_factor = {mlir_float(config.scaling_factor)}")
    if config.round_logits:
        parts.append("round_logits = true")
    return "#moe.routing<" + ", ".join(parts) + ">"


def _types(specs: Iterable[Tuple[str, Tuple[int, ...], str]]):
    return [tensor_type(shape, elem) for _, shape, elem in specs]


def layer_mlir(
    config: LayerConfig,
    name: str = "moe_layer",
    max_tokens: Optional[int] = None,
    ep: Optional["EPSpec"] = None,
) -> str:
    """`func.func @<name>(x, w_router, [router_bias], w_gate_up, w_down,
    [shared_gate_up, shared_down], [b_gate_up, b_down]) -> (out, logits)` with one
    `moe.layer`. With `max_tokens` the token count is dynamic (`?`) up to that bound,
    `config.tokens` unused. With `ep` (`moe_mlir.distributed.EPSpec`) the layer is
    expert-parallel: w_gate_up and w_down (and the expert biases) hold one rank's
    `experts / ep.size` experts (docs/distributed.md)."""
    config.validate()
    if ep is not None:
        ep.validate(config)
    if not _NAME_RE.match(name):
        raise ValueError(f"invalid function name {name!r}")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")

    def tokens_dynamic(specs):
        if max_tokens is None:
            return specs
        return [(n, (-1, *shape[1:]), e) for n, shape, e in specs]

    args = config.arg_specs()
    if ep is not None:  # one rank's experts
        local = config.experts // ep.size
        args = [(n, (local, *shape[1:]) if n in _EXPERT_ARGS else shape, e) for n, shape, e in args]
    types = {arg: tensor_type(shape, elem) for arg, shape, elem in args}
    if max_tokens is not None:
        (x_name, x_shape, x_elem) = next(a for a in args if a[0] == "x")
        types["x"] = tensor_type((-1, *x_shape[1:]), x_elem)
    out_t, logits_t = _types(tokens_dynamic(config.result_specs()))
    params = ",\n    ".join(f"%{arg}: {types[arg]}" for arg, _, _ in args)

    attrs = [f"activation = #moe.activation<{config.activation}>"]
    if max_tokens is not None:
        attrs.append(f"max_tokens = {max_tokens}")
    if config.capacity_factor is not None:
        attrs.append(f"capacity_factor = {mlir_float(config.capacity_factor)} : f64")
    if ep is not None:
        attrs.append(f"ep_size = {ep.size}")
        attrs.append(f"ep_capacity = {ep.capacity}")
        attrs.append(f"ep_overflow = #moe.ep_overflow<{ep.overflow}>")
        if ep.chunk_tokens is not None:
            if max_tokens is None:
                raise ValueError(
                    "EPSpec.chunk_tokens needs max_tokens: a chunked layer's T is dynamic"
                )
            if ep.chunk_tokens > max_tokens:
                raise ValueError(
                    f"EPSpec.chunk_tokens ({ep.chunk_tokens}) is more than max_tokens "
                    f"({max_tokens}): a chunk is part of a step"
                )
            attrs.append(f"ep_chunk_tokens = {ep.chunk_tokens}")
    attrs.append(f"routing = {routing_attr(config)}")

    operands = "%x, %w_router, %w_gate_up, %w_down"
    extras = ""
    if config.router_bias:
        extras += f"\n      bias(%router_bias : {types['router_bias']})"
    if config.has_shared:
        extras += (
            f"\n      shared(%shared_gate_up, %shared_down : "
            f"{types['shared_gate_up']}, {types['shared_down']})"
        )
    if config.expert_bias:
        extras += (
            f"\n      expert_bias(%b_gate_up, %b_down : {types['b_gate_up']}, {types['b_down']})"
        )
    main_types = ", ".join(types[a] for a in ("x", "w_router", "w_gate_up", "w_down"))
    return (
        f"func.func @{name}(\n    {params})\n    -> ({out_t}, {logits_t}) {{\n"
        f"  %out, %logits = moe.layer {operands}{extras}\n"
        f"      {{{', '.join(attrs)}}}\n"
        f"      : {main_types} -> {out_t}, {logits_t}\n"
        f"  return %out, %logits : {out_t}, {logits_t}\n"
        f"}}\n"
    )


def aux_loss_mlir(
    experts: int,
    top_k: int,
    scoring: str,
    name: str = "aux_loss",
    max_tokens: Optional[int] = None,
    grad: bool = True,
) -> str:
    """`func.func @<name>(logits [?, E] f32, experts [?, k] i32) -> (load_balance, z_loss)`
    (0-d f32) with one `moe.aux_loss`; with `grad`, `@<name>_grad(logits, experts,
    d_load_balance, d_z_loss) -> d_logits` with its `moe.aux_loss_grad` (the CPU path). T is
    dynamic; `max_tokens` bounds it (`moe.max_tokens`, what moe-compile needs; it derives the
    backward itself, so give `grad=False` there)."""
    LayerConfig(0, 1, 1, experts, top_k, scoring=scoring).validate()
    if not _NAME_RE.match(name):
        raise ValueError(f"invalid function name {name!r}")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    lt = tensor_type((-1, experts), "f32")
    et = tensor_type((-1, top_k), "i32")
    attr = f"{{scoring = #moe.scoring<{scoring}>}}"
    bound = "" if max_tokens is None else f" attributes {{moe.max_tokens = {max_tokens} : i64}}"
    text = (
        f"func.func @{name}(%logits: {lt}, %experts: {et})\n"
        f"    -> (tensor<f32>, tensor<f32>){bound} {{\n"
        f"  %lb, %z = moe.aux_loss %logits, %experts {attr}\n"
        f"      : {lt}, {et} -> tensor<f32>, tensor<f32>\n"
        f"  return %lb, %z : tensor<f32>, tensor<f32>\n}}\n"
    )
    if grad:
        text += (
            f"func.func @{name}_grad(%logits: {lt}, %experts: {et},\n"
            f"    %d_lb: tensor<f32>, %d_z: tensor<f32>) -> {lt}{bound} {{\n"
            f"  %d = moe.aux_loss_grad %logits, %experts, %d_lb, %d_z {attr}\n"
            f"      : {lt}, {et}, tensor<f32>, tensor<f32> -> {lt}\n"
            f"  return %d : {lt}\n}}\n"
        )
    return text
