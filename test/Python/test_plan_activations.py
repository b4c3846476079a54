"""moe-plan-activations on the CPU path: the same layer compiled with policy=keep and
policy=recompute gives bitwise the same forward output and gradients, and the recompute plan
saves fewer tensors (no H)."""

import re

import numpy as np
import pytest

from moe_mlir import cpu
from moe_mlir.config import LayerConfig

REQUIRED_PASSES = ("moe-lower-to-cpu-pipeline", "moe-generate-backward", "moe-plan-activations")


@pytest.fixture(scope="module", autouse=True)
def _require_pipeline():
    ok, missing = cpu.moe_opt_has_passes(*REQUIRED_PASSES)
    if not ok:
        pytest.skip("moe-opt --help does not list " + ", ".join(f"--{m}" for m in missing))


CONFIG = LayerConfig(tokens=37, hidden=48, ffn=40, experts=5, top_k=2, renormalize=True,
                     shared_ffn=24)


def compile_with(policy):
    pre = ("--moe-decompose", f"--moe-plan-activations=policy={policy} report=false",
           "--moe-generate-backward")
    return cpu.CompiledLayer(CONFIG, f"layer_{policy}", pre_passes=pre)


def saved_names(layer):
    return re.findall(r'moe\.saved = "([^"]+)"', layer.module.tensor_ir)


def test_keep_and_recompute_are_bitwise_identical():
    keep, recompute = compile_with("keep"), compile_with("recompute")
    assert "moe.expert_ffn.h" in saved_names(keep)
    assert "moe.shared_expert.h" in saved_names(keep)
    assert "moe.expert_ffn.h" not in saved_names(recompute)
    assert "moe.shared_expert.h" not in saved_names(recompute)
    assert recompute.num_saved == keep.num_saved - 2

    rng = np.random.default_rng(3)
    args = {
        "x": rng.standard_normal((37, 48)),
        "w_router": rng.standard_normal((48, 5)) / 7,
        "w_gate_up": rng.standard_normal((5, 48, 80)) / 7,
        "w_down": rng.standard_normal((5, 40, 48)) / 6,
        "shared_gate_up": rng.standard_normal((48, 48)) / 7,
        "shared_down": rng.standard_normal((24, 48)) / 5,
    }
    args = {k: v.astype(np.float32) for k, v in args.items()}
    assert set(args) == set(CONFIG.arg_names())
    d_out = rng.standard_normal((37, 48)).astype(np.float32)
    d_logits = rng.standard_normal((37, 5)).astype(np.float32)

    results = {}
    for name, layer in (("keep", keep), ("recompute", recompute)):
        out, logits, saved = layer.forward(dict(args))
        assert len(saved) == layer.num_saved
        grads = layer.backward(saved, d_out.copy(), d_logits.copy())
        results[name] = (out, logits, grads)
    (k_out, k_logits, k_grads), (r_out, r_logits, r_grads) = results["keep"], results["recompute"]
    assert k_out.tobytes() == r_out.tobytes()
    assert k_logits.tobytes() == r_logits.tobytes()
    assert list(k_grads) == list(r_grads) and len(k_grads) == 6
    for gname in k_grads:
        assert k_grads[gname].dtype == r_grads[gname].dtype
        assert k_grads[gname].tobytes() == r_grads[gname].tobytes(), gname
    assert np.isfinite(k_out).all() and np.abs(k_out).sum() > 0
