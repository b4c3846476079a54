"""NumPy reference of an MoE layer, forward and backward (docs/cpu-path.md §2).

Every function mirrors one CPU kernel (`__moe_cpu_*`, docs/cpu-path.md §1) and computes in the
floating type of its inputs: float64 when any float input is float64, float32 otherwise.
Index tensors (experts, token ids, offsets, rows) are int32.

The whole layer: `layer_forward` and `layer_backward`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, Optional, Tuple

import numpy as np

from .config import ACTIVATIONS, SCORINGS, LayerConfig, capacity_for

__all__ = [
    "LayerConfig",
    "capacity_for",
    "compute_dtype",
    "scores",
    "select_experts",
    "group_scores",
    "router",
    "router_grad",
    "dispatch",
    "activation",
    "activation_grad",
    "expert_ffn",
    "expert_ffn_grad",
    "expert_combine_grad",
    "shared_expert",
    "shared_expert_grad",
    "combine",
    "combine_grad",
    "aux_loss",
    "aux_loss_grad",
    "BIAS_UPDATE_RULES",
    "expert_loads",
    "update_selection_bias",
    "LayerCache",
    "layer_forward",
    "layer_backward",
]


# --------------------------------------------------------------------------- helpers


def compute_dtype(*arrays) -> np.dtype:
    """float64 when any floating input is float64, else float32."""
    for a in arrays:
        if a is not None and np.asarray(a).dtype == np.float64:
            return np.dtype(np.float64)
    return np.dtype(np.float32)


def _f(a, dtype) -> np.ndarray:
    return np.asarray(a, dtype=dtype)


def _i32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.int32)


def _check_scoring(scoring: str) -> None:
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")


def _check_act(act: str) -> None:
    if act not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {act!r}")


def _sigmoid(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(1 / (1 + np.exp(-v)), dtype=v.dtype)


def _softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, maximum subtracted."""
    if logits.shape[-1] == 0:
        return logits.copy()
    with np.errstate(invalid="ignore", over="ignore"):
        m = np.max(logits, axis=-1, keepdims=True)
        e = np.exp(logits - m)
        return e / np.sum(e, axis=-1, keepdims=True)


def _logsumexp(logits: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = np.max(logits, axis=-1)
        return m + np.log(np.sum(np.exp(logits - m[..., None]), axis=-1))


_erf_u = np.frompyfunc(math.erf, 1, 1)


def _erf(v: np.ndarray) -> np.ndarray:
    # math.erf in double precision, rounded to the input's type.
    return np.asarray(_erf_u(v.astype(np.float64)), dtype=np.float64).astype(v.dtype)


def scores(logits: np.ndarray, scoring: str) -> np.ndarray:
    """s = softmax(logits) over the experts, or sigmoid(logits)."""
    _check_scoring(scoring)
    logits = np.asarray(logits)
    return _softmax(logits) if scoring == "softmax" else _sigmoid(logits)


# --------------------------------------------------------------------------- selection


def _argbest(values: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Per row, the index of the best candidate under the order rule of docs/cpu-path.md §2.

    Scanning candidates in index order, a candidate beats the current best when it is not NaN
    and (the best is NaN or it is strictly greater). Hence: the first index of the maximum
    among non-NaN candidates; the first candidate when every candidate is NaN. Every row must
    have a candidate.
    """
    valid = candidates & ~np.isnan(values)
    masked = np.where(valid, values, -np.inf)
    best_value = masked.max(axis=1, initial=-np.inf)
    is_best = valid & (masked == best_value[:, None])
    has_valid = valid.any(axis=1)
    first_best = np.argmax(is_best, axis=1)
    first_candidate = np.argmax(candidates, axis=1)
    return np.where(has_valid, first_best, first_candidate)


def group_scores(c: np.ndarray, num_groups: int) -> np.ndarray:
    """[T, G]: the sum of each group's two best selection scores (its best when E/G = 1)."""
    T, E = c.shape
    size = E // num_groups
    groups = c.reshape(T, num_groups, size).transpose(1, 0, 2)  # [G, T, size]
    out = np.empty((T, num_groups), dtype=c.dtype)
    rows = np.arange(T)
    for g in range(num_groups):
        vals = groups[g]
        avail = np.ones_like(vals, dtype=bool)
        b1 = _argbest(vals, avail)
        score = vals[rows, b1]
        if size > 1:
            avail[rows, b1] = False
            b2 = _argbest(vals, avail)
            score = score + vals[rows, b2]
        out[:, g] = score
    return out


def select_experts(
    c: np.ndarray, top_k: int, num_groups: int = 1, topk_groups: int = 1
) -> np.ndarray:
    """[T, k] int32: k rounds of the best remaining candidate of the selection scores `c`
    (group-limited when num_groups > 1). experts[t, j] is the j-th pick."""
    c = np.asarray(c)
    T, E = c.shape
    if top_k > E:
        raise ValueError(f"top_k ({top_k}) exceeds the number of experts ({E})")
    if num_groups < 1 or E % num_groups != 0:
        raise ValueError(f"num_groups ({num_groups}) must divide the number of experts ({E})")
    if not 1 <= topk_groups <= num_groups:
        raise ValueError(
            f"topk_groups must be in [1, num_groups = {num_groups}], got {topk_groups}"
        )
    rows = np.arange(T)
    candidates = np.ones((T, E), dtype=bool)
    if num_groups > 1:
        size = E // num_groups
        if top_k > topk_groups * size:
            raise ValueError(
                f"top_k ({top_k}) exceeds the {topk_groups * size} experts of "
                f"the topk_groups ({topk_groups}) best groups"
            )
        gs = group_scores(c, num_groups)
        gavail = np.ones((T, num_groups), dtype=bool)
        kept = np.zeros((T, num_groups), dtype=bool)
        for _ in range(topk_groups):
            g = _argbest(gs, gavail)
            gavail[rows, g] = False
            kept[rows, g] = True
        candidates = np.repeat(kept, size, axis=1)
    experts = np.empty((T, top_k), dtype=np.int32)
    for j in range(top_k):
        e = _argbest(c, candidates)
        experts[:, j] = e
        candidates[rows, e] = False
    return experts


# --------------------------------------------------------------------------- router


def router(
    x,
    wr,
    bias=None,
    *,
    scoring: str = "softmax",
    top_k: int = 1,
    renormalize: bool = False,
    num_groups: int = 1,
    topk_groups: int = 1,
    scaling: float = 1.0,
    logits=None,
):
    """`__moe_cpu_router`: returns weights [T,k], experts [T,k] int32, logits [T,E].
    `logits` given (e.g. rounded to bf16, routing round_logits) replaces x @ wr."""
    _check_scoring(scoring)
    dt = compute_dtype(x, wr)
    x, wr = _f(x, dt), _f(wr, dt)
    if logits is not None:
        logits = _f(logits, dt)
    else:
        with np.errstate(invalid="ignore", over="ignore"):  # NaN and inf propagate (IEEE)
            logits = x @ wr
    s = scores(logits, scoring)
    c = s if bias is None else s + _f(bias, dt)[None, :]
    experts = select_experts(c, top_k, num_groups, topk_groups)
    u = np.take_along_axis(s, experts.astype(np.intp), axis=1)
    w = u.copy()
    if renormalize:
        total = np.zeros(u.shape[0], dtype=dt)
        for j in range(top_k):  # the sum in j order
            total = total + u[:, j]
        nz = total != 0
        with np.errstate(invalid="ignore", divide="ignore"):
            w = np.where(nz[:, None], w / np.where(nz, total, 1)[:, None], w)
    w = (w * dt.type(scaling)).astype(dt)
    return w, experts, logits


def router_grad(
    x,
    wr,
    logits,
    experts,
    d_weights,
    d_logits=None,
    *,
    scoring: str = "softmax",
    renormalize: bool = False,
    scaling: float = 1.0,
):
    """`__moe_cpu_router_grad`: returns dx [T,d], d_wr [d,E]."""
    _check_scoring(scoring)
    dt = compute_dtype(x, wr, logits, d_weights, d_logits)
    x, wr, logits, dw = _f(x, dt), _f(wr, dt), _f(logits, dt), _f(d_weights, dt)
    experts = _i32(experts).astype(np.intp)
    T, E = logits.shape
    k = experts.shape[1]
    s = scores(logits, scoring)
    valid = (experts >= 0) & (experts < E)  # picks outside [0, E) are skipped
    safe = np.where(valid, experts, 0)
    u = np.where(valid, np.take_along_axis(s, safe, axis=1), 0).astype(dt)
    dw = np.where(valid, dw, 0).astype(dt)
    sc = dt.type(scaling)
    if renormalize:
        S = np.zeros(T, dtype=dt)
        dot = np.zeros(T, dtype=dt)
        for j in range(k):
            S = S + u[:, j]
            dot = dot + dw[:, j] * u[:, j]
        nz = S != 0
        Ssafe = np.where(nz, S, 1)
        du = sc * (dw / Ssafe[:, None] - (dot / (Ssafe * Ssafe))[:, None])
        du = np.where(nz[:, None], du, 0).astype(dt)
    else:
        du = (sc * dw).astype(dt)
    ds = np.zeros((T, E), dtype=dt)
    rows = np.arange(T)
    for j in range(k):
        v = valid[:, j]
        ds[rows[v], experts[v, j]] = du[v, j]
    if scoring == "softmax":
        inner = np.sum(ds * s, axis=1, keepdims=True)
        dl = s * (ds - inner)
    else:
        dl = ds * s * (1 - s)
    if d_logits is not None:
        dl = dl + _f(d_logits, dt)
    dx = dl @ wr.T
    d_wr = x.T @ dl
    return dx, d_wr


# --------------------------------------------------------------------------- dispatch


def dispatch(experts, num_experts: int, capacity: Optional[int] = None):
    """`__moe_cpu_dispatch`: returns token_ids [R], offsets [E+1], rows [T,k] (all int32).

    `capacity=None` means T*k (dropless)."""
    experts = _i32(experts)
    T, k = experts.shape
    R = T * k
    E = int(num_experts)
    cap = R if capacity is None else int(capacity)
    kept_counts = np.zeros(E, dtype=np.int64)
    keep = np.zeros((T, k), dtype=bool)
    # The i-th kept pair of its expert (pair order t-major, j-minor).
    rank = np.zeros((T, k), dtype=np.int64)
    for t in range(T):
        for j in range(k):
            e = int(experts[t, j])
            if 0 <= e < E and kept_counts[e] < cap:
                rank[t, j] = kept_counts[e]
                kept_counts[e] += 1
                keep[t, j] = True
    offsets = np.zeros(E + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(kept_counts)
    rows = np.full((T, k), -1, dtype=np.int64)
    token_ids = np.zeros(R, dtype=np.int32)
    tt, jj = np.nonzero(keep)
    r = offsets[experts[tt, jj]] + rank[tt, jj]
    rows[tt, jj] = r
    token_ids[r] = tt
    return token_ids, offsets.astype(np.int32), rows.astype(np.int32)


# --------------------------------------------------------------------------- activations


def _silu(v):
    return v * _sigmoid(v)


def _silu_grad(v):
    s = _sigmoid(v)
    return s * (1 + v * (1 - s))


def _gelu(v):
    return v / 2 * (1 + _erf(v / v.dtype.type(math.sqrt(2.0))))


def _gelu_grad(v):
    cdf = (1 + _erf(v / v.dtype.type(math.sqrt(2.0)))) / 2
    pdf = np.exp(-v * v / 2) / v.dtype.type(math.sqrt(2 * math.pi))
    return cdf + v * pdf


# gelu_tanh's constants, as torch's gelu(approximate="tanh") has them
_GELU_TANH_BETA = math.sqrt(2 / math.pi)
_GELU_TANH_KAPPA = 0.044715


def _gelu_tanh_inner(v):
    t = v.dtype.type
    return np.tanh(t(_GELU_TANH_BETA) * (v + t(_GELU_TANH_KAPPA) * v * v * v))


def _gelu_tanh(v):
    return v.dtype.type(0.5) * v * (1 + _gelu_tanh_inner(v))


def _gelu_tanh_grad(v):
    t = v.dtype.type
    th = _gelu_tanh_inner(v)
    inner_grad = t(_GELU_TANH_BETA) * (1 + t(3 * _GELU_TANH_KAPPA) * v * v)
    return t(0.5) * (1 + th) + t(0.5) * v * (1 - th * th) * inner_grad


def activation(h, act: str):
    """a = act(h). swiglu: silu(h[:, :n]) * h[:, n:]; gelu exact (erf); silu; gelu_tanh
    0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3)))."""
    _check_act(act)
    h = np.asarray(h)
    if act == "swiglu":
        n = h.shape[-1] // 2
        return _silu(h[..., :n]) * h[..., n:]
    if act == "gelu":
        return _gelu(h)
    if act == "gelu_tanh":
        return _gelu_tanh(h)
    return _silu(h)


def activation_grad(h, da, act: str):
    """dh = act'(h) · da (swiglu: dg = da·u·silu'(g), du = da·silu(g))."""
    _check_act(act)
    h = np.asarray(h)
    da = np.asarray(da, dtype=h.dtype)
    if act == "swiglu":
        n = h.shape[-1] // 2
        g, u = h[..., :n], h[..., n:]
        return np.concatenate([da * u * _silu_grad(g), da * _silu(g)], axis=-1)
    if act == "gelu":
        return da * _gelu_grad(h)
    if act == "gelu_tanh":
        return da * _gelu_tanh_grad(h)
    return da * _silu_grad(h)


# --------------------------------------------------------------------------- experts


def _expert_rows(offsets, E):
    offsets = _i32(offsets)
    for e in range(E):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi > lo:
            yield e, lo, hi


def _check_biases(bgu, bd, E, G, d):
    if (bgu is None) != (bd is None):
        raise ValueError("expected both b_gate_up and b_down, or neither")
    if bgu is not None:
        if np.shape(bgu) != (E, G):
            raise ValueError(f"b_gate_up has shape {np.shape(bgu)}, expected {(E, G)}")
        if np.shape(bd) != (E, d):
            raise ValueError(f"b_down has shape {np.shape(bd)}, expected {(E, d)}")


def expert_ffn(x, token_ids, offsets, wgu, wd, act: str, bgu=None, bd=None):
    """`__moe_cpu_expert_ffn`: returns y [R,d], h [R,G]; rows from offsets[E] on are 0.
    With the biases bgu [E,G] and bd [E,d]: h = x·wgu[e] + bgu[e], y = act(h)·wd[e] + bd[e]."""
    _check_act(act)
    dt = compute_dtype(x, wgu, wd, bgu, bd)
    x, wgu, wd = _f(x, dt), _f(wgu, dt), _f(wd, dt)
    token_ids = _i32(token_ids)
    E, d, G = wgu.shape
    _check_biases(bgu, bd, E, G, d)
    R = token_ids.shape[0]
    y = np.zeros((R, d), dtype=dt)
    h = np.zeros((R, G), dtype=dt)
    for e, lo, hi in _expert_rows(offsets, E):
        he = x[token_ids[lo:hi]] @ wgu[e]
        if bgu is not None:
            he = he + _f(bgu, dt)[e]
        h[lo:hi] = he
        y[lo:hi] = activation(he, act) @ wd[e]
        if bd is not None:
            y[lo:hi] += _f(bd, dt)[e]
    return y, h


def _ffn_backward(x, token_ids, offsets, wgu, wd, h, dy, act, dt):
    E, d, G = wgu.shape
    T = x.shape[0]
    dx = np.zeros((T, d), dtype=dt)
    d_wgu = np.zeros_like(wgu)
    d_wd = np.zeros_like(wd)
    d_bgu = np.zeros((E, G), dtype=dt)
    d_bd = np.zeros((E, d), dtype=dt)
    for e, lo, hi in _expert_rows(offsets, E):
        he, dye = h[lo:hi], dy[lo:hi]
        tok = token_ids[lo:hi]
        a = activation(he, act)
        da = dye @ wd[e].T
        dh = activation_grad(he, da, act)
        d_wd[e] = a.T @ dye
        d_wgu[e] = x[tok].T @ dh
        d_bgu[e] = dh.sum(axis=0)
        d_bd[e] = dye.sum(axis=0)
        np.add.at(dx, tok, dh @ wgu[e].T)  # ascending rows
    return dx, d_wgu, d_wd, d_bgu, d_bd


def expert_ffn_grad(x, token_ids, offsets, wgu, wd, h, dy, act: str, bias: bool = False):
    """`__moe_cpu_expert_ffn_grad`: returns dx [T,d], d_wgu, d_wd, plus with `bias` the
    bias gradients d_bgu [E,G] and d_bd [E,d] (each expert's column sums of dh and dy)."""
    _check_act(act)
    dt = compute_dtype(x, wgu, wd, h, dy)
    grads = _ffn_backward(
        _f(x, dt), _i32(token_ids), offsets, _f(wgu, dt), _f(wd, dt), _f(h, dt), _f(dy, dt), act, dt
    )
    return grads if bias else grads[:3]


def expert_combine_grad(
    x, token_ids, offsets, rows, weights, wgu, wd, h, dout, act: str, bd=None, bias: bool = False
):
    """`__moe_cpu_expert_combine_grad`: the expert FFN gradient fused with the combine
    gradient. Returns dx [T,d], d_weights [T,k], d_wgu, d_wd, plus with `bias` d_bgu, d_bd.

    For each kept (t, j), r = rows[t, j], expert e of r: ga = dout[t]·wd[e]ᵀ,
    d_weights[t, j] = <ga, act(h[r])> (+ <dout[t], bd[e]> with the down bias bd),
    dy[r] = weights[t, j]·dout[t]."""
    _check_act(act)
    dt = compute_dtype(x, weights, wgu, wd, h, dout, bd)
    x, wgu, wd, h, dout = _f(x, dt), _f(wgu, dt), _f(wd, dt), _f(h, dt), _f(dout, dt)
    weights = _f(weights, dt)
    rows = _i32(rows)
    token_ids = _i32(token_ids)
    offsets = _i32(offsets)
    E = wgu.shape[0]
    T, k = rows.shape
    R = h.shape[0]
    d_weights = np.zeros((T, k), dtype=dt)
    dy = np.zeros((R, x.shape[1]), dtype=dt)
    expert_of_row = np.full(R, -1, dtype=np.int64)
    for e, lo, hi in _expert_rows(offsets, E):
        expert_of_row[lo:hi] = e
    for j in range(k):
        r_all = rows[:, j].astype(np.intp)
        inr = (r_all >= 0) & (r_all < R)
        kept = inr & (expert_of_row[np.where(inr, r_all, 0)] >= 0) if R else inr
        tt = np.nonzero(kept)[0]
        r = r_all[tt]
        e = expert_of_row[r]
        ga = np.einsum("td,tnd->tn", dout[tt], wd[e])
        d_weights[tt, j] = np.sum(ga * activation(h[r], act), axis=1)
        if bd is not None:
            d_weights[tt, j] += np.sum(dout[tt] * _f(bd, dt)[e], axis=1)
        dy[r] = weights[tt, j][:, None] * dout[tt]
    dx, d_wgu, d_wd, d_bgu, d_bd = _ffn_backward(x, token_ids, offsets, wgu, wd, h, dy, act, dt)
    if bias:
        return dx, d_weights, d_wgu, d_wd, d_bgu, d_bd
    return dx, d_weights, d_wgu, d_wd


def shared_expert(x, wgu, wd, act: str):
    """`__moe_cpu_shared_expert`: returns y [T,d], h [T,G]."""
    _check_act(act)
    dt = compute_dtype(x, wgu, wd)
    x, wgu, wd = _f(x, dt), _f(wgu, dt), _f(wd, dt)
    h = x @ wgu
    return activation(h, act) @ wd, h


def shared_expert_grad(x, wgu, wd, h, dy, act: str):
    """`__moe_cpu_shared_expert_grad`: returns dx, d_wgu, d_wd."""
    _check_act(act)
    dt = compute_dtype(x, wgu, wd, h, dy)
    x, wgu, wd, h, dy = _f(x, dt), _f(wgu, dt), _f(wd, dt), _f(h, dt), _f(dy, dt)
    a = activation(h, act)
    dh = activation_grad(h, dy @ wd.T, act)
    return dh @ wgu.T, x.T @ dh, a.T @ dy


# --------------------------------------------------------------------------- combine


def combine(y, weights, rows):
    """`__moe_cpu_combine`: out[t] = Σ_j (rows[t,j] ≥ 0) weights[t,j]·y[rows[t,j]], in j order."""
    dt = compute_dtype(y, weights)
    y, weights, rows = _f(y, dt), _f(weights, dt), _i32(rows)
    T, k = rows.shape
    out = np.zeros((T, y.shape[1]), dtype=dt)
    R = y.shape[0]
    for j in range(k):
        kept = (rows[:, j] >= 0) & (rows[:, j] < R)
        r = np.where(kept, rows[:, j], 0)
        if R:
            out = np.where(kept[:, None], out + weights[:, j][:, None] * y[r], out)
    return out


def combine_grad(dout, weights, rows, y):
    """`__moe_cpu_combine_grad`: returns dy [R,d] (0 on rows nobody owns), d_weights [T,k]."""
    dt = compute_dtype(dout, weights, y)
    dout, weights, rows, y = _f(dout, dt), _f(weights, dt), _i32(rows), _f(y, dt)
    T, k = rows.shape
    dy = np.zeros_like(y)
    d_weights = np.zeros((T, k), dtype=dt)
    R = y.shape[0]
    for j in range(k):
        tt = np.nonzero((rows[:, j] >= 0) & (rows[:, j] < R))[0]
        r = rows[tt, j]
        dy[r] = weights[tt, j][:, None] * dout[tt]
        d_weights[tt, j] = np.sum(dout[tt] * y[r], axis=1)
    return dy, d_weights


# --------------------------------------------------------------------------- aux losses


def _aux_probs(logits, scoring):
    if scoring == "softmax":
        return _softmax(logits), None
    sig = _sigmoid(logits)
    total = np.sum(sig, axis=1, keepdims=True)
    return sig / total, (sig, total)


def _expert_fractions(experts, T, E, dt):
    experts = _i32(experts)
    k = experts.shape[1] if experts.ndim == 2 else 0
    valid = (experts >= 0) & (experts < E)
    counts = np.bincount(experts[valid].astype(np.intp), minlength=E)[:E]
    return (counts / (T * k)).astype(dt) if T * k else np.zeros(E, dtype=dt)


def aux_loss(logits, experts, scoring: str = "softmax"):
    """`__moe_cpu_aux_loss`: returns (load_balance, z_loss) as 0-d arrays."""
    _check_scoring(scoring)
    dt = compute_dtype(logits)
    logits = _f(logits, dt)
    T, E = logits.shape
    if T == 0:
        return np.zeros((), dtype=dt), np.zeros((), dtype=dt)
    p, _ = _aux_probs(logits, scoring)
    f = _expert_fractions(experts, T, E, dt)
    P = np.mean(p, axis=0)
    lb = dt.type(E) * np.sum(f * P)
    lse = _logsumexp(logits)
    z = np.mean(lse * lse)
    return np.asarray(lb, dtype=dt), np.asarray(z, dtype=dt)


def aux_loss_grad(logits, experts, d_lb, d_z, scoring: str = "softmax"):
    """`__moe_cpu_aux_loss_grad`: returns d_logits [T,E]."""
    _check_scoring(scoring)
    dt = compute_dtype(logits, d_lb, d_z)
    logits = _f(logits, dt)
    d_lb, d_z = dt.type(np.asarray(d_lb)), dt.type(np.asarray(d_z))
    T, E = logits.shape
    if T == 0:
        return np.zeros_like(logits)
    f = _expert_fractions(experts, T, E, dt)
    g = np.broadcast_to(d_lb * dt.type(E) * f / dt.type(T), (T, E))
    p, sig = _aux_probs(logits, scoring)
    inner = np.sum(g * p, axis=1, keepdims=True)
    if scoring == "softmax":
        dl = p * (g - inner)
    else:
        sigma, total = sig
        dl = (g - inner) / total * sigma * (1 - sigma)
    lse = _logsumexp(logits)
    dl = dl + (d_z * 2 * lse / dt.type(T))[:, None] * _softmax(logits)
    return dl.astype(dt)


# --------------------------------------------------------------------------- selection-bias update

BIAS_UPDATE_RULES = ("sign", "proportional")


def _check_bias_update(rate, rule: str) -> float:
    if rule not in BIAS_UPDATE_RULES:
        raise ValueError(f"rule must be one of {BIAS_UPDATE_RULES}, got {rule!r}")
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.floating, np.integer)):
        raise ValueError(f"rate must be a positive finite number, got {rate!r}")
    if not (math.isfinite(float(rate)) and float(rate) > 0):
        raise ValueError(f"rate must be a positive finite number, got {rate!r}")
    return float(rate)


def expert_loads(experts, num_experts: int) -> np.ndarray:
    """Entries of `experts` [T, k] equal to each expert, as int64 [E]; entries outside
    [0, E) (-1: no expert) are not counted."""
    experts = _i32(experts).reshape(-1)
    valid = (experts >= 0) & (experts < num_experts)
    loads = np.bincount(experts[valid].astype(np.intp), minlength=num_experts)
    return loads[:num_experts].astype(np.int64)


def update_selection_bias(bias, experts, rate: float, rule: str = "sign"):
    """`__moe_cpu_update_selection_bias`: the bias [E] moved by the step's expert loads.
    With D_e = sum(loads) - E * load_e (E times mean - load_e, exact in integers):
    `sign` adds rate * sign(D_e) (DeepSeek-V3), `proportional` adds
    rate * (D_e / sum(loads)) = rate * (mean - load_e) / mean. Unchanged where nothing was
    counted (T = 0). rate is rounded to the bias's type first."""
    rate = _check_bias_update(rate, rule)
    dt = compute_dtype(bias)
    bias = _f(bias, dt)
    if bias.ndim != 1:
        raise ValueError(f"bias must be [E], got shape {bias.shape}")
    experts = _i32(experts)
    if experts.ndim != 2:
        raise ValueError(f"experts must be [T, k], got shape {experts.shape}")
    E = bias.shape[0]
    loads = expert_loads(experts, E)
    total = int(loads.sum())
    if total == 0:
        return bias.copy()
    diff = total - E * loads
    if rule == "sign":
        step = np.sign(diff).astype(dt)
    else:
        step = diff.astype(dt) / dt.type(total)
    return bias + dt.type(rate) * step


# --------------------------------------------------------------------------- the layer


@dataclasses.dataclass
class LayerCache:
    """Everything `layer_backward` reads, as the forward computed it."""

    config: LayerConfig
    x: np.ndarray
    w_router: np.ndarray
    w_gate_up: np.ndarray
    w_down: np.ndarray
    router_bias: Optional[np.ndarray]
    shared_gate_up: Optional[np.ndarray]
    shared_down: Optional[np.ndarray]
    b_gate_up: Optional[np.ndarray]
    b_down: Optional[np.ndarray]
    weights: np.ndarray
    experts: np.ndarray
    logits: np.ndarray
    token_ids: np.ndarray
    offsets: np.ndarray
    rows: np.ndarray
    y: np.ndarray
    h: np.ndarray
    routed_out: np.ndarray
    shared_y: Optional[np.ndarray] = None
    shared_h: Optional[np.ndarray] = None

    def as_dict(self) -> Dict[str, np.ndarray]:
        return {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "config"
        }


def _check_layer_shapes(config: LayerConfig, arrays: Dict[str, Optional[np.ndarray]]):
    config.validate()
    for name, shape, _ in config.arg_specs():
        a = arrays.get(name)
        if a is None:
            raise ValueError(f"the layer config needs {name} (shape {shape})")
        if tuple(np.shape(a)) != tuple(shape):
            raise ValueError(f"{name} has shape {tuple(np.shape(a))}, expected {tuple(shape)}")
    if not config.router_bias and arrays.get("router_bias") is not None:
        raise ValueError("router_bias given but config.router_bias is False")
    if not config.has_shared and (
        arrays.get("shared_gate_up") is not None or arrays.get("shared_down") is not None
    ):
        raise ValueError("shared expert weights given but config.shared_ffn is 0")
    if not config.expert_bias and (
        arrays.get("b_gate_up") is not None or arrays.get("b_down") is not None
    ):
        raise ValueError("expert biases given but config.expert_bias is False")


def layer_forward(
    config: LayerConfig,
    x,
    w_router,
    w_gate_up,
    w_down,
    router_bias=None,
    shared_gate_up=None,
    shared_down=None,
    b_gate_up=None,
    b_down=None,
):
    """The whole layer (moe.layer after moe-decompose). Returns (out [T,d], logits [T,E],
    cache)."""
    _check_layer_shapes(
        config,
        dict(
            x=x,
            w_router=w_router,
            w_gate_up=w_gate_up,
            w_down=w_down,
            router_bias=router_bias,
            shared_gate_up=shared_gate_up,
            shared_down=shared_down,
            b_gate_up=b_gate_up,
            b_down=b_down,
        ),
    )
    dt = compute_dtype(
        x, w_router, w_gate_up, w_down, shared_gate_up, shared_down, b_gate_up, b_down
    )
    x, w_router = _f(x, dt), _f(w_router, dt)
    w_gate_up, w_down = _f(w_gate_up, dt), _f(w_down, dt)
    if config.expert_bias:
        b_gate_up, b_down = _f(b_gate_up, dt), _f(b_down, dt)
    weights, experts, logits = router(
        x,
        w_router,
        router_bias,
        scoring=config.scoring,
        top_k=config.top_k,
        renormalize=config.renormalize,
        num_groups=config.num_groups,
        topk_groups=config.topk_groups,
        scaling=config.scaling_factor,
    )
    token_ids, offsets, rows = dispatch(experts, config.experts, config.capacity)
    y, h = expert_ffn(
        x, token_ids, offsets, w_gate_up, w_down, config.activation, b_gate_up, b_down
    )
    routed = combine(y, weights, rows)
    out = routed
    shared_y = shared_h = None
    if config.has_shared:
        shared_gate_up, shared_down = _f(shared_gate_up, dt), _f(shared_down, dt)
        shared_y, shared_h = shared_expert(x, shared_gate_up, shared_down, config.activation)
        out = routed + shared_y
    cache = LayerCache(
        config=config,
        x=x,
        w_router=w_router,
        w_gate_up=w_gate_up,
        w_down=w_down,
        router_bias=router_bias,
        shared_gate_up=shared_gate_up,
        shared_down=shared_down,
        b_gate_up=b_gate_up,
        b_down=b_down,
        weights=weights,
        experts=experts,
        logits=logits,
        token_ids=token_ids,
        offsets=offsets,
        rows=rows,
        y=y,
        h=h,
        routed_out=routed,
        shared_y=shared_y,
        shared_h=shared_h,
    )
    return out, logits, cache


def layer_backward(
    config: LayerConfig, cache: LayerCache, d_out, d_logits=None, fused: bool = True
) -> Tuple[np.ndarray, ...]:
    """Gradients of the layer for the cotangents d_out [T,d] and d_logits [T,E] (None = 0).

    Returns (dx, d_router, d_gate_up, d_down), plus (d_shared_gate_up, d_shared_down) with a
    shared expert, plus (d_b_gate_up, d_b_down) with expert biases (layer_gradient_names
    order). The router bias gets no gradient. `fused=False` uses combine_grad +
    expert_ffn_grad instead of expert_combine_grad (same mathematics)."""
    c = cache
    dt = compute_dtype(c.x, d_out, d_logits)
    d_out = _f(d_out, dt)
    if d_out.shape != c.x.shape:
        raise ValueError(f"d_out has shape {d_out.shape}, expected {c.x.shape}")
    if d_logits is not None:
        d_logits = _f(d_logits, dt)
        if d_logits.shape != c.logits.shape:
            raise ValueError(f"d_logits has shape {d_logits.shape}, expected {c.logits.shape}")
    act = config.activation
    if fused:
        dx_e, d_weights, d_wgu, d_wd, d_bgu, d_bd = expert_combine_grad(
            c.x,
            c.token_ids,
            c.offsets,
            c.rows,
            c.weights,
            c.w_gate_up,
            c.w_down,
            c.h,
            d_out,
            act,
            bd=c.b_down,
            bias=True,
        )
    else:
        dy, d_weights = combine_grad(d_out, c.weights, c.rows, c.y)
        dx_e, d_wgu, d_wd, d_bgu, d_bd = expert_ffn_grad(
            c.x, c.token_ids, c.offsets, c.w_gate_up, c.w_down, c.h, dy, act, bias=True
        )
    dx_r, d_wr = router_grad(
        c.x,
        c.w_router,
        c.logits,
        c.experts,
        d_weights,
        d_logits,
        scoring=config.scoring,
        renormalize=config.renormalize,
        scaling=config.scaling_factor,
    )
    dx = dx_e + dx_r
    grads = [dx, d_wr, d_wgu, d_wd]
    if config.has_shared:
        dx_s, d_sgu, d_sd = shared_expert_grad(
            c.x, c.shared_gate_up, c.shared_down, c.shared_h, d_out, act
        )
        grads[0] = dx + dx_s
        grads += [d_sgu, d_sd]
    if config.expert_bias:
        grads += [d_bgu, d_bd]
    return tuple(grads)


def layer_gradient_names(config: LayerConfig):
    """Names of the arguments `layer_backward` returns gradients for, in its order."""
    names = ["x", "w_router", "w_gate_up", "w_down"]
    if config.has_shared:
        names += ["shared_gate_up", "shared_down"]
    if config.expert_bias:
        names += ["b_gate_up", "b_down"]
    return names
