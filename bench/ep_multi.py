#!/usr/bin/env python3
"""The expert-parallel layer on several GPUs of one host (docs/distributed.md), one process a
GPU under torchrun with NCCL:

    torchrun --standalone --nproc-per-node=S bench/ep_multi.py

Takes mixtral-8x7b-ep{S} and mixtral-8x7b-ep{S}-drop of scripts/inputs/build-ep-layers.sh
(T = 4096 tokens a rank; capacity 4096 * k and 2048 with overflow = drop) and, as the
single-GPU reference holding all experts, mixtral-8x7b-t4096 of
scripts/inputs/build-dynamic-layers.sh, each linked into NAME.so
(scripts/gpu/layer-check.sh --only build). Every rank builds the same weights (one seed) and
its own tokens:

- correctness, for random routing, skewed routing (most rows to rank 0's experts) and routing
  that leaves every rank but 0 empty: each rank's output against the reference layer on its
  tokens, and its gradients (the expert weights' against the reference's summed over the ranks,
  cut to its experts), within BENCH.md's bf16 tolerances;
- speed: forward + backward of the staged layer (median of --steps), the share of it in the
  all-to-alls (CUDA events around each), and the scaling efficiency against the reference on
  one GPU at the same tokens a GPU (its step time / ours); beside it, the same layer in
  Megatron-style torch (the router, a sort by expert, all_to_all_single with split sizes,
  grouped matmuls of the local experts, the way back), in the same run;
- memory: the peak of torch's allocations a rank (outputs, saved tensors, gradients) plus the
  stages' workspaces, skewed routing, with C = 4096 * k and with the capacity of 2048 (drop),
  beside what the plan predicts (docs/distributed.md, Memory per rank).

With mixtral-8x7b-ep{S}-chunk (the same layer in 4 chunks of 1024 tokens, capacity 1024 * k a
chunk; pipelined, one chunk's all-to-all overlapping another's experts) the correctness checks,
its step time beside the unchunked one, and its peak memory under skewed routing, likewise.

Rank 0 prints one line a check and "N passed, M failed"; JSON to $OUT/ep_multi.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import traceback
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

from moe_mlir import gpu  # noqa: E402
from moe_mlir.distributed import CapacityError, GPUEPLayer  # noqa: E402

results: List[Dict[str, Any]] = []
TOKENS, HIDDEN, FFN, EXPERTS, TOP_K = 4096, 4096, 14336, 8, 2
RTOL = 2e-2  # BENCH.md's bf16 gradient tolerance


def record(rank: int, kind: str, name: str, ok: bool, **detail) -> None:
    results.append({"kind": kind, "name": name, "ok": ok, **detail})
    if rank == 0:
        print(f"{'PASS' if ok else 'FAIL'} {kind} {name} {json.dumps(detail)}", flush=True)


def weights(torch):
    gen = torch.Generator(device="cuda").manual_seed(1)
    bf = torch.bfloat16
    return [
        (torch.randn(HIDDEN, EXPERTS, generator=gen, device="cuda") * 0.02).to(bf),
        (torch.randn(EXPERTS, HIDDEN, 2 * FFN, generator=gen, device="cuda") * 0.02).to(bf),
        (torch.randn(EXPERTS, FFN, HIDDEN, generator=gen, device="cuda") * 0.02).to(bf),
    ]


def tokens(torch, rank: int, mode: str, w_router):
    """This rank's x: random, or pulled toward expert 0's (rank 0's) router column."""
    gen = torch.Generator(device="cuda").manual_seed(100 + rank)
    x = torch.randn(TOKENS, HIDDEN, generator=gen, device="cuda")
    if mode != "random":
        direction = w_router[:, 0].float() / w_router[:, 0].float().norm()
        share = 0.8 if mode == "skewed" else 1.0
        pulled = torch.rand(TOKENS, generator=gen, device="cuda") < share
        strength = 400.0 if mode == "empty" else 200.0
        x = x + pulled[:, None] * strength * direction[None, :]
        if mode == "empty":  # the second choice on rank 0 too: expert 1
            d1 = w_router[:, 1].float() / w_router[:, 1].float().norm()
            x = x + strength * 0.99 * d1[None, :]
    return x.to(torch.bfloat16)


def rel(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def megatron_step(torch, dist, x, w_router, wgu_local, wd_local, d_out, size, rank):
    """The layer in plain torch as Megatron-style code runs it: route, sort by expert, send
    with split sizes, grouped matmuls of the local experts, send back, combine; autograd."""
    x = x.detach().requires_grad_()
    local = EXPERTS // size
    logits = (x @ w_router).float()
    weights, experts = torch.topk(torch.softmax(logits, -1), TOP_K, -1)
    weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    rows = x.repeat_interleave(TOP_K, 0)[order]
    counts = torch.bincount(flat, minlength=EXPERTS)
    send = counts.view(size, local).sum(1)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)
    recv = recv_counts.view(size, local).sum(1)
    send_l, recv_l = send.tolist(), recv.tolist()  # the host synchronisation it needs
    received = torch.distributed.nn.functional.all_to_all_single(
        torch.empty(sum(recv_l), HIDDEN, dtype=x.dtype, device=x.device), rows, recv_l, send_l
    )
    per_expert = recv_counts.view(size, local)
    # rows arrive by source rank, then expert: regroup by expert for the grouped matmul
    src_expert = torch.repeat_interleave(
        torch.arange(size * local, device=x.device) % local, per_expert.reshape(-1)
    )
    regroup = torch.argsort(src_expert, stable=True)
    grouped = received[regroup]
    offs = torch.cumsum(per_expert.sum(0), 0).to(torch.int32)
    h = torch._grouped_mm(grouped, wgu_local, offs=offs)
    a = torch.nn.functional.silu(h[:, :FFN]) * h[:, FFN:]
    y = torch._grouped_mm(a, wd_local, offs=offs)
    back = torch.empty_like(y)
    back = back.index_copy(0, regroup, y)
    returned = torch.distributed.nn.functional.all_to_all_single(
        torch.empty(sum(send_l), HIDDEN, dtype=x.dtype, device=x.device), back, send_l, recv_l
    )
    unsorted = torch.empty_like(returned).index_copy(0, order, returned)
    out = (unsorted.view(TOKENS, TOP_K, HIDDEN) * weights[..., None]).sum(1)
    out.backward(d_out)
    return out


def time_it(torch, fn, warmup: int, steps: int) -> float:
    times = []
    for i in range(warmup + steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ep-dir", default=os.path.join(ROOT, "gpu-inputs", "ep", "layers"))
    ap.add_argument(
        "--reference",
        default=os.path.join(ROOT, "gpu-inputs", "dynamic", "layers", "mixtral-8x7b-t4096.so"),
    )
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/moe-gpu-out"))
    args = ap.parse_args()
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group("nccl")
    size = dist.get_world_size()
    local = EXPERTS // size
    try:
        staged = GPUEPLayer(os.path.join(args.ep_dir, f"mixtral-8x7b-ep{size}.so"))
        drop = GPUEPLayer(os.path.join(args.ep_dir, f"mixtral-8x7b-ep{size}-drop.so"))
        chunk_path = os.path.join(args.ep_dir, f"mixtral-8x7b-ep{size}-chunk.so")
        chunked = GPUEPLayer(chunk_path) if os.path.exists(chunk_path) else None
        reference = gpu.CompiledLayer(args.reference)
        w_router, wgu, wd = weights(torch)
        wgu_local = wgu[rank * local : (rank + 1) * local].contiguous()
        wd_local = wd[rank * local : (rank + 1) * local].contiguous()
        gen = torch.Generator(device="cuda").manual_seed(200 + rank)
        d_out = (torch.randn(TOKENS, HIDDEN, generator=gen, device="cuda") * 0.1).to(torch.bfloat16)
        d_logits = torch.zeros(TOKENS, EXPERTS, device="cuda")
        names = [reference.manifest.forward.params[i].name for i in range(4)]

        def ours(layer, x):
            out = layer.forward([x, w_router, wgu_local, wd_local])
            grads = layer.backward(out[2:], d_out, d_logits)
            return out, dict(zip([f"d_arg{i}" for i in layer.gradient_args], grads))

        variants = [("", staged)] + ([("chunked ", chunked)] if chunked else [])
        for (label, layer), mode in (
            (v, m) for v in variants for m in ("random", "skewed", "empty")
        ):
            x = tokens(torch, rank, mode, w_router)
            out, grads = ours(layer, x)
            f = reference.forward(dict(zip(names, [x, w_router, wgu, wd])))
            g = reference.backward(f, {"d_result0": d_out, "d_result1": d_logits})
            worst = {"out": rel(out[0], f["result0"])}
            for name, whole in g.items():
                if name in ("d_arg2", "d_arg3"):
                    summed = whole.float()
                    dist.all_reduce(summed)
                    whole = summed[rank * local : (rank + 1) * local]
                worst[name] = rel(grads[name], whole)
            ok = all(v <= RTOL for v in worst.values())
            record(rank, "correct", f"{label}{mode} rank{rank}", ok, rel=worst)

        x = tokens(torch, rank, "random", w_router)
        ours_ms = time_it(torch, lambda: ours(staged, x), args.warmup, args.steps)
        ref_args = dict(zip(names, [x, w_router, wgu, wd]))

        def reference_step():
            f = reference.forward(ref_args)
            reference.backward(f, {"d_result0": d_out, "d_result1": d_logits})

        one_gpu_ms = time_it(torch, reference_step, args.warmup, args.steps)
        megatron_ms = time_it(
            torch,
            lambda: megatron_step(torch, dist, x, w_router, wgu_local, wd_local, d_out, size, rank),
            args.warmup,
            args.steps,
        )
        chunked_ms = (
            time_it(torch, lambda: ours(chunked, x), args.warmup, args.steps) if chunked else None
        )
        record(
            rank,
            "speed",
            f"rank{rank}",
            True,
            ours_ms=round(ours_ms, 3),
            one_gpu_ms=round(one_gpu_ms, 3),
            megatron_ms=round(megatron_ms, 3),
            scaling_efficiency=round(one_gpu_ms / ours_ms, 3),
            megatron_over_ours=round(megatron_ms / ours_ms, 3),
            chunked_ms=chunked_ms and round(chunked_ms, 3),
            chunked_over_ours=chunked_ms and round(chunked_ms / ours_ms, 3),
        )

        memory_runs = [("capacity T*k", staged), ("capacity 2048, drop", drop)]
        if chunked:
            memory_runs.append(("4 chunks, capacity 1024*k a chunk", chunked))
        for label, layer in memory_runs:
            x = tokens(torch, rank, "skewed", w_router)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            try:
                ours(layer, x)
            except CapacityError as e:
                record(rank, "memory", f"{label} rank{rank}", False, error=str(e)[:200])
                continue
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
            # The stages run one after another, each freeing its workspace at its end.
            workspace = max(layer.workspace_bytes.values())
            dropped = [d.tolist() for d in (layer.dropped or [])]
            block = size * layer.capacity * HIDDEN * 2  # one [S * C, d] bf16 buffer
            record(
                rank,
                "memory",
                f"{label} rank{rank}",
                True,
                torch_peak_mib=round(peak / 2**20, 1),
                workspace_mib=round(workspace / 2**20, 1),
                block_mib=round(block / 2**20, 1),
                dropped=dropped,
            )
    except Exception as e:  # noqa: BLE001
        record(rank, "error", f"rank{rank}", False, error=f"{type(e).__name__}: {e}"[:400])
        traceback.print_exc()
    gathered = [None] * size
    dist.all_gather_object(gathered, results)
    dist.destroy_process_group()
    if rank == 0:
        merged = [r for part in gathered for r in part]
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"ep_multi_{size}.json"), "w") as f:
            json.dump(merged, f, indent=1)
        failed = sum(not r["ok"] for r in merged)
        print(f"{len(merged) - failed} passed, {failed} failed")
        return 1 if failed else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
