"""The tanh form of GELU (`activation="gelu_tanh"`, `#moe.activation<gelu_tanh>`) against torch's
`gelu(approximate="tanh")`: the NumPy reference's forward and derivative, the torch reference,
the layer's text, and a whole layer on the CPU path (torch.autograd through moe-opt's CPU
pipeline) on random data. The CPU kernels and the compiled layer against the NumPy reference
are in test_cpu_kernels.py and test_cpu_layer.py."""

import dataclasses

import numpy as np
import pytest

from moe_mlir import reference as ref
from moe_mlir.config import ACTIVATION_CODES, ACTIVATIONS, LayerConfig
from moe_mlir.mlir_text import layer_mlir

torch = pytest.importorskip("torch")
F = torch.nn.functional
from moe_mlir import torch_reference as TR  # noqa: E402 (needs torch)


def rel(a, b):
    a, b = (np.asarray(v.detach() if torch.is_tensor(v) else v, np.float64) for v in (a, b))
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)


def test_codes_are_appended():
    # The CPU kernels and the dialect's enum share these codes; the older ones keep theirs.
    assert ACTIVATION_CODES == {"swiglu": 0, "gelu": 1, "silu": 2, "gelu_tanh": 3}
    assert ACTIVATIONS[-1] == "gelu_tanh"
    cfg = LayerConfig(37, 48, 40, 5, 2, activation="gelu_tanh")
    assert not cfg.gated and cfg.gate_up_width == 40


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-13), (np.float32, 2e-6)])
def test_forward_and_derivative_match_torch(dtype, rtol):
    rng = np.random.default_rng(7)
    # wide enough to reach both saturated tails, where tanh is +-1
    h = (rng.standard_normal((64, 33)) * 3).astype(dtype)
    da = rng.standard_normal(h.shape).astype(dtype)
    th = torch.from_numpy(h).requires_grad_(True)
    want = F.gelu(th, approximate="tanh")
    want.backward(torch.from_numpy(da))
    got = ref.activation(h, "gelu_tanh")
    assert got.dtype == dtype
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=rtol, atol=rtol)
    grad = ref.activation_grad(h, da, "gelu_tanh")
    np.testing.assert_allclose(grad, th.grad.numpy(), rtol=rtol, atol=10 * rtol)
    # and not the erf form, which differs by up to ~5e-4
    assert np.abs(got - ref.activation(h, "gelu")).max() > 1e-5


def test_derivative_matches_finite_differences():
    rng = np.random.default_rng(3)
    h = rng.standard_normal((5, 7)) * 2
    da = rng.standard_normal(h.shape)
    eps = 1e-6
    num = (ref.activation(h + eps, "gelu_tanh") - ref.activation(h - eps, "gelu_tanh")) / (2 * eps)
    np.testing.assert_allclose(ref.activation_grad(h, da, "gelu_tanh"), da * num, atol=1e-8)


def test_torch_reference_activation():
    h = torch.randn(9, 12, dtype=torch.float64) * 2
    assert torch.equal(TR.activation(h, "gelu_tanh"), F.gelu(h, approximate="tanh"))
    with pytest.raises(ValueError, match="gelu_tanh"):
        TR.activation(h, "gelu_new")


def test_bad_activation_is_named():
    with pytest.raises(ValueError, match="gelu_tanh"):
        LayerConfig(37, 48, 40, 5, 2, activation="gelu_pytorch_tanh").validate()
    with pytest.raises(ValueError, match="activation must be one of"):
        ref.activation(np.ones((2, 2)), "tanh")


def test_layer_text_names_the_activation():
    cfg = LayerConfig(37, 48, 40, 5, 2, activation="gelu_tanh")
    text = layer_mlir(cfg, "layer_gelu_tanh")
    assert "activation = #moe.activation<gelu_tanh>" in text
    assert "tensor<5x48x40xf32>" in text  # w_gate_up is n wide: not gated


def test_cpu_layer_matches_the_torch_reference():
    """A gelu_tanh MoELayer on CPU tensors (moe-opt's CPU pipeline, forward and backward)
    against the autograd of the torch reference, with a shared expert."""
    from moe_mlir.layer import MoELayer

    cfg = LayerConfig(0, 24, 16, 4, 2, activation="gelu_tanh", renormalize=True, shared_ffn=8)
    torch.manual_seed(5)
    layer = MoELayer(cfg, init_std=0.3)
    x = torch.randn(3, 7, cfg.hidden, requires_grad=True)
    out, logits = layer(x, return_router_logits=True)
    d_out = torch.randn_like(out)
    out.backward(d_out)
    inputs = {"x": x.detach().reshape(-1, cfg.hidden).float()}
    inputs.update({n: p.detach().float() for n, p in layer.named_parameters()})
    want, grads = TR.forward_backward(
        dataclasses.replace(cfg, tokens=21), inputs, d_out.reshape(-1, cfg.hidden).float()
    )
    assert rel(out.detach().reshape(-1, cfg.hidden), want.out) < 1e-5
    assert rel(logits.detach(), want.logits) < 1e-5
    assert rel(x.grad.reshape(-1, cfg.hidden), grads["x"]) < 1e-5
    for n, p in layer.named_parameters():
        assert rel(p.grad, grads[n]) < 1e-5, n
    # the erf form computes another layer
    erf = TR.forward_backward(
        dataclasses.replace(cfg, tokens=21, activation="gelu"),
        inputs,
        d_out.reshape(-1, cfg.hidden).float(),
    )[0]
    assert rel(out.detach().reshape(-1, cfg.hidden), erf.out) > 1e-5


def test_gpu_contract_takes_it():
    from moe_mlir import layer as L

    L.check_gpu_config(LayerConfig(0, 64, 64, 4, 2, activation="gelu_tanh"))
