#!/usr/bin/env python3
"""The expert-parallel layer over one rank against the same layer unsplit, on the GPU
(docs/distributed.md).

Takes the layers scripts/inputs/build-ep-layers.sh compiles (NAME-ep1: the benchmark layer with
ep_size 1, split by moe-ep-stages into stages between its collectives) and the unsplit layers
of scripts/inputs/build-layers.sh (NAME), each linked into NAME.so by
scripts/gpu/layer-check.sh --only build, and runs both in one process with a NCCL group of one
rank (the stages' all-to-alls go through torch.distributed.all_to_all_single on the current
stream):

- correctness: the same random inputs and cotangents; the forward's output and logits bitwise
  equal to the unsplit layer's (each row meets the same GEMM tiles and the same combine); the
  gradients within BENCH.md's bf16 tolerance (the staged backward computes the routing-weight
  gradient as <dout, y> where the unsplit one fuses it as <dA, A>, and sums x's rows per token
  in slot order);
- speed: forward + backward of each, alternating, median of --steps after --warmup, CUDA
  events; the ratio staged / unsplit, which the issue bounds by 1.03, and each step's peak
  memory above its inputs;
- where NAME-ep1-chunk exists (the layer with ep_chunk_tokens: the step in chunks, each its
  own dispatch, pipelined), the same checks of it against the unsplit layer, its speed and
  peak reported without a bound.

Prints one line a check and "N passed, M failed" last; JSON to $OUT/ep_staged.json.

    python3 bench/ep_staged.py --ep-dir gpu-inputs/ep/layers --dir gpu-inputs/layers
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
from moe_mlir.distributed import GPUEPLayer  # noqa: E402

CONFIGS = ("mixtral-8x7b", "olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-v3")
results: List[Dict[str, Any]] = []


def record(kind: str, name: str, ok: bool, **detail) -> None:
    results.append({"kind": kind, "name": name, "ok": ok, **detail})
    print(f"{'PASS' if ok else 'FAIL'} {kind} {name} {json.dumps(detail)}", flush=True)


def inputs_of(torch, layer: gpu.CompiledLayer, gen) -> List[Any]:
    ep = layer.manifest.forward
    values = []
    for spec in ep.by_role("input"):
        name = layer.input_name(spec.name)
        std = 1.0 if name == "x" else 0.01 if name == "bias" else 0.02
        value = torch.randn(spec.shape, generator=gen, device="cuda", dtype=torch.float32) * std
        values.append(value.to(gpu.torch_dtype(spec.dtype)))
    return values


def rel(torch, a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def check_and_time(
    torch, name: str, plain: gpu.CompiledLayer, staged: GPUEPLayer, args, variant: str = ""
) -> None:
    """`variant` "": the staged layer, whose speed the issue bounds; "chunked": the layer in
    chunks (NAME-ep1-chunk), its speed and peak memory reported beside the unsplit layer's."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    args_list = inputs_of(torch, plain, gen)
    fwd = plain.manifest.forward
    named = {spec.name: v for spec, v in zip(fwd.by_role("input"), args_list)}
    bwd = plain.manifest.entry("backward")
    cots = [
        (torch.randn(spec.shape, generator=gen, device="cuda") * 0.1).to(
            gpu.torch_dtype(spec.dtype)
        )
        for spec in bwd.by_role("cotangent")
    ]
    cot_named = {spec.name: v for spec, v in zip(bwd.by_role("cotangent"), cots)}

    def plain_step():
        f = plain.forward(named)
        return f, plain.backward(f, cot_named)

    def staged_step():
        out = staged.forward(args_list)
        saved = out[2:]
        grads = staged.backward(saved, cots[0], cots[1])
        return out, grads

    (f, g), (s_out, s_grads) = plain_step(), staged_step()
    torch.cuda.synchronize()
    outs_equal = torch.equal(f["result0"], s_out[0]) and torch.equal(f["result1"], s_out[1])
    tag = f"{variant}-" if variant else ""
    record(f"{tag}forward-bitwise", name, bool(outs_equal))
    grad_names = [f"d_arg{i}" for i in staged.gradient_args]
    worst = {n: rel(torch, s, g[n]) for n, s in zip(grad_names, s_grads) if n in g}
    tolerance = 2e-2  # BENCH.md's bf16 gradient tolerance
    record(f"{tag}gradients", name, all(v <= tolerance for v in worst.values()), rel=worst)

    times: Dict[str, List[float]] = {"staged": [], "plain": []}
    runs = {"staged": staged_step, "plain": plain_step}
    for i in range(args.warmup + args.steps):
        for key in ("staged", "plain") if i % 2 == 0 else ("plain", "staged"):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            runs[key]()
            end.record()
            end.synchronize()
            if i >= args.warmup:
                times[key].append(start.elapsed_time(end))
    staged_ms, plain_ms = statistics.median(times["staged"]), statistics.median(times["plain"])
    ratio = staged_ms / plain_ms
    # Each step's peak above what is allocated before it (inputs, weights).
    peaks = {}
    for key in ("staged", "plain"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        runs[key]()
        torch.cuda.synchronize()
        peaks[key] = torch.cuda.max_memory_allocated() - base
    record(
        f"{tag}speed",
        name,
        ratio <= 1.03 or bool(variant),
        staged_ms=round(staged_ms, 3),
        plain_ms=round(plain_ms, 3),
        ratio=round(ratio, 4),
        staged_peak_mib=round(peaks["staged"] / 2**20, 1),
        plain_peak_mib=round(peaks["plain"] / 2**20, 1),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=os.path.join(ROOT, "gpu-inputs", "layers"))
    ap.add_argument("--ep-dir", default=os.path.join(ROOT, "gpu-inputs", "ep", "layers"))
    ap.add_argument("--only", default="", help="comma-separated configurations (default: all)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/moe-gpu-out"))
    args = ap.parse_args()
    import torch
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    names = [n for n in CONFIGS if not args.only or n in args.only.split(",")]
    for name in names:
        try:
            plain = gpu.CompiledLayer(os.path.join(args.dir, name + ".so"))
            staged = GPUEPLayer(os.path.join(args.ep_dir, name + "-ep1.so"))
            check_and_time(torch, name, plain, staged, args)
            del staged
            chunked = os.path.join(args.ep_dir, name + "-ep1-chunk.so")
            if os.path.exists(chunked):
                torch.cuda.empty_cache()
                check_and_time(torch, name, plain, GPUEPLayer(chunked), args, "chunked")
            del plain
        except Exception as e:  # noqa: BLE001
            record("error", name, False, error=f"{type(e).__name__}: {e}"[:400])
            traceback.print_exc()
        torch.cuda.empty_cache()
    dist.destroy_process_group()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ep_staged.json"), "w") as f:
        json.dump(results, f, indent=1)
    failed = sum(not r["ok"] for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
