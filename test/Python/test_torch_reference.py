"""python/moe_mlir/torch_reference.py against the NumPy reference (docs/cpu-path.md §2).

Skipped without torch (CI has none); runs on the CPU.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from moe_mlir import reference as R  # noqa: E402
from moe_mlir import torch_reference as TR  # noqa: E402
from moe_mlir.config import LayerConfig  # noqa: E402

CONFIGS = {
    "softmax-renorm": LayerConfig(37, 48, 40, 5, 2, renormalize=True),
    "softmax-k=E": LayerConfig(1, 48, 40, 5, 5),
    "softmax-k=1": LayerConfig(20, 16, 8, 4, 1),
    "sigmoid-groups-shared": LayerConfig(
        37,
        48,
        40,
        16,
        4,
        scoring="sigmoid",
        router_bias=True,
        num_groups=4,
        topk_groups=2,
        scaling_factor=2.5,
        renormalize=True,
        shared_ffn=24,
    ),
    "sigmoid-plain": LayerConfig(11, 16, 8, 6, 3, scoring="sigmoid"),
    "gelu": LayerConfig(20, 16, 8, 4, 2, activation="gelu"),
    "silu": LayerConfig(20, 16, 8, 4, 2, activation="silu"),
    "gelu_tanh": LayerConfig(20, 16, 8, 4, 2, activation="gelu_tanh"),
}


def rel(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def random_layer(cfg, seed=0):
    rng = np.random.default_rng(seed)
    return {
        name: rng.standard_normal(shape) * (1.0 if name == "x" else 0.3)
        for name, shape, _ in cfg.arg_specs()
    }


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_matches_numpy_reference(name):
    cfg = CONFIGS[name]
    arrays = random_layer(cfg)
    out, logits, cache = R.layer_forward(cfg, **arrays)
    rng = np.random.default_rng(1)
    d_out = rng.standard_normal(out.shape)
    d_logits = rng.standard_normal(logits.shape)
    grads = R.layer_backward(cfg, cache, d_out, d_logits)
    ref, tgrads = TR.forward_backward(
        cfg,
        {k: torch.tensor(v) for k, v in arrays.items()},
        torch.tensor(d_out),
        torch.tensor(d_logits),
    )
    assert np.array_equal(ref.experts.numpy(), cache.experts)
    assert rel(ref.out.detach().numpy(), out) < 1e-5
    assert rel(ref.logits.detach().numpy(), logits) < 1e-5
    assert rel(ref.weights.detach().numpy(), cache.weights) < 1e-5
    assert "router_bias" not in tgrads
    for gname, g in zip(R.layer_gradient_names(cfg), grads):
        assert rel(tgrads[gname].numpy(), g) < 1e-5, gname


def test_forced_experts_are_used():
    cfg = CONFIGS["softmax-renorm"]
    arrays = {k: torch.tensor(v) for k, v in random_layer(cfg).items()}
    forced = torch.tensor([[(t + 1) % 5, (t + 3) % 5] for t in range(cfg.tokens)])
    ref = TR.forward(cfg, arrays, experts=forced)
    assert torch.equal(ref.experts, forced)
    # The NumPy path with the same experts: router weights from those picks, then the rest.
    x = arrays["x"].double().numpy()
    logits = x @ arrays["w_router"].double().numpy()
    s = R.scores(logits, "softmax")
    u = np.take_along_axis(s, forced.numpy(), axis=1)
    w = u / u.sum(axis=1, keepdims=True)
    tok, off, rows = R.dispatch(forced.numpy(), cfg.experts)
    y, _ = R.expert_ffn(
        x,
        tok,
        off,
        arrays["w_gate_up"].double().numpy(),
        arrays["w_down"].double().numpy(),
        "swiglu",
    )
    assert rel(ref.out.detach().numpy(), R.combine(y, w, rows)) < 1e-5


def test_forced_experts_are_checked():
    cfg = CONFIGS["softmax-renorm"]
    arrays = {k: torch.tensor(v) for k, v in random_layer(cfg).items()}
    with pytest.raises(ValueError, match="expected"):
        TR.forward(cfg, arrays, experts=torch.zeros(cfg.tokens, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="outside"):
        TR.forward(cfg, arrays, experts=torch.full((cfg.tokens, 2), 5))


def test_tie_and_nan_rules():
    # Ties go to the lower index; NaN loses to every number; all-NaN picks the first.
    c = torch.tensor(
        [[0.5, 0.5, 0.1, 0.5], [float("nan"), 0.2, float("nan"), 0.3], [float("nan")] * 4]
    )
    picks = TR.select_experts(c, 2)
    assert picks.tolist() == [[0, 1], [3, 1], [0, 1]]
    assert np.array_equal(picks.numpy(), R.select_experts(c.numpy(), 2))


def test_group_selection_matches_numpy():
    rng = np.random.default_rng(3)
    c = rng.standard_normal((64, 16)).astype(np.float32)
    c[5, :] = 0.25  # all tied
    c[6, 4:8] = np.nan
    got = TR.select_experts(torch.tensor(c), 4, num_groups=4, topk_groups=2)
    assert np.array_equal(got.numpy(), R.select_experts(c, 4, 4, 2))


def test_config_from_manifest():
    layer = {
        "T": 37,
        "d": 256,
        "n": 128,
        "E": 16,
        "k": 4,
        "activation": "swiglu",
        "scoring": "sigmoid",
        "renormalize": True,
        "num_groups": 4,
        "topk_groups": 2,
        "scaling_factor": 2.5,
        "has_bias": True,
        "shared_n": 128,
    }
    cfg = TR.config_from_manifest(layer)
    assert (cfg.tokens, cfg.hidden, cfg.ffn, cfg.experts, cfg.top_k) == (37, 256, 128, 16, 4)
    assert cfg.router_bias and cfg.shared_ffn == 128 and cfg.scaling_factor == 2.5
    names = [n for n, _, _ in cfg.arg_specs()]
    assert names == [
        "x",
        "w_router",
        "router_bias",
        "w_gate_up",
        "w_down",
        "shared_gate_up",
        "shared_down",
    ]
    assert TR.canonical_inputs({"bias": 1, "shared_w_down": 2}) == {
        "router_bias": 1,
        "shared_down": 2,
    }


def test_config_from_manifest_expert_bias():
    """moe-compile's "expert_bias"; without it (an older manifest), the inputs decide."""
    layer = {"T": 37, "d": 256, "n": 192, "E": 8, "k": 2, "renormalize": True}
    assert not TR.config_from_manifest(layer).expert_bias
    inputs = {"x": "arg0", "w_router": "arg1", "w_gate_up": "arg2", "w_down": "arg3"}
    assert not TR.config_from_manifest(dict(layer, inputs=inputs)).expert_bias
    assert not TR.config_from_manifest(dict(layer, expert_bias=False, inputs=inputs)).expert_bias
    biased = dict(inputs, b_gate_up="arg4", b_down="arg5")
    for manifest in (dict(layer, expert_bias=True, inputs=biased), dict(layer, inputs=biased)):
        cfg = TR.config_from_manifest(manifest)
        assert cfg.expert_bias
        specs = {n: s for n, s, _ in cfg.arg_specs()}
        assert specs["b_gate_up"] == (8, 384) and specs["b_down"] == (8, 256)
        # the manifest's input names are arg_specs' own: nothing to rename
        assert TR.canonical_inputs(biased) == biased
        assert set(TR.canonical_inputs(biased)) == set(specs)
