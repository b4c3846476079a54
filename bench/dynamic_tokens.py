#!/usr/bin/env python3
"""One compiled layer for every token count up to its bound, on the GPU (docs/dynamic-tokens.md).

Takes the layers scripts/inputs/build-dynamic-layers.sh compiles (linked into NAME.so by
scripts/gpu/layer-check.sh --only build with MOE_GPU_INPUTS=gpu-inputs/dynamic):

- correctness: for each configuration and each T of its NAME-tT layers, the dynamic layer
  NAME-dyn at T against NAME-tT, the layer compiled for exactly that T, on the same random
  inputs and cotangents: every output, saved tensor and gradient bitwise equal. NAME-tT run
  twice first: a layer that is not bitwise repeatable itself would make that comparison
  meaningless, and is reported;
- the sweep: small-dyn against each small-tT (50 token counts in [1, 1024]), bitwise;
- refusals: T = 0 and T = bound + 1 raise before any launch, and the C entry point called
  with them returns MOE_ERROR_INVALID_ARGUMENT with its message; _workspace_bytes(T) is -1
  outside [1, bound];
- CUDA graphs: a forward + backward of small-dyn at one T captured into a torch.cuda.CUDAGraph
  (no host synchronisation, no allocation outside the graph's pool) and replayed on new
  inputs copied into the captured ones: bitwise the eager step's results;
- CUDA graphs of the benchmark layers too, at T = 1000 (or the count nearest it);
- speed: forward + backward of NAME-dyn against NAME-tT, alternating, median of --steps after
  --warmup, CUDA events: the ratio, which the issue bounds by 1.02. Eager steps, and up to
  --graph-max-tokens also replays of each step captured in a CUDA graph: at small T an eager
  step waits on the host's issue time, and the graph ratio (the one judged there) is the GPU's;
- with --profile, where the time of a pair goes at the smallest T: each layer's kernels (GPU
  time a step, from torch.profiler) and the host time to issue a step.

Prints one table and "N passed, M failed" last; JSON to $OUT/dynamic_tokens.json.

    python3 bench/dynamic_tokens.py --dir gpu-inputs/dynamic/layers
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import re
import statistics
import sys
import traceback
from typing import Any, Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

from moe_mlir import gpu  # noqa: E402

results: List[Dict[str, Any]] = []


def record(kind: str, name: str, ok: bool, **detail) -> None:
    results.append({"kind": kind, "name": name, "ok": ok, **detail})
    print(f"{'PASS' if ok else 'FAIL'} {kind} {name} {json.dumps(detail)}", flush=True)


def load(path: str) -> gpu.CompiledLayer:
    return gpu.CompiledLayer(path + ".so")


def make_inputs(torch, layer: gpu.CompiledLayer, tokens: int, gen) -> Dict[str, Any]:
    """Random inputs at `tokens` tokens: x ~ N(0, 1), weights N(0, 0.02^2), a bias N(0, 0.01^2)."""
    ep = layer.manifest.forward
    ep = ep.at(tokens) if ep.max_tokens else ep
    inputs = {}
    for spec in ep.by_role("input"):
        name = layer.input_name(spec.name)
        std = 1.0 if name == "x" else 0.01 if name == "bias" else 0.02
        value = torch.randn(spec.shape, generator=gen, device="cuda", dtype=torch.float32) * std
        inputs[spec.name] = value.to(gpu.torch_dtype(spec.dtype))
    return inputs


def make_cotangents(torch, layer: gpu.CompiledLayer, tokens: int, gen) -> Dict[str, Any]:
    ep = layer.manifest.entry("backward")
    ep = ep.at(tokens) if ep.max_tokens else ep
    return {
        spec.name: (torch.randn(spec.shape, generator=gen, device="cuda") * 0.1).to(
            gpu.torch_dtype(spec.dtype)
        )
        for spec in ep.by_role("cotangent")
    }


def step(layer: gpu.CompiledLayer, inputs, cotangents) -> Dict[str, Any]:
    fwd = layer.forward(inputs)
    grads = layer.backward(fwd, cotangents)
    out = {k: v for k, v in fwd.items() if k not in inputs}
    out.update(grads)
    return out


def compare(torch, a: Dict[str, Any], b: Dict[str, Any]) -> Tuple[bool, Dict[str, float]]:
    """Bitwise equality of every tensor both hold; the largest difference of each that is not."""
    diffs = {}
    for name in sorted(set(a) & set(b)):
        x, y = a[name], b[name]
        if x.shape != y.shape or not torch.equal(x, y):
            diffs[name] = (
                float((x.float() - y.float()).abs().max()) if x.shape == y.shape else float("inf")
            )
    return not diffs and set(a) == set(b), diffs


def check_pair(torch, dynamic, fixed, tokens: int, name: str, seed: int) -> None:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    inputs = make_inputs(torch, fixed, tokens, gen)
    cots = make_cotangents(torch, fixed, tokens, gen)
    first = step(fixed, inputs, cots)
    again = step(fixed, inputs, cots)
    repeatable, _ = compare(torch, first, again)
    ours = step(dynamic, inputs, cots)
    equal, diffs = compare(torch, ours, first)
    record(
        "bitwise",
        f"{name} T={tokens}",
        equal,
        static_repeatable=repeatable,
        differing=diffs,
    )
    del first, again, ours
    torch.cuda.empty_cache()


def check_refusals(torch, dynamic, name: str) -> None:
    bound = dynamic.manifest.max_tokens
    gen = torch.Generator(device="cuda").manual_seed(1)
    ok = True
    detail = {}
    for tokens in (0, bound + 1):
        inputs = make_inputs(torch, dynamic, 1, gen)
        x = dynamic.manifest.input_names["x"]
        inputs[x] = torch.zeros((tokens, inputs[x].shape[1]), dtype=inputs[x].dtype, device="cuda")
        try:
            dynamic.forward(inputs)
            ok = False
            detail[f"T={tokens}"] = "no exception"
        except ValueError as e:
            detail[f"T={tokens}"] = str(e)[:120]
    # The C entry point itself, with valid pointers and a T outside the bound.
    ep = dynamic.manifest.forward
    fn = dynamic._fns["forward"]
    buffers = [torch.empty(64, dtype=torch.int64, device="cuda") for _ in ep.params]
    for tokens in (0, bound + 1):
        status = fn(
            ctypes.c_void_p(torch.cuda.current_stream().cuda_stream or gpu.CU_STREAM_LEGACY),
            ctypes.c_int64(tokens),
            *[ctypes.c_void_p(b.data_ptr()) for b in buffers],
        )
        message = dynamic._last_message()
        detail[f"entry T={tokens}"] = f"{status}: {message}"
        ok &= status == 3 and "outside [1, " in message
    ok &= dynamic.workspace_bytes("forward", bound + 1) == -1
    ok &= dynamic.workspace_bytes("forward", bound) > 0
    record("refusal", name, ok, **detail)


def check_graph(torch, dynamic, tokens: int, name: str) -> None:
    gen = torch.Generator(device="cuda").manual_seed(7)
    inputs = make_inputs(torch, dynamic, tokens, gen)
    cots = make_cotangents(torch, dynamic, tokens, gen)
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step(dynamic, inputs, cots)  # warm-up: modules loaded, pools primed
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step(dynamic, inputs, cots)
        # New values into the captured inputs, then replay.
        gen2 = torch.Generator(device="cuda").manual_seed(8)
        fresh = make_inputs(torch, dynamic, tokens, gen2)
        fresh_cots = make_cotangents(torch, dynamic, tokens, gen2)
        for k, v in fresh.items():
            inputs[k].copy_(v)
        for k, v in fresh_cots.items():
            cots[k].copy_(v)
        graph.replay()
        torch.cuda.synchronize()
        replayed = {k: v.clone() for k, v in captured.items()}
        eager = step(dynamic, fresh, fresh_cots)
        equal, diffs = compare(torch, replayed, eager)
        graph.replay()
        torch.cuda.synchronize()
        again, _ = compare(torch, {k: v.clone() for k, v in captured.items()}, eager)
        record("cuda-graph", f"{name} T={tokens}", equal and again, differing=diffs)
    except Exception as e:  # noqa: BLE001
        record("cuda-graph", f"{name} T={tokens}", False, error=f"{type(e).__name__}: {e}"[:400])
        traceback.print_exc()


def graph_of(torch, layer, inputs, cots):
    """A forward + backward of `layer` on `inputs` captured into a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(layer, inputs, cots)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(layer, inputs, cots)
    return graph


def alternate(torch, runs, warmup: int, steps: int) -> Dict[str, float]:
    """The median time of each of `runs` (name -> callable), alternating their order."""
    times: Dict[str, List[float]] = {key: [] for key in runs}
    order = list(runs.items())
    for i in range(warmup + steps):
        for key, run in order[:: 1 if i % 2 == 0 else -1]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            if i >= warmup:
                times[key].append(start.elapsed_time(end))
    return {key: statistics.median(values) for key, values in times.items()}


def time_pair(
    torch, dynamic, fixed, tokens: int, name: str, warmup: int, steps: int, graphs: bool
) -> None:
    """Eager steps (what a Python caller sees, host time to issue the step included) and, with
    `graphs`, replays of each layer's step captured in a CUDA graph (the GPU's time alone: at
    small T an eager step is bound by the host's issue time, which is the same Python and the
    same launches for both layers)."""
    gen = torch.Generator(device="cuda").manual_seed(3)
    inputs = make_inputs(torch, fixed, tokens, gen)
    cots = make_cotangents(torch, fixed, tokens, gen)
    eager = alternate(
        torch,
        {"dyn": lambda: step(dynamic, inputs, cots), "static": lambda: step(fixed, inputs, cots)},
        warmup,
        steps,
    )
    detail = dict(
        dynamic_ms=round(eager["dyn"], 4),
        static_ms=round(eager["static"], 4),
        ratio=round(eager["dyn"] / eager["static"], 4),
    )
    ratio = detail["ratio"]
    if graphs:
        captured = {"dyn": graph_of(torch, dynamic, inputs, cots)}
        captured["static"] = graph_of(torch, fixed, inputs, cots)
        replay = alternate(torch, {k: g.replay for k, g in captured.items()}, warmup, steps)
        ratio = replay["dyn"] / replay["static"]
        detail.update(
            graph_dynamic_ms=round(replay["dyn"], 4),
            graph_static_ms=round(replay["static"], 4),
            graph_ratio=round(ratio, 4),
        )
        del captured
    record("speed", f"{name} T={tokens}", True, within_2_percent=ratio <= 1.02, **detail)
    torch.cuda.empty_cache()


def profile_pair(torch, dynamic, fixed, tokens: int, name: str, steps: int = 5) -> None:
    """Prints, for each layer of the pair, the GPU time a step of each kernel and the host time
    to issue a step: what a speed ratio above 1 is made of."""
    import cProfile
    import pstats
    import time

    from torch.profiler import ProfilerActivity, profile

    gen = torch.Generator(device="cuda").manual_seed(3)
    inputs = make_inputs(torch, fixed, tokens, gen)
    cots = make_cotangents(torch, fixed, tokens, gen)
    for key, layer in (("dyn", dynamic), ("static", fixed)):
        for _ in range(3):
            step(layer, inputs, cots)
        torch.cuda.synchronize()
        issue = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step(layer, inputs, cots)
            issue.append((time.perf_counter() - t0) * 1e3)
            torch.cuda.synchronize()
        host = cProfile.Profile()
        host.enable()
        for _ in range(steps):
            step(layer, inputs, cots)
        host.disable()
        torch.cuda.synchronize()
        print(f"profile {name} T={tokens} {key}: host functions, {steps} steps")
        pstats.Stats(host).sort_stats("tottime").print_stats(12)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step(layer, inputs, cots)
            torch.cuda.synchronize()
        kernels: Dict[str, List[float]] = {}
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                kernels.setdefault(ev.name, []).append(ev.device_time / 1e3)
        total = sum(sum(v) for v in kernels.values()) / steps
        print(
            f"profile {name} T={tokens} {key}: host issue {statistics.median(issue):.3f} ms, "
            f"GPU busy {total:.3f} ms a step"
        )
        for kname, times in sorted(kernels.items(), key=lambda kv: -sum(kv[1])):
            print(f"    {sum(times) / steps:8.4f} ms  x{len(times) // steps:<3d} {kname[:90]}")
        record(
            "profile",
            f"{name} T={tokens} {key}",
            True,
            host_ms=statistics.median(issue),
            gpu_ms=total,
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", default=os.path.join(ROOT, "gpu-inputs", "dynamic", "layers"))
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--only", default="", help="comma-separated configurations (default: all)")
    ap.add_argument("--profile", action="store_true", help="profile each pair at its smallest T")
    ap.add_argument(
        "--graph-max-tokens",
        type=int,
        default=1000,
        help="also time CUDA graph replays of each pair up to this T (0: never)",
    )
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/moe-gpu-out"))
    args = ap.parse_args()
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    names = sorted(
        {
            re.sub(r"-(dyn|t\d+)$", "", os.path.basename(p)[:-3])
            for p in glob.glob(os.path.join(args.dir, "*-dyn.so"))
        }
    )
    if args.only:
        names = [n for n in names if n in args.only.split(",")]
    if not names:
        print(f"no NAME-dyn.so in {args.dir}", file=sys.stderr)
        return 2
    for name in names:
        try:
            dynamic = load(os.path.join(args.dir, name + "-dyn"))
            check_refusals(torch, dynamic, name)
            counts = sorted(
                int(m.group(1))
                for p in glob.glob(os.path.join(args.dir, name + "-t*.so"))
                if (m := re.search(r"-t(\d+)\.so$", p))
            )
            for i, tokens in enumerate(counts):
                fixed = load(os.path.join(args.dir, f"{name}-t{tokens}"))
                check_pair(torch, dynamic, fixed, tokens, name, seed=100 + i)
                if name != "small":
                    time_pair(
                        torch,
                        dynamic,
                        fixed,
                        tokens,
                        name,
                        args.warmup,
                        args.steps,
                        graphs=tokens <= args.graph_max_tokens,
                    )
                    if args.profile and i == 0:
                        profile_pair(torch, dynamic, fixed, tokens, name)
                del fixed
            if name == "small":
                check_graph(torch, dynamic, counts[len(counts) // 2], name)
            else:
                check_graph(torch, dynamic, min(counts, key=lambda t: abs(t - 1000)), name)
        except Exception as e:  # noqa: BLE001
            record("error", name, False, error=f"{type(e).__name__}: {e}"[:400])
            traceback.print_exc()
        torch.cuda.empty_cache()

    print(
        "\nspeed: forward + backward, dynamic layer / layer compiled for exactly T (median);"
        " eager, then CUDA graph replays"
    )
    for r in results:
        if r["kind"] == "speed":
            graph = (
                f"   graph {r['graph_dynamic_ms']:9.3f} ms {r['graph_static_ms']:9.3f} ms "
                f"{r['graph_ratio']:.4f}"
                if "graph_ratio" in r
                else ""
            )
            print(
                f"  {r['name']:28s} {r['dynamic_ms']:9.3f} ms {r['static_ms']:9.3f} ms "
                f"{r['ratio']:.4f}{graph}"
            )
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "dynamic_tokens.json"), "w") as f:
        json.dump(results, f, indent=1)
    failed = sum(not r["ok"] for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
