#!/usr/bin/env python3
"""Offload of H on the CUDA path: how much of its copy time a stack of layers hides.

A stack of L layers (one `MoELayer` applied L times, so each application saves its own H; its
weights are shared, as a stack's compute and copies are the same either way), forward through
all, then backward, timed with H kept (`policy="keep"`) and with H offloaded to pinned host
memory (`policy="offload"`: moe_mlir.offload copies a layer's H out on a stream of its own
while the next layer's forward runs, and back one layer ahead in backward; the last layer's H,
whose backward comes first, stays on the device). The copy time is that of the bytes copied out
and back, on that stream alone. Hidden fraction = 1 - (offload - keep) / copies.
The target: at least 80% hidden on deepseek-v3. Also checked: the offloaded stack's output
and gradients equal the kept stack's bitwise, and the device memory held between forward and
backward.

    # the LLVM machine: compile the layer (policy keep, which offload runs on) into DIR
    python3 bench/offload_stack.py --prebuild gpu-inputs/offload --layers gpu-inputs/layers
    # the GPU machine (MOE_RUNTIME_LIB set; MOE_MLIR_PREBUILT gets DIR)
    python3 bench/offload_stack.py --run gpu-inputs/offload --out $OUT

Last line: "N passed, M failed". Writes offload_stack.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GIB = float(1 << 30)


def prebuild(folder: str, layers_dir: str, names: List[str]) -> int:
    from long_context import layer_configs  # noqa: PLC0415
    from moe_mlir import compile_cache as cc  # noqa: PLC0415

    os.makedirs(folder, exist_ok=True)
    os.environ["MOE_MLIR_CACHE"] = os.path.abspath(folder)
    configs = layer_configs(layers_dir, names)
    failed = 0
    for name, cfg in configs.items():
        try:
            entry = cc.build_gpu_entry(cfg, cc.BuildOptions(policy="keep"))
            print(f"PASS {name}: {entry.path}")
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    with open(os.path.join(folder, "stack.json"), "w") as f:
        json.dump({"layers": {n: dataclasses.asdict(c) for n, c in configs.items()}}, f, indent=1)
    print(f"{len(configs) - failed} passed, {failed} failed")
    return 1 if failed else 0


def run_stack(torch, layer, x, d_out, depth: int, iters: int) -> Dict[str, Any]:
    """Forward through `depth` applications of `layer`, backward; the median of `iters`
    steps after one warm-up; the bytes held after the forward (minus before) and the result."""

    def step():
        h = x
        for _ in range(depth):
            h = h + layer(h)  # a residual stream, as in a model
        return h

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    out = step()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    out.backward(d_out)
    result = {
        "out": out.detach().clone(),
        "x_grad": x.grad.clone(),
        "grads": {n: p.grad.clone() for n, p in layer.named_parameters()},
    }
    del out
    times = []
    for i in range(iters + 1):
        layer.zero_grad(set_to_none=True)
        x.grad = None
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step().backward(d_out)
        torch.cuda.synchronize()
        if i:
            times.append((time.perf_counter() - t0) * 1e3)
    return {
        "median_ms": statistics.median(times),
        "times_ms": times,
        "held_bytes": held,
        "result": result,
    }


def copy_time(torch, nbytes: int, iters: int) -> float:
    """ms to copy `nbytes` device -> pinned host -> device on a stream of its own."""
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    stream = torch.cuda.Stream()
    times = []
    for i in range(iters + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.cuda.stream(stream):
            host.copy_(dev, non_blocking=True)
            dev.copy_(host, non_blocking=True)
        stream.synchronize()
        if i:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def run(folder: str, depth: int, iters: int, out_dir: str) -> int:
    import torch  # noqa: PLC0415
    from moe_mlir.config import LayerConfig  # noqa: PLC0415
    from moe_mlir.layer import MoELayer  # noqa: PLC0415
    from moe_mlir.offload import offloader  # noqa: PLC0415

    with open(os.path.join(folder, "stack.json")) as f:
        planned = json.load(f)
    os.environ["MOE_MLIR_PREBUILT"] = os.pathsep.join(
        p for p in (folder, os.environ.get("MOE_MLIR_PREBUILT", "")) if p
    )
    report: Dict[str, Any] = {"device": torch.cuda.get_device_name(), "depth": depth, "layers": {}}
    passed = failed = 0
    for name, fields in planned["layers"].items():
        cfg = LayerConfig(**fields)
        rep: Dict[str, Any] = {"config": fields}
        try:
            gen = torch.Generator(device="cuda").manual_seed(1)
            x = torch.randn(
                (cfg.tokens, cfg.hidden), generator=gen, device="cuda", dtype=torch.bfloat16
            ).requires_grad_(True)
            d_out = torch.randn(
                (cfg.tokens, cfg.hidden), generator=gen, device="cuda", dtype=torch.bfloat16
            )
            runs = {}
            state = None
            for policy in ("keep", "offload"):
                torch.manual_seed(0)
                layer = MoELayer(
                    dataclasses.replace(cfg, tokens=0),
                    policy=policy,
                    device="cuda",
                    dtype=torch.bfloat16,
                )
                if state is None:
                    if cfg.router_bias:
                        layer.router_bias.normal_(0.0, 0.01)
                    state = {k: v.clone() for k, v in layer.state_dict().items()}
                else:
                    layer.load_state_dict(state)
                before = offloader(torch.device("cuda")).offloaded_bytes
                runs[policy] = run_stack(torch, layer, x, d_out, depth, iters)
                runs[policy]["offloaded_bytes"] = (
                    offloader(torch.device("cuda")).offloaded_bytes - before
                )
                del layer
                x.grad = None
                gc.collect()
                torch.cuda.empty_cache()
            keep, off = runs["keep"], runs["offload"]
            rk, ro = keep.pop("result"), off.pop("result")
            same = (
                torch.equal(rk["out"], ro["out"])
                and torch.equal(rk["x_grad"], ro["x_grad"])
                and all(torch.equal(rk["grads"][n], ro["grads"][n]) for n in rk["grads"])
            )
            per_step = off["offloaded_bytes"] / (iters + 2)  # the untimed step, the warm-up
            copies = copy_time(torch, int(per_step / depth), iters) * depth
            hidden = 1.0 - (off["median_ms"] - keep["median_ms"]) / copies
            rep.update(
                keep=keep,
                offload=off,
                bitwise_equal=same,
                offloaded_bytes_per_step=per_step,
                copy_ms=copies,
                hidden_fraction=hidden,
            )
            ok = same and per_step > 0
            print(
                f"{name}: {depth} layers; keep {keep['median_ms']:.1f} ms, holds "
                f"{keep['held_bytes'] / GIB:.2f} GiB; offload {off['median_ms']:.1f} ms, holds "
                f"{off['held_bytes'] / GIB:.2f} GiB on the device; H out and back "
                f"{per_step / GIB:.2f} GiB a step, {copies:.1f} ms of copies alone; hidden "
                f"{hidden * 100:.0f}%; output and gradients bitwise equal: {same}",
                flush=True,
            )
        except Exception as e:  # noqa: BLE001
            import traceback  # noqa: PLC0415

            traceback.print_exc()
            rep["error"] = f"{type(e).__name__}: {e}"
            ok = False
            print(f"FAIL {name}: {rep['error']}", flush=True)
        report["layers"][name] = rep
        passed += ok
        failed += not ok
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "offload_stack.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not report["layers"] else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prebuild", metavar="DIR")
    p.add_argument("--run", metavar="DIR")
    p.add_argument("--layers", default=os.path.join(ROOT, "gpu-inputs", "layers"))
    p.add_argument("--only", default="deepseek-v3")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args(argv)
    if bool(args.prebuild) == bool(args.run) or args.depth < 1 or args.iters < 1:
        print(
            "offload_stack.py: give one of --prebuild DIR and --run DIR (depth, iters >= 1)",
            file=sys.stderr,
        )
        return 2
    names = [n for n in args.only.split(",") if n]
    if args.prebuild:
        return prebuild(args.prebuild, args.layers, names)
    return run(args.run, args.depth, args.iters, args.out)


if __name__ == "__main__":
    sys.exit(main())
