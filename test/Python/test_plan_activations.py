"""moe-plan-activations and moe-offload on the CPU path: the same layer compiled with
policy=keep, recompute, offload and a mixed auto plan gives bitwise the same forward output and
gradients on random data; the recompute plan saves fewer tensors (no H) and the offload plan
sends H through host tensors (`!moe.host_tensor`, which the CPU path lowers to a copy into a
buffer of its own and a copy back)."""

import re

import numpy as np
import pytest

from moe_mlir import cpu
from moe_mlir.config import LayerConfig
from moe_mlir.mlir_text import layer_mlir

REQUIRED_PASSES = (
    "moe-lower-to-cpu-pipeline",
    "moe-generate-backward",
    "moe-plan-activations",
    "moe-offload",
)


@pytest.fixture(scope="module", autouse=True)
def _require_pipeline():
    ok, missing = cpu.moe_opt_has_passes(*REQUIRED_PASSES)
    if not ok:
        pytest.skip("moe-opt --help does not list " + ", ".join(f"--{m}" for m in missing))


CONFIG = LayerConfig(
    tokens=37, hidden=48, ffn=40, experts=5, top_k=2, renormalize=True, shared_ffn=24
)

# Every plan of CONFIG keeps x and the routing metadata (f32): x 37*48*4, weights, experts 37*2*4
# each, logits 37*5*4, token ids 74*4, offsets 6*4, rows 37*2*4.
COMMON_BYTES = 37 * 48 * 4 + 3 * 37 * 2 * 4 + 37 * 5 * 4 + 74 * 4 + 6 * 4

# The options of each plan. "mixed": both h must leave the device; at 1 TFLOP/s the routed
# experts' copies hide behind the shared expert after them, the shared expert's do not.
PLANS = {
    "keep": "policy=keep",
    "recompute": "policy=recompute",
    "offload": "policy=offload",
    "mixed": f"memory-budget={COMMON_BYTES} gpu-tflops=1",
}


class Layer:
    """A layer compiled with one activation plan: `forward(args)` -> (out, logits, saved),
    `backward(saved, d_out, d_logits)` -> gradients. The CPU path passes a `!moe.host_tensor`
    as the tensor it mirrors, so the signatures are read with that type in its place."""

    def __init__(self, plan):
        self.name = f"layer_{plan}"
        pre = (
            "--moe-decompose",
            f"--moe-plan-activations={PLANS[plan]} report=false",
            "--moe-generate-backward",
            "--moe-offload",
        )
        self.tensor_ir = cpu.run_opt(layer_mlir(CONFIG, self.name), pre)
        lowered = cpu.run_opt(self.tensor_ir, cpu.CPU_PIPELINE)
        self.module = cpu.CompiledModule(
            self.tensor_ir.replace("!moe.host_tensor<", "tensor<"), lowered, cpu.CpuModule(lowered)
        )
        fwd = self.module.signatures[f"{self.name}_forward"]
        self.num_saved = fwd.attr_int("moe.num_saved")
        self.plan = fwd.attr("moe.activation_plan")

    def saved(self):
        """(name, offloaded) of every saved argument of backward, in order."""
        bwd = re.search(rf"func\.func @{self.name}_backward\((.*?)\) ->", self.tensor_ir)
        return [
            (m.group(2) or m.group(3), m.group(1) is not None)
            for m in re.finditer(
                r'!moe\.host_tensor<[^>]*> \{(moe\.offloaded), moe\.saved = "([^"]+)"\}'
                r'|tensor<[^>]*> \{moe\.saved = "([^"]+)"\}',
                bwd.group(1),
            )
        ]

    def forward(self, args):
        res = self.module[f"{self.name}_forward"](*[args[n] for n in CONFIG.arg_names()])
        return res[0], res[1], list(res[2:])

    def backward(self, saved, d_out, d_logits):
        return self.module[f"{self.name}_backward"](*saved, d_out, d_logits)


@pytest.fixture(scope="module")
def layers():
    return {plan: Layer(plan) for plan in PLANS}


def random_inputs(seed):
    rng = np.random.default_rng(seed)
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
    return args, d_out, d_logits


def test_the_plans_save_what_they_say(layers):
    keep, recompute, offload, mixed = (layers[p] for p in ("keep", "recompute", "offload", "mixed"))
    assert (keep.plan, recompute.plan, offload.plan, mixed.plan) == (
        '"keep"',
        '"recompute"',
        '"offload"',
        '"partial"',
    )
    h = {"moe.expert_ffn.h", "moe.shared_expert.h"}
    assert {n for n, off in keep.saved() if off} == set()
    assert h <= {n for n, _ in keep.saved()}
    assert not h & {n for n, _ in recompute.saved()}
    assert recompute.num_saved == keep.num_saved - 2
    # Offload saves what keep saves, h through the host.
    assert [n for n, _ in offload.saved()] == [n for n, _ in keep.saved()]
    assert {n for n, off in offload.saved() if off} == h
    assert offload.tensor_ir.count("moe.offload %") == 2
    assert offload.tensor_ir.count("moe.prefetch %") == 2
    # Mixed: the routed experts' h offloaded, the shared expert's recomputed.
    assert {n for n, off in mixed.saved() if off} == {"moe.expert_ffn.h"}
    assert "moe.shared_expert.h" not in {n for n, _ in mixed.saved()}
    assert mixed.num_saved == keep.num_saved - 1


@pytest.mark.parametrize("seed", [3, 20240607])
def test_every_plan_is_bitwise_identical(layers, seed):
    args, d_out, d_logits = random_inputs(seed)
    results = {}
    for plan, layer in layers.items():
        out, logits, saved = layer.forward(dict(args))
        assert len(saved) == layer.num_saved
        grads = layer.backward(saved, d_out.copy(), d_logits.copy())
        results[plan] = (out, logits, grads, saved)
    k_out, k_logits, k_grads, k_saved = results["keep"]
    assert np.isfinite(k_out).all() and np.abs(k_out).sum() > 0
    assert len(k_grads) == 6
    for plan in ("recompute", "offload", "mixed"):
        out, logits, grads, _ = results[plan]
        assert out.tobytes() == k_out.tobytes(), plan
        assert logits.tobytes() == k_logits.tobytes(), plan
        assert len(grads) == len(k_grads), plan
        for i, (g, kg) in enumerate(zip(grads, k_grads)):
            assert g.dtype == kg.dtype and g.tobytes() == kg.tobytes(), (plan, i)
    # The host copies hold h itself: what offload hands to backward is what keep saves.
    o_saved = results["offload"][3]
    assert [a.tobytes() for a in o_saved] == [a.tobytes() for a in k_saved]


def test_offloaded_h_is_really_read_from_the_host_copy(layers):
    """Backward reads h from the host tensor it is given: zeroing that copy changes the
    gradients, so nothing reaches backward around it."""
    layer = layers["offload"]
    args, d_out, d_logits = random_inputs(5)
    _, _, saved = layer.forward(dict(args))
    grads = layer.backward(saved, d_out.copy(), d_logits.copy())
    index = [n for n, _ in layer.saved()].index("moe.expert_ffn.h")
    zeroed = list(saved)
    zeroed[index] = np.zeros_like(saved[index])
    changed = layer.backward(zeroed, d_out.copy(), d_logits.copy())
    assert any(a.tobytes() != b.tobytes() for a, b in zip(grads, changed))
    # The CPU path copies on the way out and back: a linalg.copy into a tensor of its own for
    # each moe.offload and moe.prefetch (two of each), which bufferization gives a buffer.
    linalg = cpu.run_opt(layer.tensor_ir, ("--convert-moe-to-linalg",))
    assert "moe.offload %" not in linalg and "moe.prefetch %" not in linalg
    assert len(re.findall(r"linalg\.copy ins\(%\S+ : tensor<", linalg)) == 4
