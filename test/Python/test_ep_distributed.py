"""Expert parallelism on the CPU path through torch.distributed (gloo), 2 and 4 ranks.

One `EPLayer` is compiled in this process (moe-ep-stages splits it at its collectives) and
loaded by each rank of a `torch.multiprocessing` group; each rank runs forward and backward on
its own tokens with its share of the experts. Every rank's output and gradients are held to the
single-process layer holding all experts (`cpu.CompiledLayer`) on that rank's tokens: the output
bitwise (each row's expert FFN and the combine add in the same order), the gradients within a
relative 1e-5 (the experts' weight gradients sum the rows of every rank at once, and x's sums
its rows per token in slot order, where the single layer sums in row order).

Cases: random routing; every token on rank 0's experts (the other ranks receive nothing) with
T = 1 on one rank; the capacity exactly met; the capacity exceeded, raising CapacityError on
every rank (no rank left waiting) or, with overflow="drop", dropping the rows past it (their
results zero: the documented result, checked against the layer without the drop); a step
in chunks, with ranks whose chunks are empty, and a chunk's capacity exceeded. And the GPU
path's runner (`GPUEPLayer`'s scheduler and torch backend) over the CPU stages on torch
tensors, bitwise against the CPU runner.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import tempfile
import traceback

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from moe_mlir import cpu  # noqa: E402
from moe_mlir.config import LayerConfig  # noqa: E402
from moe_mlir import gpu  # noqa: E402
from moe_mlir.distributed import (  # noqa: E402
    CapacityError,
    EPLayer,
    EPSpec,
    GPUEPLayer,
    LocalExchange,
    TorchExchange,
    _NumpyBackend,
    shard_experts,
)

BOUND = 16
CONFIG = LayerConfig(
    tokens=BOUND, hidden=16, ffn=12, experts=8, top_k=2, renormalize=True, router_bias=True
)
RTOL = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _inputs(seed: int, tokens, skew: bool):
    """Whole-layer arguments for each rank: x of its token count, the weights shared; with
    `skew` a selection bias that sends every token to experts 0 and 1 (rank 0's)."""
    rng = np.random.default_rng(seed)
    d, n, e = CONFIG.hidden, CONFIG.ffn, CONFIG.experts
    shared = {
        "w_router": rng.normal(0, 0.3, (d, e)).astype(np.float32),
        "router_bias": (
            np.where(np.arange(e) < 2, 100.0, 0.0) if skew else rng.normal(0, 0.1, e)
        ).astype(np.float32),
        "w_gate_up": rng.normal(0, 0.3, (e, d, 2 * n)).astype(np.float32),
        "w_down": rng.normal(0, 0.3, (e, n, d)).astype(np.float32),
    }
    per_rank = []
    for t in tokens:
        args = dict(shared, x=rng.normal(0, 1, (t, d)).astype(np.float32))
        cot = {
            "d_out": rng.normal(0, 1, (t, d)).astype(np.float32),
            "d_logits": rng.normal(0, 0.1, (t, e)).astype(np.float32),
        }
        per_rank.append((args, cot))
    return per_rank


def _worker(rank, world, port, state, ep, per_rank, queue):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        layer = EPLayer.load(CONFIG, ep, state)
        exchange = TorchExchange()
        args, cot = per_rank[rank]
        local = shard_experts(args, world, rank)
        try:
            out, logits, saved = layer.forward(local, exchange)
            dropped = layer.dropped.copy()
            grads = layer.backward(saved, cot["d_out"], cot["d_logits"], exchange)
            queue.put((rank, "ok", (out, logits, grads, dropped)))
        except CapacityError as e:
            queue.put((rank, "capacity", str(e)))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        queue.put((rank, "error", traceback.format_exc()))


def _run(layer: EPLayer, per_rank, timeout: float = 120.0):
    world = layer.ep.size
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_worker, args=(r, world, port, layer.state(), layer.ep, per_rank, queue))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in range(world):
            rank, status, payload = queue.get(timeout=timeout)
            results[rank] = (status, payload)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    for rank, (status, payload) in results.items():
        assert status != "error", f"rank {rank} failed:\n{payload}"
    return results


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    """The EP layers compile into the compile cache: this module's own."""
    before = os.environ.get("MOE_MLIR_CACHE")
    os.environ["MOE_MLIR_CACHE"] = str(tmp_path_factory.mktemp("ep_cpu_cache"))
    yield
    if before is None:
        os.environ.pop("MOE_MLIR_CACHE", None)
    else:
        os.environ["MOE_MLIR_CACHE"] = before


@pytest.fixture(scope="module")
def reference():
    return cpu.CompiledLayer(CONFIG, "moe_layer", max_tokens=BOUND)


_LAYERS = {}


def _layer(size: int, capacity: int, overflow: str = "error", chunk=None) -> EPLayer:
    key = (size, capacity, overflow, chunk)
    if key not in _LAYERS:
        _LAYERS[key] = EPLayer(
            CONFIG, EPSpec(size, capacity, overflow, chunk), "moe_layer", max_tokens=BOUND
        )
    return _LAYERS[key]


def _rel(a, b) -> float:
    scale = float(np.max(np.abs(b))) or 1.0
    return float(np.max(np.abs(np.asarray(a, np.float64) - b))) / scale


def _check_against_reference(reference, results, per_rank, world):
    """Each rank's output bitwise and gradients within RTOL of the whole layer on its tokens;
    the expert weights' gradients summed over the ranks, cut to each rank's experts."""
    names = ("w_gate_up", "w_down")
    whole = {n: 0.0 for n in names}
    for rank in range(world):
        args, cot = per_rank[rank]
        out, logits, saved = reference.forward(args)
        grads = reference.backward(saved, cot["d_out"], cot["d_logits"])
        status, (ep_out, ep_logits, ep_grads, _) = results[rank]
        assert status == "ok"
        np.testing.assert_array_equal(ep_out, out, err_msg=f"rank {rank} out")
        np.testing.assert_array_equal(ep_logits, logits, err_msg=f"rank {rank} logits")
        for name in ("x", "w_router", "router_bias"):
            if name in grads:
                assert _rel(ep_grads[name], grads[name]) <= RTOL, (rank, name)
        for n in names:
            whole[n] = whole[n] + grads[n].astype(np.float64)
    local = CONFIG.experts // world
    for rank in range(world):
        ep_grads = results[rank][1][2]
        for n in names:
            expect = whole[n][rank * local : (rank + 1) * local]
            assert _rel(ep_grads[n], expect) <= RTOL, (rank, n)


@pytest.mark.parametrize("world", [2, 4])
def test_random_routing(reference, world):
    per_rank = _inputs(10 + world, [BOUND - r for r in range(world)], skew=False)
    layer = _layer(world, BOUND * CONFIG.top_k)
    results = _run(layer, per_rank)
    _check_against_reference(reference, results, per_rank, world)
    for rank in range(world):
        assert not results[rank][1][3].any()  # nothing dropped


@pytest.mark.parametrize("world", [2, 4])
def test_all_tokens_on_one_rank(reference, world):
    # Every token chooses experts 0 and 1, rank 0's; the other ranks receive nothing. Rank 1
    # has a single token.
    tokens = [BOUND] + [1] + [5] * (world - 2)
    per_rank = _inputs(20 + world, tokens, skew=True)
    layer = _layer(world, BOUND * CONFIG.top_k)
    results = _run(layer, per_rank)
    _check_against_reference(reference, results, per_rank, world)


def test_capacity_exactly_met(reference):
    # Each rank sends its T * k = 2 * BOUND rows to rank 0: a capacity of exactly that.
    per_rank = _inputs(30, [BOUND, BOUND], skew=True)
    layer = _layer(2, BOUND * CONFIG.top_k)
    results = _run(layer, per_rank)
    _check_against_reference(reference, results, per_rank, 2)


def test_capacity_exceeded_raises_on_every_rank():
    per_rank = _inputs(40, [BOUND, 3], skew=True)
    layer = _layer(2, BOUND * CONFIG.top_k - 1)
    results = _run(layer, per_rank)
    for rank in range(2):
        status, message = results[rank]
        assert status == "capacity", (rank, status)
        assert f"capacity of {BOUND * CONFIG.top_k - 1} rows" in message
        assert "overflow='drop'" in message


def test_capacity_exceeded_drop(reference):
    """With overflow="drop", rank 0's block for rank 0 loses its last row: the last token
    (in token order) of expert 1, the rank's last expert that was chosen. That pair's result
    is a zero row, so its token's output lacks that expert's weighted output; every other
    token's output is the whole layer's, bitwise."""
    capacity = BOUND * CONFIG.top_k - 1
    per_rank = _inputs(50, [BOUND, 3], skew=True)
    results = _run(_layer(2, capacity, "drop"), per_rank)
    args, cot = per_rank[0]
    out, logits, saved = reference.forward(args)
    status, (ep_out, _, ep_grads, dropped) = results[0]
    assert status == "ok"
    np.testing.assert_array_equal(dropped, [[1, 0]])
    np.testing.assert_array_equal(results[1][1][3], [[0, 0]])  # rank 1 sends 6 rows
    # The dropped pair: the last row of expert 1's queue, i.e. its last token in token order.
    weights, experts, _ = cpu_router(reference, args)
    chosen = np.argwhere(experts == 1)
    t, j = chosen[-1]
    x = args["x"][t]
    h = x @ args["w_gate_up"][1]
    n = CONFIG.ffn
    a = h[:n] / (1 + np.exp(-h[:n])) * h[n:]
    y = a @ args["w_down"][1]
    expected = out.astype(np.float64)
    expected[t] -= weights[t, j] * y
    keep = np.arange(out.shape[0]) != t
    np.testing.assert_array_equal(ep_out[keep], out[keep])
    assert _rel(ep_out[t], expected[t]) <= 1e-5
    for name, grad in ep_grads.items():
        assert np.isfinite(grad).all(), name


def cpu_router(reference, args):
    """The routing weights and experts of the whole layer's forward (its saved tensors)."""
    out, logits, saved = reference.forward(args)
    t = args["x"].shape[0]
    # The saved tensors in forward's order: x, the weights, then the router's weights and
    # experts (docs/cpu-path.md); find them by shape and dtype.
    weights = next(s for s in saved if s.shape == (t, CONFIG.top_k) and s.dtype == np.float32)
    experts = next(s for s in saved if s.shape == (t, CONFIG.top_k) and s.dtype == np.int32)
    return weights, experts, logits


@pytest.mark.parametrize("world", [2, 4])
def test_chunked_step(reference, world):
    """A step in chunks of at most 5 tokens (4 chunks of the bound of 16), each with its
    own dispatch and a capacity of a chunk's: the same output, bitwise, and gradients as the
    whole layer. Rank 1 has 2 tokens, so two of its chunks are empty while the other ranks'
    are not; every rank still makes every collective."""
    tokens = [BOUND, 2] + [7] * (world - 2)
    per_rank = _inputs(80 + world, tokens, skew=False)
    layer = _layer(world, 5 * CONFIG.top_k, chunk=5)
    assert layer.chunks == 4
    results = _run(layer, per_rank)
    _check_against_reference(reference, results, per_rank, world)
    for rank in range(world):
        assert not results[rank][1][3].any()


def test_chunked_skewed_step(reference):
    """Every token on rank 0's experts, in chunks: rank 1 receives nothing in any chunk."""
    per_rank = _inputs(90, [BOUND, 1], skew=True)
    results = _run(_layer(2, 5 * CONFIG.top_k, chunk=5), per_rank)
    _check_against_reference(reference, results, per_rank, 2)


def test_chunk_capacity_exceeded_raises_on_every_rank():
    """The capacity is a chunk's: 4 tokens a chunk, all on rank 0's experts, send 8 rows
    from each rank to rank 0, past a capacity of 7, in chunk 0 already."""
    per_rank = _inputs(100, [BOUND, BOUND], skew=True)
    results = _run(_layer(2, 7, chunk=5), per_rank)
    for rank in range(2):
        status, message = results[rank]
        assert status == "capacity", (rank, status)
        assert "(chunk 0 of 4)" in message and "capacity of 7 rows" in message


def test_chunked_world_of_one(reference):
    """ep_size 1 in this process, chunked, for T from the bound down to 1 (chunks without
    tokens): the whole layer's output bitwise and its gradients."""
    layer = EPLayer(
        CONFIG, EPSpec(1, 5 * CONFIG.top_k, chunk_tokens=5), "moe_layer", max_tokens=BOUND
    )
    for t in (BOUND, 11, 2, 1):
        ((args, cot),) = _inputs(110 + t, [t], skew=False)
        out, logits, saved = reference.forward(args)
        grads = reference.backward(saved, cot["d_out"], cot["d_logits"])
        ep_out, ep_logits, ep_saved = layer.forward(args, LocalExchange())
        assert [n for _, n in ep_saved.spans] == [
            t // 4 + (1 if i < t % 4 else 0) for i in range(4)
        ]
        ep_grads = layer.backward(ep_saved, cot["d_out"], cot["d_logits"], LocalExchange())
        np.testing.assert_array_equal(ep_out, out)
        np.testing.assert_array_equal(ep_logits, logits)
        for name, grad in grads.items():
            assert _rel(ep_grads[name], grad) <= RTOL, (t, name)
        if t > 1:
            with pytest.raises(ValueError, match="cotangents of"):
                layer.backward(ep_saved, cot["d_out"][:-1], cot["d_logits"][:-1], LocalExchange())


def test_world_of_one_is_the_layer(reference):
    """ep_size 1, in this process: the staged layer against the unsplit one."""
    layer = EPLayer(CONFIG, EPSpec(1, BOUND * CONFIG.top_k), "moe_layer", max_tokens=BOUND)
    ((args, cot),) = _inputs(60, [11], skew=False)
    out, logits, saved = reference.forward(args)
    grads = reference.backward(saved, cot["d_out"], cot["d_logits"])
    ep_out, ep_logits, ep_saved = layer.forward(args, LocalExchange())
    ep_grads = layer.backward(ep_saved, cot["d_out"], cot["d_logits"], LocalExchange())
    np.testing.assert_array_equal(ep_out, out)
    np.testing.assert_array_equal(ep_logits, logits)
    for name, grad in grads.items():
        assert _rel(ep_grads[name], grad) <= RTOL, name
    plain_out, plain_logits = layer.layer(args, LocalExchange())
    np.testing.assert_array_equal(plain_out, out)


def test_compiles_into_the_cache(tmp_path, monkeypatch):
    """The layer compiles into the compile cache, not a temporary folder of its own (which
    nothing removed): a second layer of the same config, here without any moe-opt, loads that
    entry and computes the same bits; another function name is another entry; keep_dir still
    compiles into the folder given."""
    from moe_mlir import compile_cache

    monkeypatch.setenv("MOE_MLIR_CACHE", str(tmp_path / "cache"))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    ep = EPSpec(1, BOUND * CONFIG.top_k)
    first = EPLayer(CONFIG, ep, max_tokens=BOUND)
    assert first.state()["so"].startswith(str(tmp_path / "cache" / "cpu"))
    assert first.state()["rows"] and first.state()["checks"]
    monkeypatch.setattr(compile_cache, "_find_moe_opt", lambda: None)
    again = EPLayer(CONFIG, ep, max_tokens=BOUND)
    assert again.state()["so"] == first.state()["so"]
    assert again.state()["checks"] == first.state()["checks"]
    ((args, _),) = _inputs(75, [9], skew=False)
    for a, b in zip(
        first.forward(args, LocalExchange())[:2], again.forward(args, LocalExchange())[:2]
    ):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(compile_cache.NoCompilerError, match="expert-parallel layer"):
        EPLayer(CONFIG, ep, "other_name", max_tokens=BOUND)
    assert not [p for p in os.listdir(scratch) if p.startswith("moe_mlir_ep_")]
    monkeypatch.undo()
    kept = EPLayer(CONFIG, ep, max_tokens=BOUND, keep_dir=str(tmp_path / "kept"))
    assert kept.state()["so"] == str(tmp_path / "kept" / "module.so")


def test_bad_use_is_an_error():
    layer = _layer(2, BOUND * CONFIG.top_k)
    ((args, _),) = _inputs(70, [4], skew=False)
    with pytest.raises(ValueError, match="compiled for 2 ranks but the exchange has 1"):
        layer.forward(shard_experts(args, 2, 0), LocalExchange())
    with pytest.raises(ValueError, match="outside \\[1, 16\\]"):
        layer.forward(
            dict(shard_experts(args, 2, 0), x=np.zeros((17, 16), np.float32)), LocalExchange()
        )
    with pytest.raises(ValueError, match="must divide the number of experts"):
        EPLayer(dataclasses.replace(CONFIG, experts=6), EPSpec(4, 8))
    with pytest.raises(ValueError, match="overflow must be one of"):
        EPSpec(2, 8, "ignore").validate()
    with pytest.raises(ValueError, match="chunk_tokens must be a positive integer"):
        EPSpec(2, 8, chunk_tokens=0).validate()
    with pytest.raises(ValueError, match="is more than max_tokens"):
        EPLayer(CONFIG, EPSpec(2, 8, chunk_tokens=BOUND + 1), max_tokens=BOUND)
    with pytest.raises(ValueError, match="chunk_tokens needs max_tokens"):
        EPLayer(CONFIG, EPSpec(2, 8, chunk_tokens=4))
    with pytest.raises(RuntimeError, match="torch.distributed initialised"):
        TorchExchange()


# =========================================================================== the GPU runner


class _StagesOnTorch(GPUEPLayer):
    """`GPUEPLayer`'s runner (the scheduler, its torch backend, the chunks) over the CPU stages
    of an `EPLayer`, on CPU tensors, with the manifest entries the GPU layer would have: what
    the GPU path does between its kernels, checked without a GPU."""

    device = "cpu"

    def __init__(self, layer: EPLayer):  # noqa: D107 (no manifest to read)
        self.cpu_layer, self.name, self.dropped = layer, layer.name, None
        self.entries, self.ep = {}, {}
        for half in ("forward", "backward"):
            function = layer.functions[half]
            plan = function.plan
            for i, stage in enumerate(plan.stages):
                kind = f"{half}_stage{i}"
                sig = function.module[stage.name].signature
                outputs = tuple(
                    gpu.ParamSpec(
                        name,
                        "output",
                        t.element,
                        tuple(-1 if d is None else d for d in t.shape),
                        rows_per_token=r or 0,
                    )
                    for name, t, r in zip(stage.outputs, sig.results, stage.rows)
                )
                self.entries[kind] = gpu.EntryPoint(kind, stage.name, None, outputs, BOUND)
                self.ep[kind] = {
                    "inputs": stage.inputs,
                    "outputs": stage.outputs,
                    "collectives": plan.kinds,
                    "overflows": plan.overflows,
                    "results": plan.results,
                    "stages": len(plan.stages),
                    "size": plan.ep_size,
                    "capacity": plan.capacity,
                    "num_saved": function.num_saved,
                    "gradient_args": function.gradient_args,
                }
                if plan.step_tokens:
                    self.ep[kind]["step_tokens"] = plan.step_tokens
        self.ep_size, self.capacity = layer.ep.size, self.ep["forward_stage0"]["capacity"]
        self.max_tokens = layer.functions["forward"].plan.chunk_tokens

    def _call(self, kind, inputs, tokens):
        half, index = kind.split("_stage")
        backend = _NumpyBackend(self.cpu_layer.functions[half], None)
        outs = backend.call(int(index), [t.numpy() for t in inputs], tokens)
        return [torch.from_numpy(np.ascontiguousarray(o)) for o in outs]


def _torch_runner_worker(rank, world, port, state, ep, per_rank, queue):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        layer = EPLayer.load(CONFIG, ep, state)
        args, cot = per_rank[rank]
        local = shard_experts(args, world, rank)
        out, logits, saved = layer.forward(local, TorchExchange())
        grads = layer.backward(saved, cot["d_out"], cot["d_logits"], TorchExchange())
        runner = _StagesOnTorch(layer)
        tensors = [torch.from_numpy(local[n]) for n in CONFIG.arg_names()]
        results = runner.forward(tensors)
        t_grads = runner.backward(
            results[2:], torch.from_numpy(cot["d_out"]), torch.from_numpy(cot["d_logits"])
        )
        names = [CONFIG.arg_names()[i] for i in runner.gradient_args]
        same = {
            "out": bool(np.array_equal(results[0].numpy(), out)),
            "logits": bool(np.array_equal(results[1].numpy(), logits)),
            "dropped": bool(
                np.array_equal(np.stack([d.numpy() for d in runner.dropped]), layer.dropped)
            ),
        }
        for name, g in zip(names, t_grads):
            same[name] = bool(np.array_equal(g.numpy(), grads[name]))
        queue.put((rank, "ok", same))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        queue.put((rank, "error", traceback.format_exc()))


@pytest.mark.parametrize("chunk", [None, 5])
def test_gpu_runner_on_cpu_tensors(chunk):
    """GPUEPLayer's runner, its collectives through torch.distributed on torch tensors, gives
    bitwise what the CPU path's runner gives, unchunked and in chunks (one rank with two
    tokens: empty chunks), with rows dropped past a small capacity."""
    capacity = 5 * CONFIG.top_k if chunk else BOUND * CONFIG.top_k - 3
    layer = _layer(2, capacity, "drop", chunk=chunk)
    per_rank = _inputs(120, [BOUND, 2], skew=chunk is None)
    world, ctx = 2, mp.get_context("spawn")
    queue, port = ctx.Queue(), _free_port()
    procs = [
        ctx.Process(
            target=_torch_runner_worker,
            args=(r, world, port, layer.state(), layer.ep, per_rank, queue),
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        results = dict((r, (st, pay)) for r, st, pay in (queue.get(timeout=120) for _ in procs))
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    for rank, (status, same) in results.items():
        assert status == "ok", same
        assert all(same.values()), (rank, same)


def test_chunks_release_their_buffers():
    """A chunk's blocks are released once its later stages no longer need them: while the
    wavefront runs, at most the blocks of the two chunks in flight are alive, not every
    chunk's."""
    import gc
    import weakref

    from moe_mlir.distributed import _run_stages

    layer = _layer(1, 5 * CONFIG.top_k, chunk=5)
    function = layer.functions["forward"]
    ((args, _),) = _inputs(130, [BOUND], skew=False)
    args = [args[n] for n in CONFIG.arg_names()]
    blocks, most_alive = [], []

    class Tracking(_NumpyBackend):
        def call(self, index, inputs, tokens):
            gc.collect()
            most_alive.append(sum(ref() is not None for ref in blocks))
            outputs = super().call(index, inputs, tokens)
            names = function.plan.stages[index].outputs
            blocks.extend(weakref.ref(o) for n, o in zip(names, outputs) if n.startswith("send"))
            return outputs

    spans = function.plan.split(BOUND)
    chunks = [([args[0][a : a + t], *args[1:]], t) for a, t in spans]
    _run_stages(function.plan, Tracking(function, LocalExchange()), chunks, False)
    # Each chunk sends twice (dispatch and combine; the rows and the counts at a dispatch).
    assert len(blocks) == 3 * len(spans)
    assert max(most_alive) <= 2 * 3, most_alive
