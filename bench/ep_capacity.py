#!/usr/bin/env python3
"""The expert-parallel layer's per-source capacity, and a load-aware placement of its experts,
measured on the CPU path (docs/distributed.md, Capacity and load).

    python3 bench/ep_capacity.py [--quick] [--out ep_capacity.json]

For S = 2 and 4 ranks (gloo, one torch.multiprocessing process a rank, as
test/Python/test_ep_distributed.py) one small layer is compiled with `overflow="drop"` at each
capacity C of T*k (the default, never exceeded), 3/4, 1/2, 1/4 and 1/8 of it (1/S and 1/(2S) of
T*k among them), and run on:

- random routing (a random router), and
- skewed routing: a chosen fraction of each rank's tokens carry a feature that the router
  maps to rank 0's experts (both slots of those tokens land there), the rest random.

Each routing runs with the layer's own placement (rank r: experts [r E/S, (r+1) E/S)) and with
`moe_mlir.ep_placement.balanced_placement` computed from the expert counts of another batch of
the same distribution (a calibration step), the weights permuted to it. Per setting:

- dropped: the (token, slot) rows past the capacity (`EPLayer.dropped`, all ranks) over S T k,
  and the same predicted from the routing (each source-rank pair's rows past C);
- the most rows one source sends one rank, the most rows one rank receives (after the drop);
- the receive block per rank, S C d b bytes, and moe-plan-memory's plan of the stages at that
  capacity (the send block it plans, the largest stage peak, the stages' arenas; the plan the
  GPU path executes, the CPU path bufferizes on its own);
- the relative error (Frobenius, all ranks) of out and of dx against the uncapped layer with
  the layer's own placement on the same tokens;
- the CPU step time (forward + backward, the slowest rank's, median of --steps, every setting
  interleaved) and its ratio to the uncapped one of the same routing and placement.

JSON to --out, a table on stdout. --quick: a CI-sized run (test/Python/test_ep_capacity_bench.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import statistics
import sys
import time
import traceback
from typing import Dict, List, Sequence

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

from moe_mlir import memory_plot  # noqa: E402
from moe_mlir.config import LayerConfig  # noqa: E402
from moe_mlir.cpu import run_opt  # noqa: E402
from moe_mlir.distributed import EP_PRE_PASSES, EPLayer, EPSpec, shard_experts  # noqa: E402
from moe_mlir.ep_placement import (  # noqa: E402
    balanced_placement,
    expert_counts,
    identity_placement,
)
from moe_mlir.mlir_text import layer_mlir  # noqa: E402

FRACTIONS = (1.0, 0.75, 0.5, 0.25, 0.125)  # of T * k
FULL = dict(tokens=256, hidden=64, ffn=128, skews=(0.5, 0.9), steps=7)
QUICK = dict(tokens=32, hidden=16, ffn=24, skews=(0.75,), steps=2)
EXPERTS, TOP_K = 8, 2
ELEM = 4  # f32 on the CPU path


def config_of(preset: dict) -> LayerConfig:
    return LayerConfig(
        tokens=preset["tokens"],
        hidden=preset["hidden"],
        ffn=preset["ffn"],
        experts=EXPERTS,
        top_k=TOP_K,
        renormalize=True,
    )


def capacities(config: LayerConfig) -> List[int]:
    tk = config.tokens * config.top_k
    return sorted({max(1, int(tk * f)) for f in FRACTIONS}, reverse=True)


def planned_memory(config: LayerConfig, ep: EPSpec) -> dict:
    """moe-plan-memory's plan of the training stages (forward_stage*, backward_stage*)."""
    report = run_opt(
        layer_mlir(config, "moe_layer", ep=ep),
        [*EP_PRE_PASSES, "--moe-plan-memory=memory-report=-", "-o", "/dev/null"],
    )
    stages = [
        r
        for r in memory_plot.parse_reports(report)
        if r.forward.startswith(("moe_layer_forward_stage", "moe_layer_backward_stage"))
    ]
    if not stages:
        raise RuntimeError("moe-plan-memory reported no training stages")
    send = [
        b.size
        for r in stages
        if r.forward == "moe_layer_forward_stage0"
        for b in r.buffers
        if b.name == "moe.ep_pack.send"
    ]
    return {
        "send_block_bytes": send[0] if send else None,
        "stage_peak_bytes": max(r.peak for r in stages),
        "arena_bytes": sum(r.arena for r in stages),
        "stages": len(stages),
    }


# =========================================================================== inputs


def weights(config: LayerConfig, seed: int) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    d, n, e = config.hidden, config.ffn, config.experts
    w_router = rng.normal(0, 1 / np.sqrt(d), (d, e)).astype(np.float32)
    w_router[0] = 0.0  # feature 0 is the skew's: it only ever points at the hot experts
    return {
        "w_router": w_router,
        "w_gate_up": rng.normal(0, 1 / np.sqrt(d), (e, d, 2 * n)).astype(np.float32),
        "w_down": rng.normal(0, 1 / np.sqrt(n), (e, n, d)).astype(np.float32),
    }


def with_hot(w: Dict[str, np.ndarray], hot: Sequence[int]) -> Dict[str, np.ndarray]:
    w = dict(w)
    w["w_router"] = w["w_router"].copy()
    w["w_router"][0, list(hot)] = 1.0
    return w


def tokens_of(config: LayerConfig, seed: int, skew: float) -> np.ndarray:
    """x of one rank: a `skew` fraction of its tokens (exactly) with feature 0 = 12, which
    the router sends to the hot experts; the others 0 there."""
    rng = np.random.default_rng(seed)
    t, d = config.tokens, config.hidden
    x = rng.normal(0, 1, (t, d)).astype(np.float32)
    pulled = rng.permutation(t) < int(round(skew * t))
    x[:, 0] = np.where(pulled, 12.0, 0.0)
    return x


def chosen(logits: np.ndarray, k: int) -> np.ndarray:
    """The layer's experts from its logits (softmax is monotonic; no selection bias)."""
    return np.argsort(-logits, axis=1, kind="stable")[:, :k]


# =========================================================================== ranks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _step(layer, local, d_out, exchange):
    """One forward + backward: out, logits, the forward's dropped rows, the gradients."""
    out, logits, saved = layer.forward(local, exchange)
    dropped = layer.dropped.copy()
    d_logits = np.zeros(logits.shape, np.float32)
    grads = layer.backward(saved, d_out, d_logits, exchange)
    return out, logits, dropped, grads


def _rel(per_rank, capacity, key) -> float:
    """The Frobenius relative error over every rank's rows."""
    num = sum(r[capacity][f"{key}_err2"] for r in per_rank)
    den = sum(r[capacity][f"{key}_ref2"] for r in per_rank)
    return float(np.sqrt(num / den)) if den else 0.0


def _worker(rank, size, port, config, states, cases, steps, queue):
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        from moe_mlir.distributed import TorchExchange

        dist.init_process_group("gloo", rank=rank, world_size=size)
        exchange = TorchExchange()
        layers = {c: EPLayer.load(config, EPSpec(size, c, "drop"), s) for c, s in states.items()}
        uncapped = max(layers)
        inputs = [
            (shard_experts(case["args"][rank], size, rank), case["d_out"][rank]) for case in cases
        ]
        runs = []
        for local, d_out in inputs:
            per_c = {}
            for c, layer in layers.items():
                o, logits, dropped, grads = _step(layer, local, d_out, exchange)
                per_c[c] = {"out": o, "dx": grads["x"], "logits": logits, "dropped": dropped}
            runs.append(per_c)
        times = [{c: [] for c in layers} for _ in cases]
        for _ in range(steps):  # every case and capacity interleaved
            for i, (local, d_out) in enumerate(inputs):
                for c, layer in layers.items():
                    dist.barrier()
                    t0 = time.perf_counter()
                    _step(layer, local, d_out, exchange)
                    times[i][c].append(time.perf_counter() - t0)
        out = []
        for case, per_c, case_times in zip(cases, runs, times):
            ref = runs[case["ref"]][uncapped]
            ref_out, ref_dx = ref["out"].astype(np.float64), ref["dx"].astype(np.float64)
            out.append(
                {
                    c: {
                        "out_err2": float(np.sum((r["out"] - ref_out) ** 2)),
                        "out_ref2": float(np.sum(ref_out**2)),
                        "dx_err2": float(np.sum((r["dx"] - ref_dx) ** 2)),
                        "dx_ref2": float(np.sum(ref_dx**2)),
                        "experts": chosen(r["logits"], config.top_k),
                        "dropped": r["dropped"][0].tolist(),
                        "times": case_times[c],
                    }
                    for c, r in per_c.items()
                }
            )
        queue.put((rank, "ok", out))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        queue.put((rank, "error", traceback.format_exc()))


def spawn_ranks(worker, size: int, args: tuple, timeout: float = 900.0) -> Dict[int, object]:
    """`worker(rank, size, port, *args, queue)` in one spawned process a rank (each puts
    (rank, "ok" or "error", payload) on the queue); returns {rank: payload}, raising the
    first rank's error."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=worker, args=(r, size, port, *args, queue)) for r in range(size)]
    for p in procs:
        p.start()
    results = {}
    try:
        while len(results) < size:
            rank, status, payload = queue.get(timeout=timeout)
            if status == "error":
                raise RuntimeError(f"rank {rank} failed:\n{payload}")
            results[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    return results


def run_ranks(size, config, states, cases, steps, timeout=900.0):
    """Every case on `size` ranks, one process a rank; returns [case][rank] {capacity:
    measures}, each case's errors against the uncapped run of case `ref`."""
    results = spawn_ranks(_worker, size, (config, states, cases, steps), timeout)
    return [[results[r][i] for r in range(size)] for i in range(len(cases))]


# =========================================================================== one size


def measure_size(size: int, config: LayerConfig, preset: dict, seed: int) -> List[dict]:
    caps = capacities(config)
    layers = {c: EPLayer(config, EPSpec(size, c, "drop"), "moe_layer") for c in caps}
    states = {c: layer.state() for c, layer in layers.items()}
    plans = {c: planned_memory(config, EPSpec(size, c, "drop")) for c in caps}
    tk = config.tokens * config.top_k
    local = config.experts // size
    hot = list(range(local))  # rank 0's experts in the layer's own placement
    rng = np.random.default_rng(seed)
    d_outs = [
        rng.normal(0, 1, (config.tokens, config.hidden)).astype(np.float32) for _ in range(size)
    ]
    base = with_hot(weights(config, seed), hot)
    routings = [("random", 0.0)] + [(f"skew{s:g}", s) for s in preset["skews"]]

    # Each routing with the layer's own placement (its uncapped run the reference of both)
    # and with the placement balanced for a calibration batch of the same distribution.
    cases, placements = [], {}
    for i, (name, skew) in enumerate(routings):
        xs = [tokens_of(config, seed + 100 * i + r, skew) for r in range(size)]
        calib = [tokens_of(config, seed + 100 * i + 50 + r, skew) for r in range(size)]
        counts = np.stack(
            [expert_counts(chosen(x @ base["w_router"], TOP_K), EXPERTS) for x in calib]
        )
        placements[name] = balanced_placement(counts, size)
        placed = placements[name].permute(base)
        own = len(cases)
        for weights_of in (base, placed):
            args = [dict(weights_of, x=x) for x in xs]
            cases.append({"args": args, "d_out": d_outs, "ref": own})
    measured = run_ranks(size, config, states, cases, preset["steps"])

    rows = []
    for i, (name, skew) in enumerate(routings):
        for label, placement, per_rank in (
            ("own", identity_placement(EXPERTS, size), measured[2 * i]),
            ("balanced", placements[name], measured[2 * i + 1]),
        ):
            t_uncapped = None
            for c in caps:
                # Rows each source sends each rank, from the layer's own routing decisions
                # (in the placed numbering: the layer's experts are placed ones).
                pair = np.stack(
                    [
                        identity_placement(EXPERTS, size).pair_rows(
                            expert_counts(per_rank[r][c]["experts"], EXPERTS)
                        )[0]
                        for r in range(size)
                    ]
                )
                dropped = sum(sum(per_rank[r][c]["dropped"]) for r in range(size))
                predicted = int(np.maximum(pair - c, 0).sum())
                times = [
                    max(per_rank[r][c]["times"][s] for r in range(size))
                    for s in range(preset["steps"])
                ]
                t = statistics.median(times)
                if c == tk:
                    t_uncapped = t

                rows.append(
                    {
                        "ranks": size,
                        "routing": name,
                        "skew": skew,
                        "placement": label,
                        "order": placement.order.tolist(),
                        "capacity": c,
                        "capacity_of_tk": c / tk,
                        "dropped": dropped,
                        "dropped_predicted": predicted,
                        "dropped_fraction": dropped / (size * tk),
                        "max_pair_rows": int(pair.max()),
                        "max_received_rows": int(np.minimum(pair, c).sum(0).max()),
                        "recv_bytes": size * c * config.hidden * ELEM,
                        "plan": plans[c],
                        "out_rel_err": _rel(per_rank, c, "out"),
                        "dx_rel_err": _rel(per_rank, c, "dx"),
                        "step_ms": 1e3 * t,
                        "step_ratio": t / t_uncapped,
                        "times_ms": [1e3 * v for v in times],
                    }
                )
    return rows


def table(rows: List[dict]) -> str:
    head = (
        f"{'S':>2} {'routing':<9} {'placement':<9} {'C':>5} {'C/Tk':>6} {'dropped':>8} "
        f"{'pair max':>8} {'recv max':>8} {'recv KiB':>8} {'plan peak':>9} "
        f"{'out err':>8} {'dx err':>8} {'step ms':>8} {'ratio':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['ranks']:>2} {r['routing']:<9} {r['placement']:<9} {r['capacity']:>5} "
            f"{r['capacity_of_tk']:>6.3f} {r['dropped_fraction']:>8.4f} {r['max_pair_rows']:>8} "
            f"{r['max_received_rows']:>8} {r['recv_bytes'] / 1024:>8.1f} "
            f"{r['plan']['stage_peak_bytes']:>9} {r['out_rel_err']:>8.2e} "
            f"{r['dx_rel_err']:>8.2e} {r['step_ms']:>8.2f} {r['step_ratio']:>6.2f}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a CI-sized run")
    ap.add_argument("--sizes", default="2,4", help="rank counts, comma-separated")
    ap.add_argument("--steps", type=int, default=None, help="timed steps a setting")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON file")
    args = ap.parse_args(argv)
    preset = dict(QUICK if args.quick else FULL)
    if args.steps is not None:
        if args.steps < 1:
            ap.error("--steps must be at least 1")
        preset["steps"] = args.steps
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s]
    except ValueError:
        ap.error(f"--sizes takes integers, got {args.sizes!r}")
    bad = [s for s in sizes if s < 1 or EXPERTS % s]
    if not sizes or bad:
        ap.error(f"--sizes must divide {EXPERTS} experts, got {args.sizes!r}")
    config = config_of(preset)
    rows = []
    for size in sizes:
        rows += measure_size(size, config, preset, args.seed)
    report = {
        "config": dataclasses.asdict(config),
        "quick": args.quick,
        "steps": preset["steps"],
        "cpus": os.cpu_count(),
        "rows": rows,
    }
    print(
        f"T={config.tokens} a rank, d={config.hidden}, n={config.ffn}, E={EXPERTS}, "
        f"k={TOP_K}, f32; step: forward + backward, median of {preset['steps']}, "
        f"{os.cpu_count()} CPUs"
    )
    print(table(rows))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
