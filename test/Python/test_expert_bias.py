"""Expert biases (gpt-oss): `LayerConfig(expert_bias=True)` adds b_gate_up [E, G] before the
activation and b_down [E, d] after the down projection, inside each routed expert (so scaled
by its routing weight). The CPU path (moe-decompose, moe-generate-backward, the CPU
pipeline), the NumPy reference and MoELayer on CPU tensors are checked against torch
autograd (torch_reference) on random data, forward and every gradient, the bias gradients
included; the CUDA path refuses the feature by name (gpu_contract.json)."""

import math

import numpy as np
import pytest
import torch

from moe_mlir import cpu
from moe_mlir import reference as ref
from moe_mlir import torch_reference as tr
from moe_mlir.config import LayerConfig
from moe_mlir.layer import MoELayer, check_gpu_config
from moe_mlir.mlir_text import layer_mlir

RTOL = 1e-4

CASES = {
    "swiglu": LayerConfig(23, 16, 12, 5, 2, renormalize=True, expert_bias=True),
    "gelu": LayerConfig(23, 16, 12, 5, 2, activation="gelu", expert_bias=True),
    "silu_sigmoid": LayerConfig(
        19, 16, 8, 4, 2, scoring="sigmoid", activation="silu", expert_bias=True
    ),
    "gelu_tanh_shared": LayerConfig(
        23, 16, 12, 5, 3, activation="gelu_tanh", shared_ffn=8, expert_bias=True
    ),
    "swiglu_shared_router_bias": LayerConfig(
        17, 16, 8, 6, 2, scoring="sigmoid", router_bias=True, shared_ffn=12, expert_bias=True
    ),
    "t1_kE": LayerConfig(1, 16, 8, 4, 4, renormalize=True, expert_bias=True),
}


def random_args(config, seed):
    """f32 inputs whose routing decision is clear (no near-ties between experts)."""
    for attempt in range(50):
        rng = np.random.default_rng(seed * 100 + attempt)
        args = {}
        for name, shape, _ in config.arg_specs():
            scale = 1.0 if name == "x" else 1.0 / math.sqrt(shape[-2] if len(shape) > 1 else 4)
            if name in ("b_gate_up", "b_down"):
                scale = 0.5  # biases as large as the products, so a dropped one shows
            if name == "router_bias":
                scale = 0.05
            args[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
        logits = args["x"].astype(np.float64) @ args["w_router"].astype(np.float64)
        c = ref.scores(logits, config.scoring)
        if config.router_bias:
            c = c + args["router_bias"]
        s = np.sort(c, axis=1)[:, ::-1]
        if (
            config.top_k == config.experts
            or np.min(s[:, config.top_k - 1] - s[:, config.top_k]) > 1e-3
        ):
            return args
    raise AssertionError("no seed gave a clear routing decision")


def rel_err(actual, expected):
    expected = np.asarray(expected, np.float64)
    norm = np.linalg.norm(expected)
    diff = np.linalg.norm(np.asarray(actual, np.float64) - expected)
    return diff / norm if norm > 0 else diff


def torch_grads(config, args, d_out, d_logits):
    out, grads = tr.forward_backward(
        config,
        {k: torch.tensor(v, dtype=torch.float64) for k, v in args.items()},
        torch.tensor(d_out),
        torch.tensor(d_logits),
    )
    return out, {k: v.double().numpy() for k, v in grads.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_reference_matches_torch_autograd(name):
    config = CASES[name]
    args = random_args(config, 1)
    args64 = {k: v.astype(np.float64) for k, v in args.items()}
    out, logits, cache = ref.layer_forward(config, **args64)
    rng = np.random.default_rng(2)
    d_out = rng.standard_normal(out.shape)
    d_logits = rng.standard_normal(logits.shape)
    t_out, t_grads = torch_grads(config, args, d_out, d_logits)
    assert rel_err(out, t_out.out.detach().numpy()) < 1e-5
    names = ref.layer_gradient_names(config)
    assert names[-2:] == ["b_gate_up", "b_down"]
    for fused in (True, False):
        grads = ref.layer_backward(config, cache, d_out, d_logits, fused=fused)
        for gname, g in zip(names, grads):
            assert rel_err(g, t_grads[gname]) < 1e-5, (fused, gname)


def test_bias_changes_the_layer():
    """A zero bias is the unbiased layer; a random one is not (the test data can see it)."""
    config = CASES["swiglu"]
    args = random_args(config, 3)
    plain = LayerConfig(23, 16, 12, 5, 2, renormalize=True)
    base, _, _ = ref.layer_forward(plain, **{k: v for k, v in args.items() if k[0] != "b"})
    zero = {
        **args,
        "b_gate_up": np.zeros_like(args["b_gate_up"]),
        "b_down": np.zeros_like(args["b_down"]),
    }
    assert np.array_equal(ref.layer_forward(config, **zero)[0], base)
    assert rel_err(ref.layer_forward(config, **args)[0], base) > 0.1


_COMPILED = {}


def compiled(name):
    if name not in _COMPILED:
        _COMPILED[name] = cpu.CompiledLayer(CASES[name], "bias_" + name)
    return _COMPILED[name]


@pytest.mark.parametrize("name", list(CASES))
def test_cpu_path_matches_torch_autograd(name):
    config = CASES[name]
    layer = compiled(name)
    args = random_args(config, 5)
    rng = np.random.default_rng(6)
    d_out = rng.standard_normal((config.tokens, config.hidden)).astype(np.float32)
    d_logits = rng.standard_normal((config.tokens, config.experts)).astype(np.float32)
    t_out, t_grads = torch_grads(
        config, args, d_out.astype(np.float64), d_logits.astype(np.float64)
    )
    out, logits, saved = layer.forward(args)
    assert rel_err(out, t_out.out.detach().numpy()) <= RTOL
    assert rel_err(logits, t_out.logits.detach().numpy()) <= RTOL
    grads = layer.backward(saved, d_out, d_logits)
    assert list(grads) == ref.layer_gradient_names(config)
    for gname, g in grads.items():
        err = rel_err(g, t_grads[gname])
        assert err <= RTOL, f"gradient of {gname}: relative error {err}"


RECOMPUTE_PASSES = (
    "--moe-decompose",
    "--moe-plan-activations=policy=recompute",
    "--moe-generate-backward",
)


def test_cpu_path_with_dropped_pairs_and_recompute():
    """Token dropping (dropped pairs get no bias) and H recomputed in backward."""
    config = LayerConfig(37, 16, 12, 4, 2, capacity_factor=0.5, expert_bias=True)
    args = random_args(config, 7)
    passes = RECOMPUTE_PASSES
    layer = cpu.CompiledLayer(config, "bias_capacity", pre_passes=passes)
    backward = cpu.run_opt(layer.source, passes).split("@bias_capacity_backward")[1]
    assert "moe.expert_ffn " in backward  # H recomputed, with the biases

    args64 = {k: v.astype(np.float64) for k, v in args.items()}
    r_out, r_logits, cache = ref.layer_forward(config, **args64)
    assert (cache.rows < 0).any()
    rng = np.random.default_rng(8)
    d_out = rng.standard_normal(r_out.shape).astype(np.float32)
    d_logits = rng.standard_normal(r_logits.shape).astype(np.float32)
    r_grads = ref.layer_backward(config, cache, d_out, d_logits)
    out, logits, saved = layer.forward(args)
    assert rel_err(out, r_out) <= RTOL
    grads = layer.backward(saved, d_out, d_logits)
    for (gname, g), r in zip(grads.items(), r_grads):
        assert rel_err(g, r) <= RTOL, gname


def test_torch_layer_on_cpu():
    """MoELayer(expert_bias) has the bias parameters, and its forward and backward on CPU
    tensors are torch autograd's."""
    config = CASES["gelu_tanh_shared"]
    torch.manual_seed(0)
    layer = MoELayer(config, init_std=0.2)
    assert tuple(layer.b_gate_up.shape) == (config.experts, config.gate_up_width)
    assert tuple(layer.b_down.shape) == (config.experts, config.hidden)
    names = [n for n, _ in layer.named_parameters()]
    assert "b_gate_up" in names and "b_down" in names
    x = torch.randn(config.tokens, config.hidden, requires_grad=True)
    y, logits = layer(x, return_router_logits=True)
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    inputs = {
        "x": x.detach(),
        **{k: v.detach() for k, v in layer.layer_weights().items() if v is not None},
    }
    t_out, t_grads = tr.forward_backward(config, inputs, dy)
    assert rel_err(y.detach().numpy(), t_out.out.detach().numpy()) <= RTOL
    assert rel_err(x.grad.numpy(), t_grads["x"].numpy()) <= RTOL
    for name in ("w_gate_up", "w_down", "b_gate_up", "b_down", "shared_gate_up"):
        g = getattr(layer, name).grad
        assert g is not None, name
        assert rel_err(g.numpy(), t_grads[name].numpy()) <= RTOL, name


def test_gpu_path_takes_expert_bias():
    # The sm_90a path runs the biases forward and backward (gpu_contract.json); the other
    # limits still apply to a biased layer.
    check_gpu_config(LayerConfig(64, 64, 64, 4, 2, expert_bias=True))
    check_gpu_config(LayerConfig(64, 64, 64, 4, 2))
    with pytest.raises(NotImplementedError, match="tile_multiple"):
        check_gpu_config(LayerConfig(64, 48, 64, 4, 2, expert_bias=True))


def test_config_and_text():
    config = CASES["gelu"]
    specs = dict((n, s) for n, s, _ in config.arg_specs())
    assert specs["b_gate_up"] == (5, 12) and specs["b_down"] == (5, 16)
    assert dict((n, s) for n, s, _ in CASES["swiglu"].arg_specs())["b_gate_up"] == (5, 24)
    text = layer_mlir(config)
    assert "expert_bias(%b_gate_up, %b_down : tensor<5x12xf32>, tensor<5x16xf32>)" in text
    with pytest.raises(ValueError, match="expert_bias must be a bool"):
        LayerConfig(4, 16, 8, 4, 2, expert_bias=1).validate()
    with pytest.raises(ValueError, match="expert biases given"):
        ref.layer_forward(
            LayerConfig(23, 16, 12, 5, 2, activation="gelu"), **random_args(config, 1)
        )
