"""A stand-in for a compiled layer, for dry runs of check_layer.py and bench.py without a GPU.

`manifest_for(config, name)` writes the manifest moe-compile would (docs/gpu-path.md §2, the
saved set of moe-generate-backward); `EmulatedLayer` offers CompiledLayer's interface and
computes with the fp32 torch reference, rounding outputs and gradients to the manifest's
dtypes. It checks the scripts' plumbing (names, shapes, routing variants, comparisons), never
our kernels.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, Mapping

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

from moe_mlir import gpu  # noqa: E402
from moe_mlir import torch_reference as TR  # noqa: E402
from moe_mlir.config import LayerConfig  # noqa: E402


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
    bwd = [dict(p, role="saved", forward_param=p["name"]) for p in inputs]
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
            "inputs": {a: f"arg{i}" for i, (a, _, _) in enumerate(args)},
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
        self.cfg = TR.config_from_manifest(self.manifest.layer)

    def workspace_bytes(self, kind: str = "forward"):
        return 0

    def _named(self, tensors: Mapping[str, Any]) -> Dict[str, Any]:
        return {a: tensors[p] for a, p in self.manifest.input_names.items()}

    def _call(self, kind, ep, tensors, device, tokens=None):
        import torch

        cfg = self.cfg
        if kind == "forward":
            ref = TR.forward(cfg, self._named(tensors), requires_grad=False)
            tensors["result0"].copy_(ref.out)
            tensors["result1"].copy_(ref.logits)
            experts = ref.experts
            tensors["moe.router.weights"].copy_(ref.weights)
            tensors["moe.router.experts"].copy_(experts)
            tensors["moe.router.logits"].copy_(ref.logits)
            counts = torch.bincount(experts.flatten(), minlength=cfg.experts)
            offsets = torch.zeros(cfg.experts + 1, dtype=torch.long)
            offsets[1:] = torch.cumsum(counts.cpu(), 0)
            tensors["moe.dispatch.offsets"].copy_(offsets)
            for name in (
                "moe.dispatch.token_ids",
                "moe.dispatch.rows",
                "moe.expert_ffn.h",
                "moe.shared_expert.h",
            ):
                if name in tensors:
                    tensors[name].zero_()  # not needed by the emulated backward
            return
        named = self._named(tensors)
        _, grads = TR.forward_backward(
            cfg,
            named,
            tensors["d_result0"],
            tensors["d_result1"],
            experts=tensors["moe.router.experts"],
        )
        for spec in ep.by_role("gradient"):
            arg = self.input_name(spec.of)
            tensors[spec.name].copy_(grads[TR.INPUT_ALIASES.get(arg, arg)])
