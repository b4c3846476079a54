"""torch_reference with a capacity factor against the NumPy reference (docs/cpu-path.md §2):
each expert keeps its first ceil(capacity_factor * T * k / E) pairs in token order, the
dropped pairs add nothing and get no gradient; on skewed routing, where many pairs drop, and
with forced routing decisions (what the GPU checks pass). Runs on the CPU."""

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from moe_mlir import reference as R  # noqa: E402
from moe_mlir import torch_reference as TR  # noqa: E402
from moe_mlir.config import LayerConfig  # noqa: E402

CONFIGS = {
    "swiglu-0.75": LayerConfig(37, 32, 24, 8, 2, capacity_factor=0.75),
    "gelu-tanh-renorm-0.5": LayerConfig(
        29, 16, 8, 4, 2, renormalize=True, activation="gelu_tanh", capacity_factor=0.5
    ),
    "sigmoid-bias-shared-silu-1.0": LayerConfig(
        41,
        16,
        8,
        8,
        3,
        scoring="sigmoid",
        router_bias=True,
        renormalize=True,
        shared_ffn=16,
        activation="silu",
        capacity_factor=1.0,
    ),
}


def rel(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def skewed_layer(cfg, seed):
    """Random weights with half the experts' router columns raised: most pairs go there."""
    rng = np.random.default_rng(seed)
    arrays = {
        name: rng.standard_normal(shape) * (1.0 if name == "x" else 0.3)
        for name, shape, _ in cfg.arg_specs()
    }
    arrays["w_router"][:, ::2] += 0.6 * np.sign(arrays["x"].sum(0))[:, None]
    return arrays


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_capacity_matches_numpy_reference(name):
    cfg = CONFIGS[name]
    arrays = skewed_layer(cfg, 3)
    out, logits, cache = R.layer_forward(cfg, **arrays)
    dropped = int((cache.rows < 0).sum())
    assert dropped > 0, "the routing must drop pairs"
    rng = np.random.default_rng(4)
    d_out = rng.standard_normal(out.shape)
    d_logits = rng.standard_normal(logits.shape)
    grads = R.layer_backward(cfg, cache, d_out, d_logits)
    tensors = {k: torch.tensor(v) for k, v in arrays.items()}
    ref, tgrads = TR.forward_backward(cfg, tensors, torch.tensor(d_out), torch.tensor(d_logits))
    assert np.array_equal(ref.experts.numpy(), cache.experts)
    assert rel(ref.out.detach().numpy(), out) < 1e-5
    for gname, g in zip(R.layer_gradient_names(cfg), grads):
        assert rel(tgrads[gname].numpy(), g) < 1e-5, gname
    # Forced experts (the GPU checks' way) drop the same pairs.
    forced = TR.forward(cfg, tensors, experts=torch.tensor(cache.experts))
    assert torch.equal(forced.out, ref.out)
    # And the drops matter: the dropless layer differs.
    dropless = TR.forward(dataclasses.replace(cfg, capacity_factor=None), tensors)
    assert rel(dropless.out.detach().numpy(), out) > 1e-3


def test_capacity_of_a_dynamic_call_follows_its_tokens():
    """A layer of dynamic T computes its capacity from the call's T: the reference's config
    carries that T (dataclasses.replace(cfg, tokens=T)), as the GPU checks give it."""
    cfg = LayerConfig(64, 16, 8, 4, 2, capacity_factor=0.75)
    for T in (1, 13, 64):
        c = dataclasses.replace(cfg, tokens=T)
        arrays = skewed_layer(c, T)
        out, _, cache = R.layer_forward(c, **arrays)
        ref = TR.forward(c, {k: torch.tensor(v) for k, v in arrays.items()})
        assert rel(ref.out.detach().numpy(), out) < 1e-5
        assert int((cache.rows >= 0).sum()) <= c.capacity * c.experts


def test_capacity_layer_check_on_the_stand_in(tmp_path, monkeypatch):
    """test/GPU/capacity_layer_check.py's whole path (the capacity at each T, forward, backward
    twice, the reference with drops, gradients by the manifest's names) on bench/emulate.py's
    stand-in, given the drops: every check passes and skewed routing drops pairs; a stand-in
    that drops nothing fails it."""
    import json
    import os

    from moe_mlir import compile_cache as cc

    if cc.find_moe_compile() is None:
        pytest.skip("no moe-compile")
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    for sub in ("bench", os.path.join("test", "GPU")):
        monkeypatch.syspath_prepend(os.path.join(root, sub))
    monkeypatch.setenv("MOE_MLIR_CACHE", str(tmp_path / "cache"))
    import capacity_layer_check as clc
    import emulate

    cfg = LayerConfig(64, 128, 128, 8, 2, capacity_factor=0.75, dtype="bf16")
    entry = cc.build_gpu_entry(cfg, cc.BuildOptions(max_tokens=64))
    prefix = str(tmp_path / "capacity-dyn")
    os.symlink(entry.path / f"{entry.name}.json", f"{prefix}.json")
    out = tmp_path / "rows.json"
    argv = ["--emulate", "--layer", prefix, "--capacity-factor", "0.75", "--json", str(out)]
    assert clc.main(argv) == 0
    rows = json.loads(out.read_text())
    assert sorted({(r["T"], r["routing"]) for r in rows}) == sorted(
        (T, r) for T in (1, 37, 64) for r in ("random", "all-to-one", "skewed")
    )
    assert all(r["dropped"] > 0 for r in rows if r["T"] > 1 and r["routing"] == "skewed")
    assert all(v < 4e-3 for r in rows for v in r["rel_error"].values())  # bf16 outputs

    call = emulate.EmulatedLayer._call

    def dropless(self, kind, ep, tensors, device, tokens=None):
        self.cfg = dataclasses.replace(self.cfg, capacity_factor=None)
        return call(self, kind, ep, tensors, device, tokens)

    monkeypatch.setattr(emulate.EmulatedLayer, "_call", dropless)
    assert clc.main(argv + ["--tokens", "37", "--routing", "skewed"]) == 1
