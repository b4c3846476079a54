#!/usr/bin/env python3
"""The expert-parallel layer with its step in chunks (`EPSpec.chunk_tokens`), measured on the
CPU path (docs/distributed.md, Chunks).

    python3 bench/ep_chunks.py [--quick] [--out ep_chunks.json]

For S = 2 and 4 ranks (gloo, one torch.multiprocessing process a rank) one layer is compiled
unchunked and in 2, 4 and 8 chunks (capacity: a chunk's T * k, never exceeded) and run on the
same random tokens and weights, forward + backward. Per setting:

- the output of every rank bitwise against the unchunked layer's, and the largest relative
  error of any gradient (the weights' gradients are summed over the chunks);
- moe-plan-memory's plan of the stages: the send block of one dispatch (S * C rows) and the
  largest stage peak, both a chunk's;
- the step time (the slowest rank's, median of --steps, every setting interleaved) and its
  ratio to the unchunked step. On the CPU a chunk's all-to-all (gloo's threads) overlaps the
  next chunk's stages (native code, run without the GIL), which this measures; the CPU has
  few cores, so the ratio mostly shows what chunking costs in calls and small GEMMs.

JSON to --out, a table on stdout. --quick: a CI-sized run (test/Python/test_ep_chunks_bench.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from typing import Dict, List

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from ep_capacity import planned_memory, spawn_ranks  # noqa: E402

from moe_mlir.config import LayerConfig  # noqa: E402
from moe_mlir.distributed import EPLayer, EPSpec, shard_experts  # noqa: E402

FULL = dict(tokens=1024, hidden=128, ffn=256, chunks=(1, 2, 4, 8), steps=5)
QUICK = dict(tokens=32, hidden=16, ffn=24, chunks=(1, 4), steps=1)
EXPERTS, TOP_K = 8, 2


def _inputs(config: LayerConfig, size: int, seed: int):
    rng = np.random.default_rng(seed)
    d, n, e, t = config.hidden, config.ffn, config.experts, config.tokens
    shared = {
        "w_router": rng.normal(0, 1 / np.sqrt(d), (d, e)).astype(np.float32),
        "w_gate_up": rng.normal(0, 1 / np.sqrt(d), (e, d, 2 * n)).astype(np.float32),
        "w_down": rng.normal(0, 1 / np.sqrt(n), (e, n, d)).astype(np.float32),
    }
    return [
        (
            dict(shared, x=rng.normal(0, 1, (t, d)).astype(np.float32)),
            rng.normal(0, 1, (t, d)).astype(np.float32),
            rng.normal(0, 0.1, (t, e)).astype(np.float32),
        )
        for _ in range(size)
    ]


def _step(layer, local, d_out, d_logits, exchange):
    out, logits, saved = layer.forward(local, exchange)
    return out, layer.backward(saved, d_out, d_logits, exchange)


def _worker(rank, size, port, config, states, inputs, steps, queue):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        from moe_mlir.distributed import TorchExchange

        dist.init_process_group("gloo", rank=rank, world_size=size)
        exchange = TorchExchange()
        layers = {c: EPLayer.load(config, ep, state) for c, (ep, state) in states.items()}
        args, d_out, d_logits = inputs[rank]
        local = shard_experts(args, size, rank)
        results = {c: _step(layer, local, d_out, d_logits, exchange) for c, layer in layers.items()}
        times: Dict[int, List[float]] = {c: [] for c in layers}
        for _ in range(steps):
            for c, layer in layers.items():
                dist.barrier()
                t0 = time.perf_counter()
                _step(layer, local, d_out, d_logits, exchange)
                times[c].append(time.perf_counter() - t0)
        ref_out, ref_grads = results[1]
        report = {}
        for c, (out, grads) in results.items():
            worst = max(
                float(np.max(np.abs(grads[n] - g)) / (np.max(np.abs(g)) or 1.0))
                for n, g in ref_grads.items()
            )
            report[c] = {
                "bitwise": bool(np.array_equal(out, ref_out)),
                "grad_rel": worst,
                "times": times[c],
            }
        queue.put((rank, "ok", report))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        queue.put((rank, "error", traceback.format_exc()))


def measure_size(size: int, preset: dict, seed: int) -> List[dict]:
    t = preset["tokens"]
    config = LayerConfig(
        tokens=t, hidden=preset["hidden"], ffn=preset["ffn"], experts=EXPERTS, top_k=TOP_K
    )
    states, plans = {}, {}
    for c in preset["chunks"]:
        chunk = -(-t // c)
        ep = EPSpec(size, chunk * TOP_K, "error", chunk if c > 1 else None)
        states[c] = (ep, EPLayer(config, ep, max_tokens=t).state())
        plans[c] = planned_memory(config, ep) if c == 1 else _chunk_plan(config, ep)
    inputs = _inputs(config, size, seed)
    per_rank = spawn_ranks(_worker, size, (config, states, inputs, preset["steps"]))
    rows = []
    base = None
    for c in preset["chunks"]:
        slowest = [
            max(per_rank[r][c]["times"][i] for r in range(size)) for i in range(preset["steps"])
        ]
        ms = statistics.median(slowest) * 1e3
        base = base or ms
        rows.append(
            {
                "ranks": size,
                "chunks": c,
                "chunk_tokens": -(-t // c),
                "capacity": states[c][0].capacity,
                "bitwise": all(per_rank[r][c]["bitwise"] for r in range(size)),
                "grad_rel": max(per_rank[r][c]["grad_rel"] for r in range(size)),
                "step_ms": round(ms, 2),
                "ratio": round(ms / base, 3),
                **plans[c],
            }
        )
    return rows


def _chunk_plan(config: LayerConfig, ep: EPSpec) -> dict:
    """The plan of one chunk: the layer at the chunk's bound (the stages a chunk runs)."""
    import dataclasses

    return planned_memory(
        dataclasses.replace(config, tokens=ep.chunk_tokens),
        dataclasses.replace(ep, chunk_tokens=None),
    )


def table(rows: List[dict]) -> str:
    lines = [
        "ranks chunks chunk_T capacity bitwise grad_rel  send_block  stage_peak  step_ms ratio"
    ]
    for r in rows:
        lines.append(
            f"{r['ranks']:5d} {r['chunks']:6d} {r['chunk_tokens']:7d} {r['capacity']:8d} "
            f"{str(r['bitwise']):7s} {r['grad_rel']:8.1e} {r['send_block_bytes'] / 1024:8.0f} KiB "
            f"{r['stage_peak_bytes'] / 1024:7.0f} KiB {r['step_ms']:8.2f} {r['ratio']:5.3f}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a CI-sized run")
    ap.add_argument("--sizes", default="2,4", help="rank counts (default 2,4)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON results")
    args = ap.parse_args(argv)
    preset = QUICK if args.quick else FULL
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        rows += measure_size(size, preset, args.seed + size)
    print(table(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"preset": preset, "rows": rows}, f, indent=1)
    ok = all(r["bitwise"] and r["grad_rel"] <= 1e-5 for r in rows)
    print("PASS" if ok else "FAIL", "chunked steps equal the unchunked one")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
