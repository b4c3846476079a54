"""The CPU kernel library (lib/Conversion/MoEToLinalg/MoECPULibrary.mlir) kernel by kernel
against the NumPy reference, including ties, NaN and out-of-range indices, which a whole-layer
test cannot reach (it needs well-separated scores).

Each kernel gets a static-shape wrapper (tensor.cast to the kernel's dynamic types, constants
for its scalar configuration); the library plus wrappers are lowered with upstream mlir-opt in
the calling convention of docs/cpu-path.md §3. Skipped when the library file is absent."""

import os

import numpy as np
import pytest

from moe_mlir import cpu
from moe_mlir import reference as ref

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIBRARY = os.path.join(ROOT, "lib", "Conversion", "MoEToLinalg", "MoECPULibrary.mlir")

# The kernels are inlined into the wrappers (as moe-lower-to-cpu-pipeline does). C wrappers
# are requested before convert-math-to-libm so that the libm declarations it adds (expf, erff,
# logf) keep their plain C names.
KERNEL_PIPELINE = (
    "--pass-pipeline=builtin.module(inline,symbol-dce,"
    "func.func(convert-elementwise-to-linalg),canonicalize,"
    "one-shot-bufferize{bufferize-function-boundaries "
    "function-boundary-type-conversion=identity-layout-map},"
    "buffer-results-to-out-params{hoist-static-allocs modify-public-functions},"
    "ownership-based-buffer-deallocation,canonicalize,buffer-deallocation-simplification,"
    "bufferization-lower-deallocations,func.func(convert-linalg-to-loops),"
    "expand-strided-metadata,lower-affine,convert-scf-to-cf,"
    "func.func(llvm-request-c-wrappers),convert-math-to-libm,"
    "convert-to-llvm,reconcile-unrealized-casts)",
)

T, D, N, E, K, M = 37, 12, 8, 6, 2, 5
R = T * K
ACTS = {"swiglu": 0, "gelu": 1, "silu": 2, "gelu_tanh": 3}
SCORING = {"softmax": 0, "sigmoid": 1}
# name -> (scoring, k, renormalize, num_groups, topk_groups, scaling)
ROUTERS = {
    "softmax_renorm": ("softmax", 2, True, 1, 1, 1.0),
    "softmax_k_equals_e": ("softmax", E, False, 1, 1, 1.0),
    "sigmoid_groups_of_two": ("sigmoid", 3, True, 3, 2, 2.5),
    "sigmoid_groups_of_one": ("sigmoid", 2, False, 6, 3, 1.5),
}
CAPACITIES = (R, 7)


def _tensor(shape, elem, dynamic=False):
    return "tensor<" + "".join(("?" if dynamic else str(s)) + "x" for s in shape) + elem + ">"


def wrapper(name, kernel, items, results):
    """items: ("t", shape, elem) tensor arguments or ("c", literal, type) constants."""
    params, body, args, types = [], [], [], []
    for it in items:
        if it[0] == "t":
            _, shape, elem = it
            i = len(params)
            params.append(f"%a{i}: {_tensor(shape, elem)}")
            if shape:
                body.append(
                    f"  %d{i} = tensor.cast %a{i} : {_tensor(shape, elem)} to "
                    f"{_tensor(shape, elem, True)}"
                )
                args.append(f"%d{i}")
            else:
                args.append(f"%a{i}")
            types.append(_tensor(shape, elem, True))
        else:
            _, literal, typ = it
            c = f"%c{len(body)}"
            body.append(f"  {c} = arith.constant {literal}" + ("" if typ == "i1" else f" : {typ}"))
            args.append(c)
            types.append(typ)
    dyn = [_tensor(s, e, True) for s, e in results]
    static = [_tensor(s, e) for s, e in results]
    body.append(
        f"  %r:{len(results)} = func.call @{kernel}({', '.join(args)}) : "
        f"({', '.join(types)}) -> ({', '.join(dyn)})"
    )
    outs = []
    for i, (s, _) in enumerate(results):
        if s:
            body.append(f"  %o{i} = tensor.cast %r#{i} : {dyn[i]} to {static[i]}")
            outs.append(f"%o{i}")
        else:
            outs.append(f"%r#{i}")
    body.append(f"  return {', '.join(outs)} : {', '.join(static)}")
    return (
        f"func.func @{name}({', '.join(params)}) -> ({', '.join(static)}) {{\n"
        + "\n".join(body)
        + "\n}\n"
    )


def t(shape, elem="f32"):
    return ("t", tuple(shape), elem)


def c(value, typ):
    if typ == "i1":
        value = "true" if value else "false"
    elif typ == "f32":
        value = repr(float(value))
    return ("c", value, typ)


def gate_up(act, width):
    return 2 * width if act == "swiglu" else width


def wrappers():
    w = []
    for name, (scoring, k, ren, g, tg, scal) in ROUTERS.items():
        sc = SCORING[scoring]
        w.append(
            wrapper(
                f"router_{name}",
                "__moe_cpu_router",
                [
                    t((T, D)),
                    t((D, E)),
                    t((E,)),
                    c(sc, "i32"),
                    c(k, "index"),
                    c(ren, "i1"),
                    c(g, "index"),
                    c(tg, "index"),
                    c(scal, "f32"),
                    c(False, "i1"),
                ],
                [((T, k), "f32"), ((T, k), "i32"), ((T, E), "f32")],
            )
        )
        w.append(
            wrapper(
                f"router_grad_{name}",
                "__moe_cpu_router_grad",
                [
                    t((T, D)),
                    t((D, E)),
                    t((T, E)),
                    t((T, k), "i32"),
                    t((T, k)),
                    t((T, E)),
                    c(sc, "i32"),
                    c(ren, "i1"),
                    c(scal, "f32"),
                ],
                [((T, D), "f32"), ((D, E), "f32")],
            )
        )
    # round_logits on a bf16 layer: the same router with its logits rounded to bf16
    w.append(
        wrapper(
            "router_round",
            "__moe_cpu_router",
            [
                t((T, D)),
                t((D, E)),
                t((E,)),
                c(0, "i32"),
                c(2, "index"),
                c(True, "i1"),
                c(1, "index"),
                c(1, "index"),
                c(1.0, "f32"),
                c(True, "i1"),
            ],
            [((T, 2), "f32"), ((T, 2), "i32"), ((T, E), "f32")],
        )
    )
    for cap in CAPACITIES:
        w.append(
            wrapper(
                f"dispatch_{cap}",
                "__moe_cpu_dispatch",
                [t((T, K), "i32"), c(E, "index"), c(cap, "index")],
                [((R,), "i32"), ((E + 1,), "i32"), ((T, K), "i32")],
            )
        )
    for act, code in ACTS.items():
        G, Gs = gate_up(act, N), gate_up(act, M)
        queue = [t((T, D)), t((R,), "i32"), t((E + 1,), "i32")]
        w.append(
            wrapper(
                f"ffn_{act}",
                "__moe_cpu_expert_ffn",
                queue + [t((E, D, G)), t((E, N, D)), t((E, G)), t((E, D)), c(code, "i32")],
                [((R, D), "f32"), ((R, G), "f32")],
            )
        )
        w.append(
            wrapper(
                f"ffn_grad_{act}",
                "__moe_cpu_expert_ffn_grad",
                queue + [t((E, D, G)), t((E, N, D)), t((R, G)), t((R, D)), c(code, "i32")],
                [
                    ((T, D), "f32"),
                    ((E, D, G), "f32"),
                    ((E, N, D), "f32"),
                    ((E, G), "f32"),
                    ((E, D), "f32"),
                ],
            )
        )
        w.append(
            wrapper(
                f"combine_grad_fused_{act}",
                "__moe_cpu_expert_combine_grad",
                queue
                + [
                    t((T, K), "i32"),
                    t((T, K)),
                    t((E, D, G)),
                    t((E, N, D)),
                    t((R, G)),
                    t((T, D)),
                    t((E, D)),
                    c(code, "i32"),
                ],
                [
                    ((T, D), "f32"),
                    ((T, K), "f32"),
                    ((E, D, G), "f32"),
                    ((E, N, D), "f32"),
                    ((E, G), "f32"),
                    ((E, D), "f32"),
                ],
            )
        )
        w.append(
            wrapper(
                f"shared_{act}",
                "__moe_cpu_shared_expert",
                [t((T, D)), t((D, Gs)), t((M, D)), c(code, "i32")],
                [((T, D), "f32"), ((T, Gs), "f32")],
            )
        )
        w.append(
            wrapper(
                f"shared_grad_{act}",
                "__moe_cpu_shared_expert_grad",
                [t((T, D)), t((D, Gs)), t((M, D)), t((T, Gs)), t((T, D)), c(code, "i32")],
                [((T, D), "f32"), ((D, Gs), "f32"), ((M, D), "f32")],
            )
        )
    w.append(
        wrapper(
            "combine",
            "__moe_cpu_combine",
            [t((R, D)), t((T, K)), t((T, K), "i32")],
            [((T, D), "f32")],
        )
    )
    w.append(
        wrapper(
            "combine_grad",
            "__moe_cpu_combine_grad",
            [t((T, D)), t((T, K)), t((T, K), "i32"), t((R, D))],
            [((R, D), "f32"), ((T, K), "f32")],
        )
    )
    for scoring, sc in SCORING.items():
        w.append(
            wrapper(
                f"aux_{scoring}",
                "__moe_cpu_aux_loss",
                [t((T, E)), t((T, K), "i32"), c(sc, "i32")],
                [((), "f32"), ((), "f32")],
            )
        )
        w.append(
            wrapper(
                f"aux_grad_{scoring}",
                "__moe_cpu_aux_loss_grad",
                [t((T, E)), t((T, K), "i32"), t(()), t(()), c(sc, "i32")],
                [((T, E), "f32")],
            )
        )
    return w


@pytest.fixture(scope="module")
def kernels():
    if not os.path.exists(LIBRARY):
        pytest.skip(f"{LIBRARY} not present")
    try:
        opt = cpu.find_mlir_opt()
        cpu.find_mlir_translate()
        cpu.find_clang()
    except cpu.ToolError as exc:
        pytest.skip(f"LLVM 22 tools missing: {exc}")
    with open(LIBRARY) as fh:
        library = fh.read().replace("func.func @__moe_cpu_", "func.func private @__moe_cpu_")
    return cpu.compile_mlir(library + "\n" + "\n".join(wrappers()), KERNEL_PIPELINE, opt_tool=opt)


def rel_err(actual, expected):
    expected = np.asarray(expected, np.float64)
    norm = np.linalg.norm(expected)
    diff = np.linalg.norm(np.asarray(actual, np.float64) - expected)
    return diff / norm if norm > 0 else diff


TOL = 1e-5
f32 = np.float32


def router_inputs():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, D)).astype(f32)
    wr = (rng.standard_normal((D, E)) / np.sqrt(D)).astype(f32)
    x[3] = 0.0  # every logit 0: ties everywhere
    x[4] = 0.0
    x[5, 2] = np.nan  # a NaN row of logits
    wr[1, 1] = 0.0
    x[7, 1] = np.inf  # logits +-inf, and NaN for expert 1 (inf * 0)
    bias = (rng.standard_normal(E) * 0.1).astype(f32)
    bias_ties = np.zeros(E, f32)
    return x, wr, bias, bias_ties


@pytest.mark.parametrize("name", list(ROUTERS))
def test_router_kernel(kernels, name):
    scoring, k, ren, g, tg, scal = ROUTERS[name]
    x, wr, bias, zeros = router_inputs()
    b = bias if scoring == "sigmoid" else zeros
    w, e, logits = kernels[f"router_{name}"](x, wr, b)
    rw, re_, rl = ref.router(
        x,
        wr,
        b,
        scoring=scoring,
        top_k=k,
        renormalize=ren,
        num_groups=g,
        topk_groups=tg,
        scaling=scal,
    )
    np.testing.assert_array_equal(e, re_)
    for row in e:
        assert len(set(row.tolist())) == k
    np.testing.assert_array_equal(np.isnan(logits), np.isnan(rl))
    np.testing.assert_array_equal(np.isnan(w), np.isnan(rw))
    ok = ~np.isnan(rw)
    assert rel_err(w[ok], rw[ok]) <= TOL
    fin = np.isfinite(rl)
    assert rel_err(logits[fin], rl[fin]) <= TOL


def bf16_round(a):
    """Round-to-nearest-even of f32 to bf16, back in f32 (NaN and inf kept)."""
    bits = a.astype(f32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    out = rounded.astype(np.uint32).view(f32)
    return np.where(np.isfinite(a), out, a).astype(f32)


def test_router_kernel_round_logits(kernels):
    """The logits are bf16 values, the f32 router's logits rounded, and the weights and
    experts follow from the rounded logits."""
    x, wr, _, zeros = router_inputs()
    w, e, logits = kernels["router_round"](x, wr, zeros)
    _, _, rl = ref.router(x, wr, zeros, scoring="softmax", top_k=2, renormalize=True)
    fin = np.isfinite(rl)
    np.testing.assert_array_equal(logits[fin], bf16_round(logits[fin]))
    assert not np.array_equal(logits[fin], rl[fin])  # the rounding did something
    # within half a bf16 ulp of the f32 logits (plus the f32 sums' own rounding)
    assert np.all(np.abs(logits[fin] - rl[fin]) <= np.abs(rl[fin]) * 2.0**-8 + 1e-6)
    rw, re_, _ = ref.router(
        x, wr, zeros, scoring="softmax", top_k=2, renormalize=True, logits=logits
    )
    np.testing.assert_array_equal(e, re_)
    ok = ~np.isnan(rw)
    assert rel_err(w[ok], rw[ok]) <= TOL


@pytest.mark.parametrize("name", list(ROUTERS))
def test_router_grad_kernel(kernels, name):
    scoring, k, ren, g, tg, scal = ROUTERS[name]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((T, D)).astype(f32)
    wr = (rng.standard_normal((D, E)) / np.sqrt(D)).astype(f32)
    logits = (x.astype(np.float64) @ wr).astype(f32)
    experts = ref.select_experts(ref.scores(logits, scoring), k, g, tg)
    experts[2, 0] = -1  # out-of-range picks are skipped
    dw = rng.standard_normal((T, k)).astype(f32)
    dl = rng.standard_normal((T, E)).astype(f32)
    dx, dwr = kernels[f"router_grad_{name}"](x, wr, logits, experts, dw, dl)
    rdx, rdwr = ref.router_grad(
        x, wr, logits, experts, dw, dl, scoring=scoring, renormalize=ren, scaling=scal
    )
    assert rel_err(dx, rdx) <= TOL and rel_err(dwr, rdwr) <= TOL


def dispatch_experts():
    rng = np.random.default_rng(2)
    experts = np.empty((T, K), np.int32)
    experts[:, 0] = rng.integers(0, E, size=T)
    experts[:, 1] = (experts[:, 0] + 1 + rng.integers(0, E - 1, size=T)) % E
    experts[0, 0] = -1  # dropped: out of range
    experts[1, 1] = E + 2
    experts[2:12] = [0, 1]  # experts 0 and 1 overflow a capacity of 7
    experts[experts == 4] = 5  # expert 4 gets no token
    return experts


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_dispatch_kernel(kernels, capacity):
    experts = dispatch_experts()
    got = kernels[f"dispatch_{capacity}"](experts)
    want = ref.dispatch(experts, E, capacity)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert want[1][4] == want[1][5]


def expert_inputs(act, seed):
    rng = np.random.default_rng(seed)
    G = gate_up(act, N)
    x = rng.standard_normal((T, D)).astype(f32)
    wgu = (rng.standard_normal((E, D, G)) / np.sqrt(D)).astype(f32)
    wd = (rng.standard_normal((E, N, D)) / np.sqrt(N)).astype(f32)
    token_ids, offsets, rows = ref.dispatch(dispatch_experts(), E, 7)
    return rng, x, wgu, wd, token_ids, offsets, rows


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("act", list(ACTS))
def test_expert_ffn_kernels(kernels, act, bias):
    """The expert kernels take the biases (zeros for a layer without them) and return the
    bias gradients."""
    rng, x, wgu, wd, token_ids, offsets, rows = expert_inputs(act, 3)
    G = gate_up(act, N)
    bgu = rng.standard_normal((E, G)).astype(f32) * bias
    bd = rng.standard_normal((E, D)).astype(f32) * bias
    y, h = kernels[f"ffn_{act}"](x, token_ids, offsets, wgu, wd, bgu, bd)
    ry, rh = ref.expert_ffn(x, token_ids, offsets, wgu, wd, act, bgu, bd)
    assert rel_err(y, ry) <= TOL and rel_err(h, rh) <= TOL
    assert not y[offsets[-1] :].any() and not h[offsets[-1] :].any()
    dy = rng.standard_normal((R, D)).astype(f32)
    got = kernels[f"ffn_grad_{act}"](x, token_ids, offsets, wgu, wd, rh.astype(f32), dy)
    want = ref.expert_ffn_grad(x, token_ids, offsets, wgu, wd, rh, dy, act, bias=True)
    assert len(got) == len(want) == 5
    for g, w in zip(got, want):
        assert rel_err(g, w) <= TOL
    weights = rng.standard_normal((T, K)).astype(f32)
    dout = rng.standard_normal((T, D)).astype(f32)
    got = kernels[f"combine_grad_fused_{act}"](
        x, token_ids, offsets, rows, weights, wgu, wd, rh.astype(f32), dout, bd
    )
    want = ref.expert_combine_grad(
        x, token_ids, offsets, rows, weights, wgu, wd, rh, dout, act, bd=bd, bias=True
    )
    assert len(got) == len(want) == 6
    for g, w in zip(got, want):
        assert rel_err(g, w) <= TOL
    assert (got[1][rows < 0] == 0).all()


@pytest.mark.parametrize("act", list(ACTS))
def test_shared_expert_kernels(kernels, act):
    rng = np.random.default_rng(4)
    Gs = gate_up(act, M)
    x = rng.standard_normal((T, D)).astype(f32)
    wgu = (rng.standard_normal((D, Gs)) / np.sqrt(D)).astype(f32)
    wd = (rng.standard_normal((M, D)) / np.sqrt(M)).astype(f32)
    y, h = kernels[f"shared_{act}"](x, wgu, wd)
    ry, rh = ref.shared_expert(x, wgu, wd, act)
    assert rel_err(y, ry) <= TOL and rel_err(h, rh) <= TOL
    dy = rng.standard_normal((T, D)).astype(f32)
    got = kernels[f"shared_grad_{act}"](x, wgu, wd, rh.astype(f32), dy)
    for g, w in zip(got, ref.shared_expert_grad(x, wgu, wd, rh, dy, act)):
        assert rel_err(g, w) <= TOL


def test_combine_kernels(kernels):
    rng = np.random.default_rng(5)
    y = rng.standard_normal((R, D)).astype(f32)
    weights = rng.standard_normal((T, K)).astype(f32)
    _, _, rows = ref.dispatch(dispatch_experts(), E, 7)
    rows[4, 0] = R + 3  # out of range: skipped like a dropped pair
    out = kernels["combine"](y, weights, rows)[0]
    assert rel_err(out, ref.combine(y, weights, rows)) <= TOL
    dout = rng.standard_normal((T, D)).astype(f32)
    got = kernels["combine_grad"](dout, weights, rows, y)
    for g, w in zip(got, ref.combine_grad(dout, weights, rows, y)):
        assert rel_err(g, w) <= TOL


@pytest.mark.parametrize("scoring", list(SCORING))
def test_aux_loss_kernels(kernels, scoring):
    rng = np.random.default_rng(6)
    logits = (rng.standard_normal((T, E)) * 3).astype(f32)
    experts = dispatch_experts()
    lb, z = kernels[f"aux_{scoring}"](logits, experts)
    rlb, rz = ref.aux_loss(logits, experts, scoring)
    assert lb.shape == () and rel_err(lb, rlb) <= TOL and rel_err(z, rz) <= TOL
    d = kernels[f"aux_grad_{scoring}"](logits, experts, np.array(0.7, f32), np.array(-1.3, f32))[0]
    assert rel_err(d, ref.aux_loss_grad(logits, experts, 0.7, -1.3, scoring)) <= TOL
