#!/usr/bin/env python3
"""Checks every host function of the GPU library (docs/gpu-path.md section 1) on the GPU
against an fp32 PyTorch reference, op by op, on random data.

    python3 test/GPU/ops_check.py --lib build/ops.so [--quick] [--json out.json]

The library is ops_harness.mlir (gen_ops_harness.py) lowered by moe-opt/mlir-opt, translated
to an object and linked with libmoe_runtime into a shared library. Tolerances: docs/benchmarks.md
(relative Frobenius error 1e-2 for forward outputs, 2e-2 for gradients; NaN never passes).

A library built with a non-gated activation (build-ops-harness.sh DIR up:b=w_mn:activation=ACT
dact:activation=ACT, ACT silu, gelu_erf or gelu_tanh; docs/gpu-kernels.md section 2.2.1) has
W_gate_up [E, d, n], H [R, n] and A = act(H): --activation ACT, or --variant DIR/VARIANT (the
build script's record of its configs), checks its expert host functions against
torch.nn.functional.silu / gelu(approximate="none") / gelu(approximate="tanh"); the other
ops are the library's and are not run again.

A library built with the expert biases (build-ops-harness.sh --bias: expert_ffn's up and down
GEMMs with bias=true, its host functions taking b_gate_up [E, G] and b_down [E, d] after the
weights; docs/gpu-kernels.md) runs only the bias-ffn checks: H = x wgu[e] + b_gate_up[e] and
y = act(H) wd[e] + b_down[e] against fp32 torch, and the bias-grad checks of the backward
host functions with biases (expert_combine_grad_bias, its _acc form, expert_ffn_grad_bias) on
its forward's H; the default library runs the bias-grad checks on an H made in torch.
"""

import argparse
import ctypes
import json
import os
import sys
import time

import numpy as np
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
# bench/ for the lazily imported energy and step_gaps, python/ ahead of it
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "python"))
from moe_mlir import reference as ref  # noqa: E402

DEV = "cuda"
PROFILE = False
ENERGY_S = 0.0  # --energy: seconds of each op back to back under NVML's energy counter
RESULTS = []
# The library's expert activation (--activation, --variant) and the `act` argument its host
# functions take (docs/gpu-path.md: the code of the op's moe.activation, which they do not
# branch on): SwiGLU is gated, W_gate_up and H 2n wide.
ACTIVATIONS = ("swiglu", "silu", "gelu_erf", "gelu_tanh")
ACT_CODES = {"swiglu": 0, "gelu_erf": 1, "gelu_tanh": 3, "silu": 2}
ACT = "swiglu"
ACT_CODE = 0
# The steps a non-gated library runs: those of the expert FFNs, forward and backward.
EXPERT_STEPS = ("ffn", "shared", "split-vs-fused", "empty")
# Whether the library's expert_ffn adds the expert biases (--variant): it runs the bias-ffn
# and bias-grad steps alone.
BIAS = False


def set_activation(act):
    global ACT, ACT_CODE
    if act not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, not {act!r}")
    ACT, ACT_CODE = act, ACT_CODES[act]


def act_ref(h, act=None):
    """A = act(H) in fp32: SwiGLU silu(gate) * up of H's halves, the others elementwise."""
    act = act or ACT
    h = h.float()
    if act == "swiglu":
        n = h.shape[-1] // 2
        return torch.nn.functional.silu(h[..., :n]) * h[..., n:]
    if act == "silu":
        return torch.nn.functional.silu(h)
    if act == "gelu_erf":
        return torch.nn.functional.gelu(h, approximate="none")
    if act == "gelu_tanh":
        return torch.nn.functional.gelu(h, approximate="tanh")
    raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, not {act!r}")


def up_width(n, act=None):
    """Columns of W_gate_up and H for an FFN of width n: 2n gated (SwiGLU), else n."""
    return 2 * n if (act or ACT) == "swiglu" else n


def activation_of_variant(text):
    """The expert activation of a library from its VARIANT file ("library: moe-opt
    --moe-gpu-emit-library[=configs=C,...]"): swiglu without an `activation=`, else the one
    that its up and dact configs both set (a library whose forward and backward disagree
    has no reference, and is refused)."""
    configs = []
    for line in text.splitlines():
        _, sep, value = line.partition("--moe-gpu-emit-library=configs=")
        if sep:
            configs += [c.strip() for c in value.split(",") if c.strip()]
    found = {}  # role -> activations
    for config in configs:
        head, *pairs = config.split(":")
        role = head.rpartition(".")[2]
        for pair in pairs:
            key, _, value = pair.partition("=")
            if key == "activation":
                found.setdefault(role, set()).add(value)
    if not found:
        return "swiglu"
    acts = set().union(*found.values())
    if len(acts) != 1 or set(found) != {"up", "dact"}:
        raise ValueError(
            "the library's up and dact configs must set one activation, both of them: "
            + ", ".join(f"{r}: {sorted(a)}" for r, a in sorted(found.items()))
        )
    act = acts.pop()
    if act not in ACTIVATIONS:
        raise ValueError(f"unknown activation {act!r} in the library's configs")
    return act


def bias_of_variant(text):
    """Whether a library's VARIANT file builds expert_ffn with the expert biases: its up and
    down configs both set bias=true (one of them alone has no reference, and is refused)."""
    roles = set()
    for line in text.splitlines():
        _, sep, value = line.partition("--moe-gpu-emit-library=configs=")
        if not sep:
            continue
        for config in (c.strip() for c in value.split(",")):
            head, *pairs = config.split(":")
            if "bias=true" in pairs:
                op, _, role = head.rpartition(".")
                if op not in ("", "expert_ffn"):
                    raise ValueError(f"bias=true on {head}: only expert_ffn's GEMMs add biases")
                roles.add(role)
    if roles and roles != {"up", "down"}:
        raise ValueError(f"bias=true on {sorted(roles)}: expert_ffn's up and down need it both")
    return bool(roles)


def desc_type(rank):
    class D(ctypes.Structure):
        _fields_ = [
            ("allocated", ctypes.c_void_p),
            ("aligned", ctypes.c_void_p),
            ("offset", ctypes.c_int64),
            ("sizes", ctypes.c_int64 * rank),
            ("strides", ctypes.c_int64 * rank),
        ]

    return D


_DESCS = {r: desc_type(r) for r in (0, 1, 2, 3)}


def desc(t):
    assert t.is_contiguous() and t.device.type == "cuda"
    d = _DESCS[t.dim()]()
    d.allocated = d.aligned = t.data_ptr()
    d.offset = 0
    for i, (s, st) in enumerate(zip(t.shape, t.stride())):
        d.sizes[i] = s
        d.strides[i] = st
    return ctypes.pointer(d)


class Lib:
    def __init__(self, path):
        self.so = ctypes.CDLL(path)
        self.so.moeGetLastStatus.restype = ctypes.c_int
        self.so.moeGetLastErrorMessage.restype = ctypes.c_char_p

    def has(self, name):
        """Whether the harness wraps host function `name` (some exist only in a library
        built with their setting, gen_ops_harness.py's OPTIONAL_OPS)."""
        return hasattr(self.so, "_mlir_ciface_op_" + name)

    def call(self, name, *args):
        conv = []
        for a in args:
            if isinstance(a, torch.Tensor):
                conv.append(desc(a))
            elif isinstance(a, float):
                conv.append(ctypes.c_float(a))
            else:
                conv.append(ctypes.c_int64(int(a)))
        # the wrappers run on a blocking stream of the runtime, which waits for
        # torch's legacy default stream but not for a stream torch might be
        # set to: the inputs must be written first
        torch.cuda.synchronize()
        self.so.moeClearLastError()
        getattr(self.so, "_mlir_ciface_op_" + name)(*conv)
        torch.cuda.synchronize()
        status = self.so.moeGetLastStatus()
        if status:
            raise RuntimeError(f"{name}: status {status}: {self.so.moeGetLastErrorMessage()}")


def rel(ours, ref):
    ours, ref = ours.float(), ref.float()
    if torch.isnan(ours).any():
        return float("nan")
    den = ref.norm().item()
    num = (ours - ref).norm().item()
    return num / den if den > 0 else num


def check(name, value, tol):
    ok = value == value and value <= tol
    RESULTS.append({"check": name, "value": value, "tol": tol, "ok": ok})
    print(f"{'PASS' if ok else 'FAIL'} {name}: {value:.3e} (tol {tol:.0e})", flush=True)
    return ok


def check_exact(name, ours, ref):
    ok = torch.equal(ours.cpu(), ref.cpu())
    bad = int((ours.cpu() != ref.cpu()).sum()) if ours.shape == ref.shape else -1
    RESULTS.append({"check": name, "mismatches": bad, "ok": ok})
    print(f"{'PASS' if ok else 'FAIL'} {name}: {bad} mismatches", flush=True)
    return ok


def bf(*shape, std=1.0):
    return (torch.randn(*shape, device=DEV) * std).to(torch.bfloat16)


# --------------------------------------------------------------------------- references


def ref_scores(logits, scoring):
    return torch.softmax(logits, -1) if scoring == 0 else torch.sigmoid(logits)


def ref_select(c, k, G, TG):
    T, E = c.shape
    if G > 1:
        size = E // G
        grp = c.view(T, G, size)
        gs = grp.topk(min(2, size), dim=-1).values.sum(-1)
        keep = torch.zeros(T, G, dtype=torch.bool, device=c.device)
        keep.scatter_(1, gs.topk(TG, dim=-1).indices, True)
        c = c.masked_fill(~keep.repeat_interleave(size, 1), float("-inf"))
    return c.topk(k, dim=-1).indices.to(torch.int32)


def ref_dispatch(experts, E):
    flat = experts.flatten().long()
    order = torch.sort(flat, stable=True).indices
    k = experts.shape[1]
    token_ids = (order // k).to(torch.int32)
    counts = torch.bincount(flat, minlength=E)
    offsets = torch.zeros(E + 1, dtype=torch.int32, device=experts.device)
    offsets[1:] = torch.cumsum(counts, 0).to(torch.int32)
    rows = torch.empty_like(flat, dtype=torch.int32)
    rows[order] = torch.arange(flat.numel(), dtype=torch.int32, device=experts.device)
    return token_ids, offsets, rows.view_as(experts)


def ref_ffn(x, token_ids, offsets, wgu, wd, bgu=None, bd=None):
    """fp32 grouped FFN of the library's activation on the queues: returns y [R,d] and h
    [R,2n] (SwiGLU) or [R,n] (silu, gelu); with the expert biases bgu [E,G] and bd [E,d],
    h = x wgu[e] + bgu[e] and y = act(h) wd[e] + bd[e]."""
    R = token_ids.numel()
    n = wd.shape[1]
    y = torch.zeros(R, x.shape[1], device=x.device)
    h = torch.zeros(R, up_width(n), device=x.device)
    for e in range(wgu.shape[0]):
        lo, hi = int(offsets[e]), int(offsets[e + 1])
        if hi == lo:
            continue
        xe = x[token_ids[lo:hi].long()]
        he = xe @ wgu[e]
        if bgu is not None:
            he = he + bgu[e]
        a = act_ref(he)
        h[lo:hi] = he
        y[lo:hi] = a @ wd[e] + (bd[e] if bd is not None else 0)
    return y, h


# --------------------------------------------------------------------------- checks


def run_router(
    lib, T, d, E, k, scoring, renorm, G=1, TG=1, scaling=1.0, bias=False, round_logits=False
):
    tag = f"router T={T} d={d} E={E} k={k} {'softmax' if scoring == 0 else 'sigmoid'}"
    if round_logits:
        tag += " round_logits"
    x, wr = bf(T, d), bf(d, E, std=0.02)
    b = (torch.rand(E, device=DEV) * 0.1) if bias else torch.empty(0, device=DEV)
    w = torch.empty(T, k, device=DEV)
    ex = torch.empty(T, k, dtype=torch.int32, device=DEV)
    lg = torch.empty(T, E, device=DEV)
    lib.call(
        "router",
        x,
        wr,
        b,
        scoring,
        int(renorm),
        G,
        TG,
        float(scaling),
        int(round_logits),
        w,
        ex,
        lg,
    )
    ref_lg = x.float() @ wr.float()
    ok = check(f"{tag} logits", rel(lg, ref_lg), 1e-2)
    if round_logits:  # what a bf16 nn.Linear router holds: bf16 values
        ok &= check_exact(f"{tag} logits are bf16 values", lg, lg.to(torch.bfloat16).float())
    s = ref_scores(lg, scoring)  # our logits, so selection ties cannot differ
    c = s + (b if bias else 0)
    ref_ex = ref_select(c, k, G, TG)
    ok &= check_exact(f"{tag} experts", torch.sort(ex, 1).values, torch.sort(ref_ex, 1).values)
    u = torch.gather(s, 1, ex.long())
    if renorm:
        u = u / u.sum(1, keepdim=True)
    ok &= check(f"{tag} weights", rel(w, u * scaling), 1e-5)
    return ok


def distinct_picks(T, n, k):
    """[T, k] int64: each row k distinct values of range(n), uniformly drawn, in a few
    kernels whatever T is (a randperm a row made T launches, which under racecheck took
    minutes for T = 5000)."""
    return torch.rand(T, n, device=DEV).argsort(dim=1)[:, :k]


def run_dispatch(lib, T, k, E, mode):
    tag = f"dispatch T={T} k={k} E={E} {mode}"
    if mode.startswith("counts="):  # k = 1, expert e gets the e-th count of tokens, shuffled
        counts = torch.tensor([int(v) for v in mode[7:].split(",")], device=DEV)
        assert k == 1 and len(counts) == E and int(counts.sum()) == T, mode
        ex = torch.repeat_interleave(torch.arange(E, device=DEV), counts)
        ex = ex[torch.randperm(T, device=DEV)][:, None].to(torch.int32)
    elif mode == "random":
        ex = distinct_picks(T, E, k).to(torch.int32)
    elif mode == "skewed":  # experts E/2.. get nothing
        ex = distinct_picks(T, max(k, E // 2), k).to(torch.int32)
    else:  # all-to-one: every token's first pick is expert 0
        ex = torch.cat(
            [torch.zeros(T, 1, dtype=torch.long, device=DEV), 1 + distinct_picks(T, E - 1, k - 1)],
            dim=1,
        ).to(torch.int32)
    R = T * k
    tid = torch.empty(R, dtype=torch.int32, device=DEV)
    off = torch.empty(E + 1, dtype=torch.int32, device=DEV)
    rows = torch.empty(T, k, dtype=torch.int32, device=DEV)
    lib.call("dispatch", ex, tid, off, rows)
    rt, ro, rr = ref_dispatch(ex, E)
    ok = check_exact(f"{tag} offsets", off, ro)
    ok &= check_exact(f"{tag} token_ids", tid, rt)
    ok &= check_exact(f"{tag} rows", rows, rr)
    return ok, ex, tid, off, rows


def run_ffn(lib, T, d, n, E, k, mode, grads=True):
    tag = f"experts T={T} d={d} n={n} E={E} k={k} {mode}"
    ok, ex, tid, off, rows = run_dispatch(lib, T, k, E, mode)
    R = T * k
    x = bf(T, d)
    wgu, wd = bf(E, d, up_width(n), std=0.02), bf(E, n, d, std=0.02)
    y = torch.empty(R, d, dtype=torch.bfloat16, device=DEV)
    h = torch.empty(R, up_width(n), dtype=torch.bfloat16, device=DEV)
    lib.call("expert_ffn", x, tid, off, wgu, wd, ACT_CODE, y, h)
    ry, rh = ref_ffn(x.float(), tid, off, wgu.float(), wd.float())
    ok &= check(f"{tag} h", rel(h, rh), 1e-2)
    ok &= check(f"{tag} y", rel(y, ry), 1e-2)
    # H alone (a recomputation in backward): the same bits as the full FFN's H
    h_only = torch.full_like(h, float("nan"))
    lib.call("expert_ffn_h", x, tid, off, wgu, wd, ACT_CODE, h_only)
    ok &= check_exact(
        f"{tag} h only (recompute) bitwise", h_only.view(torch.int16), h.view(torch.int16)
    )
    w = torch.rand(T, k, device=DEV)
    out = torch.empty(T, d, dtype=torch.bfloat16, device=DEV)
    lib.call("combine", y, w, rows, out)
    rout = (ry[rows.long()] * w[..., None]).sum(1)
    ok &= check(f"{tag} combine", rel(out, rout), 1e-2)
    # determinism
    out2 = torch.empty_like(out)
    lib.call("combine", y, w, rows, out2)
    ok &= check_exact(f"{tag} combine bitwise", out2.view(torch.int16), out.view(torch.int16))
    if lib.has("combine_acc"):
        # out += the combined rows (what a shared expert's y is added to), out of the rows' size
        out0 = bf(T, d, std=rout.std().item())
        out_acc = out0.clone()
        lib.call("combine_acc", y, w, rows, out_acc)
        ok &= check(f"{tag} combine_acc", rel(out_acc, out0.float() + rout), 1e-2)
    if not grads:
        return ok
    dout = bf(T, d)
    dx = torch.empty(T, d, dtype=torch.bfloat16, device=DEV)
    dw = torch.empty(T, k, device=DEV)
    dwgu = torch.empty_like(wgu)
    dwd = torch.empty_like(wd)
    lib.call(
        "expert_combine_grad", x, tid, off, rows, w, wgu, wd, h, dout, ACT_CODE, dx, dw, dwgu, dwd
    )
    # fp32 autograd reference on the same queues and weights
    xr = x.float().requires_grad_()
    wgur = wgu.float().requires_grad_()
    wdr = wd.float().requires_grad_()
    wr_ = w.clone().requires_grad_()
    yy = []
    for e in range(E):
        lo, hi = int(off[e]), int(off[e + 1])
        he = xr[tid[lo:hi].long()] @ wgur[e]
        a = act_ref(he)
        yy.append(a @ wdr[e])
    yall = torch.cat(yy)
    o = (yall[rows.long()] * wr_[..., None]).sum(1)
    (o * dout.float()).sum().backward()
    ok &= check(f"{tag} dx", rel(dx, xr.grad), 2e-2)
    ok &= check(f"{tag} d_weights", rel(dw, wr_.grad), 2e-2)
    ok &= check(f"{tag} d_w_gate_up", rel(dwgu, wgur.grad), 2e-2)
    ok &= check(f"{tag} d_w_down", rel(dwd, wdr.grad), 2e-2)
    dx2 = torch.empty_like(dx)
    dwgu2 = torch.empty_like(dwgu)
    lib.call(
        "expert_combine_grad", x, tid, off, rows, w, wgu, wd, h, dout, ACT_CODE, dx2, dw, dwgu2, dwd
    )
    ok &= check_exact(
        f"{tag} backward bitwise",
        torch.cat([dx2.flatten(), dwgu2.flatten()]).view(torch.int16),
        torch.cat([dx.flatten(), dwgu.flatten()]).view(torch.int16),
    )
    if lib.has("expert_combine_grad_acc"):
        # dx += the experts' dx (what the shared expert's dx is added to), of its size; the
        # other outputs as the plain call's, bit for bit
        dx0 = bf(T, d, std=xr.grad.std().item())
        dx_acc = dx0.clone()
        dw3, dwgu3, dwd3 = torch.empty_like(dw), torch.empty_like(dwgu), torch.empty_like(dwd)
        lib.call(
            "expert_combine_grad_acc",
            x,
            tid,
            off,
            rows,
            w,
            wgu,
            wd,
            h,
            dout,
            ACT_CODE,
            dx_acc,
            dw3,
            dwgu3,
            dwd3,
        )
        ok &= check(f"{tag} dx accumulated", rel(dx_acc, dx0.float() + xr.grad), 2e-2)
        ok &= check_exact(
            f"{tag} accumulating backward's weight gradients bitwise",
            torch.cat([dwgu3.flatten(), dwd3.flatten()]).view(torch.int16),
            torch.cat([dwgu.flatten(), dwd.flatten()]).view(torch.int16),
        )
        ok &= check_exact(f"{tag} accumulating backward's d_weights bitwise", dw3, dw)
    return ok


def run_bias_ffn(lib, T, d, n, E, k, mode):
    """The expert FFN with the expert biases (a --bias library): H and y against fp32 torch on
    random biases (of the outputs' size, so a dropped bias shows), H alone bitwise."""
    tag = f"bias-ffn T={T} d={d} n={n} E={E} k={k} {mode} {ACT}"
    ok, ex, tid, off, rows = run_dispatch(lib, T, k, E, mode)
    R = T * k
    G = up_width(n)
    x = bf(T, d)
    wgu, wd = bf(E, d, G, std=0.05), bf(E, n, d, std=0.05)
    bgu, bd = bf(E, G), bf(E, d)
    y = torch.full((R, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    h = torch.full((R, G), float("nan"), dtype=torch.bfloat16, device=DEV)
    lib.call("expert_ffn", x, tid, off, wgu, wd, bgu, bd, ACT_CODE, y, h)
    ry, rh = ref_ffn(x.float(), tid, off, wgu.float(), wd.float(), bgu.float(), bd.float())
    ok &= check(f"{tag} h", rel(h, rh), 1e-2)
    ok &= check(f"{tag} y", rel(y, ry), 1e-2)
    h_only = torch.full_like(h, float("nan"))
    lib.call("expert_ffn_h", x, tid, off, wgu, wd, bgu, bd, ACT_CODE, h_only)
    ok &= check_exact(
        f"{tag} h only (recompute) bitwise", h_only.view(torch.int16), h.view(torch.int16)
    )
    return ok


# The backward of experts with biases: the host functions that take b_gate_up and b_down
# after dout (dy) and write d_b_gate_up and d_b_down after the weights' gradients.
BIAS_GRAD_OPS = ("expert_combine_grad_bias", "expert_combine_grad_bias_acc")
BIAS_FFN_GRAD_OPS = ("expert_ffn_grad_bias",)


def has_ops(lib, tag, *names):
    """Whether the library has host functions `names`; a FAIL line names each one it lacks
    (a check that cannot run is no pass)."""
    missing = [name for name in names if not lib.has(name)]
    for name in missing:
        RESULTS.append({"check": f"{tag} {name}", "error": "not in the library", "ok": False})
        print(f"FAIL {tag}: the library has no {name}", flush=True)
    return not missing


def bias_grad_routing(T, k, E, mode):
    """token_ids, offsets and rows: ep_routing's for random, skewed (experts E/2.. empty) and
    all-to-one; dropped: capacity_routing's skewed picks through the reference's dispatch at
    capacity factor 1 (expert 0 overflows: slots with rows -1, queue rows past offsets[E])."""
    if mode == "dropped":
        ex = capacity_routing(T, k, E, "skewed")
        return tuple(ref_dispatch_capacity(ex, E, ref.capacity_for(1.0, T, k, E)))
    return ep_routing(T, k, E, 2, mode)


def bias_grad_inputs(lib, T, d, n, E, k, mode, forward):
    """Routing, x, the weights, the biases and H [R, G] of the biased FFN: the library's biased
    expert_ffn's H with `forward` (a --bias library), else fp32 torch's rounded to bf16 (the
    default library's expert_ffn takes no biases). The biases are about as large as what they
    are added to, so that one left out shows."""
    tid, off, rows = bias_grad_routing(T, k, E, mode)
    G = up_width(n)
    x = bf(T, d)
    wgu, wd = bf(E, d, G, std=0.05), bf(E, n, d, std=0.05)
    bgu, bd = bf(E, G, std=0.5), bf(E, d, std=0.2)
    if forward:
        y = torch.zeros(T * k, d, dtype=torch.bfloat16, device=DEV)
        h = torch.zeros(T * k, G, dtype=torch.bfloat16, device=DEV)
        lib.call("expert_ffn", x, tid, off, wgu, wd, bgu, bd, ACT_CODE, y, h)
    else:
        h = ref_ffn(x.float(), tid, off, wgu.float(), wd.float(), bgu.float(), bd.float())[1]
        h = h.to(torch.bfloat16)
    return tid, off, rows, x, wgu, wd, bgu, bd, h


def bias_ffn_autograd(x, tid, off, wgu, wd, bgu, bd, h):
    """fp32 leaves x, wgu, wd, bgu, bd requiring grad, and y [R + 1, d] of the biased FFN on
    the queues with H's values as its pre-activations (the kernels' bf16 H; the gradient
    flows as through x wgu[e] + bgu[e]); rows in no queue and row R (a dropped slot's) 0."""
    leaves = [t.float().requires_grad_() for t in (x, wgu, wd, bgu, bd)]
    xr, wgur, wdr, bgur, bdr = leaves
    R, d = h.shape[0], x.shape[1]
    parts = []
    for e in range(wgu.shape[0]):
        lo, hi = int(off[e]), int(off[e + 1])
        if hi == lo:
            continue
        he = xr[tid[lo:hi].long()] @ wgur[e] + bgur[e]
        he = h[lo:hi].float() + (he - he.detach())
        parts.append(act_ref(he) @ wdr[e] + bdr[e])
    used = int(off[-1])
    yall = torch.cat(parts + [torch.zeros(R + 1 - used, d, device=x.device)])
    return leaves, yall


def nan_bf16(*shape):
    return torch.full(shape, float("nan"), dtype=torch.bfloat16, device=DEV)


def raw_bytes(*tensors):
    """The bytes of the tensors, one after another: a bitwise comparison of mixed dtypes."""
    return torch.cat([t.detach().cpu().contiguous().flatten().view(torch.uint8) for t in tensors])


def check_bias_grad_zeros(tag, off, dbgu, dbd):
    """The bias gradients of experts without rows are 0 (a sum of nothing, written)."""
    empty = (off[1:] - off[:-1]) == 0
    if not bool(empty.any()):
        return True
    got = flat(dbgu[empty].float(), dbd[empty].float())
    return check_exact(f"{tag} bias gradients of experts without rows are 0", got, 0 * got)


def run_bias_grad(lib, T, d, n, E, k, mode, forward=False):
    """expert_combine_grad_bias and its _acc form (the fused combine and expert backward of
    experts with biases, y = act(H) wd[e] + b_down[e]) against fp32 autograd of the biased FFN
    and the combine with the biases as leaves: dx, d_weights (<dout[t], y[r]>, b_down's part
    too), d_w_gate_up, d_w_down, d_b_gate_up and d_b_down; dropped slots' d_weights and empty
    experts' bias gradients exactly 0; the same bits twice; dx, d_w_gate_up and d_w_down the
    plain expert_combine_grad's bits (H given, the biases change no GEMM); _acc's dx the
    plain call's added to what dx held, its other outputs the plain call's bits."""
    tag = f"bias-grad T={T} d={d} n={n} E={E} k={k} {mode} {ACT}{' forward' if forward else ''}"
    if not has_ops(lib, tag, *BIAS_GRAD_OPS):
        return False
    tid, off, rows, x, wgu, wd, bgu, bd, h = bias_grad_inputs(lib, T, d, n, E, k, mode, forward)
    G = up_width(n)
    w = torch.rand(T, k, device=DEV)
    dout = bf(T, d)

    def call(name, dx):
        outs = (dx, torch.full((T, k), float("nan"), device=DEV), nan_bf16(E, d, G))
        outs += (nan_bf16(E, n, d), nan_bf16(E, G), nan_bf16(E, d))
        lib.call(name, x, tid, off, rows, w, wgu, wd, h, dout, bgu, bd, ACT_CODE, *outs)
        return outs

    outs = call("expert_combine_grad_bias", nan_bf16(T, d))
    leaves, yall = bias_ffn_autograd(x, tid, off, wgu, wd, bgu, bd, h)
    wr_ = w.clone().requires_grad_()
    slot_rows = torch.where(rows >= 0, rows, h.shape[0]).long()
    o = (yall[slot_rows] * wr_[..., None]).sum(1)
    (o * dout.float()).sum().backward()
    xr, wgur, wdr, bgur, bdr = leaves
    refs = (xr.grad, wr_.grad, wgur.grad, wdr.grad, bgur.grad, bdr.grad)
    names = ("dx", "d_weights", "d_w_gate_up", "d_w_down", "d_b_gate_up", "d_b_down")
    ok = True
    for name, got, want in zip(names, outs, refs):
        ok &= check(f"{tag} {name}", rel(got, want), 2e-2)
    dw = outs[1]
    dropped = rows < 0
    if bool(dropped.any()):
        ok &= check_exact(
            f"{tag} d_weights of dropped slots are 0", dw[dropped], torch.zeros_like(dw[dropped])
        )
    ok &= check_bias_grad_zeros(tag, off, outs[4], outs[5])
    again = call("expert_combine_grad_bias", nan_bf16(T, d))
    ok &= check_exact(f"{tag} bitwise twice", raw_bytes(*again), raw_bytes(*outs))
    plain = (nan_bf16(T, d), torch.full((T, k), float("nan"), device=DEV), nan_bf16(E, d, G))
    plain += (nan_bf16(E, n, d),)
    lib.call("expert_combine_grad", x, tid, off, rows, w, wgu, wd, h, dout, ACT_CODE, *plain)
    ok &= check_exact(
        f"{tag} dx, d_w_gate_up, d_w_down as expert_combine_grad's",
        raw_bytes(outs[0], outs[2], outs[3]),
        raw_bytes(plain[0], plain[2], plain[3]),
    )
    # dx += the experts' dx, from values of its size (an error in either part shows)
    dx0 = bf(T, d, std=xr.grad.std().item())
    acc = call("expert_combine_grad_bias_acc", dx0.clone())
    ok &= check(f"{tag} dx accumulated", rel(acc[0], dx0.float() + outs[0].float()), 2e-2)
    ok &= check_exact(
        f"{tag} accumulating call's other outputs as the plain call's bitwise",
        raw_bytes(*acc[1:]),
        raw_bytes(*outs[1:]),
    )
    return ok


def run_bias_ffn_grad(lib, T, d, n, E, k, mode, forward=False):
    """expert_ffn_grad_bias (the experts' backward from dy in queue order, with biases)
    against fp32 autograd of the biased FFN with the biases as leaves: dx, d_w_gate_up,
    d_w_down, d_b_gate_up (each expert's column sums of dH) and d_b_down (of its dy rows;
    dy's rows in no queue, past offsets[E], random and counted nowhere); empty experts' bias
    gradients exactly 0; the same bits twice; dx, d_w_gate_up and d_w_down the plain
    expert_ffn_grad's bits."""
    tag = f"bias-grad ffn T={T} d={d} n={n} E={E} k={k} {mode} {ACT}{' forward' if forward else ''}"
    if not has_ops(lib, tag, *BIAS_FFN_GRAD_OPS):
        return False
    tid, off, rows, x, wgu, wd, bgu, bd, h = bias_grad_inputs(lib, T, d, n, E, k, mode, forward)
    G = up_width(n)
    dy = bf(h.shape[0], d)

    def call():
        outs = (nan_bf16(T, d), nan_bf16(E, d, G), nan_bf16(E, n, d), nan_bf16(E, G))
        outs += (nan_bf16(E, d),)
        lib.call("expert_ffn_grad_bias", x, tid, off, wgu, wd, h, dy, bgu, bd, ACT_CODE, *outs)
        return outs

    outs = call()
    leaves, yall = bias_ffn_autograd(x, tid, off, wgu, wd, bgu, bd, h)
    (yall[: h.shape[0]] * dy.float()).sum().backward()
    refs = [t.grad for t in leaves]
    names = ("dx", "d_w_gate_up", "d_w_down", "d_b_gate_up", "d_b_down")
    ok = True
    for name, got, want in zip(names, outs, refs):
        ok &= check(f"{tag} {name}", rel(got, want), 2e-2)
    ok &= check_bias_grad_zeros(tag, off, outs[3], outs[4])
    again = call()
    ok &= check_exact(f"{tag} bitwise twice", raw_bytes(*again), raw_bytes(*outs))
    plain = (nan_bf16(T, d), nan_bf16(E, d, G), nan_bf16(E, n, d))
    lib.call("expert_ffn_grad", x, tid, off, wgu, wd, h, dy, ACT_CODE, *plain)
    ok &= check_exact(
        f"{tag} dx, d_w_gate_up, d_w_down as expert_ffn_grad's",
        raw_bytes(*outs[:3]),
        raw_bytes(*plain),
    )
    return ok


def bias_grad_steps(lib, quick, forward):
    """The bias-grad steps: odd T (a partial M tile), T = 1, d of 3 k-steps and n of a
    64-column tail tile, skewed routing (empty experts), all-to-one, dropped slots; with
    `forward`, H from the library's biased expert_ffn."""
    shapes = [
        (37, 128, 128, 4, 2, "random"),
        (37, 256, 192, 6, 2, "skewed"),
        (1, 128, 64, 4, 2, "random"),
        (300, 128, 128, 8, 2, "dropped"),
    ]
    if not quick:
        shapes += [
            (300, 192, 320, 8, 3, "skewed"),
            (53, 128, 192, 6, 3, "all-to-one"),
            (1000, 1536, 704, 8, 2, "random"),
            (1000, 1536, 704, 8, 2, "dropped"),
        ]
    steps = []
    for T, d, n, E, k, mode in shapes:
        shape = f"t{T}-d{d}-n{n}-e{E}-k{k}-{mode}"
        steps += [
            (
                f"bias-grad-{shape}",
                lambda s=(T, d, n, E, k, mode): run_bias_grad(lib, *s, forward=forward),
            ),
            (
                f"bias-grad-ffn-{shape}",
                lambda s=(T, d, n, E, k, mode): run_bias_ffn_grad(lib, *s, forward=forward),
            ),
        ]
    return steps


def capacity_routing(T, k, E, mode):
    """[T, k] int32 experts for the capacity checks: distinct random picks (random), or every
    token's first pick expert 0 but one in eight tokens' (skewed: expert 0 overflows, so
    pairs drop at any factor up to about E / k)."""
    ex = distinct_picks(T, E, k)
    if mode == "skewed":
        first = torch.where(
            torch.rand(T, device=DEV) < 7 / 8, 0, torch.randint(0, E, (T,), device=DEV)
        )
        # the token's other picks: distinct from the first, drawn from the rest
        rest = (first[:, None] + 1 + distinct_picks(T, E - 1, k - 1)) % E
        ex = torch.cat([first[:, None], rest], dim=1)
    return ex.to(torch.int32)


def flat(*tensors):
    return torch.cat([t.flatten() for t in tensors])


def ref_dispatch_capacity(ex, E, cap):
    """moe_mlir.reference.dispatch (the CPU path's NumPy reference) on the GPU's experts."""
    tid, off, rows = ref.dispatch(ex.cpu().numpy(), E, cap)
    return (torch.from_numpy(a).to(DEV) for a in (tid, off, rows))


def run_dispatch_capacity(lib, T, k, E, factor, mode):
    """dispatch_capacity against the NumPy reference's dispatch with the capacity of
    `factor` (config.capacity_for): the same offsets, token ids and rows, bit for bit (so
    the same kept pairs: each expert's first `cap` in token order, the rest -1), the same
    bits run to run, and the dropless dispatch's result at cap = T * k."""
    cap = ref.capacity_for(factor, T, k, E)
    tag = f"capacity dispatch T={T} k={k} E={E} factor={factor} cap={cap} {mode}"
    ex = capacity_routing(T, k, E, mode)
    outs = []
    for _ in range(2):
        tid = torch.full((T * k,), -7, dtype=torch.int32, device=DEV)
        off = torch.full((E + 1,), -7, dtype=torch.int32, device=DEV)
        rows = torch.full((T, k), -7, dtype=torch.int32, device=DEV)
        lib.call("dispatch_capacity", ex, cap, tid, off, rows)
        outs.append((tid, off, rows))
    (tid, off, rows), again = outs
    rt, ro, rr = ref_dispatch_capacity(ex, E, cap)
    ok = check_exact(f"{tag} offsets", off, ro)
    ok &= check_exact(f"{tag} token_ids", tid, rt)
    ok &= check_exact(f"{tag} rows", rows, rr)
    ok &= check_exact(f"{tag} bitwise run to run", flat(*again), flat(*outs[0]))
    dropped = T * k - int(off[E])
    if mode == "skewed" and factor <= 1.25:
        ok &= check_exact(
            f"{tag} drops pairs ({dropped})", torch.tensor(dropped > 0), torch.tensor(True)
        )
    # no capacity (T * k): the dropless dispatch's result
    plain = [torch.empty_like(a) for a in (tid, off, rows)]
    lib.call("dispatch", ex, *plain)
    full = [torch.empty_like(a) for a in (tid, off, rows)]
    lib.call("dispatch_capacity", ex, T * k, *full)
    ok &= check_exact(f"{tag} cap = T * k is dropless", flat(*full), flat(*plain))
    return ok


def run_capacity_layer(lib, T, d, n, E, k, factor, mode, renorm=True):
    """A layer's op sequence with a capacity factor, forward and backward: router,
    dispatch_capacity, expert_ffn, combine, expert_combine_grad, router_grad, against fp32
    autograd of the layer on the GPU router's picks with the NumPy reference's kept pairs
    (a dropped pair adds nothing): out, dx, dW_router, dW_gate_up, dW_down and the routing
    weights' gradient, which is exactly 0 for a dropped pair (the CPU path's)."""
    cap = ref.capacity_for(factor, T, k, E)
    tag = f"capacity layer T={T} d={d} n={n} E={E} k={k} factor={factor} {mode}"
    x, wr = bf(T, d), bf(d, E, std=0.02)
    if mode == "skewed":  # a constant feature that raises expert 0's logit by 2: it overflows
        x[:, 0] = 2.0
        wr[0, 0] = 1.0
    wgu, wd = bf(E, d, up_width(n), std=0.02), bf(E, n, d, std=0.02)
    w = torch.empty(T, k, device=DEV)
    ex = torch.empty(T, k, dtype=torch.int32, device=DEV)
    lg = torch.empty(T, E, device=DEV)
    empty_bias = torch.empty(0, device=DEV)
    lib.call("router", x, wr, empty_bias, 0, int(renorm), 1, 1, 1.0, 0, w, ex, lg)
    R = T * k
    tid = torch.empty(R, dtype=torch.int32, device=DEV)
    off = torch.empty(E + 1, dtype=torch.int32, device=DEV)
    rows = torch.empty(T, k, dtype=torch.int32, device=DEV)
    lib.call("dispatch_capacity", ex, cap, tid, off, rows)
    rt, ro, rr = ref_dispatch_capacity(ex, E, cap)
    ok = check_exact(f"{tag} rows", rows, rr) & check_exact(f"{tag} offsets", off, ro)
    dropped = R - int(off[E])
    print(f"     {tag}: cap {cap}, {dropped} of {R} pairs dropped", flush=True)
    y = torch.empty(R, d, dtype=torch.bfloat16, device=DEV)
    h = torch.empty(R, up_width(n), dtype=torch.bfloat16, device=DEV)
    lib.call("expert_ffn", x, tid, off, wgu, wd, ACT_CODE, y, h)
    out = torch.empty(T, d, dtype=torch.bfloat16, device=DEV)
    lib.call("combine", y, w, rows, out)
    dout = bf(T, d)
    dx_e = torch.empty(T, d, dtype=torch.bfloat16, device=DEV)
    dw = torch.full((T, k), float("nan"), device=DEV)
    dwgu, dwd = torch.empty_like(wgu), torch.empty_like(wd)
    lib.call(
        "expert_combine_grad", x, tid, off, rows, w, wgu, wd, h, dout, ACT_CODE, dx_e, dw, dwgu, dwd
    )
    dx_r = torch.empty(T, d, dtype=torch.bfloat16, device=DEV)
    dwr = torch.empty(d, E, dtype=torch.bfloat16, device=DEV)
    no_dl = torch.zeros(T, E, device=DEV)
    lib.call("router_grad", x, wr, lg, ex, dw, no_dl, 0, int(renorm), 1.0, dx_r, dwr)
    # fp32 autograd on the same picks; a kept pair's row is its expert's FFN of its token
    xr = x.float().requires_grad_()
    wrr, wgur, wdr = (t.float().requires_grad_() for t in (wr, wgu, wd))
    s = torch.softmax(xr @ wrr, -1)
    u = torch.gather(s, 1, ex.long())
    if renorm:
        u = u / u.sum(1, keepdim=True)
    kept = rr >= 0
    o = torch.zeros(T, d, device=DEV)
    for e in range(E):
        sel = (ex == e) & kept
        t_idx, j_idx = sel.nonzero(as_tuple=True)
        if t_idx.numel() == 0:
            continue
        ye = act_ref(xr[t_idx] @ wgur[e]) @ wdr[e]
        o = o.index_add(0, t_idx, ye * u[t_idx, j_idx][:, None])
    (o * dout.float()).sum().backward()
    ok &= check(f"{tag} out", rel(out, o), 1e-2)
    dropped_tokens = ~kept.any(1)
    if bool(dropped_tokens.any()):
        ok &= check_exact(
            f"{tag} out of tokens with every pair dropped is 0",
            out[dropped_tokens].float(),
            torch.zeros_like(out[dropped_tokens].float()),
        )
    ok &= check_exact(
        f"{tag} d_weights of dropped pairs are 0", dw[~kept], torch.zeros_like(dw[~kept])
    )
    ok &= check(f"{tag} dx", rel(dx_e.float() + dx_r.float(), xr.grad), 2e-2)
    ok &= check(f"{tag} d_w_router", rel(dwr, wrr.grad), 2e-2)
    ok &= check(f"{tag} d_w_gate_up", rel(dwgu, wgur.grad), 2e-2)
    ok &= check(f"{tag} d_w_down", rel(dwd, wdr.grad), 2e-2)
    return ok


def run_router_hostile(lib, scoring):
    """NaN and inf in x: logits, experts and weights follow docs/cpu-path.md's rules, checked
    against the NumPy reference (python/moe_mlir/reference.py) on our own logits."""
    T, d, E, k = 37, 128, 8, 2
    tag = f"router hostile {'softmax' if scoring == 0 else 'sigmoid'}"
    x, wr = bf(T, d), bf(d, E, std=0.02)
    x[0, 5] = float("nan")
    x[1, 7] = float("inf")
    x[2, :] = float("-inf")
    x[3, 0] = float("inf")
    x[3, 1] = float("-inf")  # inf - inf in the dot products
    w = torch.empty(T, k, device=DEV)
    ex = torch.empty(T, k, dtype=torch.int32, device=DEV)
    lg = torch.empty(T, E, device=DEV)
    lib.call("router", x, wr, torch.empty(0, device=DEV), scoring, 1, 1, 1, 1.0, 0, w, ex, lg)
    ref_lg = x.float() @ wr.float()
    ok = check_exact(f"{tag} logits NaN pattern", torch.isnan(lg), torch.isnan(ref_lg))
    finite = torch.isfinite(ref_lg)
    ok &= check(f"{tag} finite logits", rel(lg[finite], ref_lg[finite]), 1e-2)
    s = ref.scores(lg.cpu().numpy().astype(np.float32), "softmax" if scoring == 0 else "sigmoid")
    ref_ex = ref.select_experts(s, k)
    ok &= check_exact(f"{tag} experts", ex.cpu(), torch.from_numpy(ref_ex))
    u = np.take_along_axis(s, ref_ex.astype(np.intp), axis=1)
    tot = u.sum(1, keepdims=True)
    ref_w = np.where(tot != 0, u / np.where(tot != 0, tot, 1), u)
    same = np.isclose(w.cpu().numpy(), ref_w, rtol=1e-5, atol=0, equal_nan=True)
    RESULTS.append(
        {"check": f"{tag} weights", "mismatches": int((~same).sum()), "ok": bool(same.all())}
    )
    print(
        f"{'PASS' if same.all() else 'FAIL'} {tag} weights (NaN where the reference has NaN): "
        f"{int((~same).sum())} mismatches",
        flush=True,
    )
    return ok and bool(same.all())


def run_empty(lib):
    """T = 0: every op runs on empty tensors without an error and without touching memory."""
    d, n, E, k = 128, 128, 4, 2
    x = torch.empty(0, d, dtype=torch.bfloat16, device=DEV)
    wr, wgu, wd = bf(d, E, std=0.02), bf(E, d, up_width(n), std=0.02), bf(E, n, d, std=0.02)
    w = torch.empty(0, k, device=DEV)
    ex = torch.empty(0, k, dtype=torch.int32, device=DEV)
    lg = torch.empty(0, E, device=DEV)
    lib.call("router", x, wr, torch.empty(0, device=DEV), 0, 1, 1, 1, 1.0, 0, w, ex, lg)
    tid = torch.empty(0, dtype=torch.int32, device=DEV)
    off = torch.full((E + 1,), -7, dtype=torch.int32, device=DEV)
    rows = torch.empty(0, k, dtype=torch.int32, device=DEV)
    lib.call("dispatch", ex, tid, off, rows)
    y = torch.empty(0, d, dtype=torch.bfloat16, device=DEV)
    h = torch.empty(0, up_width(n), dtype=torch.bfloat16, device=DEV)
    lib.call("expert_ffn", x, tid, off, wgu, wd, ACT_CODE, y, h)
    out = torch.empty(0, d, dtype=torch.bfloat16, device=DEV)
    lib.call("combine", y, w, rows, out)
    dx = torch.empty(0, d, dtype=torch.bfloat16, device=DEV)
    dw = torch.empty(0, k, device=DEV)
    dwgu, dwd = torch.empty_like(wgu), torch.empty_like(wd)
    lib.call(
        "expert_combine_grad", x, tid, off, rows, w, wgu, wd, h, out, ACT_CODE, dx, dw, dwgu, dwd
    )
    dxr, dwr = torch.empty(0, d, dtype=torch.bfloat16, device=DEV), torch.empty_like(wr)
    lib.call("router_grad", x, wr, lg, ex, dw, torch.empty(0, 0, device=DEV), 0, 1, 1.0, dxr, dwr)
    ok = check_exact("T=0 offsets all zero", off, torch.zeros(E + 1, dtype=torch.int32, device=DEV))
    ok &= check(
        "T=0 weight gradients are zero",
        float(dwgu.float().abs().sum() + dwd.float().abs().sum() + dwr.float().abs().sum()),
        0.0,
    )
    return ok


def run_router_grad(lib, T, d, E, k, scoring, renorm, scaling, accumulate=False):
    """router_grad against autograd; accumulate: router_grad_acc, which adds dx's part to
    what dx holds (random values of the part's size, so that an error in the part shows
    in the sum as much as in the part)."""
    name = "router_grad_acc" if accumulate else "router_grad"
    tag = f"{name} T={T} d={d} E={E} k={k} {'softmax' if scoring == 0 else 'sigmoid'}"
    x, wr = bf(T, d), bf(d, E, std=0.02)
    logits = x.float() @ wr.float()
    ex = distinct_picks(T, E, k).to(torch.int32)
    dw = torch.randn(T, k, device=DEV)
    dl_in = torch.randn(T, E, device=DEV) * 0.1
    xr = x.float().requires_grad_()
    wrr = wr.float().requires_grad_()
    lg = xr @ wrr
    s = ref_scores(lg, scoring)
    u = torch.gather(s, 1, ex.long())
    if renorm:
        u = u / u.sum(1, keepdim=True)
    ((u * scaling * dw).sum() + (lg * dl_in).sum()).backward()
    if accumulate:
        dx0 = bf(T, d, std=xr.grad.std().item())
        dx = dx0.clone()
    else:
        dx0 = torch.zeros(T, d, dtype=torch.bfloat16, device=DEV)
        dx = torch.empty(T, d, dtype=torch.bfloat16, device=DEV)
    dwr = torch.empty(d, E, dtype=torch.bfloat16, device=DEV)
    lib.call(name, x, wr, logits, ex, dw, dl_in, scoring, int(renorm), float(scaling), dx, dwr)
    ok = check(f"{tag} dx", rel(dx, dx0.float() + xr.grad), 2e-2)
    ok &= check(f"{tag} d_w_router", rel(dwr, wrr.grad), 2e-2)
    return ok


def aux_routing(T, E, k, mode):
    """[T, k] int32 experts: distinct picks among all E (random), among the first
    max(k, E / 8) experts (skewed: most experts never picked), or random with about one
    slot in 16 out of range (-1 or E, which count for no expert)."""
    if mode == "skewed":
        return distinct_picks(T, max(k, E // 8), k).to(torch.int32)
    ex = distinct_picks(T, E, k).to(torch.int32)
    if mode == "invalid":
        bad = torch.rand(T, k, device=DEV) < 1 / 16
        low = torch.rand(T, k, device=DEV) < 0.5
        wrong = torch.where(low, torch.full_like(ex, -1), torch.full_like(ex, E))
        ex = torch.where(bad, wrong, ex)
    return ex


def run_aux_loss(lib, T, E, k, scoring, mode):
    """aux_loss and aux_loss_grad against the CPU path's reference (moe_mlir.reference: the
    losses in f64, d_logits in fp32 NumPy) on random logits, and run to run: the same bits
    twice (no float atomics)."""
    tag = f"aux_loss T={T} E={E} k={k} {'softmax' if scoring == 0 else 'sigmoid'} {mode}"
    name = "softmax" if scoring == 0 else "sigmoid"
    logits = torch.randn(T, E, device=DEV) * 2.0
    ex = aux_routing(T, E, k, mode)
    # the losses' reference in f64: NumPy's f32 mean over T (axis 0, summed in order) is itself
    # 1e-5 off at T = 16384, as far as the kernels may be
    lb_ref, z_ref = ref.aux_loss(logits.double().cpu().numpy(), ex.cpu().numpy(), name)
    d_lb = torch.tensor(float(torch.randn(())), device=DEV)
    d_z = torch.tensor(float(torch.randn(())), device=DEV)
    dl_ref = ref.aux_loss_grad(
        logits.cpu().numpy(), ex.cpu().numpy(), d_lb.cpu().numpy(), d_z.cpu().numpy(), name
    )
    outs = []
    for _ in range(2):
        lb = torch.full((), float("nan"), device=DEV)
        z = torch.full((), float("nan"), device=DEV)
        lib.call("aux_loss", logits, ex, scoring, lb, z)
        dl = torch.full_like(logits, float("nan"))
        lib.call("aux_loss_grad", logits, ex, d_lb, d_z, scoring, dl)
        outs.append((lb, z, dl))
    (lb, z, dl), (lb2, z2, dl2) = outs
    lb_t = torch.from_numpy(np.asarray(lb_ref, dtype=np.float32)).to(DEV)
    z_t = torch.from_numpy(np.asarray(z_ref, dtype=np.float32)).to(DEV)
    ok = check(f"{tag} load_balance", rel(lb, lb_t), 1e-5)
    ok &= check(f"{tag} z_loss", rel(z, z_t), 1e-5)
    ok &= check(f"{tag} d_logits", rel(dl, torch.from_numpy(dl_ref).to(DEV)), 1e-4)
    ok &= check_exact(f"{tag} load_balance twice", lb2, lb)
    ok &= check_exact(f"{tag} z_loss twice", z2, z)
    ok &= check_exact(f"{tag} d_logits twice", dl2, dl)
    return ok


def run_aux_loss_empty(lib):
    """T = 0: both losses 0, and d_logits has nothing to write."""
    E, k = 8, 2
    logits = torch.empty(0, E, device=DEV)
    ex = torch.empty(0, k, dtype=torch.int32, device=DEV)
    ok = True
    for scoring in (0, 1):
        lb = torch.full((), float("nan"), device=DEV)
        z = torch.full((), float("nan"), device=DEV)
        lib.call("aux_loss", logits, ex, scoring, lb, z)
        zero = torch.zeros((), device=DEV)
        ok &= check_exact(f"aux_loss T=0 scoring={scoring} load_balance", lb, zero)
        ok &= check_exact(f"aux_loss T=0 scoring={scoring} z_loss", z, zero)
        one = torch.ones((), device=DEV)
        lib.call("aux_loss_grad", logits, ex, one, one, scoring, torch.empty(0, E, device=DEV))
    return ok


def router_aux_inputs(T, d, E, k, scoring, bias):
    x, wr = bf(T, d), bf(d, E, std=0.5)
    b = (torch.rand(E, device=DEV) * 0.1) if bias else torch.empty(0, device=DEV)
    return x, wr, b


def run_router_aux(lib, T, d, E, k, scoring, G=1, TG=1, bias=False, round_logits=False):
    """router_aux (the router whose kernels compute the auxiliary losses) against router
    then aux_loss on its outputs: the same bits for the weights, experts, logits and both
    losses; the losses against the fp32 reference on its logits and experts; the same bits
    run to run."""
    name = "softmax" if scoring == 0 else "sigmoid"
    tag = f"aux-fused T={T} d={d} E={E} k={k} {name}"
    if G > 1:
        tag += f" groups={G}/{TG}"
    if bias:
        tag += " bias"
    if round_logits:
        tag += " round_logits"
    x, wr, b = router_aux_inputs(T, d, E, k, scoring, bias)
    args = (x, wr, b, scoring, 1, G, TG, 1.0, int(round_logits))

    def outputs():
        w = torch.full((T, k), float("nan"), device=DEV)
        ex = torch.full((T, k), -7, dtype=torch.int32, device=DEV)
        lg = torch.full((T, E), float("nan"), device=DEV)
        lb = torch.full((), float("nan"), device=DEV)
        z = torch.full((), float("nan"), device=DEV)
        return w, ex, lg, lb, z

    w1, ex1, lg1, lb1, z1 = outputs()
    lib.call("router", *args, w1, ex1, lg1)
    lib.call("aux_loss", lg1, ex1, scoring, lb1, z1)
    fused = []
    for _ in range(2):
        out = outputs()
        lib.call("router_aux", *args, *out)
        fused.append(out)
    (w2, ex2, lg2, lb2, z2), again = fused
    ok = check_exact(f"{tag} weights as router's", w2, w1)
    ok &= check_exact(f"{tag} experts as router's", ex2, ex1)
    ok &= check_exact(f"{tag} logits as router's", lg2, lg1)
    ok &= check_exact(f"{tag} load_balance as aux_loss's", lb2, lb1)
    ok &= check_exact(f"{tag} z_loss as aux_loss's", z2, z1)
    lb_ref, z_ref = ref.aux_loss(lg2.double().cpu().numpy(), ex2.cpu().numpy(), name)  # f64
    lb_t = torch.from_numpy(np.asarray(lb_ref, dtype=np.float32)).to(DEV)
    z_t = torch.from_numpy(np.asarray(z_ref, dtype=np.float32)).to(DEV)
    ok &= check(f"{tag} load_balance", rel(lb2, lb_t), 1e-5)
    ok &= check(f"{tag} z_loss", rel(z2, z_t), 1e-5)
    ok &= check(f"{tag} logits", rel(lg2, x.float() @ wr.float()), 1e-2)
    c = ref_scores(lg2, scoring) + (b if bias else 0)
    ref_ex = ref_select(c, k, G, TG)
    ok &= check_exact(f"{tag} experts", torch.sort(ex2, 1).values, torch.sort(ref_ex, 1).values)
    for got, first, what in zip(again, fused[0], ("weights", "experts", "logits", "lb", "z")):
        ok &= check_exact(f"{tag} {what} twice", got, first)
    return ok


def run_router_grad_aux(lib, T, d, E, k, scoring, accumulate=False):
    """router_grad_aux (moe.aux_loss_grad's d_logits added in the router's d_logits pass)
    against aux_loss_grad then router_grad with those d_logits: the same bits for dx and
    d_w_router; and against autograd of the router's weights plus the fp32 reference's
    d_logits of the losses. accumulate: the `_acc` forms, from the same random dx."""
    name = "softmax" if scoring == 0 else "sigmoid"
    suffix = "_acc" if accumulate else ""
    tag = f"aux-fused grad{suffix} T={T} d={d} E={E} k={k} {name}"
    x, wr = bf(T, d), bf(d, E, std=0.5)
    logits = x.float() @ wr.float()
    ex = distinct_picks(T, E, k).to(torch.int32)
    dw = torch.randn(T, k, device=DEV)
    d_lb = torch.tensor(float(torch.randn(())), device=DEV)
    d_z = torch.tensor(float(torch.randn(())), device=DEV)
    dl_ref = torch.from_numpy(
        ref.aux_loss_grad(
            logits.cpu().numpy(), ex.cpu().numpy(), d_lb.cpu().numpy(), d_z.cpu().numpy(), name
        )
    ).to(DEV)
    xr = x.float().requires_grad_()
    wrr = wr.float().requires_grad_()
    lg = xr @ wrr
    u = torch.gather(ref_scores(lg, scoring), 1, ex.long())
    u = u / u.sum(1, keepdim=True)
    ((u * dw).sum() + (lg * dl_ref).sum()).backward()
    dx0 = bf(T, d, std=xr.grad.std().item()) if accumulate else None

    def fresh():
        dx = dx0.clone() if accumulate else torch.full((T, d), float("nan"), device=DEV)
        return dx.to(torch.bfloat16), torch.full((d, E), float("nan"), device=DEV).bfloat16()

    dl = torch.full_like(logits, float("nan"))
    lib.call("aux_loss_grad", logits, ex, d_lb, d_z, scoring, dl)
    dx1, dwr1 = fresh()
    lib.call("router_grad" + suffix, x, wr, logits, ex, dw, dl, scoring, 1, 1.0, dx1, dwr1)
    dx2, dwr2 = fresh()
    lib.call(
        "router_grad_aux" + suffix, x, wr, logits, ex, dw, d_lb, d_z, scoring, 1, 1.0, dx2, dwr2
    )
    ok = check_exact(f"{tag} dx as aux_loss_grad + router_grad", dx2, dx1)
    ok &= check_exact(f"{tag} d_w_router as aux_loss_grad + router_grad", dwr2, dwr1)
    base = dx0.float() if accumulate else 0
    ok &= check(f"{tag} dx", rel(dx2, base + xr.grad), 2e-2)
    ok &= check(f"{tag} d_w_router", rel(dwr2, wrr.grad), 2e-2)
    return ok


def run_router_aux_empty(lib):
    """T = 0: both losses 0, as aux_loss gives them."""
    E, k, d = 8, 2, 128
    ok = True
    for scoring in (0, 1):
        x, wr, b = router_aux_inputs(0, d, E, k, scoring, False)
        w = torch.empty(0, k, device=DEV)
        ex = torch.empty(0, k, dtype=torch.int32, device=DEV)
        lg = torch.empty(0, E, device=DEV)
        lb = torch.full((), float("nan"), device=DEV)
        z = torch.full((), float("nan"), device=DEV)
        lib.call("router_aux", x, wr, b, scoring, 1, 1, 1, 1.0, 0, w, ex, lg, lb, z)
        zero = torch.zeros((), device=DEV)
        ok &= check_exact(f"aux-fused T=0 scoring={scoring} load_balance", lb, zero)
        ok &= check_exact(f"aux-fused T=0 scoring={scoring} z_loss", z, zero)
    return ok


def median_ms(ops, reps):
    """The median ms of each callable of `ops`, called in turn, `reps` timed rounds after an
    untimed one: CUDA events around each call on the GPU, the wall clock elsewhere (the
    tests' stand-in libraries)."""
    times = {name: [] for name in ops}
    for rep in range(reps + 1):
        for name, fn in ops.items():
            if DEV == "cuda":
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                ms = start.elapsed_time(end)
            else:
                t0 = time.perf_counter()
                fn()
                ms = (time.perf_counter() - t0) * 1e3
            if rep:
                times[name].append(ms)
    return {name: sorted(v)[len(v) // 2] for name, v in times.items()}


def report_bench(tag, med, summary):
    """A bench's line (BENCH TAG: SUMMARY) and its medians in the results (not a check)."""
    print(f"BENCH {tag}: {summary}", flush=True)
    RESULTS.append({"check": tag, "ms": med, "ok": True})
    return True


def bench_router_aux(lib, T, d, E, k, scoring, reps=20):
    """Times router + aux_loss (what convert-moe-to-gpu calls without the fusion) against
    router_aux, CUDA events around each, medians in ms (MOE_PROFILE-style, not a check)."""
    x, wr, b = router_aux_inputs(T, d, E, k, scoring, False)
    args = (x, wr, b, scoring, 1, 1, 1, 1.0, 0)
    w = torch.empty(T, k, device=DEV)
    ex = torch.empty(T, k, dtype=torch.int32, device=DEV)
    lg = torch.empty(T, E, device=DEV)
    lb, z = torch.empty((), device=DEV), torch.empty((), device=DEV)
    ops = {
        "router": lambda: lib.call("router", *args, w, ex, lg),
        "aux_loss": lambda: lib.call("aux_loss", lg, ex, scoring, lb, z),
        "router_aux": lambda: lib.call("router_aux", *args, w, ex, lg, lb, z),
    }
    med = median_ms(ops, reps)
    separate = med["router"] + med["aux_loss"]
    tag = f"aux-fused-bench T={T} d={d} E={E} k={k} {'softmax' if scoring == 0 else 'sigmoid'}"
    return report_bench(
        tag,
        med,
        f"router {med['router']:.4f} + aux_loss {med['aux_loss']:.4f} = {separate:.4f} ms, "
        f"router_aux {med['router_aux']:.4f} ms",
    )


def bench_bias_grad(lib, T, d, n, E, k, reps=10):
    """Times expert_combine_grad against expert_combine_grad_bias (the same GEMMs, then each
    expert's column sums of dH and of dout's rows and the routing weights' <dout, b_down[e]>),
    random routing, CUDA events around each call, medians in ms (not a check)."""
    tid, off, rows = bias_grad_routing(T, k, E, "random")
    G = up_width(n)
    x, h, dout = bf(T, d), bf(T * k, G), bf(T, d)
    wgu, wd = bf(E, d, G, std=0.05), bf(E, n, d, std=0.05)
    bgu, bd = bf(E, G, std=0.5), bf(E, d, std=0.2)
    w = torch.rand(T, k, device=DEV)
    dx, dw = nan_bf16(T, d), torch.empty(T, k, device=DEV)
    dwgu, dwd, dbgu, dbd = nan_bf16(E, d, G), nan_bf16(E, n, d), nan_bf16(E, G), nan_bf16(E, d)
    common = (x, tid, off, rows, w, wgu, wd, h, dout)
    ops = {
        "plain": lambda: lib.call("expert_combine_grad", *common, ACT_CODE, dx, dw, dwgu, dwd),
        "bias": lambda: lib.call(
            "expert_combine_grad_bias", *common, bgu, bd, ACT_CODE, dx, dw, dwgu, dwd, dbgu, dbd
        ),
    }
    med = median_ms(ops, reps)
    tag = f"bias-grad-bench T={T} d={d} n={n} E={E} k={k} {ACT}"
    return report_bench(
        tag,
        med,
        f"expert_combine_grad {med['plain']:.3f} ms, expert_combine_grad_bias "
        f"{med['bias']:.3f} ms ({med['bias'] / med['plain']:.3f}x)",
    )


def run_shared(lib, T, d, m):
    tag = f"shared T={T} d={d} m={m}"
    x = bf(T, d)
    wgu, wd = bf(d, up_width(m), std=0.02), bf(m, d, std=0.02)
    y = torch.empty(T, d, dtype=torch.bfloat16, device=DEV)
    h = torch.empty(T, up_width(m), dtype=torch.bfloat16, device=DEV)
    lib.call("shared_expert", x, wgu, wd, ACT_CODE, y, h)
    xr = x.float().requires_grad_()
    wgur, wdr = wgu.float().requires_grad_(), wd.float().requires_grad_()
    hr = xr @ wgur
    yr = act_ref(hr) @ wdr
    ok = check(f"{tag} h", rel(h, hr.detach()), 1e-2)
    ok &= check(f"{tag} y", rel(y, yr.detach()), 1e-2)
    h_only = torch.full_like(h, float("nan"))
    lib.call("shared_expert_h", x, wgu, wd, ACT_CODE, h_only)
    ok &= check_exact(
        f"{tag} h only (recompute) bitwise", h_only.view(torch.int16), h.view(torch.int16)
    )
    dy = bf(T, d)
    (yr * dy.float()).sum().backward()
    dx = torch.empty_like(x)
    dwgu, dwd = torch.empty_like(wgu), torch.empty_like(wd)
    lib.call("shared_expert_grad", x, wgu, wd, h, dy, ACT_CODE, dx, dwgu, dwd)
    ok &= check(f"{tag} dx", rel(dx, xr.grad), 2e-2)
    ok &= check(f"{tag} d_w_gate_up", rel(dwgu, wgur.grad), 2e-2)
    ok &= check(f"{tag} d_w_down", rel(dwd, wdr.grad), 2e-2)
    return ok


# --------------------------------------------------------------------------- expert parallelism
# The local expert-parallel ops against references that follow the CPU library's rules
# (lib/Conversion/MoEToLinalg/MoECPULibrary.mlir) to the letter, bounds checks included, so
# that hostile offsets and indices are compared too. Rows are copies and the reduce one f32
# sum in slot order: every result is compared bit for bit.


def ep_blocks(offsets, ranks, cap):
    """The local experts El and each rank's (first row, rows, kept rows) of `offsets`."""
    off = [int(v) for v in offsets.tolist()]
    local = max(len(off) - 1, 0) // ranks
    blocks = []
    for s in range(ranks):
        lo, hi = off[s * local], off[(s + 1) * local]
        n = max(hi - lo, 0)
        blocks.append((lo, n, min(n, cap)))
    return off, local, blocks


def ref_ep_pack(source, offsets, token_ids, ranks, cap):
    source = source.cpu()
    off, local, blocks = ep_blocks(offsets, ranks, cap)
    ids = None if token_ids is None else token_ids.tolist()
    n_ids = source.shape[0] if ids is None else len(ids)
    send = torch.zeros(ranks * cap, source.shape[1], dtype=source.dtype)
    counts = torch.zeros(ranks, local, dtype=torch.int32)
    dropped = torch.zeros(ranks, dtype=torch.int32)
    dst, src = [], []
    for s, (lo, n, kept) in enumerate(blocks):
        dropped[s] = n - kept
        end = lo + kept
        for e in range(local):
            g = s * local + e
            counts[s, e] = max(min(off[g + 1], end) - min(off[g], end), 0)
        for j in range(kept):
            i = lo + j
            if 0 <= i < n_ids:
                t = i if ids is None else ids[i]
                if 0 <= t < source.shape[0]:
                    dst.append(s * cap + j)
                    src.append(t)
    send[dst] = source[src]
    return send, counts, dropped


def ref_ep_unpack(returned, offsets, ranks, cap, rows):
    returned = returned.cpu()
    _, _, blocks = ep_blocks(offsets, ranks, cap)
    where = {}  # result row -> returned row, the later rank's where blocks overlap
    for s, (lo, _, kept) in enumerate(blocks):
        for j in range(kept):
            r, i = lo + j, s * cap + j
            if 0 <= r < rows and 0 <= i < returned.shape[0]:
                where[r] = i
    out = torch.zeros(rows, returned.shape[1], dtype=returned.dtype)
    if where:
        out[list(where)] = returned[list(where.values())]
    return out


def ref_ep_unpack_reduce(returned, offsets, rows_of, ranks, cap):
    tokens, k = rows_of.shape
    unpacked = ref_ep_unpack(returned, offsets, ranks, cap, tokens * k).float()
    rows_of = rows_of.cpu().long()
    out = torch.zeros(tokens, returned.shape[1])
    for j in range(k):  # slot order, in f32
        r = rows_of[:, j]
        kept = (r >= 0) & (r < tokens * k)
        out[kept] += unpacked[r[kept]]
    return out.to(torch.bfloat16)


def ref_ep_queues(counts, cap):
    """A rank's counts past C (which a valid exchange never has) are cut at C."""
    ranks, local = counts.shape
    c = counts.tolist()
    ids = torch.full((ranks * cap,), -1, dtype=torch.int32)
    offsets = torch.zeros(local + 1, dtype=torch.int32)
    take = [[0] * local for _ in range(ranks)]
    start = [[0] * local for _ in range(ranks)]
    for s in range(ranks):
        used = 0
        for e in range(local):
            take[s][e] = min(max(c[s][e], 0), cap - used)
            start[s][e] = s * cap + used
            used += take[s][e]
    pos = 0
    for e in range(local):
        for s in range(ranks):
            n = take[s][e]
            ids[pos : pos + n] = torch.arange(start[s][e], start[s][e] + n, dtype=torch.int32)
            pos += n
        offsets[e + 1] = pos
    return ids, offsets


def ref_gather_rows(source, indices):
    source, idx = source.cpu(), indices.cpu().long()
    out = torch.zeros(idx.numel(), source.shape[1], dtype=source.dtype)
    ok = (idx >= 0) & (idx < source.shape[0])
    out[ok] = source[idx[ok]]
    return out


def ref_scatter_rows(source, indices, rows):
    source, idx = source.cpu(), indices.cpu().tolist()
    where = {}  # the later index wins
    for i, v in enumerate(idx[: source.shape[0]]):
        if 0 <= v < rows:
            where[v] = i
    out = torch.zeros(rows, source.shape[1], dtype=source.dtype)
    if where:
        out[list(where)] = source[list(where.values())]
    return out


def bits(t):
    return t.cpu().view(torch.int16) if t.dtype == torch.bfloat16 else t.cpu()


def ep_routing(T, k, E, ranks, mode):
    """moe.dispatch's token ids, offsets and rows for `mode`: random, skewed (every pick among
    rank 0's experts, the other ranks' blocks empty), or all-to-one (every token's first pick
    is expert 0)."""
    local = E // ranks
    if mode == "skewed":
        ex = distinct_picks(T, local, k)
    elif mode == "all-to-one":
        ex = torch.cat(
            [torch.zeros(T, 1, dtype=torch.long, device=DEV), 1 + distinct_picks(T, E - 1, k - 1)],
            dim=1,
        )
    else:
        ex = distinct_picks(T, E, k)
    return ref_dispatch(ex.to(torch.int32), E)


def ep_capacity(offsets, ranks, kind):
    """A capacity above every block, exactly the largest, or half of it (rows dropped)."""
    _, _, blocks = ep_blocks(offsets, ranks, 1 << 30)
    largest = max(n for _, n, _ in blocks)
    return {"larger": largest + 3, "exact": max(largest, 1), "exceeded": max(largest // 2, 1)}[kind]


def run_ep_pack(lib, T, d, E, k, ranks, mode, kind, gather):
    tag = f"ep_pack{'_gather' if gather else ''} T={T} d={d} E={E} k={k} S={ranks} {mode} {kind}"
    tid, off, _ = ep_routing(T, k, E, ranks, mode)
    cap = ep_capacity(off, ranks, kind)
    source = bf(T, d) if gather else bf(T * k, d)
    send = torch.full((ranks * cap, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    counts = torch.full((ranks, E // ranks), -7, dtype=torch.int32, device=DEV)
    dropped = torch.full((ranks,), -7, dtype=torch.int32, device=DEV)
    if gather:
        lib.call("ep_pack_gather", source, off, tid, ranks, cap, send, counts, dropped)
    else:
        lib.call("ep_pack", source, off, ranks, cap, send, counts, dropped)
    rs, rc, rd = ref_ep_pack(source, off, tid if gather else None, ranks, cap)
    ok = check_exact(f"{tag} send bitwise", bits(send), bits(rs))
    ok &= check_exact(f"{tag} send_counts", counts, rc)
    ok &= check_exact(f"{tag} dropped", dropped, rd)
    if kind != "exceeded":
        ok &= check_exact(f"{tag} nothing dropped", dropped, torch.zeros_like(rd))
    return ok


def run_ep_unpack(lib, T, d, E, k, ranks, mode, kind, extra_rows=0):
    """ep_unpack into T * k (+ extra_rows: zero rows past offsets[E]) rows, and with reduce
    over the dispatch's rows, a few slots of which are -1 or out of range (they add nothing)."""
    tag = f"ep_unpack T={T} d={d} E={E} k={k} S={ranks} {mode} {kind}"
    _, off, rows = ep_routing(T, k, E, ranks, mode)
    cap = ep_capacity(off, ranks, kind)
    returned = bf(ranks * cap, d)
    R = T * k + extra_rows
    out = torch.full((R, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    lib.call("ep_unpack", returned, off, ranks, cap, out)
    ok = check_exact(f"{tag} bitwise", bits(out), bits(ref_ep_unpack(returned, off, ranks, cap, R)))
    rows_of = rows.clone()
    flat = rows_of.view(-1)
    flat[::7] = -1
    flat[3::11] = T * k + 5
    flat[5::13] = -9
    red = torch.full((T, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    lib.call("ep_unpack_reduce", returned, off, rows_of, ranks, cap, red)
    ref = ref_ep_unpack_reduce(returned, off, rows_of, ranks, cap)
    ok &= check_exact(f"{tag} reduce bitwise (f32 in slot order)", bits(red), bits(ref))
    return ok


def run_ep_hostile(lib):
    """Offsets that no dispatch gives (negative, decreasing, past the rows), token ids and
    indices outside their sources: zero rows or nothing, as the CPU path, and no access out of
    bounds (compute-sanitizer's memcheck runs these under --quick)."""
    T, d, E, k, ranks, cap = 11, 64, 8, 2, 2, 6
    R = T * k
    off = torch.tensor([0, 3, -4, 9, 30, 30, 2, 25, 40], dtype=torch.int32, device=DEV)
    tid = torch.randint(-3, T + 3, (R,), dtype=torch.int32, device=DEV)
    x = bf(T, d)
    send = torch.full((ranks * cap, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    counts = torch.full((ranks, E // ranks), -7, dtype=torch.int32, device=DEV)
    dropped = torch.full((ranks,), -7, dtype=torch.int32, device=DEV)
    lib.call("ep_pack_gather", x, off, tid, ranks, cap, send, counts, dropped)
    rs, rc, rd = ref_ep_pack(x, off, tid, ranks, cap)
    ok = check_exact("ep hostile pack_gather send bitwise", bits(send), bits(rs))
    ok &= check_exact("ep hostile pack_gather send_counts", counts, rc)
    ok &= check_exact("ep hostile pack_gather dropped", dropped, rd)
    rows = bf(R, d)
    lib.call("ep_pack", rows, off, ranks, cap, send, counts, dropped)
    rs, rc, rd = ref_ep_pack(rows, off, None, ranks, cap)
    ok &= check_exact("ep hostile pack send bitwise", bits(send), bits(rs))
    returned = bf(ranks * cap, d)
    out = torch.full((R, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    lib.call("ep_unpack", returned, off, ranks, cap, out)
    ref = ref_ep_unpack(returned, off, ranks, cap, R)
    ok &= check_exact("ep hostile unpack bitwise", bits(out), bits(ref))
    rows_of = torch.randint(-5, R + 5, (T, k), dtype=torch.int32, device=DEV)
    red = torch.full((T, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    lib.call("ep_unpack_reduce", returned, off, rows_of, ranks, cap, red)
    ref = ref_ep_unpack_reduce(returned, off, rows_of, ranks, cap)
    ok &= check_exact("ep hostile unpack_reduce bitwise", bits(red), bits(ref))
    # counts past C and negative ones
    cnt = torch.tensor([[3, -2, 9, 1], [0, 0, 0, 7]], dtype=torch.int32, device=DEV)
    ids = torch.full((ranks * cap,), 77, dtype=torch.int32, device=DEV)
    qoff = torch.full((5,), 77, dtype=torch.int32, device=DEV)
    lib.call("ep_queues", cnt, cap, ids, qoff)
    ri, ro = ref_ep_queues(cnt.cpu(), cap)
    ok &= check_exact("ep hostile queues token_ids", ids, ri)
    ok &= check_exact("ep hostile queues offsets", qoff, ro)
    idx = torch.tensor([0, -1, 5, 11, -7, 2**31 - 1, 3, 3, 10], dtype=torch.int32, device=DEV)
    src = bf(11, d)
    g = torch.full((idx.numel(), d), float("nan"), dtype=torch.bfloat16, device=DEV)
    lib.call("gather_rows", src, idx, g)
    ok &= check_exact("ep hostile gather_rows bitwise", bits(g), bits(ref_gather_rows(src, idx)))
    s9 = bf(idx.numel(), d)
    sc = torch.full((12, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    lib.call("scatter_rows", s9, idx, sc)
    ref = ref_scatter_rows(s9, idx, 12)
    ok &= check_exact(
        "ep hostile scatter_rows bitwise (the later of two indices wins)", bits(sc), bits(ref)
    )
    return ok


def run_ep_queues(lib, ranks, local, cap, mode):
    """Random counts whose rows sum to at most C each (the exchange's), with empty experts and
    empty ranks; or a full rank (its counts sum to C)."""
    tag = f"ep_queues S={ranks} El={local} C={cap} {mode}"
    g = torch.Generator().manual_seed(ranks * 1000 + local)
    counts = torch.zeros(ranks, local, dtype=torch.int32)
    for s in range(ranks):
        if mode == "sparse" and s % 2:
            continue  # a rank that sent nothing
        total = cap if mode == "full" else int(torch.randint(0, cap + 1, (1,), generator=g))
        cuts = torch.sort(torch.randint(0, total + 1, (local - 1,), generator=g)).values
        edges = torch.cat([torch.tensor([0]), cuts, torch.tensor([total])])
        counts[s] = torch.diff(edges).to(torch.int32)
        if mode == "sparse":
            counts[s, ::3] = 0
    ids = torch.full((ranks * cap,), 77, dtype=torch.int32, device=DEV)
    offs = torch.full((local + 1,), 77, dtype=torch.int32, device=DEV)
    lib.call("ep_queues", counts.to(DEV), cap, ids, offs)
    ri, ro = ref_ep_queues(counts, cap)
    ok = check_exact(f"{tag} offsets", offs, ro)
    ok &= check_exact(f"{tag} token_ids", ids, ri)
    return ok


def selection_bias_routing(T, k, E, mode):
    """experts [T, k] int32 on the GPU: distinct experts a token, uniform (random) or on a
    few experts (skewed: Pareto weights), every 7th entry -1 (no expert); all -1 (none)."""
    if mode == "none" or T == 0:
        return torch.full((T, k), -1, dtype=torch.int32, device=DEV)
    if mode == "skewed":
        w = torch.distributions.Pareto(1.0, 1.0).sample((E,)).to(DEV)
    else:
        w = torch.ones(E, device=DEV)
    e = torch.multinomial(w.expand(T, E).contiguous(), k, replacement=False).to(torch.int32)
    e.view(-1)[::7] = -1
    return e.contiguous()


def run_selection_bias(lib, T, k, E, mode, rule, rate):
    """moe.update_selection_bias (rule 0 sign, 1 proportional) against the NumPy reference,
    bitwise: integer loads, then one IEEE f32 operation a step in the same order."""
    tag = f"selection_bias T={T} k={k} E={E} {mode} {('sign', 'proportional')[rule]}"
    bias = torch.randn(E, device=DEV) * 0.1
    experts = selection_bias_routing(T, k, E, mode)
    out = torch.full((E,), float("nan"), device=DEV)
    lib.call("update_selection_bias", bias, experts, rate, rule, out)
    want = ref.update_selection_bias(
        bias.cpu().numpy(), experts.cpu().numpy(), rate, ("sign", "proportional")[rule]
    )
    ok = check_exact(
        f"{tag} bitwise", out.cpu().view(torch.int32), torch.from_numpy(want).view(torch.int32)
    )
    # the same call again: the loads are integers, so the result does not depend on the
    # order of the atomics
    again = torch.full((E,), float("nan"), device=DEV)
    lib.call("update_selection_bias", bias, experts, rate, rule, again)
    ok &= check_exact(
        f"{tag} repeat bitwise", again.cpu().view(torch.int32), out.cpu().view(torch.int32)
    )
    return ok


def run_rows(lib, N, M, d):
    """gather_rows of M rows from N (some -1), and scatter_rows back of distinct indices."""
    tag = f"rows N={N} M={M} d={d}"
    src = bf(N, d)
    idx = torch.randint(0, N, (M,), dtype=torch.int32, device=DEV)
    idx[::5] = -1
    g = torch.full((M, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    lib.call("gather_rows", src, idx, g)
    ok = check_exact(f"gather_{tag} bitwise", bits(g), bits(ref_gather_rows(src, idx)))
    # distinct targets among N rows, some -1
    dest = torch.randperm(N, device=DEV)[:M].to(torch.int32) if M <= N else None
    if dest is not None:
        dest[1::4] = -1
        sc = torch.full((N, d), float("nan"), dtype=torch.bfloat16, device=DEV)
        lib.call("scatter_rows", g, dest, sc)
        ok &= check_exact(f"scatter_{tag} bitwise", bits(sc), bits(ref_scatter_rows(g, dest, N)))
    return ok


def run_ep_chain(lib, T, d, E, k, ranks, kind):
    """What a one-rank step runs, ep_size S blocks on one GPU: dispatch, pack, the queues
    over the packed rows (the exchange is the identity), the expert rows gathered and
    scattered back, unpack and its reduce; timed once as a sanity check of the row moves'
    bandwidth (not a benchmark)."""
    tag = f"ep chain T={T} d={d} E={E} k={k} S={ranks} {kind}"
    tid, off, rows = ep_routing(T, k, E, ranks, "random")
    cap = ep_capacity(off, ranks, kind)
    x = bf(T, d)
    local = E // ranks
    send = torch.empty(ranks * cap, d, dtype=torch.bfloat16, device=DEV)
    counts = torch.empty(ranks, local, dtype=torch.int32, device=DEV)
    dropped = torch.empty(ranks, dtype=torch.int32, device=DEV)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    lib.call("ep_pack_gather", x, off, tid, ranks, cap, send, counts, dropped)
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end)
    rs, rc, rd = ref_ep_pack(x, off, tid, ranks, cap)
    ok = check_exact(f"{tag} send bitwise", bits(send), bits(rs))
    ok &= check_exact(f"{tag} send_counts", counts, rc)
    # the counts of rank s's rows for its own experts: each rank's block as its queues
    for s in range(min(ranks, 2)):
        c = counts[s : s + 1].contiguous()
        ids = torch.empty(cap, dtype=torch.int32, device=DEV)
        qoff = torch.empty(local + 1, dtype=torch.int32, device=DEV)
        lib.call("ep_queues", c, cap, ids, qoff)
        ri, ro = ref_ep_queues(c.cpu(), cap)
        ok &= check_exact(f"{tag} queues of rank {s}", ids, ri)
        blk = send[s * cap : (s + 1) * cap].contiguous()
        q = torch.empty(cap, d, dtype=torch.bfloat16, device=DEV)
        lib.call("gather_rows", blk, ids, q)
        back = torch.empty(cap, d, dtype=torch.bfloat16, device=DEV)
        lib.call("scatter_rows", q, ids, back)
        ok &= check_exact(
            f"{tag} rank {s} gathered and scattered back bitwise",
            bits(back),
            bits(ref_scatter_rows(ref_gather_rows(blk, ids), ids, cap)),
        )
    out = torch.empty(T * k, d, dtype=torch.bfloat16, device=DEV)
    lib.call("ep_unpack", send, off, ranks, cap, out)
    ok &= check_exact(
        f"{tag} unpack bitwise", bits(out), bits(ref_ep_unpack(send, off, ranks, cap, T * k))
    )
    red = torch.empty(T, d, dtype=torch.bfloat16, device=DEV)
    lib.call("ep_unpack_reduce", send, off, rows, ranks, cap, red)
    ok &= check_exact(
        f"{tag} reduce bitwise", bits(red), bits(ref_ep_unpack_reduce(send, off, rows, ranks, cap))
    )
    moved = 2 * ranks * cap * d * 2  # the send rows read and written, about
    print(f"INFO {tag}: ep_pack_gather {ms:.3f} ms, {moved / ms / 1e6:.0f} GB/s", flush=True)
    return ok


def run_combine_grad(lib, T, d, E, k, mode, extra_rows=0):
    """combine_grad over the dispatch's rows (skewed: every pick among half the experts), a few slots of which are dropped (-1) or out of
    range (nobody owns their row): dy bitwise (one rounding of w * dout), rows nobody owns
    zero, d_weights against an f32 dot, zero for those slots; the same bits twice."""
    tag = f"combine_grad T={T} d={d} E={E} k={k} {mode}"
    _, _, rows = ep_routing(T, k, E, 2, mode)
    rows = rows.clone()
    flat = rows.view(-1)
    flat[::7] = -1
    flat[3::11] = T * k + extra_rows + 5
    flat[5::13] = -9
    R = T * k + extra_rows
    dout, y = bf(T, d), bf(R, d)
    w = torch.rand(T, k, device=DEV)
    dy = torch.full((R, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    dw = torch.full((T, k), float("nan"), device=DEV)
    lib.call("combine_grad", dout, w, rows, y, dy, dw)
    ref_dy = torch.zeros(R, d, dtype=torch.bfloat16, device=DEV)
    ref_dw = torch.zeros(T, k, device=DEV)
    for t in range(T):
        for j in range(k):
            r = int(rows[t, j])
            if 0 <= r < R:
                ref_dy[r] = (w[t, j] * dout[t].float()).to(torch.bfloat16)
                ref_dw[t, j] = (dout[t].float() * y[r].float()).sum()
    ok = check_exact(f"{tag} dy bitwise", bits(dy), bits(ref_dy))
    ok &= check(f"{tag} d_weights", rel(dw, ref_dw), 1e-5)
    none = (rows < 0) | (rows >= R)
    ok &= check_exact(f"{tag} d_weights of dropped slots", dw[none], torch.zeros_like(dw[none]))
    dy2, dw2 = torch.empty_like(dy), torch.empty_like(dw)
    lib.call("combine_grad", dout, w, rows, y, dy2, dw2)
    ok &= check_exact(
        f"{tag} bitwise twice",
        torch.cat([bits(dy2).flatten().float(), dw2.cpu().flatten()]),
        torch.cat([bits(dy).flatten().float(), dw.cpu().flatten()]),
    )
    return ok


def run_expert_ffn_grad(lib, T, d, n, E, k, mode, ep=False):
    """expert_ffn_grad from dy in queue order against fp32 autograd on the same queues, H from
    the GPU's forward. Without ep, x is the tokens and the queue the dispatch's (a token's k
    rows summed in row order); with ep, x is the received rows [S * C, d] and each queue row
    one of them, half the experts' rows dropped past offsets[E] (token id -1) and x rows
    that no queue row reads (their dx zero)."""
    tag = f"expert_ffn_grad T={T} d={d} n={n} E={E} k={k} {mode}{' ep' if ep else ''}"
    tid, off, _ = ep_routing(T, k, E, 2, mode)
    if ep:
        # the queue keeps the first half of each expert's rows, renumbered; its rows read
        # distinct rows of x, which has extra ones
        keep = [(int(off[e]), (int(off[e + 1]) - int(off[e]) + 1) // 2) for e in range(E)]
        counts = torch.tensor([c for _, c in keep], device=DEV)
        off = torch.zeros(E + 1, dtype=torch.int32, device=DEV)
        off[1:] = torch.cumsum(counts, 0).to(torch.int32)
        kept = int(off[E])
        X = T * k + 3
        tid = torch.full((T * k,), -1, dtype=torch.int32, device=DEV)
        tid[:kept] = torch.randperm(X, device=DEV)[:kept].to(torch.int32)
    else:
        X = T
    R = tid.numel()
    x = bf(X, d)
    wgu, wd = bf(E, d, up_width(n), std=0.02), bf(E, n, d, std=0.02)
    h = torch.zeros(R, up_width(n), dtype=torch.bfloat16, device=DEV)
    lib.call("expert_ffn_h", x, tid, off, wgu, wd, ACT_CODE, h)
    dy = bf(R, d)
    dx = torch.full((X, d), float("nan"), dtype=torch.bfloat16, device=DEV)
    dwgu, dwd = torch.empty_like(wgu), torch.empty_like(wd)
    lib.call("expert_ffn_grad", x, tid, off, wgu, wd, h, dy, ACT_CODE, dx, dwgu, dwd)
    xr = x.float().requires_grad_()
    wgur = wgu.float().requires_grad_()
    wdr = wd.float().requires_grad_()
    loss = torch.zeros((), device=DEV)
    for e in range(E):
        lo, hi = int(off[e]), int(off[e + 1])
        if hi == lo:
            continue
        he = xr[tid[lo:hi].long()] @ wgur[e]
        a = act_ref(he)
        loss = loss + ((a @ wdr[e]) * dy[lo:hi].float()).sum()
    loss.backward()
    ok = check(f"{tag} dx", rel(dx, xr.grad), 2e-2)
    ok &= check(f"{tag} d_w_gate_up", rel(dwgu, wgur.grad), 2e-2)
    ok &= check(f"{tag} d_w_down", rel(dwd, wdr.grad), 2e-2)
    if ep:
        unread = torch.ones(X, dtype=torch.bool, device=DEV)
        unread[tid[: int(off[E])].long()] = False
        ok &= check_exact(
            f"{tag} dx of unread rows zero", bits(dx[unread]), bits(torch.zeros_like(dx[unread]))
        )
    dx2, dwgu2, dwd2 = torch.empty_like(dx), torch.empty_like(dwgu), torch.empty_like(dwd)
    lib.call("expert_ffn_grad", x, tid, off, wgu, wd, h, dy, ACT_CODE, dx2, dwgu2, dwd2)
    ok &= check_exact(
        f"{tag} bitwise twice",
        torch.cat([dx2.flatten(), dwgu2.flatten(), dwd2.flatten()]).view(torch.int16),
        torch.cat([dx.flatten(), dwgu.flatten(), dwd.flatten()]).view(torch.int16),
    )
    return ok


def run_split_vs_fused(lib, T, d, n, E, k, mode):
    """combine_grad then expert_ffn_grad against the fused expert_combine_grad on the same
    inputs: the weight gradients and dx within bf16 rounding of dy, d_weights likewise."""
    tag = f"split backward vs fused T={T} d={d} n={n} E={E} k={k} {mode}"
    tid, off, rows = ep_routing(T, k, E, 2, mode)
    R = T * k
    x = bf(T, d)
    wgu, wd = bf(E, d, up_width(n), std=0.02), bf(E, n, d, std=0.02)
    y = torch.empty(R, d, dtype=torch.bfloat16, device=DEV)
    h = torch.empty(R, up_width(n), dtype=torch.bfloat16, device=DEV)
    lib.call("expert_ffn", x, tid, off, wgu, wd, ACT_CODE, y, h)
    w = torch.rand(T, k, device=DEV)
    dout = bf(T, d)
    dy = torch.empty(R, d, dtype=torch.bfloat16, device=DEV)
    dw = torch.empty(T, k, device=DEV)
    lib.call("combine_grad", dout, w, rows, y, dy, dw)
    dx, dwgu, dwd = torch.empty_like(x), torch.empty_like(wgu), torch.empty_like(wd)
    lib.call("expert_ffn_grad", x, tid, off, wgu, wd, h, dy, ACT_CODE, dx, dwgu, dwd)
    fdx, fdw = torch.empty_like(x), torch.empty_like(dw)
    fdwgu, fdwd = torch.empty_like(wgu), torch.empty_like(wd)
    lib.call(
        "expert_combine_grad",
        x,
        tid,
        off,
        rows,
        w,
        wgu,
        wd,
        h,
        dout,
        ACT_CODE,
        fdx,
        fdw,
        fdwgu,
        fdwd,
    )
    ok = check(f"{tag} dx", rel(dx, fdx), 2e-2)
    ok &= check(f"{tag} d_weights", rel(dw, fdw), 2e-2)
    ok &= check(f"{tag} d_w_gate_up", rel(dwgu, fdwgu), 2e-2)
    ok &= check(f"{tag} d_w_down", rel(dwd, fdwd), 2e-2)
    return ok


CONFIGS = {  # docs/benchmarks.md: T, d, n, E, k, scoring, renormalize, groups, topk_groups, scaling
    "mixtral-8x7b": (16384, 4096, 14336, 8, 2, 0, True, 1, 1, 1.0),
    "olmoe-1b-7b": (16384, 2048, 1024, 64, 8, 0, False, 1, 1, 1.0),
    "qwen3-30b-a3b": (16384, 2048, 768, 128, 8, 0, True, 1, 1, 1.0),
    "deepseek-v3": (8192, 7168, 2048, 256, 8, 1, True, 8, 4, 2.5),
}


def bench(lib, name, reps=5):
    """Times the op sequence of one forward + backward step; per-op medians in ms."""
    T, d, n, E, k, scoring, renorm, G, TG, scaling = CONFIGS[name]
    R = T * k
    x, wr = bf(T, d), bf(d, E, std=0.02)
    wgu, wd = bf(E, d, up_width(n), std=0.02), bf(E, n, d, std=0.02)
    bias = torch.rand(E, device=DEV) * 0.1 if scoring == 1 else torch.empty(0, device=DEV)
    w = torch.empty(T, k, device=DEV)
    ex = torch.empty(T, k, dtype=torch.int32, device=DEV)
    lg = torch.empty(T, E, device=DEV)
    tid = torch.empty(R, dtype=torch.int32, device=DEV)
    off = torch.empty(E + 1, dtype=torch.int32, device=DEV)
    rows = torch.empty(T, k, dtype=torch.int32, device=DEV)
    y = torch.empty(R, d, dtype=torch.bfloat16, device=DEV)
    h = torch.empty(R, up_width(n), dtype=torch.bfloat16, device=DEV)
    out = torch.empty(T, d, dtype=torch.bfloat16, device=DEV)
    dout = bf(T, d)
    dx, dxr, dxs = (torch.empty(T, d, dtype=torch.bfloat16, device=DEV) for _ in range(3))
    dw = torch.empty(T, k, device=DEV)
    dwgu, dwd = torch.empty_like(wgu), torch.empty_like(wd)
    dwr = torch.empty_like(wr)
    empty2 = torch.empty(0, 0, device=DEV)
    ops = [
        (
            "router",
            lambda: lib.call(
                "router", x, wr, bias, scoring, int(renorm), G, TG, float(scaling), 0, w, ex, lg
            ),
        ),
        ("dispatch", lambda: lib.call("dispatch", ex, tid, off, rows)),
        ("expert_ffn", lambda: lib.call("expert_ffn", x, tid, off, wgu, wd, ACT_CODE, y, h)),
        ("combine", lambda: lib.call("combine", y, w, rows, out)),
        (
            "expert_combine_grad",
            lambda: lib.call(
                "expert_combine_grad",
                x,
                tid,
                off,
                rows,
                w,
                wgu,
                wd,
                h,
                dout,
                ACT_CODE,
                dxs,
                dw,
                dwgu,
                dwd,
            ),
        ),
        (
            "router_grad",
            lambda: lib.call(
                "router_grad",
                x,
                wr,
                lg,
                ex,
                dw,
                empty2,
                scoring,
                int(renorm),
                float(scaling),
                dxr,
                dwr,
            ),
        ),
        ("add", lambda: lib.call("add", dxs.view(-1), dxr.view(-1), dx.view(-1))),
    ]
    if lib.has("router_grad_acc"):
        # what convert-moe-to-gpu makes of router_grad + add with such a library: the
        # router's dx added into the experts' (dxs, which then holds dx)
        ops[-2:] = [
            (
                "router_grad",
                lambda: lib.call(
                    "router_grad_acc",
                    x,
                    wr,
                    lg,
                    ex,
                    dw,
                    empty2,
                    scoring,
                    int(renorm),
                    float(scaling),
                    dxs,
                    dwr,
                ),
            )
        ]
    times = {name_: [] for name_, _ in ops}
    for rep in range(reps + 1):
        for op_name, fn in ops:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            if rep:
                times[op_name].append(start.elapsed_time(end))
    if PROFILE:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _, fn in ops:
                fn()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25), flush=True)
        gaps(name, ops)
    med = {k_: sorted(v)[len(v) // 2] if v else float("nan") for k_, v in times.items()}
    total = sum(med.values())
    # the useful FLOPs of the ops that have them: 18 T k d n + 6 T d E in all (SwiGLU)
    op_flops = {
        "router": 2 * T * d * E,
        # up (2n or n columns) and down: 2 T k d (w + n), w = up_width(n); backward twice that
        "expert_ffn": 2 * T * k * d * (up_width(n) + n),
        "expert_combine_grad": 4 * T * k * d * (up_width(n) + n),
        "router_grad": 4 * T * d * E,
    }
    flops = sum(op_flops.values())
    counts = torch.bincount(ex.flatten().long(), minlength=E)
    print(
        f"BENCH {name}: {total:.2f} ms fwd+bwd ops, {flops / total / 1e9:.0f} TFLOP/s; "
        + ", ".join(f"{k_} {v:.2f}" for k_, v in med.items())
        + f"; tokens/expert min {int(counts.min())} max {int(counts.max())}",
        flush=True,
    )
    RESULTS.append(
        {
            "check": f"bench {name}",
            "ms": med,
            "total_ms": total,
            "tflops": flops / total / 1e9,
            "ok": True,
        }
    )
    if ENERGY_S > 0:
        step_energy(name, ops, op_flops)
    return True


def step_energy(name, ops, flops):
    """ENERGY lines: each op of the step back to back for ENERGY_S seconds, after as long
    of whole steps (so every op starts from the GPU's state under a long run's power cap),
    then a dense 8192^3 matmul the same way: joules a call and, for the GEMM ops, joules
    per TFLOP against the dense matmul's (bench/energy.py)."""
    import energy

    # NVML numbers the GPUs its own way (CUDA_VISIBLE_DEVICES does not apply): MOE_NVML_INDEX
    meter = energy.NvmlEnergy(int(os.environ.get("MOE_NVML_INDEX", "0")))
    sync = torch.cuda.synchronize

    def step():
        for _, fn in ops:
            fn()

    a, b = bf(8192, 8192), bf(8192, 8192)
    # the whole step first: it also brings the GPU to a long run's clocks
    work = (
        [("step", step, sum(flops.values()))]
        + [(n_, fn, flops.get(n_, 0)) for n_, fn in ops]
        + [("dense 8192^3 matmul", lambda: a @ b, 2 * 8192**3)]
    )
    found = {}
    for label, fn, fl in work:
        found[label] = energy.measure(fn, ENERGY_S, meter, sync, tflop_per_call=fl / 1e12 or None)
        print(f"ENERGY {name} {energy.describe(label, found[label])}", flush=True)
    RESULTS.append({"check": f"energy {name}", "energy": found, "ok": True})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--only", default="", help="comma-separated substrings: the checks whose name holds one"
    )
    ap.add_argument("--json")
    ap.add_argument(
        "--bench", default="", help="comma-separated docs/benchmarks.md configs to time"
    )
    ap.add_argument("--profile", action="store_true", help="with --bench: per-kernel CUDA times")
    ap.add_argument(
        "--reps", type=int, default=5, help="with --bench: timed steps (0: one untimed)"
    )
    ap.add_argument(
        "--energy",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --bench: each op SECONDS back to back under NVML's energy counter",
    )
    ap.add_argument(
        "--activation",
        choices=ACTIVATIONS,
        help="the library's expert activation (default: from --variant, else swiglu)",
    )
    ap.add_argument(
        "--variant",
        metavar="FILE",
        help="the VARIANT file build-ops-harness.sh wrote beside the library's ops.o",
    )
    args = ap.parse_args()
    if not args.energy >= 0:
        ap.error(f"--energy must be 0 or more seconds, not {args.energy}")
    act = "swiglu"
    global BIAS
    if args.variant:
        try:
            with open(args.variant) as f:
                text = f.read()
            act = activation_of_variant(text)
            BIAS = bias_of_variant(text)
        except (OSError, ValueError) as exc:
            ap.error(f"--variant {args.variant}: {exc}")
    if args.activation:
        if args.variant and args.activation != act:
            ap.error(f"--activation {args.activation}, but {args.variant} builds {act}")
        act = args.activation
    set_activation(act)
    print(f"activation: {ACT}{' with expert biases' if BIAS else ''}", flush=True)
    global PROFILE, ENERGY_S
    PROFILE = args.profile
    ENERGY_S = args.energy
    torch.manual_seed(0)
    lib = Lib(args.lib)
    steps = [
        ("add", lambda: check("add", rel(*add_case(lib)), 1e-2)),
        # a length that is not a multiple of 8: the last thread's partial group
        ("add-tail", lambda: check("add tail N=12293", rel(*add_case(lib, 12293)), 1e-2)),
        ("dispatch", lambda: run_dispatch(lib, 37, 2, 5, "random")[0]),
        # moe.dispatch with a capacity factor: odd T, factors under, at and over 1, random
        # and skewed routing (pairs drop), one chunk of slots and several (T k > 1024)
        *[
            (
                f"capacity-dispatch-t{T}-e{E}-k{k}-{f}-{mode}",
                lambda T=T, E=E, k=k, f=f, mode=mode: run_dispatch_capacity(lib, T, k, E, f, mode),
            )
            for T, E, k in ((37, 5, 2), (1000, 8, 2), (1000, 64, 6))
            for f in (0.5, 1.0, 1.25)
            for mode in ("random", "skewed")
        ],
        ("capacity-dispatch-t1", lambda: run_dispatch_capacity(lib, 1, 2, 4, 0.5, "random")),
        # the layer's ops with drops, forward and backward
        ("capacity-layer", lambda: run_capacity_layer(lib, 37, 128, 128, 4, 2, 0.5, "skewed")),
        ("capacity-layer-1", lambda: run_capacity_layer(lib, 37, 128, 128, 4, 2, 1.0, "skewed")),
        (
            "capacity-layer-1.25",
            lambda: run_capacity_layer(lib, 1000, 256, 192, 8, 2, 1.25, "skewed"),
        ),
        (
            "capacity-layer-random",
            lambda: run_capacity_layer(lib, 1000, 128, 128, 8, 2, 1.0, "random", False),
        ),
        ("ffn-small", lambda: run_ffn(lib, 37, 128, 128, 4, 2, "random")),
        ("ffn-tail", lambda: run_ffn(lib, 37, 256, 192, 5, 2, "skewed")),
        ("ffn-one", lambda: run_ffn(lib, 1, 128, 64, 4, 2, "random")),
        ("router", lambda: run_router(lib, 37, 128, 8, 2, 0, True)),
        ("router-groups", lambda: run_router(lib, 37, 256, 16, 4, 1, True, 4, 2, 2.5, True)),
        ("router-round", lambda: run_router(lib, 37, 128, 8, 2, 0, True, round_logits=True)),
        ("router-grad", lambda: run_router_grad(lib, 37, 128, 8, 2, 0, True, 1.0)),
        # expert counts that are not a multiple of 8 (padded inside the host functions)
        ("router-e4", lambda: run_router(lib, 37, 128, 4, 2, 0, True)),
        ("router-e12", lambda: run_router(lib, 37, 192, 12, 3, 1, False, 1, 1, 1.0, True)),
        # a warp a token: experts past the 32 lanes (several a lane, E not a multiple of
        # 32), the bench configurations' routers, and groups past lane 32
        ("router-e72", lambda: run_router(lib, 37, 128, 72, 6, 0, False)),
        ("router-e128", lambda: run_router(lib, 301, 128, 128, 8, 0, True)),
        ("router-e256-groups", lambda: run_router(lib, 301, 128, 256, 8, 1, True, 8, 4, 2.5, True)),
        (
            "router-e1024-groups",
            lambda: run_router(lib, 37, 128, 1024, 8, 1, True, 64, 3, 1.0, True),
        ),
        ("router-grad-e4", lambda: run_router_grad(lib, 37, 128, 4, 2, 0, True, 1.0)),
        ("router-grad-e12", lambda: run_router_grad(lib, 37, 192, 12, 3, 1, False, 2.5)),
        ("router-grad-sigmoid", lambda: run_router_grad(lib, 37, 256, 16, 4, 1, True, 2.5)),
        # dW_r with its tokens split into slices (4 of 1280, 1280, 1280 and 1160 tokens; 2 of
        # 1536 and 1464), padded expert columns (12 of 16) and the bench routers' 128
        ("router-grad-split", lambda: run_router_grad(lib, 5000, 256, 12, 3, 1, False, 2.5)),
        ("router-grad-split-e128", lambda: run_router_grad(lib, 3000, 128, 128, 8, 0, True, 1.0)),
        ("shared", lambda: run_shared(lib, 37, 256, 128)),
        # hostile routing (issue 8): NaN/inf logits, k = E, T = 0
        ("hostile-softmax", lambda: run_router_hostile(lib, 0)),
        ("hostile-sigmoid", lambda: run_router_hostile(lib, 1)),
        ("ffn-k-eq-e", lambda: run_ffn(lib, 37, 128, 128, 4, 4, "random")),
        # every kind of partial tile: an expert's last M-tile ending in the first
        # warpgroup's 64 rows (5, 61, 64) or the second's (94, 104 = 232 - 128), its last
        # k-step of a weight gradient with 1-4 wgmma of rows (5, 30, 40, 61) or whole
        # (128, 64), and an expert with none
        ("ffn-tails", lambda: run_ffn(lib, 712, 256, 192, 7, 1, "counts=133,94,128,232,61,0,64")),
        # a non-gated up tile is 256 columns of H: n = 320 is one and a 64-column tail (a
        # SwiGLU tile 128 of gate and up each: two and a tail); d of 3 k-steps, k = 3
        ("ffn-n320", lambda: run_ffn(lib, 53, 192, 320, 6, 3, "skewed")),
        ("ffn-n320-all-to-one", lambda: run_ffn(lib, 53, 192, 320, 6, 3, "all-to-one")),
        ("shared-m320", lambda: run_shared(lib, 53, 192, 320)),
        ("ffn-grad-n320", lambda: run_expert_ffn_grad(lib, 53, 192, 320, 6, 3, "skewed")),
        ("empty-t0", lambda: run_empty(lib)),
        # the local expert-parallel ops: 1, 2 and 4 ranks, with and without gather, capacity
        # above every block, exactly the largest and exceeded, an empty rank (skewed), T = 1
        ("ep-pack", lambda: run_ep_pack(lib, 37, 128, 8, 2, 2, "random", "larger", True)),
        ("ep-pack-rows", lambda: run_ep_pack(lib, 37, 128, 8, 2, 4, "random", "exact", False)),
        (
            "ep-pack-exceeded",
            lambda: run_ep_pack(lib, 37, 192, 8, 4, 2, "random", "exceeded", True),
        ),
        ("ep-pack-skewed", lambda: run_ep_pack(lib, 37, 128, 8, 2, 4, "skewed", "exceeded", True)),
        ("ep-pack-one-rank", lambda: run_ep_pack(lib, 37, 64, 4, 2, 1, "random", "exact", False)),
        ("ep-pack-t1", lambda: run_ep_pack(lib, 1, 64, 4, 2, 2, "random", "larger", True)),
        ("ep-unpack", lambda: run_ep_unpack(lib, 37, 128, 8, 2, 2, "random", "larger", 5)),
        ("ep-unpack-exceeded", lambda: run_ep_unpack(lib, 37, 192, 8, 4, 4, "random", "exceeded")),
        ("ep-unpack-skewed", lambda: run_ep_unpack(lib, 37, 128, 8, 2, 2, "skewed", "exceeded")),
        (
            "ep-unpack-all-to-one",
            lambda: run_ep_unpack(lib, 37, 64, 8, 2, 4, "all-to-one", "exact"),
        ),
        ("ep-queues", lambda: run_ep_queues(lib, 4, 2, 24, "random")),
        ("ep-queues-full", lambda: run_ep_queues(lib, 2, 8, 33, "full")),
        ("ep-queues-sparse", lambda: run_ep_queues(lib, 8, 16, 40, "sparse")),
        ("ep-queues-wide", lambda: run_ep_queues(lib, 1, 300, 1000, "random")),
        ("ep-rows", lambda: run_rows(lib, 53, 40, 128)),
        ("ep-rows-wide", lambda: run_rows(lib, 17, 17, 1088)),
        ("ep-hostile", lambda: run_ep_hostile(lib)),
        # the unfused backward of the combine and the routed experts (the expert-parallel
        # layer's): dropped and out-of-range slots, rows nobody owns, skewed routing with
        # empty experts, T = 1, d and n of partial tiles, x of the received rows
        ("combine-grad", lambda: run_combine_grad(lib, 37, 128, 8, 2, "random", 5)),
        ("combine-grad-skewed", lambda: run_combine_grad(lib, 37, 192, 8, 4, "skewed")),
        ("combine-grad-t1", lambda: run_combine_grad(lib, 1, 64, 4, 2, "random", 3)),
        ("ffn-grad", lambda: run_expert_ffn_grad(lib, 37, 128, 128, 4, 2, "random")),
        ("ffn-grad-skewed", lambda: run_expert_ffn_grad(lib, 37, 256, 192, 6, 2, "skewed")),
        ("ffn-grad-t1", lambda: run_expert_ffn_grad(lib, 1, 128, 64, 4, 2, "random")),
        ("ffn-grad-ep", lambda: run_expert_ffn_grad(lib, 37, 128, 128, 4, 2, "random", True)),
        (
            "ffn-grad-ep-skewed",
            lambda: run_expert_ffn_grad(lib, 37, 192, 128, 8, 2, "skewed", True),
        ),
        ("split-vs-fused", lambda: run_split_vs_fused(lib, 37, 128, 128, 4, 2, "random")),
        # moe.update_selection_bias: E 8 / 64 / 256 (and the most, 1024), T odd, random and
        # skewed routing, both rules; T = 0 and every entry -1 leave the bias as it is; a
        # histogram over many blocks (65535 * 8 slots)
        *[
            (
                f"selection_bias-e{E}-t{T}-k{k}-{mode}-{rule}",
                lambda T=T, k=k, E=E, mode=mode, rule=rule: run_selection_bias(
                    lib, T, k, E, mode, rule, (1e-3, 0.25)[rule]
                ),
            )
            for T, k, E in ((37, 2, 8), (1001, 8, 64), (4095, 8, 256), (301, 8, 1024))
            for mode in ("random", "skewed")
            for rule in (0, 1)
        ],
        ("selection_bias-t0", lambda: run_selection_bias(lib, 0, 8, 64, "random", 0, 1e-3)),
        ("selection_bias-none", lambda: run_selection_bias(lib, 33, 2, 8, "none", 1, 0.5)),
        (
            "selection_bias-many-blocks",
            lambda: run_selection_bias(lib, 65535, 8, 256, "skewed", 0, 1e-3),
        ),
        # the auxiliary losses: odd T (part of one chunk of 64 tokens, several chunks; more
        # without --quick), E of one lane a warp, several and the most, k = 1, 2, 8, skewed
        # routing (most experts never picked) and slots out of range
        ("aux-37-e8-softmax", lambda: run_aux_loss(lib, 37, 8, 2, 0, "random")),
        ("aux-37-e8-sigmoid-k1", lambda: run_aux_loss(lib, 37, 8, 1, 1, "skewed")),
        ("aux-1000-e64-softmax-k8", lambda: run_aux_loss(lib, 1000, 64, 8, 0, "skewed")),
        ("aux-1000-e64-sigmoid", lambda: run_aux_loss(lib, 1000, 64, 2, 1, "random")),
        ("aux-1000-e256-sigmoid-k1", lambda: run_aux_loss(lib, 1000, 256, 1, 1, "invalid")),
        ("aux-37-e1024-softmax-k8", lambda: run_aux_loss(lib, 37, 1024, 8, 0, "random")),
        ("aux-t0", lambda: run_aux_loss_empty(lib)),
    ]
    if lib.has("router_aux"):
        # the losses in the router's kernels: T of part of a chunk, several chunks and a
        # layer's; E of one lane a warp, several and many; both scorings, groups, a
        # selection bias and bf16-rounded logits
        steps += [
            (
                f"aux-fused-{T}-e{E}-{'softmax' if s == 0 else 'sigmoid'}",
                lambda T=T, E=E, s=s: run_router_aux(lib, T, 128, E, min(8, E // 4), s),
            )
            for T in (37, 1000, 16384)
            for E in (8, 64, 256)
            for s in (0, 1)
        ]
        steps += [
            (
                "aux-fused-groups-bias",
                lambda: run_router_aux(lib, 1000, 128, 64, 4, 1, 8, 2, bias=True),
            ),
            (
                "aux-fused-round-logits",
                lambda: run_router_aux(lib, 1000, 256, 64, 8, 0, round_logits=True),
            ),
            ("aux-fused-t0", lambda: run_router_aux_empty(lib)),
        ]
    if lib.has("router_grad_aux"):
        steps += [
            (
                f"aux-fused-grad-{T}-e{E}-{'softmax' if s == 0 else 'sigmoid'}",
                lambda T=T, E=E, s=s: run_router_grad_aux(lib, T, 128, E, min(8, E // 4), s),
            )
            for T in (37, 1000, 16384)
            for E in (8, 64, 256)
            for s in (0, 1)
        ]
    if lib.has("router_grad_aux_acc"):
        steps += [
            (
                f"aux-fused-grad-acc-1000-e64-{'softmax' if s == 0 else 'sigmoid'}",
                lambda s=s: run_router_grad_aux(lib, 1000, 256, 64, 8, s, accumulate=True),
            )
            for s in (0, 1)
        ]
    if lib.has("router_grad_acc"):
        # dx += the router's part by TMA reduce-add boxes: T below a tile (37) and a
        # partial last tile (3000 = 23 * 128 + 56 rows); d of one tile (128), of two (256)
        # and with a partial last one (320: 64 columns, the other boxes outside)
        steps += [
            ("router-grad-acc", lambda: run_router_grad(lib, 37, 128, 8, 2, 0, True, 1.0, True)),
            (
                "router-grad-acc-sigmoid",
                lambda: run_router_grad(lib, 37, 256, 16, 4, 1, True, 2.5, True),
            ),
            (
                "router-grad-acc-split",
                lambda: run_router_grad(lib, 3000, 320, 128, 8, 0, True, 1.0, True),
            ),
        ]
    if not args.quick:
        steps += [
            # the auxiliary losses at a layer's T, and past 1024 chunks of 64 tokens (70001:
            # chunks of 69, a pass of 64 and a tail each)
            ("aux-16384-e256-softmax-k8", lambda: run_aux_loss(lib, 16384, 256, 8, 0, "random")),
            ("aux-16384-e256-sigmoid-k8", lambda: run_aux_loss(lib, 16384, 256, 8, 1, "skewed")),
            ("aux-16384-e8-softmax", lambda: run_aux_loss(lib, 16384, 8, 2, 0, "skewed")),
            ("aux-16384-e64-sigmoid-k1", lambda: run_aux_loss(lib, 16384, 64, 1, 1, "invalid")),
            ("aux-70001-e8-softmax", lambda: run_aux_loss(lib, 70001, 8, 2, 0, "random")),
            ("ffn-all-to-one", lambda: run_ffn(lib, 1000, 1536, 704, 8, 2, "all-to-one")),
            ("ffn-odd", lambda: run_ffn(lib, 1000, 1536, 704, 8, 2, "random")),
            ("router-big", lambda: run_router(lib, 1000, 1536, 64, 8, 0, False)),
            ("shared-big", lambda: run_shared(lib, 1000, 1536, 704)),
            # the most experts the GPU path runs (convert-moe-to-gpu refuses more): the
            # dispatch's shared-memory counts and the GEMMs' expert table are full
            ("ffn-1024-experts", lambda: run_ffn(lib, 600, 128, 64, 1024, 4, "random")),
            # the expert-parallel ops at a layer's size: most experts, many ranks
            ("ep-queues-1024", lambda: run_ep_queues(lib, 16, 64, 512, "random")),
            ("ep-chain", lambda: run_ep_chain(lib, 4096, 2048, 64, 8, 8, "exact")),
            ("ep-chain-exceeded", lambda: run_ep_chain(lib, 2048, 4096, 256, 8, 16, "exceeded")),
            ("ffn-grad-big", lambda: run_expert_ffn_grad(lib, 1000, 1536, 704, 8, 2, "random")),
            (
                "ffn-grad-big-ep",
                lambda: run_expert_ffn_grad(lib, 1000, 1536, 704, 8, 2, "all-to-one", True),
            ),
            (
                "split-vs-fused-big",
                lambda: run_split_vs_fused(lib, 1000, 1536, 704, 8, 2, "skewed"),
            ),
        ]
    # the backward of experts with biases, H of the biases made in torch
    steps += bias_grad_steps(lib, args.quick, forward=False)
    if lib.has("router_aux") and "aux-fused-bench" in args.only:
        # only on request (--only=aux-fused-bench): router + aux_loss against router_aux
        steps += [
            (
                f"aux-fused-bench-{T}-e{E}-{'softmax' if s == 0 else 'sigmoid'}",
                lambda T=T, E=E, s=s: bench_router_aux(lib, T, 2048, E, 8, s),
            )
            for T in (1024, 16384)
            for E in (64, 256)
            for s in (0, 1)
        ]
    if "bias-grad-bench" in args.only and not BIAS:
        # only on request (--only=bias-grad-bench): the biased backward against the plain one,
        # at mixtral-8x7b's and at olmoe-1b-7b's expert shapes
        steps += [
            (
                f"bias-grad-bench-{T}-d{d}-e{E}",
                lambda T=T, d=d, n=n, E=E, k=k: bench_bias_grad(lib, T, d, n, E, k),
            )
            for T, d, n, E, k in ((32768, 4096, 14336, 8, 2), (16384, 2048, 1024, 64, 8))
        ]
    if ACT != "swiglu":
        steps = [s for s in steps if s[0].startswith(EXPERT_STEPS)]
    if BIAS:
        # odd T (a partial M tile), n and d with a 64-column tail tile, skewed and one-expert
        # routing, an expert with no rows (E 5 at T 1)
        steps = [
            (
                f"bias-ffn-t{T}-d{d}-n{n}-e{E}-k{k}-{mode}",
                lambda T=T, d=d, n=n, E=E, k=k, mode=mode: run_bias_ffn(lib, T, d, n, E, k, mode),
            )
            for T, d, n, E, k, mode in (
                (37, 128, 192, 4, 2, "random"),
                (37, 256, 320, 5, 2, "skewed"),
                (1, 128, 64, 5, 2, "random"),
                (1000, 320, 320, 8, 2, "skewed"),
                (1000, 128, 256, 8, 4, "all-to-one"),
            )
            if not (args.quick and T == 1000)
        ]
        # and their backward, from the library's biased forward's H
        steps += bias_grad_steps(lib, args.quick, forward=True)
    if args.bench:
        steps = [
            (f"bench-{b}", (lambda b=b: bench(lib, b, args.reps))) for b in args.bench.split(",")
        ]
    failed = 0
    only = [s for s in args.only.split(",") if s]
    for name, fn in steps:
        if only and not any(s in name for s in only):
            continue
        try:
            if not fn():
                failed += 1
        except Exception as exc:  # keep going: one broken op must not hide the others
            failed += 1
            print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
            RESULTS.append({"check": name, "error": str(exc), "ok": False})
    n_ok = sum(1 for r in RESULTS if r["ok"])
    print(f"{n_ok} passed, {len(RESULTS) - n_ok} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(RESULTS, f, indent=1)
    return 1 if failed or n_ok != len(RESULTS) else 0


def gaps(name, ops):
    """Where each op's time goes besides its kernels: the op sequence once under the
    profiler, with host time, GPU span and idle stretches per op (bench/step_gaps.py)."""
    import step_gaps

    step_gaps.report(torch, name, ops)


def add_case(lib, n=4096):
    a, b = bf(n), bf(n)
    out = torch.full_like(a, float("nan"))
    lib.call("add", a, b, out)
    return out, a.float() + b.float()


if __name__ == "__main__":
    sys.exit(main())
