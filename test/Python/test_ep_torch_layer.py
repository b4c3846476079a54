"""`MoELayer(ep_group=...)`, `replace_moe_blocks(model, ep_group=...)`, `gather_experts` and
`load_balancing_loss` on 2 ranks of a gloo group (torch.multiprocessing), CPU path, f32.

Each rank builds the same whole layer (same seed) and the expert-parallel one holding its
experts; on its own tokens the expert-parallel output equals the whole layer's bitwise, x's
and the router's gradients are within 1e-5, and each rank's expert gradients are the whole
layer's summed over both ranks' tokens, cut to its experts. The state_dict holds the local
experts and `gather_experts` gives back the whole layer's. The group's load-balancing loss
equals the one of all tokens in one process. A Mixtral model with its MoE blocks replaced on
each rank gives the original model's loss on that rank's batch.
"""

from __future__ import annotations

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


def _layer_case(rank: int) -> dict:
    from moe_mlir.config import LayerConfig
    from moe_mlir.distributed import gather_experts, load_balancing_loss
    from moe_mlir.layer import MoELayer

    config = LayerConfig(tokens=0, hidden=16, ffn=12, experts=4, top_k=2, renormalize=True)
    torch.manual_seed(0)
    whole = MoELayer(config)
    ep = MoELayer(config, ep_group="default", max_tokens=16)
    local = config.experts // WORLD
    with torch.no_grad():
        ep.w_router.copy_(whole.w_router)
        ep.w_gate_up.copy_(whole.w_gate_up[rank * local : (rank + 1) * local])
        ep.w_down.copy_(whole.w_down[rank * local : (rank + 1) * local])
    torch.manual_seed(100 + rank)
    x = torch.randn(5 + 4 * rank, config.hidden)
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
    names = hf.replace_moe_blocks(ours, ep_group="default", max_tokens=64)
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
        "grad": bool(layer.w_gate_up.grad is not None and layer.w_gate_up.grad.abs().sum() > 0),
    }


def _worker(rank, port, queue):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        os.environ.setdefault("MOE_MLIR_QUIET", "1")
        dist.init_process_group("gloo", rank=rank, world_size=WORLD)
        result = {"layer": _layer_case(rank)}
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


def test_replace_moe_blocks(results):
    for rank, result in results.items():
        if "hf" not in result:
            pytest.skip("needs transformers")
        checks = result["hf"]
        assert checks["replaced"] == 2 and checks["local_experts"] == 2, checks
        assert checks["loss"] <= RTOL, (rank, checks["loss"])
        assert checks["grad"], checks


def test_bad_use():
    from moe_mlir.config import LayerConfig
    from moe_mlir.layer import MoELayer

    config = LayerConfig(tokens=0, hidden=16, ffn=12, experts=4, top_k=2)
    with pytest.raises(RuntimeError, match="torch.distributed initialised"):
        MoELayer(config, ep_group="default", max_tokens=16)
    np.testing.assert_equal(dist.is_initialized(), False)
