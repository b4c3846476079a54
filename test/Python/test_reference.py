"""The NumPy reference (python/moe_mlir/reference.py) against docs/cpu-path.md §2:
finite-difference gradient checks in float64, the selection and dispatch rules, edge shapes."""

import math

import numpy as np
import pytest

from moe_mlir import reference as ref
from moe_mlir.config import LayerConfig, capacity_for

# --------------------------------------------------------------------------- helpers


def make_inputs(cfg, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    T, d, n, E = cfg.tokens, cfg.hidden, cfg.ffn, cfg.experts
    args = {
        "x": rng.standard_normal((T, d)),
        "w_router": rng.standard_normal((d, E)) / math.sqrt(d),
        "w_gate_up": rng.standard_normal((E, d, cfg.gate_up_width)) / math.sqrt(d),
        "w_down": rng.standard_normal((E, n, d)) / math.sqrt(n),
    }
    if cfg.router_bias:
        args["router_bias"] = rng.standard_normal(E) * 0.1
    if cfg.has_shared:
        args["shared_gate_up"] = rng.standard_normal((d, cfg.shared_gate_up_width)) / math.sqrt(d)
        args["shared_down"] = rng.standard_normal((cfg.shared_ffn, d)) / math.sqrt(cfg.shared_ffn)
    return {k: v.astype(dtype) for k, v in args.items()}


def forward(cfg, args):
    return ref.layer_forward(cfg, **args)


def loss(cfg, args, r_out, r_logits):
    out, logits, cache = forward(cfg, args)
    return float(np.sum(out * r_out) + np.sum(logits * r_logits)), cache


def check_layer_gradients(cfg, seed, eps=1e-6, max_entries=40, rtol=2e-6):
    """Central differences of L = <out, R_out> + <logits, R_logits> against layer_backward."""
    args = make_inputs(cfg, seed)
    rng = np.random.default_rng(seed + 1000)
    r_out = rng.standard_normal((cfg.tokens, cfg.hidden))
    r_logits = rng.standard_normal((cfg.tokens, cfg.experts))
    _, cache = loss(cfg, args, r_out, r_logits)
    grads = ref.layer_backward(cfg, cache, r_out, r_logits)
    names = ref.layer_gradient_names(cfg)
    assert len(grads) == len(names)
    # The fused expert+combine gradient and combine_grad + expert_ffn_grad agree.
    unfused = ref.layer_backward(cfg, cache, r_out, r_logits, fused=False)
    for g, u in zip(grads, unfused):
        np.testing.assert_allclose(g, u, rtol=1e-12, atol=1e-12)
    for name, grad in zip(names, grads):
        base = args[name]
        assert grad.shape == base.shape, name
        flat = base.reshape(-1)
        idx = rng.choice(flat.size, size=min(max_entries, flat.size), replace=False)
        numeric = np.empty(idx.size)
        for i, p in enumerate(idx):
            vals = []
            for sign in (1, -1):
                pert = dict(args)
                arr = base.copy().reshape(-1)
                arr[p] += sign * eps
                pert[name] = arr.reshape(base.shape)
                v, c2 = loss(cfg, pert, r_out, r_logits)
                # the perturbation must not change which experts are picked or dropped
                assert np.array_equal(c2.experts, cache.experts), (name, p)
                assert np.array_equal(c2.rows, cache.rows), (name, p)
                vals.append(v)
            numeric[i] = (vals[0] - vals[1]) / (2 * eps)
        analytic = grad.reshape(-1)[idx]
        scale = max(np.abs(analytic).max(), np.abs(numeric).max(), 1e-3)
        np.testing.assert_allclose(
            analytic, numeric, rtol=0, atol=rtol * scale * 10, err_msg=f"gradient of {name}"
        )
    return cache


# --------------------------------------------------------------------------- gradients

BASE = dict(tokens=6, hidden=5, ffn=4, experts=4, top_k=2)

GRAD_CONFIGS = {
    "softmax_renorm": LayerConfig(**BASE, renormalize=True),
    "softmax_no_renorm": LayerConfig(**BASE),
    "softmax_k1_renorm": LayerConfig(**{**BASE, "top_k": 1}, renormalize=True),
    "sigmoid_bias_groups_scaling": LayerConfig(
        tokens=6,
        hidden=5,
        ffn=4,
        experts=6,
        top_k=3,
        scoring="sigmoid",
        renormalize=True,
        num_groups=3,
        topk_groups=2,
        scaling_factor=2.5,
        router_bias=True,
    ),
    "sigmoid_no_renorm": LayerConfig(**BASE, scoring="sigmoid", scaling_factor=1.5),
    "shared_expert": LayerConfig(**BASE, renormalize=True, shared_ffn=3),
    "shared_expert_gelu": LayerConfig(**BASE, shared_ffn=3, activation="gelu"),
    "capacity_dropping": LayerConfig(
        **{**BASE, "tokens": 8}, renormalize=True, capacity_factor=0.5
    ),
    "gelu": LayerConfig(**BASE, renormalize=True, activation="gelu"),
    "silu": LayerConfig(**BASE, activation="silu"),
    "k_equals_e": LayerConfig(**{**BASE, "top_k": 4}, renormalize=True),
    "one_token": LayerConfig(**{**BASE, "tokens": 1}, renormalize=True, shared_ffn=2),
}


@pytest.mark.parametrize("key", sorted(GRAD_CONFIGS))
def test_layer_gradient_finite_difference(key):
    cfg = GRAD_CONFIGS[key]
    cache = check_layer_gradients(cfg, seed=sorted(GRAD_CONFIGS).index(key) + 1)
    if cfg.capacity_factor is not None:
        assert (cache.rows < 0).any(), "the capacity factor should drop some pairs"


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_aux_loss_gradient_finite_difference(scoring):
    rng = np.random.default_rng(7)
    T, E, k = 9, 5, 2
    logits = rng.standard_normal((T, E))
    experts = ref.select_experts(ref.scores(logits, scoring), k)
    experts[0, 1] = -1  # out-of-range selections do not count
    experts[1, 0] = E
    d_lb, d_z = 0.7, -1.3
    analytic = ref.aux_loss_grad(logits, experts, d_lb, d_z, scoring)

    def f(lg):
        lb, z = ref.aux_loss(lg, experts, scoring)
        return d_lb * float(lb) + d_z * float(z)

    eps = 1e-6
    numeric = np.zeros_like(logits)
    for i in range(T):
        for e in range(E):
            p, m = logits.copy(), logits.copy()
            p[i, e] += eps
            m[i, e] -= eps
            numeric[i, e] = (f(p) - f(m)) / (2 * eps)
    np.testing.assert_allclose(analytic, numeric, atol=1e-8)


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_aux_loss_values(scoring):
    rng = np.random.default_rng(3)
    T, E, k = 7, 4, 2
    logits = rng.standard_normal((T, E))
    experts = np.array([[0, 1], [1, 2], [3, 0], [0, 2], [1, -1], [2, 3], [0, 4]], np.int32)
    lb, z = ref.aux_loss(logits, experts, scoring)
    counts = np.zeros(E)
    for e in experts.reshape(-1):
        if 0 <= e < E:
            counts[e] += 1
    f = counts / (T * k)
    if scoring == "softmax":
        p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    else:
        s = 1 / (1 + np.exp(-logits))
        p = s / s.sum(1, keepdims=True)
    assert lb.shape == () and z.shape == ()
    np.testing.assert_allclose(lb, E * np.sum(f * p.mean(0)), rtol=1e-12)
    np.testing.assert_allclose(z, np.mean(np.log(np.exp(logits).sum(1)) ** 2), rtol=1e-12)


def test_aux_loss_zero_tokens():
    lb, z = ref.aux_loss(np.zeros((0, 4)), np.zeros((0, 2), np.int32))
    assert float(lb) == 0 and float(z) == 0
    g = ref.aux_loss_grad(np.zeros((0, 4)), np.zeros((0, 2), np.int32), 1.0, 1.0)
    assert g.shape == (0, 4)


def test_router_gradient_finite_difference_direct():
    """router_grad alone, with d_weights and d_logits, for the renormalised sigmoid router."""
    rng = np.random.default_rng(11)
    T, d, E, k = 5, 4, 6, 2
    x, wr = rng.standard_normal((T, d)), rng.standard_normal((d, E))
    bias = rng.standard_normal(E) * 0.1
    kw = dict(scoring="sigmoid", renormalize=True, scaling=2.5)
    w, experts, logits = ref.router(x, wr, bias, top_k=k, num_groups=3, topk_groups=2, **kw)
    dw, dl = rng.standard_normal((T, k)), rng.standard_normal((T, E))
    dx, dwr = ref.router_grad(x, wr, logits, experts, dw, dl, **kw)

    def f(x_, wr_):
        w_, e_, l_ = ref.router(x_, wr_, bias, top_k=k, num_groups=3, topk_groups=2, **kw)
        assert np.array_equal(e_, experts)
        return np.sum(w_ * dw) + np.sum(l_ * dl)

    eps = 1e-6
    for arr, grad, which in ((x, dx, 0), (wr, dwr, 1)):
        num = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            p, m = arr.copy(), arr.copy()
            p[i] += eps
            m[i] -= eps
            args_p = (p, wr) if which == 0 else (x, p)
            args_m = (m, wr) if which == 0 else (x, m)
            num[i] = (f(*args_p) - f(*args_m)) / (2 * eps)
        np.testing.assert_allclose(grad, num, atol=1e-8)


def test_float32_follows_inputs():
    cfg = GRAD_CONFIGS["shared_expert"]
    args32 = make_inputs(cfg, 5, np.float32)
    out, logits, cache = ref.layer_forward(cfg, **args32)
    assert out.dtype == np.float32 and logits.dtype == np.float32
    grads = ref.layer_backward(cfg, cache, np.ones_like(out), np.ones_like(logits))
    assert all(g.dtype == np.float32 for g in grads)
    out64, logits64, _ = ref.layer_forward(
        cfg, **{k: v.astype(np.float64) for k, v in args32.items()}
    )
    np.testing.assert_allclose(out, out64, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- selection


def test_ties_go_to_the_lower_index():
    c = np.array([[0.5, 0.5, 0.2, 0.5], [0.1, 0.3, 0.3, 0.3]])
    np.testing.assert_array_equal(ref.select_experts(c, 2), [[0, 1], [1, 2]])
    np.testing.assert_array_equal(ref.select_experts(c, 4), [[0, 1, 3, 2], [1, 2, 3, 0]])


def test_signed_zeros_tie():
    c = np.array([[-0.0, 0.0, -1.0]])
    np.testing.assert_array_equal(ref.select_experts(c, 2), [[0, 1]])


def test_nan_loses_to_every_number():
    nan, inf = np.nan, np.inf
    c = np.array(
        [[nan, 0.1, 0.3, nan], [nan, -inf, nan, nan], [nan, nan, nan, nan], [inf, nan, -inf, 1.0]]
    )
    np.testing.assert_array_equal(
        ref.select_experts(c, 3), [[2, 1, 0], [1, 0, 2], [0, 1, 2], [0, 3, 2]]
    )
    e = ref.select_experts(c, 4)
    for row in e:
        assert sorted(row) == [0, 1, 2, 3]  # k distinct experts, always


def test_groups_use_the_sum_of_the_two_best():
    # groups (0,1) (2,3) (4,5): sums 0.9, 0.95, 0.7. Group 0 holds the best expert but
    # group 1 wins with topk_groups = 1.
    c = np.array([[0.9, 0.0, 0.5, 0.45, 0.6, 0.1]])
    np.testing.assert_array_equal(ref.group_scores(c, 3), [[0.9, 0.95, 0.7]])
    np.testing.assert_array_equal(ref.select_experts(c, 2, 3, 1), [[2, 3]])
    np.testing.assert_array_equal(ref.select_experts(c, 3, 3, 2), [[0, 2, 3]])
    np.testing.assert_array_equal(ref.select_experts(c, 2, 1, 1), [[0, 4]])


def test_groups_of_one_expert_use_its_score():
    c = np.array([[0.2, 0.9, 0.5, 0.7]])
    np.testing.assert_array_equal(ref.group_scores(c, 4), c)
    np.testing.assert_array_equal(ref.select_experts(c, 2, 4, 3), [[1, 3]])


def test_group_ties_and_nan():
    # equal group sums: lower group wins; a group with NaN among its two best loses.
    c = np.array([[0.3, 0.2, 0.25, 0.25, 0.9, np.nan], [np.nan, np.nan, 0.1, 0.0, 0.05, 0.0]])
    gs = ref.group_scores(c, 3)
    np.testing.assert_allclose(gs[0, :2], [0.5, 0.5])
    assert np.isnan(gs[0, 2]) and np.isnan(gs[1, 0])
    np.testing.assert_array_equal(ref.select_experts(c, 2, 3, 1), [[0, 1], [2, 3]])
    np.testing.assert_array_equal(ref.select_experts(c, 4, 3, 2), [[0, 2, 3, 1], [2, 4, 3, 5]])


def test_router_weights_come_from_scores_not_bias():
    x = np.eye(4)
    wr = np.diag([1.0, 2.0, 3.0, 4.0])
    bias = np.array([10.0, 0.0, 0.0, 0.0])  # forces expert 0 first
    w, e, logits = ref.router(x, wr, bias, scoring="sigmoid", top_k=2, scaling=2.0)
    s = 1 / (1 + np.exp(-logits))
    assert (e[:, 0] == 0).all()
    np.testing.assert_allclose(w, 2.0 * np.take_along_axis(s, e.astype(int), 1))
    w2, e2, _ = ref.router(x, wr, bias, scoring="sigmoid", top_k=2, renormalize=True, scaling=2.5)
    u = np.take_along_axis(s, e2.astype(int), 1)
    np.testing.assert_allclose(w2, 2.5 * u / u.sum(1, keepdims=True))


def test_softmax_router_matches_definition():
    rng = np.random.default_rng(0)
    x, wr = rng.standard_normal((5, 3)), rng.standard_normal((3, 4))
    w, e, logits = ref.router(x, wr, top_k=2)
    np.testing.assert_allclose(logits, x @ wr)
    s = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    np.testing.assert_array_equal(e, np.argsort(-s, axis=1, kind="stable")[:, :2])
    np.testing.assert_allclose(w, np.take_along_axis(s, e.astype(int), 1))
    assert e.dtype == np.int32


def test_renormalise_skipped_when_the_sum_is_zero():
    # sigmoid of -1000 is 0: the selected scores sum to 0 and are left as they are.
    x = np.array([[1.0]])
    wr = np.array([[-1000.0, -1000.0, -2000.0]])
    w, e, logits = ref.router(x, wr, scoring="sigmoid", top_k=2, renormalize=True, scaling=2.0)
    np.testing.assert_array_equal(e, [[0, 1]])
    np.testing.assert_array_equal(w, [[0.0, 0.0]])
    dx, dwr = ref.router_grad(
        x, wr, logits, e, np.ones((1, 2)), scoring="sigmoid", renormalize=True, scaling=2.0
    )
    assert np.all(np.isfinite(dx)) and np.all(dx == 0) and np.all(dwr == 0)


def test_nan_logits_select_k_distinct_experts():
    x = np.array([[1.0, np.nan], [1.0, 0.0]])
    wr = np.array([[0.1, 0.2, 0.3], [1.0, 0.0, 1.0]])
    w, e, _ = ref.router(x, wr, scoring="sigmoid", top_k=2)
    # token 0: logits NaN, 0*... -> NaN for experts 0 and 2, expert 1 gets NaN*0 = NaN too
    for row in e:
        assert len(set(row.tolist())) == 2 and all(0 <= v < 3 for v in row)
    np.testing.assert_array_equal(e[1], [2, 1])


# --------------------------------------------------------------------------- dispatch


def test_dispatch_queues():
    experts = np.array([[1, 0], [1, 2], [0, 1]], np.int32)
    token_ids, offsets, rows = ref.dispatch(experts, 3)
    np.testing.assert_array_equal(offsets, [0, 2, 5, 6])
    np.testing.assert_array_equal(token_ids, [0, 2, 0, 1, 2, 1])
    np.testing.assert_array_equal(rows, [[2, 0], [3, 5], [1, 4]])
    assert token_ids.dtype == offsets.dtype == rows.dtype == np.int32


def test_dispatch_capacity_keeps_the_first_pairs():
    experts = np.array([[1, 0], [1, 2], [0, 1]], np.int32)
    token_ids, offsets, rows = ref.dispatch(experts, 3, capacity=1)
    np.testing.assert_array_equal(offsets, [0, 1, 2, 3])
    np.testing.assert_array_equal(rows, [[1, 0], [-1, 2], [-1, -1]])
    np.testing.assert_array_equal(token_ids, [0, 0, 1, 0, 0, 0])  # unused rows are 0


def test_dispatch_drops_out_of_range_experts():
    experts = np.array([[-1, 0], [3, 2], [0, 7]], np.int32)
    token_ids, offsets, rows = ref.dispatch(experts, 3)
    np.testing.assert_array_equal(offsets, [0, 2, 2, 3])
    np.testing.assert_array_equal(rows, [[-1, 0], [-1, 2], [1, -1]])
    np.testing.assert_array_equal(token_ids, [0, 2, 1, 0, 0, 0])


def test_dispatch_empty_experts_and_all_to_one():
    experts = np.full((5, 1), 2, np.int32)
    token_ids, offsets, rows = ref.dispatch(experts, 4)
    np.testing.assert_array_equal(offsets, [0, 0, 0, 5, 5])
    np.testing.assert_array_equal(token_ids, np.arange(5))
    np.testing.assert_array_equal(rows[:, 0], np.arange(5))
    token_ids, offsets, rows = ref.dispatch(experts, 4, capacity=2)
    np.testing.assert_array_equal(offsets, [0, 0, 0, 2, 2])
    np.testing.assert_array_equal(rows[:, 0], [0, 1, -1, -1, -1])


def test_dispatch_zero_tokens():
    token_ids, offsets, rows = ref.dispatch(np.zeros((0, 2), np.int32), 5)
    assert token_ids.shape == (0,) and rows.shape == (0, 2)
    np.testing.assert_array_equal(offsets, np.zeros(6))


def test_capacity_formula():
    assert capacity_for(None, 37, 2, 5) == 74
    assert capacity_for(1.25, 37, 1, 5) == 10  # ceil(9.25)
    assert capacity_for(1.0, 40, 2, 5) == 16
    assert capacity_for(1e-9, 3, 1, 5) == 1
    assert capacity_for(4.0, 3, 1, 5) == 3  # bounded by T * k
    # f64, left to right, as the conversion computes it: 1.1 * 25 * 2 / 5 is
    # 11.000000000000002 in f64, so the capacity is 12, not the exact 11.
    assert capacity_for(1.1, 25, 2, 5) == 12
    assert (
        LayerConfig(tokens=37, hidden=4, ffn=4, experts=5, top_k=1, capacity_factor=1.25).capacity
        == 10
    )


# --------------------------------------------------------------------------- forward


def naive_layer(cfg, args):
    """Token by token, straight from the definitions."""
    out, logits, cache = ref.layer_forward(cfg, **args)
    T = cfg.tokens
    x = args["x"]
    expect = np.zeros_like(x)
    for t in range(T):
        for j in range(cfg.top_k):
            if cache.rows[t, j] < 0:
                continue
            e = cache.experts[t, j]
            h = x[t] @ args["w_gate_up"][e]
            a = ref.activation(h[None], cfg.activation)[0]
            expect[t] += cache.weights[t, j] * (a @ args["w_down"][e])
        if cfg.has_shared:
            h = x[t] @ args["shared_gate_up"]
            expect[t] += ref.activation(h[None], cfg.activation)[0] @ args["shared_down"]
    return out, expect, cache


@pytest.mark.parametrize("key", sorted(GRAD_CONFIGS))
def test_layer_forward_matches_token_by_token(key):
    cfg = GRAD_CONFIGS[key]
    out, expect, cache = naive_layer(cfg, make_inputs(cfg, 42))
    np.testing.assert_allclose(out, expect, rtol=1e-12, atol=1e-12)
    # unused rows of y and h are zero
    used = int(cache.offsets[-1])
    assert not cache.y[used:].any() and not cache.h[used:].any()


def test_activations():
    v = np.linspace(-4, 4, 9)
    np.testing.assert_allclose(ref.activation(v, "silu"), v / (1 + np.exp(-v)))
    gelu = np.array([0.5 * t * (1 + math.erf(t / math.sqrt(2))) for t in v])
    np.testing.assert_allclose(ref.activation(v, "gelu"), gelu, rtol=1e-15)
    h = np.stack([v, 2 * v], axis=-1)  # n = 1: gate v, up 2v
    np.testing.assert_allclose(ref.activation(h, "swiglu")[:, 0], v / (1 + np.exp(-v)) * 2 * v)
    for act, width in (("silu", 3), ("gelu", 3), ("swiglu", 6)):
        h = np.random.default_rng(1).standard_normal((4, width))
        da = np.random.default_rng(2).standard_normal((4, width // (2 if act == "swiglu" else 1)))
        g = ref.activation_grad(h, da, act)
        eps = 1e-6
        num = np.zeros_like(h)
        for i in np.ndindex(h.shape):
            p, m = h.copy(), h.copy()
            p[i] += eps
            m[i] -= eps
            num[i] = (np.sum(ref.activation(p, act) * da) - np.sum(ref.activation(m, act) * da)) / (
                2 * eps
            )
        np.testing.assert_allclose(g, num, atol=1e-8)


def test_all_tokens_to_one_expert_and_empty_experts():
    cfg = LayerConfig(tokens=9, hidden=4, ffn=3, experts=4, top_k=1, renormalize=True)
    args = make_inputs(cfg, 0)
    args["x"] = np.abs(args["x"]) + 0.1
    args["w_router"][:, 2] = 5.0
    out, expect, cache = naive_layer(cfg, args)
    assert (cache.experts == 2).all()
    np.testing.assert_array_equal(cache.offsets, [0, 0, 0, 9, 9])
    np.testing.assert_allclose(out, expect, rtol=1e-12)
    np.testing.assert_allclose(cache.weights, 1.0)
    check_layer_gradients(cfg, seed=0)


def test_k_equals_e_and_one_token():
    cfg = LayerConfig(tokens=1, hidden=3, ffn=2, experts=3, top_k=3)
    args = make_inputs(cfg, 1)
    out, expect, cache = naive_layer(cfg, args)
    assert sorted(cache.experts[0].tolist()) == [0, 1, 2]
    np.testing.assert_allclose(cache.weights.sum(), 1.0)  # all softmax scores
    np.testing.assert_allclose(out, expect, rtol=1e-12)
    np.testing.assert_array_equal(cache.offsets, [0, 1, 2, 3])


def test_zero_tokens():
    cfg = LayerConfig(tokens=0, hidden=3, ffn=2, experts=3, top_k=2, shared_ffn=2)
    args = make_inputs(cfg, 1)
    out, logits, cache = ref.layer_forward(cfg, **args)
    assert out.shape == (0, 3) and logits.shape == (0, 3)
    grads = ref.layer_backward(cfg, cache, np.zeros((0, 3)), np.zeros((0, 3)))
    assert grads[0].shape == (0, 3)
    assert all(not g.any() for g in grads)


def test_combine_and_its_gradient():
    rng = np.random.default_rng(5)
    y = rng.standard_normal((6, 3))
    weights = rng.standard_normal((3, 2))
    rows = np.array([[4, -1], [0, 1], [2, 5]], np.int32)
    out = ref.combine(y, weights, rows)
    np.testing.assert_allclose(out[0], weights[0, 0] * y[4])
    np.testing.assert_allclose(out[1], weights[1, 0] * y[0] + weights[1, 1] * y[1])
    dout = rng.standard_normal((3, 3))
    dy, dw = ref.combine_grad(dout, weights, rows, y)
    assert dw[0, 1] == 0
    np.testing.assert_allclose(dw[2, 1], dout[2] @ y[5])
    np.testing.assert_allclose(dy[3], 0)  # nobody owns row 3
    np.testing.assert_allclose(dy[5], weights[2, 1] * dout[2])


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(top_k=5), "exceeds the number of experts"),
        (dict(num_groups=3), "must divide"),
        (dict(num_groups=2, topk_groups=3), "topk_groups"),
        (dict(num_groups=4, topk_groups=1, top_k=2), "best groups"),
        (dict(scoring="relu"), "scoring"),
        (dict(activation="relu"), "activation"),
        (dict(capacity_factor=0.0), "capacity_factor"),
        (dict(capacity_factor=float("inf")), "capacity_factor"),
        (dict(scaling_factor=-1.0), "scaling_factor"),
        (dict(top_k=0), "top_k"),
        (dict(tokens=-1), "tokens"),
        (dict(shared_ffn=-2), "shared_ffn"),
        (dict(dtype="f8"), "dtype"),
        (dict(renormalize=1), "renormalize"),
    ],
)
def test_validate_rejects_impossible_configs(kwargs, message):
    cfg = LayerConfig(**{**dict(tokens=4, hidden=3, ffn=2, experts=4, top_k=2), **kwargs})
    with pytest.raises(ValueError, match=message):
        cfg.validate()


def test_layer_forward_checks_shapes():
    cfg = LayerConfig(tokens=4, hidden=3, ffn=2, experts=4, top_k=2)
    args = make_inputs(cfg, 0)
    args["w_down"] = args["w_down"][:, :1]
    with pytest.raises(ValueError, match="w_down"):
        ref.layer_forward(cfg, **args)
    args = make_inputs(cfg, 0)
    with pytest.raises(ValueError, match="router_bias"):
        ref.layer_forward(cfg, **args, router_bias=np.zeros(4))


# --------------------------------------------------------------------------- out of range


def test_out_of_range_indices_are_skipped_like_the_kernels():
    rng = np.random.default_rng(9)
    x, wr = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    logits = x @ wr
    experts = np.array([[0, 1], [2, -1], [7, 3]], np.int32)
    dw = rng.standard_normal((3, 2))
    dx, dwr = ref.router_grad(x, wr, logits, experts, dw, scoring="sigmoid")
    # the same as in-range picks whose weight cotangent is 0
    same = np.array([[0, 1], [2, 0], [1, 3]], np.int32)
    dw_same = dw.copy()
    dw_same[1, 1] = dw_same[2, 0] = 0
    dx2, dwr2 = ref.router_grad(x, wr, logits, same, dw_same, scoring="sigmoid")
    np.testing.assert_allclose(dx, dx2)
    np.testing.assert_allclose(dwr, dwr2)
    y = rng.standard_normal((6, 2))
    weights = rng.standard_normal((3, 2))
    rows = np.array([[0, 6], [-1, 2], [3, 99]], np.int32)
    out = ref.combine(y, weights, rows)
    np.testing.assert_allclose(
        out, [weights[0, 0] * y[0], weights[1, 1] * y[2], weights[2, 0] * y[3]]
    )
    dy, d_w = ref.combine_grad(np.ones((3, 2)), weights, rows, y)
    assert d_w[0, 1] == 0 and d_w[2, 1] == 0 and d_w[1, 0] == 0
