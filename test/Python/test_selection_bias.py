"""moe.update_selection_bias (auxiliary-loss-free balancing, DeepSeek-V3): the NumPy
reference against the rule written out, the op through the CPU path (moe-opt, clang) and the
torch form of the rule against the reference on random and skewed routing, and the user API
(moe_mlir.layer.update_selection_bias, MoELayer.update_selection_bias) with its errors."""

import os

import numpy as np
import pytest

from moe_mlir import reference as ref

try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    if os.environ.get("CI"):
        raise
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="needs torch")
f32 = np.float32


def routing(T, k, E, mode, seed):
    """experts [T, k] int32: distinct experts a token, uniformly (random), most pairs on a
    few experts (skewed), every token on the same k (all-to-few); some -1 (no expert)."""
    rng = np.random.default_rng(seed)
    if mode == "skewed":
        p = rng.pareto(1.0, E) + 1e-3
        p /= p.sum()
    else:
        p = np.full(E, 1.0 / E)
    e = np.stack([rng.choice(E, size=k, replace=False, p=p) for _ in range(T)]).astype(np.int32)
    if mode == "all-to-few":
        e[:] = np.arange(k, dtype=np.int32)
    if T:
        e.reshape(-1)[:: 7 if mode == "random" else 11] = -1
    return e.reshape(T, k)


def rule_written_out(bias, experts, rate, rule):
    """The rule in float64 from mean = sum(load) / E, rounded to f32 at the end."""
    E = bias.shape[0]
    load = np.array([(experts == e).sum() for e in range(E)], dtype=np.float64)
    if load.sum() == 0:
        return bias.astype(f32)
    mean = load.sum() / E
    if rule == "sign":
        step = np.sign(mean - load)
    else:
        step = (mean - load) / mean
    return (bias.astype(np.float64) + rate * step).astype(f32)


CASES = [
    (37, 2, 8, "random"),
    (37, 1, 8, "skewed"),
    (1001, 8, 64, "random"),
    (1001, 8, 64, "skewed"),
    (301, 8, 256, "random"),
    (301, 6, 256, "skewed"),
    (53, 4, 8, "all-to-few"),
]
RULES = ("sign", "proportional")


@pytest.mark.parametrize("T,k,E,mode", CASES)
@pytest.mark.parametrize("rule", RULES)
def test_reference_is_the_rule(T, k, E, mode, rule):
    rng = np.random.default_rng(T * E + k)
    bias = (rng.standard_normal(E) * 0.1).astype(f32)
    experts = routing(T, k, E, mode, T + E)
    rate = 1e-3 if rule == "sign" else 0.25
    got = ref.update_selection_bias(bias, experts, rate, rule)
    assert got.dtype == f32 and got.shape == (E,)
    want = rule_written_out(bias, experts, rate, rule)
    # sign: the step is exact, rate * step rounds once in f32 either way
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-7 * max(1.0, np.abs(want).max()))
    assert not np.array_equal(got, bias)


def test_reference_counts_ignore_minus_one_and_keep_bias_without_pairs():
    bias = np.array([0.5, -0.25, 0.0, 1.0], f32)
    experts = np.array([[0, 1], [0, 2], [0, -1]], np.int32)
    np.testing.assert_array_equal(ref.expert_loads(experts, 4), [3, 1, 1, 0])
    # mean = 5 / 4: expert 0 above it, the others below
    np.testing.assert_array_equal(
        ref.update_selection_bias(bias, experts, 0.5, "sign"), bias + f32([-0.5, 0.5, 0.5, 0.5])
    )
    np.testing.assert_allclose(
        ref.update_selection_bias(bias, experts, 0.5, "proportional"),
        bias + f32([-0.7, 0.1, 0.1, 0.5]),
        rtol=1e-6,
    )
    for empty in (np.zeros((0, 2), np.int32), np.full((3, 2), -1, np.int32)):
        for rule in RULES:
            np.testing.assert_array_equal(ref.update_selection_bias(bias, empty, 0.5, rule), bias)
    # a perfectly balanced step moves nothing under sign
    balanced = np.array([[0, 1], [2, 3]], np.int32)
    np.testing.assert_array_equal(ref.update_selection_bias(bias, balanced, 0.5), bias)


@pytest.mark.parametrize("rate", [0.0, -1e-3, float("nan"), float("inf"), True, "0.1", None])
def test_reference_refuses_bad_rate(rate):
    with pytest.raises(ValueError, match="rate must be a positive finite number"):
        ref.update_selection_bias(np.zeros(4, f32), np.zeros((2, 2), np.int32), rate)


def test_reference_refuses_bad_rule_and_shapes():
    with pytest.raises(ValueError, match="rule must be one of"):
        ref.update_selection_bias(np.zeros(4, f32), np.zeros((2, 2), np.int32), 1e-3, "linear")
    with pytest.raises(ValueError, match=r"bias must be \[E\]"):
        ref.update_selection_bias(np.zeros((1, 4), f32), np.zeros((2, 2), np.int32), 1e-3)
    with pytest.raises(ValueError, match=r"experts must be \[T, k\]"):
        ref.update_selection_bias(np.zeros(4, f32), np.zeros(4, np.int32), 1e-3)


# --------------------------------------------------------------------------- the CPU path


@pytest.fixture(scope="module")
def compiled():
    from moe_mlir import cpu

    try:
        cpu.find_moe_opt()
        cpu.find_clang()
    except cpu.ToolError as exc:
        pytest.skip(f"needs moe-opt and clang: {exc}")
    functions = {}

    def get(E, k, rate, rule):
        key = (E, k, rate, rule)
        if key not in functions:
            text = (
                f"func.func @f(%b: tensor<{E}xf32>, %e: tensor<?x{k}xi32>) -> tensor<{E}xf32> {{\n"
                f"  %r = moe.update_selection_bias %b, %e {{rate = {rate!r} : f64, "
                f"rule = #moe.bias_update<{rule}>}} : tensor<{E}xf32>, tensor<?x{k}xi32> "
                f"-> tensor<{E}xf32>\n"
                f"  return %r : tensor<{E}xf32>\n}}\n"
            )
            functions[key] = cpu.compile_function(text)
        return functions[key]

    return get


@pytest.mark.parametrize("T,k,E,mode", CASES)
@pytest.mark.parametrize("rule", RULES)
def test_cpu_op_matches_reference_bitwise(compiled, T, k, E, mode, rule):
    rng = np.random.default_rng(3 * T + E)
    bias = (rng.standard_normal(E) * 0.1).astype(f32)
    experts = routing(T, k, E, mode, 2 * T + E)
    rate = 0.001 if rule == "sign" else 0.3
    got = compiled(E, k, rate, rule)(bias, experts)[0]
    want = ref.update_selection_bias(bias, experts, rate, rule)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("rule", RULES)
def test_cpu_op_without_pairs_keeps_the_bias(compiled, rule):
    bias = np.random.default_rng(1).standard_normal(8).astype(f32)
    fn = compiled(8, 2, 0.5, rule)
    for empty in (np.zeros((0, 2), np.int32), np.full((5, 2), -1, np.int32)):
        np.testing.assert_array_equal(fn(bias, empty)[0], bias)


# --------------------------------------------------------------------------- the user API


@needs_torch
@pytest.mark.parametrize("T,k,E,mode", CASES)
@pytest.mark.parametrize("rule", RULES)
def test_torch_rule_matches_reference_bitwise(T, k, E, mode, rule):
    from moe_mlir import layer as L

    rng = np.random.default_rng(5 * T + E)
    bias = (rng.standard_normal(E) * 0.1).astype(f32)
    experts = routing(T, k, E, mode, 4 * T + E)
    rate = 0.001 if rule == "sign" else 0.3
    got = L._torch_bias_update(torch.from_numpy(bias), torch.from_numpy(experts), rate, rule)
    want = ref.update_selection_bias(bias, experts, rate, rule)
    np.testing.assert_array_equal(got.numpy().view(np.int32), want.view(np.int32))


@needs_torch
def test_experts_of_rows_inverts_the_dispatch():
    from moe_mlir import layer as L

    experts = routing(41, 3, 9, "skewed", 0)
    experts[experts < 0] = 0
    _, offsets, rows = ref.dispatch(experts, 9)
    got = L._experts_of_rows(torch.from_numpy(offsets), torch.from_numpy(rows))
    np.testing.assert_array_equal(got.numpy(), experts)
    rows[3, 1] = -1  # a dropped pair has no expert
    got = L._experts_of_rows(torch.from_numpy(offsets), torch.from_numpy(rows))
    assert got[3, 1] == -1


@pytest.fixture
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MOE_MLIR_CACHE", str(tmp_path_factory.getbasetemp() / "moe_mlir_cache"))
    monkeypatch.delenv("MOE_MLIR_PREBUILT", raising=False)
    monkeypatch.setenv("MOE_MLIR_QUIET", "1")


@needs_torch
@pytest.mark.parametrize("rule", RULES)
def test_layer_update_after_a_step(_cache, compiled, rule):
    from moe_mlir import LayerConfig
    from moe_mlir import torch_reference as TR
    from moe_mlir.layer import MoELayer, update_selection_bias

    cfg = LayerConfig(
        0, 32, 16, 8, 2, scoring="sigmoid", renormalize=True, router_bias=True,
        num_groups=4, topk_groups=2,
    )  # fmt: skip
    torch.manual_seed(0)
    layer = MoELayer(cfg, init_std=0.2)
    with torch.no_grad():
        layer.router_bias.copy_(torch.randn(8) * 0.05)
    x = torch.randn(37, 32)
    layer(x).square().sum().backward()
    _, want_experts, _, _ = TR.router(cfg, x, layer.w_router.detach(), layer.router_bias)
    assert layer._last_routing[0] == "dispatch"  # exact: from the saved dispatch results
    experts = layer.last_experts()
    assert experts.dtype == torch.int32
    assert torch.equal(experts.long(), want_experts)
    before = layer.router_bias.clone()
    rate = 1e-3 if rule == "sign" else 0.1
    want = ref.update_selection_bias(before.numpy(), experts.numpy(), rate, rule)
    out = layer.update_selection_bias(rate=rate, rule=rule)
    assert out is layer.router_bias
    np.testing.assert_array_equal(layer.router_bias.numpy(), want)
    assert not torch.equal(layer.router_bias, before)
    # a bias tensor: a new tensor, the input untouched
    new = update_selection_bias(before, experts, rate=rate, rule=rule)
    np.testing.assert_array_equal(new.numpy(), want)
    assert not torch.equal(new, before) and new is not before


@needs_torch
def test_router_bias_stays_f32_when_the_layer_changes_dtype(_cache, compiled):
    """layer.to(bf16) (as a bf16 model does) keeps router_bias f32 with its values: a bf16
    bias would lose the update (rate 1e-3 is below bf16's spacing at 0.5) and
    update_selection_bias refuses it."""
    from moe_mlir import LayerConfig
    from moe_mlir.layer import MoELayer

    cfg = LayerConfig(0, 32, 16, 8, 2, scoring="sigmoid", renormalize=True, router_bias=True)
    torch.manual_seed(3)
    layer = MoELayer(cfg, init_std=0.2)
    with torch.no_grad():
        layer.router_bias.copy_(0.5 + 0.01 * torch.randn(8))
    before = layer.router_bias.clone()
    for cast in (lambda m: m.to(torch.bfloat16), lambda m: m.half(), lambda m: m.float()):
        layer = cast(layer)
        assert layer.router_bias.dtype == torch.float32
        assert torch.equal(layer.router_bias, before)
    layer = layer.to(torch.bfloat16)
    assert layer.w_router.dtype == torch.bfloat16
    assert layer.state_dict()["router_bias"].dtype == torch.float32
    experts = torch.tensor([[0, 1]] * 5 + [[2, 3]], dtype=torch.int32)
    want = ref.update_selection_bias(before.numpy(), experts.numpy(), 1e-3, "sign")
    layer.update_selection_bias(rate=1e-3, rule="sign", experts=experts)
    np.testing.assert_array_equal(layer.router_bias.numpy(), want)
    assert not torch.equal(layer.router_bias, before)


@needs_torch
def test_layer_routing_without_saved_dispatch_is_recomputed(_cache):
    from moe_mlir import LayerConfig
    from moe_mlir import torch_reference as TR
    from moe_mlir.layer import MoELayer

    cfg = LayerConfig(0, 32, 16, 8, 2, scoring="sigmoid", router_bias=True)
    torch.manual_seed(1)
    layer = MoELayer(cfg, init_std=0.2)
    with torch.no_grad():
        layer.router_bias.copy_(torch.randn(8) * 0.05)
    x = torch.randn(19, 32)
    logits = x @ layer.w_router.detach()
    layer._remember_routing(logits, layer.router_bias, ())
    _, want, _, _ = TR.router(cfg, x, layer.w_router.detach(), layer.router_bias)
    assert torch.equal(layer.last_experts().long(), want)


@needs_torch
def test_update_errors(_cache):
    from moe_mlir import LayerConfig
    from moe_mlir.layer import MoELayer, update_selection_bias

    plain = MoELayer(LayerConfig(0, 32, 16, 4, 2))
    with pytest.raises(ValueError, match="the layer has no router_bias"):
        plain.update_selection_bias()
    layer = MoELayer(LayerConfig(0, 32, 16, 4, 2, router_bias=True))
    with pytest.raises(RuntimeError, match="no forward of this layer recorded its routing"):
        layer.update_selection_bias()
    experts = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    for rate in (0.0, -1.0, float("nan"), float("inf"), True, "1e-3"):
        with pytest.raises(ValueError, match="rate must be a positive finite number"):
            layer.update_selection_bias(rate=rate, experts=experts)
    with pytest.raises(ValueError, match="rule must be one of"):
        layer.update_selection_bias(rule="linear", experts=experts)
    with pytest.raises(ValueError, match=r"outside \[-1, 4\)"):
        layer.update_selection_bias(experts=torch.tensor([[0, 4]], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"outside \[-1, 4\)"):
        layer.update_selection_bias(experts=torch.tensor([[0, -2]], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"experts must be an integer tensor \[T, k\]"):
        layer.update_selection_bias(experts=torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"experts must be an integer tensor \[T, k\]"):
        layer.update_selection_bias(experts=torch.zeros(4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"experts must be an integer tensor \[T, k\]"):
        layer.update_selection_bias(experts=torch.zeros(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="the bias must be a float32 tensor"):
        update_selection_bias(torch.zeros(4, dtype=torch.float64), experts)
    with pytest.raises(ValueError, match="pass the step's experts"):
        update_selection_bias(torch.zeros(4))
    # nothing moved by the refusals
    assert torch.equal(layer.router_bias, torch.zeros(4))
