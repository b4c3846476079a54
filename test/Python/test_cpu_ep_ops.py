"""The expert-parallel ops on the CPU path (convert-moe-to-linalg and the kernels of
MoECPULibrary.mlir): moe.ep_pack, moe.ep_unpack, moe.ep_queues, moe.gather_rows,
moe.scatter_rows, and moe.ep_dispatch / moe.ep_combine of one rank, compiled and run on random
data against the NumPy references below. Rows are copies, so every result is compared bit for
bit; so is ep_unpack's reduce, an f32 sum in slot order like NumPy's here.

bf16 sources: the functions take f32 values that are bf16 numbers, truncate them to bf16 before
the op and extend its results back to f32. moe-lower-to-cpu-pipeline leaves the truncation to
a compiler-rt call (__truncsfbf2) that the CPU runner does not link, so the bf16 module is
lowered by moe-opt --convert-moe-to-linalg and then by the same passes in upstream mlir-opt with
arith-expand{include-bf16} expanding the truncation."""

import functools
import zlib

import numpy as np
import pytest
from test_cpu_kernels import bf16_round

from moe_mlir import cpu
from moe_mlir import reference as ref

f32, i32 = np.float32, np.int32
T, K, E, D = 13, 4, 8, 5
R = T * K
RANKS = (1, 2, 4)
CAPACITIES = ("larger", "exact", "exceeded")
ELEMENTS = ("f32", "bf16")

# The pipeline of moe-lower-to-cpu-pipeline after convert-moe-to-linalg, for upstream mlir-opt,
# with the bf16 truncation expanded into integer ops.
BF16_PIPELINE = (
    "--pass-pipeline=builtin.module(inline,symbol-dce,"
    "func.func(convert-elementwise-to-linalg),canonicalize,"
    "one-shot-bufferize{bufferize-function-boundaries "
    "function-boundary-type-conversion=identity-layout-map},"
    "buffer-results-to-out-params{modify-public-functions},"
    "func.func(llvm-request-c-wrappers),"
    "ownership-based-buffer-deallocation,canonicalize,buffer-deallocation-simplification,"
    "bufferization-lower-deallocations,func.func(convert-linalg-to-loops),"
    "func.func(arith-expand{include-bf16}),expand-strided-metadata,lower-affine,"
    "convert-scf-to-cf,convert-math-to-libm,convert-to-llvm,reconcile-unrealized-casts)",
)


# --------------------------------------------------------------------------- the routing


def _routing():
    """Offsets, token ids and rows of moe.dispatch for random expert choices: expert 5 is never
    chosen (an empty expert) and an expert keeps at most 8 pairs (rows of -1, and rows past
    offsets[E])."""
    rng = np.random.default_rng(7)
    allowed = [e for e in range(E) if e != 5]
    experts = np.stack([rng.choice(allowed, K, replace=False) for _ in range(T)]).astype(i32)
    token_ids, offsets, rows = ref.dispatch(experts, E, capacity=8)
    assert (rows == -1).any() and offsets[-1] < R
    return token_ids, offsets, rows


TOKEN_IDS, OFFSETS, ROWS = _routing()


def block_sizes(offsets, ranks):
    local = (offsets.size - 1) // ranks
    return np.array([offsets[(s + 1) * local] - offsets[s * local] for s in range(ranks)])


def capacity(ranks, kind):
    """A capacity larger than every block, exactly the largest, or below it."""
    largest = int(block_sizes(OFFSETS, ranks).max())
    assert largest >= 3
    return {"larger": largest + 3, "exact": largest, "exceeded": largest - 2}[kind]


# --------------------------------------------------------------------------- NumPy references


def ref_pack(source, offsets, token_ids, ranks, cap):
    rows = source if token_ids is None else source[token_ids]
    experts = offsets.size - 1
    local = experts // ranks
    expert_of = np.repeat(np.arange(experts), np.diff(offsets))
    send = np.zeros((ranks * cap, source.shape[1]), source.dtype)
    counts = np.zeros((ranks, local), i32)
    dropped = np.zeros(ranks, i32)
    for s in range(ranks):
        lo, hi = offsets[s * local], offsets[(s + 1) * local]
        kept = min(hi - lo, cap)
        send[s * cap : s * cap + kept] = rows[lo : lo + kept]
        counts[s] = np.bincount(expert_of[lo : lo + kept] - s * local, minlength=local)
        dropped[s] = hi - lo - kept
    return send, counts, dropped


def ref_unpack(returned, offsets, ranks, cap, rows):
    local = (offsets.size - 1) // ranks
    out = np.zeros((rows, returned.shape[1]), returned.dtype)
    for s in range(ranks):
        lo, hi = offsets[s * local], offsets[(s + 1) * local]
        kept = min(hi - lo, cap)
        out[lo : lo + kept] = returned[s * cap : s * cap + kept]
    return out


def ref_unpack_reduce(returned, offsets, rows_of, ranks, cap, slots=None):
    tokens, k = rows_of.shape
    unpacked = ref_unpack(returned, offsets, ranks, cap, tokens * k)
    out = np.zeros((tokens, returned.shape[1]), f32)
    for j in range(k) if slots is None else slots:  # slot order, in f32
        r = rows_of[:, j]
        kept = r >= 0
        out[kept] += unpacked[r[kept]]
    return out


def ref_queues(counts, cap):
    ranks, local = counts.shape
    ids = np.full(ranks * cap, -1, i32)
    offsets = np.zeros(local + 1, i32)
    pos = 0
    for e in range(local):
        for s in range(ranks):
            start = s * cap + counts[s, :e].sum()
            for j in range(counts[s, e]):
                ids[pos] = start + j
                pos += 1
        offsets[e + 1] = pos
    return ids, offsets


def ref_gather_rows(source, indices):
    out = np.zeros((indices.size, source.shape[1]), source.dtype)
    out[indices >= 0] = source[indices[indices >= 0]]
    return out


def ref_scatter_rows(source, indices, rows):
    out = np.zeros((rows, source.shape[1]), source.dtype)
    out[indices[indices >= 0]] = source[indices >= 0]
    return out


# --------------------------------------------------------------------------- the functions


def _t(shape, elem):
    return "tensor<" + "".join(f"{s}x" for s in shape) + elem + ">"


class Function:
    """One test function: f32 and i32 arguments; with bf16 data the float arguments are
    truncated to bf16 before the op and its float results extended after it."""

    def __init__(self, name, elem):
        self.name, self.elem = name, elem
        self.params, self.body, self.results = [], [], []

    def arg(self, shape, elem="f32"):
        name = f"%a{len(self.params)}"
        self.params.append(f"{name}: {_t(shape, elem)}")
        if elem != "f32" or self.elem == "f32":
            return name
        value = f"{name}_bf16"
        self.body.append(
            f"  {value} = arith.truncf {name} : {_t(shape, 'f32')} to {_t(shape, 'bf16')}"
        )
        return value

    def op(self, text):
        self.body.append("  " + text)

    def result(self, value, shape, elem=None):
        if elem is None and self.elem == "bf16":
            out = f"{value}_f32"
            self.body.append(
                f"  {out} = arith.extf {value} : {_t(shape, 'bf16')} to {_t(shape, 'f32')}"
            )
            value = out
        self.results.append((value, _t(shape, elem or "f32")))

    def text(self):
        values = ", ".join(v for v, _ in self.results)
        types = ", ".join(t for _, t in self.results)
        return (
            f"func.func @{self.name}({', '.join(self.params)}) -> ({types}) {{\n"
            + "\n".join(self.body)
            + f"\n  return {values} : {types}\n}}\n"
        )


def ep_send_function(name, elem, op, ranks, cap, gather, overflow):
    f = Function(name, elem)
    rows = T if gather else R
    source = f.arg((rows, D))
    offsets = f.arg((E + 1,), "i32")
    gather_text = ""
    if gather:
        ids = f.arg((R,), "i32")
        gather_text = f" gather({ids} : {_t((R,), 'i32')})"
    local = E // ranks
    send, counts = (ranks * cap, D), (ranks, local)
    f.op(
        f"%send, %counts, %dropped = moe.{op} {source}, {offsets}{gather_text} "
        f"{{capacity = {cap} : i64, ep_size = {ranks} : i64, "
        f"overflow = #moe.ep_overflow<{overflow}>}} : {_t((rows, D), f.elem)}, "
        f"{_t((E + 1,), 'i32')} -> {_t(send, f.elem)}, {_t(counts, 'i32')}, "
        f"{_t((ranks,), 'i32')}"
    )
    f.result("%send", send)
    f.result("%counts", counts, "i32")
    f.result("%dropped", (ranks,), "i32")
    return f


def ep_return_function(name, elem, op, ranks, cap, reduce):
    f = Function(name, elem)
    blocks = (ranks * cap, D)
    returned = f.arg(blocks)
    offsets = f.arg((E + 1,), "i32")
    reduce_text = ""
    result = (R, D)
    if reduce:
        rows_of = f.arg((T, K), "i32")
        reduce_text = f" reduce({rows_of} : {_t((T, K), 'i32')})"
        result = (T, D)
    f.op(
        f"%result = moe.{op} {returned}, {offsets}{reduce_text} "
        f"{{capacity = {cap} : i64, ep_size = {ranks} : i64}} : {_t(blocks, f.elem)}, "
        f"{_t((E + 1,), 'i32')} -> {_t(result, f.elem)}"
    )
    f.result("%result", result)
    return f


def rows_function(name, elem, op, source_rows, indices, result_rows):
    f = Function(name, elem)
    source = f.arg((source_rows, D))
    ids = f.arg((indices,), "i32")
    f.op(
        f"%result = moe.{op} {source}, {ids} : {_t((source_rows, D), f.elem)}, "
        f"{_t((indices,), 'i32')} -> {_t((result_rows, D), f.elem)}"
    )
    f.result("%result", (result_rows, D))
    return f


# ep_queues cases: (name, counts [S, El], C), with empty experts (zero columns), empty sources
# (zero rows) and full ranks (a row summing to C).
QUEUES = {
    "one_rank": (np.array([[2, 0, 3]], i32), 6),
    "empty_source": (np.array([[0, 0, 0], [1, 4, 0]], i32), 5),
    "four_ranks": (np.array([[3, 0], [0, 0], [1, 2], [0, 1]], i32), 3),
    "all_empty": (np.zeros((2, 2), i32), 4),
}


def _random_counts():
    rng = np.random.default_rng(11)
    ranks, local, cap = 4, 4, 7
    counts = np.zeros((ranks, local), i32)
    for s in range(ranks):
        total = rng.integers(0, cap + 1)
        cuts = np.sort(rng.integers(0, total + 1, local - 1))
        counts[s] = np.diff(np.concatenate([[0], cuts, [total]]))
    return counts, cap


QUEUES["random"] = _random_counts()

# gather/scatter: M indices, N source (gather) or result (scatter) rows.
GATHER_M, GATHER_N, SCATTER_M, SCATTER_N = 11, 7, 9, 12
# A dynamic token count: moe.dispatch, moe.ep_dispatch and moe.ep_combine of one rank (the
# result of ep_combine takes its R from the dispatch), with the queues and the row copies of
# the received rows between them.
CHAIN_C = 12
CHAIN = f"""
func.func @chain(%e: tensor<?x{K}xi32>, %x: tensor<?x{D}xf32>)
    -> (tensor<{CHAIN_C}x{D}xf32>, tensor<1x{E}xi32>, tensor<1xi32>, tensor<{CHAIN_C}xi32>,
        tensor<{E + 1}xi32>, tensor<{CHAIN_C}x{D}xf32>, tensor<{CHAIN_C}x{D}xf32>,
        tensor<?x{D}xf32>, tensor<?x{D}xf32>) {{
  %ids, %offs, %rows = moe.dispatch %e {{num_experts = {E} : i64}}
      : tensor<?x{K}xi32> -> tensor<?xi32>, tensor<{E + 1}xi32>, tensor<?x{K}xi32>
  %recv, %counts, %dropped = moe.ep_dispatch %x, %offs gather(%ids : tensor<?xi32>)
      {{capacity = {CHAIN_C} : i64, ep_size = 1 : i64, overflow = #moe.ep_overflow<drop>}}
      : tensor<?x{D}xf32>, tensor<{E + 1}xi32>
      -> tensor<{CHAIN_C}x{D}xf32>, tensor<1x{E}xi32>, tensor<1xi32>
  %qids, %qoffs = moe.ep_queues %counts {{capacity = {CHAIN_C} : i64}}
      : tensor<1x{E}xi32> -> tensor<{CHAIN_C}xi32>, tensor<{E + 1}xi32>
  %g = moe.gather_rows %recv, %qids : tensor<{CHAIN_C}x{D}xf32>, tensor<{CHAIN_C}xi32>
      -> tensor<{CHAIN_C}x{D}xf32>
  %s = moe.scatter_rows %g, %qids : tensor<{CHAIN_C}x{D}xf32>, tensor<{CHAIN_C}xi32>
      -> tensor<{CHAIN_C}x{D}xf32>
  %y = moe.ep_combine %s, %offs {{capacity = {CHAIN_C} : i64, ep_size = 1 : i64}}
      : tensor<{CHAIN_C}x{D}xf32>, tensor<{E + 1}xi32> -> tensor<?x{D}xf32>
  %dx = moe.ep_combine %s, %offs reduce(%rows : tensor<?x{K}xi32>)
      {{capacity = {CHAIN_C} : i64, ep_size = 1 : i64}}
      : tensor<{CHAIN_C}x{D}xf32>, tensor<{E + 1}xi32> -> tensor<?x{D}xf32>
  return %recv, %counts, %dropped, %qids, %qoffs, %g, %s, %y, %dx
      : tensor<{CHAIN_C}x{D}xf32>, tensor<1x{E}xi32>, tensor<1xi32>, tensor<{CHAIN_C}xi32>,
        tensor<{E + 1}xi32>, tensor<{CHAIN_C}x{D}xf32>, tensor<{CHAIN_C}x{D}xf32>,
        tensor<?x{D}xf32>, tensor<?x{D}xf32>
}}
"""


def module_text(elem):
    functions = []
    for ranks in RANKS:
        for kind in CAPACITIES:
            cap = capacity(ranks, kind)
            overflow = "drop" if kind == "exceeded" else "error"
            for gather in (False, True):
                functions.append(
                    ep_send_function(
                        f"pack_{ranks}_{kind}_{int(gather)}",
                        elem,
                        "ep_pack",
                        ranks,
                        cap,
                        gather,
                        overflow,
                    )
                )
            for reduce in (False, True):
                functions.append(
                    ep_return_function(
                        f"unpack_{ranks}_{kind}_{int(reduce)}",
                        elem,
                        "ep_unpack",
                        ranks,
                        cap,
                        reduce,
                    )
                )
    cap = capacity(1, "exceeded")
    for flag in (False, True):
        functions.append(
            ep_send_function(f"dispatch_{int(flag)}", elem, "ep_dispatch", 1, cap, flag, "drop")
        )
        functions.append(
            ep_return_function(f"combine_{int(flag)}", elem, "ep_combine", 1, cap, flag)
        )
    functions.append(rows_function("gather", elem, "gather_rows", GATHER_N, GATHER_M, GATHER_M))
    functions.append(
        rows_function("scatter", elem, "scatter_rows", SCATTER_M, SCATTER_M, SCATTER_N)
    )
    text = "".join(f.text() for f in functions)
    if elem == "f32":
        for name, (counts, cap) in QUEUES.items():
            ranks, local = counts.shape
            text += (
                f"func.func @queues_{name}(%c: {_t(counts.shape, 'i32')})\n"
                f"    -> ({_t((ranks * cap,), 'i32')}, {_t((local + 1,), 'i32')}) {{\n"
                f"  %ids, %offs = moe.ep_queues %c {{capacity = {cap} : i64}}\n"
                f"      : {_t(counts.shape, 'i32')} -> {_t((ranks * cap,), 'i32')}, "
                f"{_t((local + 1,), 'i32')}\n"
                f"  return %ids, %offs : {_t((ranks * cap,), 'i32')}, "
                f"{_t((local + 1,), 'i32')}\n}}\n"
            )
        text += CHAIN
    return text


@functools.lru_cache(maxsize=None)
def compiled_module(elem):
    try:
        cpu.find_moe_opt()
    except cpu.ToolError as exc:
        pytest.skip(f"moe-opt missing: {exc}")
    text = module_text(elem)
    if elem == "f32":
        return cpu.compile_mlir(text)
    converted = cpu.run_opt(text, ["--convert-moe-to-linalg"])
    return cpu.compile_mlir(converted, BF16_PIPELINE, opt_tool=cpu.find_mlir_opt())


@pytest.fixture(scope="module", params=ELEMENTS)
def module(request):
    return request.param, compiled_module(request.param)


@pytest.fixture(scope="module")
def f32_module():
    return compiled_module("f32")


# --------------------------------------------------------------------------- checks


def rng_for(name):
    return np.random.default_rng(zlib.crc32(name.encode()))


def values(rng, shape, elem):
    """Random values, never zero (a zero row of a result is then a row the op zeroed); bf16
    numbers for bf16 data."""
    v = (rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(f32)
    return bf16_round(v) if elem == "bf16" else v


def assert_bitwise(got, want, what):
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    bits = {4: np.uint32}[got.dtype.itemsize]
    diff = np.argwhere(got.view(bits) != want.view(bits))
    assert diff.size == 0, (
        f"{what}: {len(diff)} elements differ, first at {tuple(diff[0])}: "
        f"{got[tuple(diff[0])]!r}, expected {want[tuple(diff[0])]!r}"
    )


@pytest.mark.parametrize("gather", (False, True), ids=("rows", "gather"))
@pytest.mark.parametrize("kind", CAPACITIES)
@pytest.mark.parametrize("ranks", RANKS)
def test_ep_pack(module, ranks, kind, gather):
    elem, compiled = module
    name = f"pack_{ranks}_{kind}_{int(gather)}"
    cap = capacity(ranks, kind)
    rng = rng_for(f"{elem}_{name}")
    source = values(rng, (T if gather else R, D), elem)
    inputs = [source, OFFSETS] + ([TOKEN_IDS] if gather else [])
    send, counts, dropped = compiled[name](*inputs)
    want = ref_pack(source, OFFSETS, TOKEN_IDS if gather else None, ranks, cap)
    assert_bitwise(send, want[0], "send")
    assert_bitwise(counts, want[1], "send_counts")
    assert_bitwise(dropped, want[2], "dropped")
    sizes = block_sizes(OFFSETS, ranks)
    assert (dropped > 0).any() == (kind == "exceeded")
    assert (sizes.max() == cap) == (kind == "exact")
    # The kept rows of each block, then zero rows.
    assert ((send == 0).all(axis=1).sum()) == ranks * cap - np.minimum(sizes, cap).sum()


@pytest.mark.parametrize("reduce", (False, True), ids=("rows", "reduce"))
@pytest.mark.parametrize("kind", CAPACITIES)
@pytest.mark.parametrize("ranks", RANKS)
def test_ep_unpack(module, ranks, kind, reduce):
    elem, compiled = module
    name = f"unpack_{ranks}_{kind}_{int(reduce)}"
    cap = capacity(ranks, kind)
    rng = rng_for(f"{elem}_{name}")
    returned = values(rng, (ranks * cap, D), elem)  # rows past the kept ones are not read
    if reduce:
        (result,) = compiled[name](returned, OFFSETS, ROWS)
        want = ref_unpack_reduce(returned, OFFSETS, ROWS, ranks, cap)
        if elem == "f32":
            # The data tell the slot order from another one (sums of k bf16 numbers are exact
            # in f32, in any order).
            backwards = ref_unpack_reduce(returned, OFFSETS, ROWS, ranks, cap, reversed(range(K)))
            assert not np.array_equal(backwards.view(np.uint32), want.view(np.uint32))
        else:
            want = bf16_round(want)  # the f32 sum, rounded once
    else:
        (result,) = compiled[name](returned, OFFSETS)
        want = ref_unpack(returned, OFFSETS, ranks, cap, R)
        # Rows past offsets[E] and dropped rows are zero.
        kept = sum(min(int(n), cap) for n in block_sizes(OFFSETS, ranks))
        assert (result == 0).all(axis=1).sum() == R - kept
    assert_bitwise(result, want, "result")


@pytest.mark.parametrize("gather", (False, True), ids=("rows", "gather"))
def test_ep_dispatch_of_one_rank_is_ep_pack(module, gather):
    elem, compiled = module
    cap = capacity(1, "exceeded")
    rng = rng_for(f"{elem}_dispatch_{gather}")
    source = values(rng, (T if gather else R, D), elem)
    inputs = [source, OFFSETS] + ([TOKEN_IDS] if gather else [])
    got = compiled[f"dispatch_{int(gather)}"](*inputs)
    want = ref_pack(source, OFFSETS, TOKEN_IDS if gather else None, 1, cap)
    for g, w, what in zip(got, want, ("received", "received_counts", "dropped")):
        assert_bitwise(g, w, what)
    assert got[2][0] > 0


@pytest.mark.parametrize("reduce", (False, True), ids=("rows", "reduce"))
def test_ep_combine_of_one_rank_is_ep_unpack(module, reduce):
    elem, compiled = module
    cap = capacity(1, "exceeded")
    rng = rng_for(f"{elem}_combine_{reduce}")
    rows = values(rng, (cap, D), elem)
    if reduce:
        (result,) = compiled["combine_1"](rows, OFFSETS, ROWS)
        want = ref_unpack_reduce(rows, OFFSETS, ROWS, 1, cap)
        if elem == "bf16":
            want = bf16_round(want)
    else:
        (result,) = compiled["combine_0"](rows, OFFSETS)
        want = ref_unpack(rows, OFFSETS, 1, cap, R)
    assert_bitwise(result, want, "result")


def test_gather_rows(module):
    elem, compiled = module
    rng = rng_for(f"{elem}_gather")
    source = values(rng, (GATHER_N, D), elem)
    indices = rng.integers(0, GATHER_N, GATHER_M).astype(i32)  # repeats allowed
    indices[[1, 4, 9]] = -1
    (result,) = compiled["gather"](source, indices)
    assert_bitwise(result, ref_gather_rows(source, indices), "result")
    assert (result == 0).all(axis=1).sum() == 3


def test_scatter_rows(module):
    elem, compiled = module
    rng = rng_for(f"{elem}_scatter")
    source = values(rng, (SCATTER_M, D), elem)
    indices = rng.permutation(SCATTER_N)[:SCATTER_M].astype(i32)  # distinct
    indices[[0, 5]] = -1
    (result,) = compiled["scatter"](source, indices)
    assert_bitwise(result, ref_scatter_rows(source, indices, SCATTER_N), "result")
    assert (result == 0).all(axis=1).sum() == SCATTER_N - (SCATTER_M - 2)


@pytest.mark.parametrize("case", sorted(QUEUES))
def test_ep_queues(f32_module, case):
    counts, cap = QUEUES[case]
    ids, offsets = f32_module[f"queues_{case}"](counts)
    want_ids, want_offsets = ref_queues(counts, cap)
    assert_bitwise(ids, want_ids, "token_ids")
    assert_bitwise(offsets, want_offsets, "offsets")
    # Each queue row is a row of its rank's block.
    ranks = counts.shape[0]
    for s in range(ranks):
        assert ((ids >= s * cap) & (ids < (s + 1) * cap)).sum() == counts[s].sum()


@pytest.mark.parametrize("tokens", (5, 13))
def test_one_rank_chain_of_dynamic_token_count(f32_module, tokens):
    """R of ep_combine's result (dynamic) comes from the moe.dispatch. 13 tokens overflow the
    capacity, 5 do not."""
    rng = rng_for(f"chain_{tokens}")
    experts = np.stack([rng.choice(E, K, replace=False) for _ in range(tokens)]).astype(i32)
    x = values(rng, (tokens, D), "f32")
    rows = tokens * K
    shapes = [(CHAIN_C, D), (1, E), (1,), (CHAIN_C,), (E + 1,), (CHAIN_C, D), (CHAIN_C, D)]
    shapes += [(rows, D), (tokens, D)]
    recv, counts, dropped, qids, qoffs, g, s, y, dx = f32_module["chain"](
        experts, x, result_shapes=shapes
    )
    token_ids, offsets, rows_of = ref.dispatch(experts, E)
    want = ref_pack(x, offsets, token_ids, 1, CHAIN_C)
    assert_bitwise(recv, want[0], "received")
    assert_bitwise(counts, want[1], "received_counts")
    assert_bitwise(dropped, want[2], "dropped")
    assert (dropped[0] > 0) == (rows > CHAIN_C)
    want_ids, want_offsets = ref_queues(want[1], CHAIN_C)
    assert_bitwise(qids, want_ids, "queue token_ids")
    assert_bitwise(qoffs, want_offsets, "queue offsets")
    assert_bitwise(g, ref_gather_rows(recv, qids), "gather_rows")
    assert_bitwise(s, ref_scatter_rows(g, qids, CHAIN_C), "scatter_rows")
    # One rank: the queues are the received rows in order, so the copies give them back.
    assert_bitwise(s, recv, "received rows through the queues")
    assert_bitwise(y, ref_unpack(s, offsets, 1, CHAIN_C, rows), "ep_combine")
    assert_bitwise(dx, ref_unpack_reduce(s, offsets, rows_of, 1, CHAIN_C), "ep_combine reduce")
