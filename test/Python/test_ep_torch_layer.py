"""`MoELayer(ep_group=...)`, `replace_moe_blocks(model, ep_group=...)`, `gather_experts` and
`load_balancing_loss` on 2 ranks of a gloo group (torch.multiprocessing), CPU path, f32; and what
of the CUDA path runs without a GPU.

Each rank builds the same whole layer (same seed) and the expert-parallel one holding its
experts; on its own tokens the expert-parallel output equals the whole layer's bitwise, x's
and the router's gradients are within 1e-5, and each rank's expert gradients are the whole
layer's summed over both ranks' tokens, cut to its experts. The state_dict holds the local
experts and `gather_experts` gives back the whole layer's. The group's load-balancing loss
equals the one of all tokens in one process. A Mixtral model with its MoE blocks replaced on
each rank (in chunks of 32 tokens) gives the original model's loss on that rank's batch; a
layer in chunks of 4 tokens is the whole layer too.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import traceback

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

WORLD = 2
RTOL = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rel(a, b) -> float:
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / max(float(b.abs().max()), 1e-30))


def _local_copy(whole, ep, rank: int) -> None:
    """ep's weights: whole's, its experts this rank's."""
    local = whole.config.experts // WORLD
    with torch.no_grad():
        ep.w_router.copy_(whole.w_router)
        ep.w_gate_up.copy_(whole.w_gate_up[rank * local : (rank + 1) * local])
        ep.w_down.copy_(whole.w_down[rank * local : (rank + 1) * local])


def _against_whole(whole, ep, x, rank: int):
    """ep on this rank's tokens x against the whole layer: out and logits bitwise, x's and the
    router's gradients, and the experts' summed over the ranks."""
    local = whole.config.experts // WORLD
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, logits = whole(x1, return_router_logits=True)
    ep_out, ep_logits = ep(x2, return_router_logits=True)
    g = torch.randn_like(out)
    out.backward(g, retain_graph=True)
    ep_out.backward(g, retain_graph=True)
    checks = {
        "out_bitwise": bool(torch.equal(out, ep_out)),
        "logits_bitwise": bool(torch.equal(logits, ep_logits)),
        "dx": _rel(x2.grad, x1.grad),
        "dw_router": _rel(ep.w_router.grad, whole.w_router.grad),
    }
    for name in ("w_gate_up", "w_down"):
        summed = getattr(whole, name).grad.clone()
        dist.all_reduce(summed)
        checks[f"d{name}"] = _rel(getattr(ep, name).grad, summed[rank * local : (rank + 1) * local])
    return checks, logits, ep_logits


def _layer_case(rank: int) -> dict:
    from moe_mlir.config import LayerConfig
    from moe_mlir.distributed import gather_experts, load_balancing_loss
    from moe_mlir.layer import MoELayer

    config = LayerConfig(tokens=0, hidden=16, ffn=12, experts=4, top_k=2, renormalize=True)
    torch.manual_seed(0)
    whole = MoELayer(config)
    ep = MoELayer(config, ep_group="default", max_tokens=16)
    local = config.experts // WORLD
    _local_copy(whole, ep, rank)
    torch.manual_seed(100 + rank)
    x = torch.randn(5 + 4 * rank, config.hidden)
    checks, logits, ep_logits = _against_whole(whole, ep, x, rank)
    state = ep.state_dict()
    checks["local_shapes"] = tuple(state["w_gate_up"].shape) == (local, 16, 24)
    full = gather_experts(ep)
    checks["gathered"] = bool(
        torch.equal(full["w_gate_up"], whole.w_gate_up.detach())
        and torch.equal(full["w_down"], whole.w_down.detach())
    )
    # The load-balancing loss of the group against all tokens in one process.
    experts = logits.topk(config.top_k, -1).indices
    lb = load_balancing_loss(ep_logits, experts, config.experts)
    gathered = [None] * WORLD
    dist.all_gather_object(gathered, (logits.detach(), experts))
    all_logits = torch.cat([g[0] for g in gathered])
    all_experts = torch.cat([g[1] for g in gathered])
    probs = torch.softmax(all_logits, -1)
    f = torch.bincount(all_experts.reshape(-1), minlength=config.experts).float() / (
        all_experts.numel()
    )
    expect = config.experts * torch.sum(f * probs.mean(0))
    checks["lb"] = _rel(lb, expect)
    return checks


def _chunk_case(rank: int) -> dict:
    """ep_chunk_tokens=4 under a bound of 16: the step as 4 chunks, each with its own
    dispatch, capacity 4 * k a chunk by default; on 5 and 9 tokens (chunks of 1 to 3)."""
    from moe_mlir.config import LayerConfig
    from moe_mlir.layer import MoELayer

    config = LayerConfig(tokens=0, hidden=16, ffn=12, experts=4, top_k=2, renormalize=True)
    torch.manual_seed(1)
    whole = MoELayer(config, init_std=0.2)
    ep = MoELayer(config, ep_group="default", max_tokens=16, ep_chunk_tokens=4)
    _local_copy(whole, ep, rank)
    torch.manual_seed(200 + rank)
    checks, _, _ = _against_whole(whole, ep, torch.randn(5 + 4 * rank, config.hidden), rank)
    spec = ep.ep_spec
    checks["spec"] = (spec.chunk_tokens, spec.capacity) == (4, 8)
    checks["dropped"] = int(np.asarray(ep.last_dropped).sum()) == 0
    return checks


def _hf_case(rank: int) -> dict:
    import copy

    import transformers

    from moe_mlir import hf

    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(
        vocab_size=96,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        intermediate_size=24,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    model = transformers.MixtralForCausalLM(cfg).float()
    ours = copy.deepcopy(model)
    names = hf.replace_moe_blocks(ours, ep_group="default", max_tokens=64, ep_chunk_tokens=32)
    torch.manual_seed(10 + rank)
    ids = torch.randint(0, 96, (2, 6 + rank))
    ref = model(input_ids=ids, labels=ids).loss
    got = ours(input_ids=ids, labels=ids).loss
    got.backward()
    layer = ours.get_submodule(names[0])
    return {
        "replaced": len(names),
        "loss": _rel(got, ref),
        "local_experts": int(layer.w_gate_up.shape[0]),
        "chunk_tokens": layer.ep_spec.chunk_tokens,
        "grad": bool(layer.w_gate_up.grad is not None and layer.w_gate_up.grad.abs().sum() > 0),
    }


def _worker(rank, port, queue):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        os.environ.setdefault("MOE_MLIR_QUIET", "1")
        dist.init_process_group("gloo", rank=rank, world_size=WORLD)
        result = {"layer": _layer_case(rank), "chunk": _chunk_case(rank)}
        try:
            import transformers  # noqa: F401

            result["hf"] = _hf_case(rank)
        except ImportError:
            pass
        queue.put((rank, "ok", result))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        queue.put((rank, "error", traceback.format_exc()))


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    os.environ["MOE_MLIR_CACHE"] = str(tmp_path_factory.mktemp("ep_cache"))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    out = {}
    try:
        for _ in range(WORLD):
            rank, status, payload = queue.get(timeout=300)
            assert status == "ok", f"rank {rank}:\n{payload}"
            out[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
    return out


def test_layer_against_whole_layer(results):
    for rank, result in results.items():
        checks = result["layer"]
        assert checks["out_bitwise"] and checks["logits_bitwise"], (rank, checks)
        for name in ("dx", "dw_router", "dw_gate_up", "dw_down"):
            assert checks[name] <= RTOL, (rank, name, checks[name])
        assert checks["local_shapes"] and checks["gathered"], (rank, checks)
        assert checks["lb"] <= 1e-6, (rank, checks["lb"])


def test_chunked_layer_against_whole_layer(results):
    for rank, result in results.items():
        checks = result["chunk"]
        assert checks["out_bitwise"] and checks["logits_bitwise"], (rank, checks)
        for name in ("dx", "dw_router", "dw_gate_up", "dw_down"):
            assert checks[name] <= RTOL, (rank, name, checks[name])
        assert checks["spec"] and checks["dropped"], (rank, checks)


def test_replace_moe_blocks(results):
    for rank, result in results.items():
        if "hf" not in result:
            pytest.skip("needs transformers")
        checks = result["hf"]
        assert checks["replaced"] == 2 and checks["local_experts"] == 2, checks
        assert checks["chunk_tokens"] == 32, checks
        assert checks["loss"] <= RTOL, (rank, checks["loss"])
        assert checks["grad"], checks


def test_bad_use():
    from moe_mlir.config import LayerConfig
    from moe_mlir.layer import MoELayer

    config = LayerConfig(tokens=0, hidden=16, ffn=12, experts=4, top_k=2)
    with pytest.raises(RuntimeError, match="torch.distributed initialised"):
        MoELayer(config, ep_group="default", max_tokens=16)
    np.testing.assert_equal(dist.is_initialized(), False)


# --------------------------------------------------------------------------- the CUDA path


class _CPURunner:
    """GPUEPLayer's interface (forward(args, group) -> [out, logits, state...],
    backward(state, d_out, d_logits, group), gradient_args, dropped) over the CPU path's
    EPLayer of one rank: what the CUDA branch's autograd function drives, here on CPU
    tensors. `opaque`: forward returns its saved state as one object after out and logits
    (as a chunked step does), which must come back to backward as it is."""

    class State:
        def __init__(self, saved):
            self.saved = saved

    def __init__(self, layer, opaque: bool):
        from moe_mlir.distributed import LocalExchange

        self.layer, self.opaque, self.exchange = layer, opaque, LocalExchange()
        self.backwards = 0

    @property
    def gradient_args(self):
        return list(self.layer.functions["backward"].gradient_args)

    def forward(self, args, group):
        out, logits, saved = self.layer.forward([a.numpy() for a in args], self.exchange)
        self.dropped = [torch.from_numpy(d) for d in self.layer.dropped]
        head = [torch.from_numpy(np.array(out)), torch.from_numpy(np.array(logits))]
        if self.opaque:
            self.state = self.State(saved)
            return head + [self.state]
        return head + [torch.from_numpy(np.array(s)) for s in saved]

    def backward(self, state, d_out, d_logits, group):
        self.backwards += 1
        if self.opaque:
            assert len(state) == 1 and state[0] is self.state
            saved = state[0].saved
        else:
            saved = [s.numpy() for s in state]
        grads = self.layer.backward(saved, d_out.numpy(), d_logits.numpy(), self.exchange)
        return [torch.from_numpy(np.array(grads[n])) for n in self.layer.gradient_names]


EP_CONFIG = dict(
    tokens=0,
    hidden=16,
    ffn=12,
    experts=4,
    top_k=2,
    scoring="sigmoid",
    renormalize=True,
    router_bias=True,
    shared_ffn=8,
)


@pytest.mark.parametrize("opaque", [False, True])
@pytest.mark.parametrize("use_logits", [False, True])
def test_cuda_branch_autograd_against_the_layer(opaque, use_logits, tmp_path, monkeypatch):
    """The autograd function of the CUDA branch (layer.gpu_ep_apply) over a runner with
    GPUEPLayer's interface: out and logits bitwise the non-EP layer's, every gradient within
    1e-5, each mapped to its argument through gradient_args (the router bias, in the middle
    of the arguments, has none), the saved state passed back as it is (a list, or one
    object), a missing d_logits given as zeros."""
    from moe_mlir.config import LayerConfig
    from moe_mlir.distributed import EPSpec, ep_layer_for
    from moe_mlir.layer import MoELayer, gpu_ep_apply

    monkeypatch.setenv("MOE_MLIR_CACHE", str(tmp_path))
    config = LayerConfig(**EP_CONFIG)
    torch.manual_seed(3)
    whole = MoELayer(config, init_std=0.3)
    with torch.no_grad():
        whole.router_bias.normal_(0, 0.1)
    runner = _CPURunner(ep_layer_for(config, EPSpec(1, 16 * 2), 16), opaque)
    x = torch.randn(11, config.hidden)
    weights = {
        n: w.detach().clone().requires_grad_(n != "router_bias")
        for n, w in whole.layer_weights().items()
        if w is not None
    }
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    out, logits = whole(x1, return_router_logits=True)
    ep_out, ep_logits = gpu_ep_apply(runner, None, x2, weights, config.arg_names())
    assert torch.equal(out, ep_out) and torch.equal(logits, ep_logits)
    g, gl = torch.randn_like(out), torch.randn_like(logits)
    loss = (out * g).sum() + ((logits * gl).sum() if use_logits else 0)
    ep_loss = (ep_out * g).sum() + ((ep_logits * gl).sum() if use_logits else 0)
    loss.backward()
    ep_loss.backward()
    assert runner.backwards == 1
    assert _rel(x2.grad, x1.grad) <= RTOL
    assert weights["router_bias"].grad is None
    for name, w in weights.items():
        if name != "router_bias":
            assert _rel(w.grad, getattr(whole, name).grad) <= RTOL, name
    assert [tuple(d.shape) for d in runner.dropped] == [(1,)]
    with pytest.raises(ValueError, match="missing layer arguments"):
        gpu_ep_apply(runner, None, x2, {"w_router": weights["w_router"]}, config.arg_names())


def test_ep_build_options_and_keys():
    """An EPSpec in the build options: in the sm_90a key (size, capacity, overflow each
    change it; unset fields left out), nowhere when absent (the keys of the layers without
    it stay), refused for a CPU entry; the moe-compile command is the layer's."""
    from moe_mlir import compile_cache as cc
    from moe_mlir.config import LayerConfig
    from moe_mlir.distributed import EPSpec

    config = LayerConfig(64, 64, 64, 4, 2, renormalize=True, dtype="bf16")
    plain = cc.BuildOptions(max_tokens=64)
    assert "ep" not in plain.as_dict()
    ep = cc.BuildOptions(max_tokens=64, ep=EPSpec(2, 128))
    assert ep.as_dict()["ep"] == {"size": 2, "capacity": 128, "overflow": "error"}
    keys = {
        cc.config_key(config, "sm_90a", o)
        for o in (
            plain,
            ep,
            dataclasses.replace(ep, ep=EPSpec(1, 128)),
            dataclasses.replace(ep, ep=EPSpec(2, 64)),
            dataclasses.replace(ep, ep=EPSpec(2, 128, "drop")),
            dataclasses.replace(ep, max_tokens=32),
        )
    }
    assert len(keys) == 6
    with pytest.raises(TypeError, match="EPSpec"):
        cc.BuildOptions(ep=(2, 128))
    with pytest.raises(ValueError, match="capacity"):
        cc.BuildOptions(ep=EPSpec(2, 0))
    with pytest.raises(ValueError, match="EPLayer"):
        cc.get_cpu_layer(config, ep)
    cmd = cc.moe_compile_command(
        "moe-compile", "l.mlir", "out/moe_x", dataclasses.replace(ep, policy="recompute")
    )
    assert cmd == ["moe-compile", "l.mlir", "-o", "out/moe_x", "--policy=recompute"]


@pytest.fixture
def one_rank(tmp_path, monkeypatch):
    """A gloo group of one rank in this process, and an empty compile cache."""
    monkeypatch.setenv("MOE_MLIR_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MOE_MLIR_QUIET", "1")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield tmp_path
    dist.destroy_process_group()


def test_cuda_ep_entry_without_a_gpu(one_rank, monkeypatch):
    """compile_for(T, "cuda") of an expert-parallel MoELayer builds its sm_90a entry with
    moe-compile (no GPU needed), keyed by the EPSpec and the bound: the stages' entry points,
    capacity max_tokens * k; found again without a compiler (the GPU machine's case), and not
    for another capacity."""
    import json

    from moe_mlir import compile_cache as cc
    from moe_mlir.config import LayerConfig
    from moe_mlir.layer import MoELayer

    if cc.find_moe_compile() is None:
        pytest.skip("no moe-compile")
    config = LayerConfig(0, 64, 64, 4, 2, renormalize=True)
    layer = MoELayer(config, ep_group="default", max_tokens=32)
    assert layer.compile_for(20, "cuda") == 32
    options = layer.gpu_ep_options()
    assert (options.max_tokens, options.ep.size, options.ep.capacity) == (32, 1, 64)
    at_bound = dataclasses.replace(config, tokens=32, dtype="bf16")
    entry = cc.build_gpu_entry(at_bound, options)
    manifest = json.loads((entry.path / f"{entry.name}.json").read_text())
    stage0 = manifest["entry_points"]["forward_stage0"]
    assert stage0["ep"]["capacity"] == 64 and stage0["ep"]["size"] == 1
    assert "ep_capacity = 64" in (entry.path / "layer.mlir").read_text()
    assert entry.meta["options"]["ep"] == {"size": 1, "capacity": 64, "overflow": "error"}
    monkeypatch.setenv("MOE_COMPILE", "none")
    assert cc.find_gpu_entry(at_bound, options).path == entry.path
    other = dataclasses.replace(options, ep=dataclasses.replace(options.ep, capacity=32))
    with pytest.raises(cc.NoCompilerError, match="build-torch-cache"):
        cc.find_gpu_entry(at_bound, other)
    with pytest.raises(ValueError, match="outside \\[1, 32\\]"):
        layer.compile_for(33, "cuda")


def test_cuda_ep_errors_without_a_gpu(one_rank):
    """What the CUDA branch refuses before any kernel runs: a dtype other than bf16 (outside
    autocast), T over max_tokens, policy='offload', a layer the sm_90a path does not run;
    and the expert-parallel options' own errors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from moe_mlir.config import LayerConfig
    from moe_mlir.distributed import EPSpec
    from moe_mlir.layer import MoELayer

    config = LayerConfig(0, 64, 64, 4, 2, renormalize=True)
    with FakeTensorMode():
        layer = MoELayer(
            config, ep_group="default", max_tokens=16, device="cuda", dtype=torch.bfloat16
        )
        with pytest.raises(TypeError, match="bfloat16 only"):
            layer(torch.empty(4, 64, device="cuda"))
        with pytest.raises(ValueError, match="outside \\[1, 16\\]"):
            layer(torch.empty(17, 64, device="cuda", dtype=torch.bfloat16))
        offload = MoELayer(
            config,
            ep_group="default",
            max_tokens=16,
            policy="offload",
            device="cuda",
            dtype=torch.bfloat16,
        )
        with pytest.raises(NotImplementedError, match="offload"):
            offload(torch.empty(4, 64, device="cuda", dtype=torch.bfloat16))
        odd = MoELayer(
            dataclasses.replace(config, ffn=48),
            ep_group="default",
            max_tokens=16,
            device="cuda",
            dtype=torch.bfloat16,
        )
        with pytest.raises(NotImplementedError, match="multiple of 64"):
            odd(torch.empty(4, 64, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="need ep_group"):
        MoELayer(config, ep_capacity=8)
    with pytest.raises(ValueError, match="need ep_group"):
        MoELayer(config, ep_chunk_tokens=8)
    with pytest.raises(ValueError, match="needs max_tokens"):
        MoELayer(config, ep_group="default")
    for bad in (0, 17, True, 4.0):
        with pytest.raises(ValueError, match="ep_chunk_tokens"):
            MoELayer(config, ep_group="default", max_tokens=16, ep_chunk_tokens=bad)
    layer = MoELayer(config, ep_group="default", max_tokens=16, ep_capacity=5)
    assert layer.ep_spec == EPSpec(1, 5)
    assert MoELayer(config, ep_group="default", max_tokens=16).ep_spec == EPSpec(1, 32)
