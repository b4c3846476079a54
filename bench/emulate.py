"""A stand-in for a compiled layer, for dry runs of check_layer.py and bench.py without a GPU.

`manifest_for(config, name)` writes the manifest moe-compile would (docs/gpu-path.md §2, the
saved set of moe-generate-backward: the backward takes no router selection bias, which has no
gradient); `EmulatedLayer` offers CompiledLayer's interface on any manifest moe-compile writes
(router bias, shared expert, expert biases, every activation, a dynamic token count, host
saved tensors) and computes with the fp32 torch reference, rounding outputs and gradients to
the manifest's dtypes. It checks the scripts' plumbing (names, shapes, routing variants,
comparisons), never our kernels.

The manifest carries no capacity factor: the stand-in is dropless unless its "layer" object
has "capacity_factor" or the caller sets `layer.cfg` (test/GPU/capacity_layer_check.py does).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Dict, Mapping

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

from moe_mlir import gpu  # noqa: E402
from moe_mlir import torch_reference as TR  # noqa: E402
from moe_mlir.config import LayerConfig  # noqa: E402


# moe-compile's names of the layer's arguments in the manifest's "inputs" (the others are
# LayerConfig's).
COMPILE_NAMES = {
    "router_bias": "bias",
    "shared_gate_up": "shared_w_gate_up",
    "shared_down": "shared_w_down",
}


def manifest_for(cfg: LayerConfig, name: str) -> Dict[str, Any]:
    T, d, n, E, k = cfg.tokens, cfg.hidden, cfg.ffn, cfg.experts, cfg.top_k
    R = T * k
    args = cfg.arg_specs()
    inputs = [
        {"name": f"arg{i}", "role": "input", "dtype": dt, "shape": list(shape)}
        for i, (_, shape, dt) in enumerate(args)
    ]
    saved = [
        ("moe.router.weights", "f32", [T, k]),
        ("moe.router.experts", "i32", [T, k]),
        ("moe.router.logits", "f32", [T, E]),
        ("moe.dispatch.token_ids", "i32", [R]),
        ("moe.dispatch.offsets", "i32", [E + 1]),
        ("moe.dispatch.rows", "i32", [T, k]),
        ("moe.expert_ffn.h", cfg.dtype, [R, cfg.gate_up_width]),
    ]
    if cfg.has_shared:
        saved.append(("moe.shared_expert.h", cfg.dtype, [T, cfg.shared_gate_up_width]))
    fwd = (
        inputs
        + [
            {"name": "result0", "role": "output", "dtype": cfg.dtype, "shape": [T, d]},
            {"name": "result1", "role": "output", "dtype": "f32", "shape": [T, E]},
        ]
        + [{"name": s, "role": "saved", "dtype": dt, "shape": sh} for s, dt, sh in saved]
    )
    # The router bias only picks experts, which the backward takes saved.
    bwd = [
        dict(p, role="saved", forward_param=p["name"])
        for p, (a, _, _) in zip(inputs, args)
        if a != "router_bias"
    ]
    bwd += [
        {"name": s, "role": "saved", "forward_param": s, "dtype": dt, "shape": sh}
        for s, dt, sh in saved
    ]
    bwd += [
        {
            "name": "d_result0",
            "role": "cotangent",
            "of": "result0",
            "dtype": cfg.dtype,
            "shape": [T, d],
        },
        {
            "name": "d_result1",
            "role": "cotangent",
            "of": "result1",
            "dtype": "f32",
            "shape": [T, E],
        },
    ]
    bwd += [
        {
            "name": f"d_arg{i}",
            "role": "gradient",
            "of": f"arg{i}",
            "dtype": dt,
            "shape": list(shape),
        }
        for i, (a, shape, dt) in enumerate(args)
        if a != "router_bias"
    ]
    return {
        "name": name,
        "chip": "sm_90a",
        "compiler": "emulate.py",
        "layer": {
            "T": T,
            "d": d,
            "n": n,
            "E": E,
            "k": k,
            "activation": cfg.activation,
            "scoring": cfg.scoring,
            "renormalize": cfg.renormalize,
            "num_groups": cfg.num_groups,
            "topk_groups": cfg.topk_groups,
            "scaling_factor": cfg.scaling_factor,
            "round_logits": cfg.round_logits,
            "has_bias": cfg.router_bias,
            "shared_n": cfg.shared_ffn,
            "expert_bias": cfg.expert_bias,
            "inputs": {COMPILE_NAMES.get(a, a): f"arg{i}" for i, (a, _, _) in enumerate(args)},
        },
        "entry_points": {
            "forward": {
                "symbol": f"{name}_forward",
                "workspace_symbol": f"{name}_forward_workspace_bytes",
                "params": fwd,
            },
            "backward": {
                "symbol": f"{name}_backward",
                "workspace_symbol": f"{name}_backward_workspace_bytes",
                "params": bwd,
            },
        },
    }


def write_layer(cfg: LayerConfig, path_prefix: str) -> str:
    """Writes PREFIX.json for `cfg`; returns PREFIX."""
    os.makedirs(os.path.dirname(path_prefix) or ".", exist_ok=True)
    with open(path_prefix + ".json", "w", encoding="utf-8") as f:
        json.dump(manifest_for(cfg, os.path.basename(path_prefix)), f, indent=1)
    return path_prefix


class EmulatedLayer(gpu.CompiledLayer):
    """CompiledLayer's interface on the torch reference (CPU or GPU tensors)."""

    def __init__(self, so_path, manifest_path=None, *, require_cuda: bool = False):
        if manifest_path is None:
            manifest_path = os.path.splitext(so_path)[0] + ".json"
        super().__init__(None, manifest_path, require_cuda=require_cuda)
        # The config the stand-in computes with; T follows each call of a dynamic layer.
        self.cfg = TR.config_from_manifest(self.manifest.layer)
        capacity_factor = self.manifest.layer.get("capacity_factor")
        if capacity_factor is not None:
            self.cfg = dataclasses.replace(
                self.cfg, capacity_factor=float(capacity_factor)
            ).validate()

    def workspace_bytes(self, kind: str = "forward", tokens=None):
        return 0

    def _named(self, tensors: Mapping[str, Any]) -> Dict[str, Any]:
        return {a: tensors[p] for a, p in self.manifest.input_names.items() if p in tensors}

    def _config(self, tokens) -> LayerConfig:
        if tokens is None or tokens == self.cfg.tokens:
            return self.cfg
        return dataclasses.replace(self.cfg, tokens=int(tokens))

    def _call(self, kind, ep, tensors, device, tokens=None):
        import torch

        cfg = self._config(tokens)
        if kind == "forward":
            ref = TR.forward(cfg, self._named(tensors), requires_grad=False)
            tensors["result0"].copy_(ref.out)
            tensors["result1"].copy_(ref.logits)
            saved = {
                "moe.router.weights": ref.weights,
                "moe.router.experts": ref.experts,
                "moe.router.logits": ref.logits,
            }
            saved.update(_dispatch(cfg, ref.experts))
            for spec in ep.by_role("saved"):
                if spec.name in saved:
                    tensors[spec.name].copy_(saved[spec.name])
                else:  # H of the experts (not needed by the emulated backward)
                    tensors[spec.name].zero_()
            return
        named = TR.canonical_inputs(self._named(tensors))
        if cfg.router_bias and "router_bias" not in named:
            # The backward takes no selection bias: it only picks experts, which are forced.
            x = named["x"]
            named["router_bias"] = torch.zeros(cfg.experts, dtype=torch.float32, device=x.device)
        missing = [a for a in cfg.arg_names() if a not in named]
        if missing:
            raise ValueError(f"{ep.symbol}: the backward takes no {', '.join(missing)}")
        experts = tensors.get("moe.router.experts")
        if experts is None:
            raise ValueError(f"{ep.symbol}: the backward takes no saved moe.router.experts")
        _, grads = TR.forward_backward(
            cfg,
            named,
            tensors["d_result0"],
            tensors.get("d_result1"),
            experts=experts,
        )
        for spec in ep.by_role("gradient"):
            arg = self.input_name(spec.of or spec.name[2:])
            tensors[spec.name].copy_(grads[TR.INPUT_ALIASES.get(arg, arg)])


def _dispatch(cfg: LayerConfig, experts) -> Dict[str, Any]:
    """The saved dispatch as moe.dispatch lays it out: each expert's pairs in (t, j) order,
    the first `cfg.capacity` kept (offsets count kept pairs), a dropped pair's row -1, rows
    past offsets[E] token 0."""
    import torch

    T, k, E = experts.shape[0], experts.shape[1], cfg.experts
    flat = experts.reshape(-1).long().cpu()
    R = flat.numel()
    counts = torch.bincount(flat, minlength=E)[:E]
    first = torch.cumsum(counts, 0) - counts
    order = torch.sort(flat, stable=True).indices
    rank = torch.empty(R, dtype=torch.long)
    rank[order] = torch.arange(R) - first[flat[order]]
    capacity = cfg.capacity if cfg.capacity_factor is not None else R
    kept = rank < capacity
    offsets = torch.zeros(E + 1, dtype=torch.long)
    offsets[1:] = torch.cumsum(counts.clamp(max=capacity), 0)
    rows = torch.where(kept, offsets[flat] + rank, torch.full_like(rank, -1))
    token_ids = torch.zeros(R, dtype=torch.long)
    token_ids[rows[kept]] = torch.arange(R)[kept] // max(k, 1)
    return {
        "moe.dispatch.offsets": offsets,
        "moe.dispatch.rows": rows.view(T, k),
        "moe.dispatch.token_ids": token_ids,
    }
