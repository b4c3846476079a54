"""One compiled layer for every token count up to its bound, on the CPU path: a layer with
`max_tokens` compiles once and, at each T of a sweep, gives bitwise the outputs, saved tensors
and gradients of the layer compiled for exactly that T; a T outside [1, bound] raises."""

import dataclasses

import numpy as np
import pytest

from moe_mlir import cpu
from moe_mlir.config import LayerConfig

BOUND = 64

CONFIGS = {
    # Mixtral-like with a shared expert
    "softmax_shared": LayerConfig(
        tokens=BOUND, hidden=32, ffn=16, experts=4, top_k=2, renormalize=True, shared_ffn=8
    ),
    # DeepSeek-like: sigmoid scores, a selection bias, grouped top-k, scaled weights
    "sigmoid_groups": LayerConfig(
        tokens=BOUND,
        hidden=32,
        ffn=16,
        experts=8,
        top_k=2,
        scoring="sigmoid",
        renormalize=True,
        router_bias=True,
        num_groups=4,
        topk_groups=2,
        scaling_factor=2.5,
    ),
}
# 50 token counts of [1, BOUND] for the first configuration (1 and BOUND among them), 8 for
# the second.
SWEEP = sorted(
    {1, BOUND, *(int(t) for t in np.random.default_rng(32).choice(np.arange(2, BOUND), 48, False))}
)


@pytest.fixture(scope="module", autouse=True)
def _require_passes():
    ok, missing = cpu.moe_opt_has_passes("moe-decompose", "moe-generate-backward")
    if not ok:
        pytest.skip("moe-opt --help does not list " + ", ".join(missing))


def inputs(config, tokens, seed):
    rng = np.random.default_rng(seed)
    args = {}
    for name, shape, _ in dataclasses.replace(config, tokens=tokens).arg_specs():
        scale = 1.0 if name == "x" else 0.01 if name == "router_bias" else 0.2
        args[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
    d_out = rng.standard_normal((tokens, config.hidden)).astype(np.float32)
    d_logits = rng.standard_normal((tokens, config.experts)).astype(np.float32)
    return args, d_out, d_logits


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_one_layer_serves_every_token_count(name):
    config = CONFIGS[name]
    dynamic = cpu.CompiledLayer(config, "dyn", max_tokens=BOUND)
    counts = SWEEP if name == "softmax_shared" else SWEEP[:: max(1, len(SWEEP) // 8)]
    assert len(SWEEP) == 50
    for i, tokens in enumerate(counts):
        fixed = cpu.CompiledLayer(dataclasses.replace(config, tokens=tokens), "fixed")
        args, d_out, d_logits = inputs(config, int(tokens), seed=i)
        out, logits, saved = dynamic.forward(args)
        f_out, f_logits, f_saved = fixed.forward(args)
        assert same(out, f_out) and same(logits, f_logits), f"T = {tokens}"
        assert len(saved) == len(f_saved)
        for j, (a, b) in enumerate(zip(saved, f_saved)):
            assert same(a, b), f"T = {tokens}: saved tensor {j}"
        grads = dynamic.backward(saved, d_out, d_logits)
        f_grads = fixed.backward(f_saved, d_out, d_logits)
        assert list(grads) == list(f_grads)
        for g in grads:
            assert same(grads[g], f_grads[g]), f"T = {tokens}: gradient of {g}"
        # the layer function itself too
        l_out, l_logits = dynamic(args)
        assert same(l_out, out) and same(l_logits, logits)


def test_token_count_outside_the_bound_raises():
    config = CONFIGS["softmax_shared"]
    dynamic = cpu.CompiledLayer(config, "dyn", max_tokens=BOUND)
    for tokens in (0, BOUND + 1):
        args, d_out, d_logits = inputs(config, tokens, seed=1)
        with pytest.raises(ValueError, match=rf"T = {tokens} is outside \[1, {BOUND}\]"):
            dynamic.forward(args)
    args, d_out, d_logits = inputs(config, 5, seed=2)
    _, _, saved = dynamic.forward(args)
    with pytest.raises(ValueError, match=rf"T = {BOUND + 1} is outside"):
        dynamic.backward(saved, np.zeros((BOUND + 1, config.hidden), np.float32), d_logits)


def test_dynamic_results_need_their_shapes():
    config = CONFIGS["softmax_shared"]
    dynamic = cpu.CompiledLayer(config, "dyn", max_tokens=BOUND)
    args, _, _ = inputs(config, 3, seed=3)
    function = dynamic.module["dyn"]
    with pytest.raises(ValueError, match="has a dynamic shape: pass result_shapes"):
        function(*[args[n] for n in dynamic.arg_names])
    with pytest.raises(ValueError, match="cannot have shape"):
        function(*[args[n] for n in dynamic.arg_names], result_shapes=[(3, 31), (3, 4)])
