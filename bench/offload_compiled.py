#!/usr/bin/env python3
"""Offload of H through the compiled entry points (moe-compile --policy=offload).

For each configuration NAME, the layers DIR/NAME (H kept) and DIR/NAME-offload (H in pinned
host memory between forward and backward: the forward entry point copies it out on the
runtime's copy stream, the backward's brings it back) run as a stack of `depth` applications
(shared weights, each layer's output the next one's input, then backward through all), with
the same inputs:

- keep: the kept layer;
- offload: the offloading layer, each backward starting its own prefetches;
- offload+early: the same, with the prefetch of layer i-1's H started before layer i's backward
  (`CompiledLayer.prefetch`, the runtime's moePrefetchSaved), so the copy overlaps it.

Checked: the offloading stack's outputs and gradients equal the kept stack's bitwise (both
offload variants). Measured (median of --iters after a warm-up): each variant's step, the
device bytes torch holds after the forwards, the H bytes on the host, and the copies' own time
(H out and back on a stream alone, per layer, times depth). Hidden fraction = 1 - (offload -
keep) / copies. The target: at least 80% hidden on deepseek-v3.

    python3 bench/offload_compiled.py --layers gpu-inputs/layers [--config NAME ...]

(the .so files are linked by scripts/gpu/layer-check.sh's build step). Last line: "N passed,
M failed". Writes offload_compiled.json to --out.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from typing import Any, Dict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from offload_stack import copy_time  # noqa: E402  (H out and back on a stream alone)

GIB = float(1 << 30)
CONFIGS = ["deepseek-v3", "mixtral-8x7b", "olmoe-1b-7b", "qwen3-30b-a3b"]


def digest(torch, t, chunk: int = 1 << 26):
    """Two integer sums over `t`'s bits (plain and position-weighted), chunk by chunk: equal
    for bitwise-equal tensors, and (almost surely) not otherwise. A stack's weight gradients
    are too large to keep for the comparison (deepseek-v3: 22 GiB a layer)."""
    bits = t.reshape(-1).view(torch.int16 if t.element_size() == 2 else torch.int32)
    plain = weighted = 0
    for start in range(0, bits.numel(), chunk):
        part = bits[start : start + chunk].to(torch.int64)
        plain += int(part.sum())
        weights = (
            torch.arange(start, start + part.numel(), device=part.device, dtype=torch.int64) % 65521
            + 1
        )
        weighted += int((part * weights).sum())
    return (tuple(t.shape), str(t.dtype), plain, weighted)


def run_stack(
    torch,
    layer,
    weights: Dict[str, Any],
    x_param: str,
    x,
    d_out,
    depth: int,
    early: bool,
    keep_results: bool = False,
):
    """One forward through `depth` applications and backward; the device bytes held after
    the forwards and, with keep_results, the output and a digest of every backward's
    gradients."""
    base = torch.cuda.memory_allocated()
    saved, h = [], x
    for _ in range(depth):
        fwd = layer.forward(dict(weights, **{x_param: h}))
        saved.append(fwd)
        h = fwd["result0"]
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    grads, d = [], d_out
    for i in reversed(range(depth)):
        if early:
            # this layer's own copy first (a no-op when it started a layer ago): the copy
            # stream runs in order, and this backward needs its H before the next one does
            layer.prefetch(saved[i])
            if i > 0:
                layer.prefetch(saved[i - 1])
        g = layer.backward(saved[i], {"d_result0": d})
        saved[i] = None
        d = g["d_" + x_param]
        if keep_results:
            grads.append({k: digest(torch, v) for k, v in g.items()})
        del g
    torch.cuda.synchronize()
    return h, grads, held


def time_stack(torch, layer, weights, x_param, x, d_out, depth: int, early: bool, iters: int):
    times = []
    for i in range(iters + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run_stack(torch, layer, weights, x_param, x, d_out, depth, early)
        if i:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), times


def same_bits(torch, a, b) -> bool:
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(
            a.view(torch.int16) if a.dtype == torch.bfloat16 else a,
            b.view(torch.int16) if b.dtype == torch.bfloat16 else b,
        )
    )


def check_config(torch, layers_dir: str, name: str, depth: int, iters: int) -> Dict[str, Any]:
    from bench import make_args  # noqa: PLC0415
    from check_layer import forward_param_names  # noqa: PLC0415
    from moe_mlir import torch_reference as TR  # noqa: PLC0415
    from moe_mlir.gpu import CompiledLayer  # noqa: PLC0415

    keep = CompiledLayer(os.path.join(layers_dir, name + ".so"))
    off = CompiledLayer(os.path.join(layers_dir, name + "-offload.so"))
    host = [p for p in off.manifest.forward.by_role("saved") if p.on_host]
    if not host:
        raise RuntimeError(f"{name}-offload saves nothing in host memory")
    cfg = TR.config_from_manifest(keep.layer)
    gen = torch.Generator(device="cuda").manual_seed(1234)
    args = make_args(torch, cfg, torch.device("cuda"), gen)
    d_out = torch.randn((cfg.tokens, cfg.hidden), generator=gen, device="cuda").to(torch.bfloat16)
    params = forward_param_names(keep, cfg)
    weights = {params[a]: t for a, t in args.items() if a != "x"}
    x_param, x = params["x"], args["x"]

    rep: Dict[str, Any] = {
        "depth": depth,
        "host_bytes_per_layer": sum(p.nbytes for p in host),
        "host_tensors": [p.name for p in host],
    }
    results = {}
    for label, layer, early in (
        ("keep", keep, False),
        ("offload", off, False),
        ("offload_early", off, True),
    ):
        out, grads, held = run_stack(
            torch, layer, weights, x_param, x, d_out, depth, early, keep_results=True
        )
        results[label] = (out, grads)
        del out
        gc.collect()
        median, times = time_stack(torch, layer, weights, x_param, x, d_out, depth, early, iters)
        rep[label] = {"median_ms": median, "times_ms": times, "held_bytes": held}
        gc.collect()
    ref_out, ref_grads = results["keep"]
    for label in ("offload", "offload_early"):
        out, grads = results[label]
        same = same_bits(torch, out, ref_out) and grads == ref_grads
        rep[label]["bitwise_equal_to_keep"] = same
    copies = copy_time(torch, rep["host_bytes_per_layer"], iters) * depth
    rep["copy_ms"] = copies
    for label in ("offload", "offload_early"):
        rep[label]["hidden_fraction"] = (
            1.0 - (rep[label]["median_ms"] - rep["keep"]["median_ms"]) / copies
        )
    return rep


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default=os.path.join(ROOT, "gpu-inputs", "layers"))
    p.add_argument("--config", action="append", help=f"default: {', '.join(CONFIGS)}")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/moe-offload-out"))
    opts = p.parse_args(argv)
    import torch  # noqa: PLC0415

    report: Dict[str, Any] = {"device": torch.cuda.get_device_name(), "configs": {}}
    passed = failed = 0
    for name in opts.config or CONFIGS:
        try:
            rep = check_config(torch, opts.layers, name, opts.depth, opts.iters)
            ok = all(rep[v]["bitwise_equal_to_keep"] for v in ("offload", "offload_early"))
            k, o, e = rep["keep"], rep["offload"], rep["offload_early"]
            print(
                f"{name}: {opts.depth} layers; keep {k['median_ms']:.1f} ms, holds "
                f"{k['held_bytes'] / GIB:.2f} GiB; offload {o['median_ms']:.1f} ms, holds "
                f"{o['held_bytes'] / GIB:.2f} GiB on the device and "
                f"{rep['host_bytes_per_layer'] * opts.depth / GIB:.2f} GiB on the host; "
                f"early prefetch {e['median_ms']:.1f} ms; copies alone {rep['copy_ms']:.1f} "
                f"ms; hidden {o['hidden_fraction'] * 100:.0f}% / "
                f"{e['hidden_fraction'] * 100:.0f}% (early); bitwise equal to keep: {ok}",
                flush=True,
            )
        except Exception as exc:  # noqa: BLE001 - the other configurations still run
            import traceback  # noqa: PLC0415

            traceback.print_exc()
            rep, ok = {"error": f"{type(exc).__name__}: {exc}"}, False
            print(f"FAIL {name}: {rep['error']}", flush=True)
        report["configs"][name] = rep
        passed += ok
        failed += not ok
        gc.collect()
        torch.cuda.empty_cache()
    os.makedirs(opts.out, exist_ok=True)
    with open(os.path.join(opts.out, "offload_compiled.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
