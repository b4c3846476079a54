#!/usr/bin/env python3
"""Long context: the largest token count T whose MoE layer fits a fixed activation
budget, ours (H kept, H recomputed) against the Hugging Face `grouped_mm` Mixtral block.

"Fits" means: the bytes the layer holds from the end of its forward to its backward are at most
the budget (default 4 GiB): what torch sees allocated after the forward minus before it (the
saved tensors and the outputs), plus the input x [T, d], which both keep for backward (ours
saves it; HF's router saves it for its weight gradient) but which was allocated before. That
is the per-layer activation memory a model multiplies by its layer count.

Two steps, because the GPU machine has no compiler:

    # the LLVM machine: plan ours' largest T per layer and policy with moe-opt's activation
    # plan (exact bytes), compile those layers into gpu-inputs/long-context (MOE_MLIR_CACHE
    # layout) and write plan.json there
    python3 bench/long_context.py --prebuild gpu-inputs/long-context --layers gpu-inputs/layers

    # the GPU machine (MOE_MLIR_PREBUILT=gpu-inputs/long-context, MOE_RUNTIME_LIB): run ours at
    # the planned T (held bytes measured, forward + backward timed), and find HF's largest T
    # by measuring its held bytes (a line through two token counts, then checked at the
    # answer and one step past it)
    python3 bench/long_context.py --run gpu-inputs/long-context --out $OUT

T is a multiple of --step (256). The ratio ours / HF of the largest T is the long-context gain
(the target: at least 2x). Last line: "N passed, M failed" (a layer passes when ours at its
planned T holds at most the budget and its forward + backward runs). Writes long_context.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GIB = 1 << 30
POLICIES = ("keep", "recompute")
DEFAULT_LAYERS = ["mixtral-8x7b", "olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-v3"]


def parse_bytes(text: str) -> int:
    """ "4GiB", "512MiB", "1000000B" or a plain integer, as bytes."""
    units = {"GiB": 1 << 30, "MiB": 1 << 20, "KiB": 1 << 10, "B": 1}
    unit = next((unit for unit in units if text.endswith(unit)), None)
    if unit:
        number, scale = text[: -len(unit)].strip(), units[unit]
    else:
        number, scale = text.strip(), 1
    try:
        value = float(number) * scale
    except ValueError:
        raise ValueError(f"bad byte count {text!r} (say 4GiB, 512MiB or 1000000B)") from None
    if value < 1 or not math.isfinite(value):
        raise ValueError(f"bad byte count {text!r}: must be at least 1 byte")
    return int(value)


def layer_configs(layers_dir: str, names: List[str]):
    """name -> LayerConfig from moe-compile's manifests (NAME.json) of the benchmark layers."""
    from moe_mlir import torch_reference as TR  # noqa: PLC0415

    configs = {}
    for name in names:
        path = os.path.join(layers_dir, f"{name}.json")
        with open(path) as f:
            configs[name] = TR.config_from_manifest(json.load(f)["layer"])
    return configs


def output_bytes(cfg, tokens: int) -> int:
    """What the forward returns besides its saved tensors: out [T, d] bf16, logits [T, E] f32."""
    return tokens * (2 * cfg.hidden + 4 * cfg.experts)


def input_bytes(cfg, tokens: int, element: int = 2) -> int:
    """x [T, d]: held for backward by ours and HF alike, allocated before the forward."""
    return tokens * cfg.hidden * element


def largest_tokens(held: Callable[[int], int], budget: int, step: int, hint: int) -> int:
    """The largest multiple of `step` whose held(T) <= budget (held grows with T), found from
    `hint` by doubling or halving, then bisection; 0 when even `step` does not fit."""
    if held(step) > budget:
        return 0
    lo = max(step, hint // step * step)
    if held(lo) <= budget:
        hi = lo * 2
        while held(hi) <= budget:
            lo, hi = hi, hi * 2
    else:
        hi = lo
        lo = max(step, lo // 2 // step * step)
        while held(lo) > budget:
            hi, lo = lo, max(step, lo // 2 // step * step)
    while hi - lo > step:  # held(lo) fits, held(hi) does not
        mid = (lo + hi) // 2 // step * step
        if held(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def plan(configs, budget: int, step: int) -> Dict[str, Any]:
    """Ours' largest T per layer and policy, from moe-opt's activation plan (exact bytes)."""
    from moe_mlir.memory import plan_activations  # noqa: PLC0415

    out: Dict[str, Any] = {}
    for name, cfg in configs.items():
        out[name] = {}
        for policy in POLICIES:
            cache: Dict[int, int] = {}

            # moe-opt's plan counts x among the saved tensors.
            def held(tokens, cfg=cfg, policy=policy, cache=cache):
                if tokens not in cache:
                    p = plan_activations(dataclasses.replace(cfg, tokens=tokens), None, policy)
                    cache[tokens] = p.planned_bytes + output_bytes(cfg, tokens)
                return cache[tokens]

            t = largest_tokens(held, budget, step, cfg.tokens)
            out[name][policy] = {
                "tokens": t,
                "held_bytes": held(t) if t else None,
                "next_held_bytes": held(t + step),
            }
            print(
                f"plan {name} {policy}: T = {t} holds {held(t) / GIB:.3f} GiB "
                f"(T + {step}: {held(t + step) / GIB:.3f} GiB)",
                flush=True,
            )
    return out


def prebuild(folder: str, layers_dir: str, names: List[str], budget: int, step: int) -> int:
    from moe_mlir import compile_cache as cc  # noqa: PLC0415
    from moe_mlir.gpu import Manifest  # noqa: PLC0415

    os.makedirs(folder, exist_ok=True)
    os.environ["MOE_MLIR_CACHE"] = os.path.abspath(folder)
    configs = layer_configs(layers_dir, names)
    planned = plan(configs, budget, step)
    failed = 0
    for name, cfg in configs.items():
        for policy in POLICIES:
            t = planned[name][policy]["tokens"]
            t0 = time.time()
            try:
                entry = cc.build_gpu_entry(
                    dataclasses.replace(cfg, tokens=t), cc.BuildOptions(policy=policy)
                )
                # The compiled layer's saved tensors are what the plan counted.
                manifest = Manifest.load(str(entry.path / f"{entry.name}.json"))
                saved = manifest.saved_bytes() + output_bytes(cfg, t) + input_bytes(cfg, t)
                want = planned[name][policy]["held_bytes"]
                if saved != want:
                    raise RuntimeError(
                        f"the compiled layer holds {saved} B, the plan said {want} B"
                    )
                print(
                    f"PASS {name} {policy} T={t}: holds {saved} B; {entry.path} "
                    f"({time.time() - t0:.1f} s)"
                )
            except Exception as e:  # noqa: BLE001
                failed += 1
                print(f"FAIL {name} {policy} T={t}: {type(e).__name__}: {e}")
    with open(os.path.join(folder, "plan.json"), "w") as f:
        json.dump(
            {
                "budget_bytes": budget,
                "step": step,
                "layers": {
                    name: {"config": dataclasses.asdict(cfg), **planned[name]}
                    for name, cfg in configs.items()
                },
            },
            f,
            indent=1,
        )
    print(f"{2 * len(configs) - failed} passed, {failed} failed")
    return 1 if failed else 0


# --------------------------------------------------------------------------- the GPU side


def sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def allocated(torch, device) -> int:
    return torch.cuda.memory_allocated() if device.type == "cuda" else 0


def measure(torch, device, forward: Callable, x, d_out, iters: int) -> Dict[str, Any]:
    """Held bytes (allocated after forward minus before, plus x), then forward + backward:
    the median time of `iters` steps after one warm-up, and the peak above the start."""
    sync(torch, device)
    base = allocated(torch, device)
    out = forward()
    sync(torch, device)
    res = {"held_bytes": allocated(torch, device) - base + x.numel() * x.element_size()}
    out.backward(d_out)
    del out
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(iters + 1):
        sync(torch, device)
        t0 = time.perf_counter()
        forward().backward(d_out)
        sync(torch, device)
        if i:
            times.append((time.perf_counter() - t0) * 1e3)
    res["median_ms"] = statistics.median(times)
    if device.type == "cuda":
        res["peak_bytes"] = torch.cuda.max_memory_allocated() - base
    return res


def hf_block(torch, cfg, device, dtype):
    """HF's Mixtral block with `grouped_mm` experts and cfg's sizes (deepseek-v3's too, as
    docs/benchmarks.md measures it: the Mixtral block with E = 256, k = 8)."""
    from transformers import MixtralConfig  # noqa: PLC0415
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock  # noqa

    hc = MixtralConfig(
        hidden_size=cfg.hidden,
        intermediate_size=cfg.ffn,
        num_local_experts=cfg.experts,
        num_experts_per_tok=cfg.top_k,
    )
    hc._experts_implementation = "grouped_mm"
    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(hc).to(device=device, dtype=dtype)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.02)
    return block


def run_hf(
    torch, cfg, device, dtype, budget: int, step: int, hint: int, iters: int
) -> Dict[str, Any]:
    block = hf_block(torch, cfg, device, dtype)
    gen = torch.Generator(device=device).manual_seed(1)
    cache: Dict[int, int] = {}

    def held(tokens: int) -> int:
        if tokens not in cache:
            x = torch.randn(
                (1, tokens, cfg.hidden), generator=gen, device=device, dtype=dtype
            ).requires_grad_(True)
            sync(torch, device)
            base = allocated(torch, device)
            out = block(x)
            sync(torch, device)
            cache[tokens] = allocated(torch, device) - base + x.numel() * x.element_size()
            del out, x
            gc.collect()
        return cache[tokens]

    if device.type != "cuda":
        # No allocator statistics on the CPU: the plan of the dry run only.
        return {"tokens": 0, "note": "held bytes are measured on CUDA only"}
    # A line through two measured token counts, then the search from its answer.
    t1, t2 = max(step, hint // 4 // step * step), max(2 * step, hint // 2 // step * step)
    slope = (held(t2) - held(t1)) / (t2 - t1)
    guess = int((budget - held(t1)) / slope) + t1 if slope > 0 else hint
    t = largest_tokens(held, budget, step, guess)
    res = {
        "tokens": t,
        "held_bytes": held(t),
        "next_held_bytes": held(t + step),
        "bytes_per_token": slope,
        "measured_token_counts": sorted(cache),
    }
    x = torch.randn((1, t, cfg.hidden), generator=gen, device=device, dtype=dtype).requires_grad_(
        True
    )
    d_out = torch.randn_like(x)
    res.update(
        {
            k: v
            for k, v in measure(torch, device, lambda: block(x), x, d_out, iters).items()
            if k != "held_bytes"
        }
    )
    block = x = d_out = None  # frees them; the closures above name them
    return res


def run_ours(torch, cfg, policy: str, tokens: int, device, iters: int) -> Dict[str, Any]:
    from moe_mlir.layer import MoELayer  # noqa: PLC0415

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    layer = MoELayer(dataclasses.replace(cfg, tokens=0), policy=policy, device=device, dtype=dtype)
    if cfg.router_bias:
        layer.router_bias.normal_(0.0, 0.01)
    gen = torch.Generator(device=device).manual_seed(2)
    x = torch.randn((tokens, cfg.hidden), generator=gen, device=device, dtype=dtype)
    d_out = torch.randn_like(x)
    res = measure(torch, device, lambda: layer(x), x, d_out, iters)
    res["tokens"] = tokens
    layer = x = d_out = None  # frees them; the lambda above names them
    return res


def run(folder: str, names: Optional[List[str]], device, iters: int, out_dir: str) -> int:
    import torch  # noqa: PLC0415
    from moe_mlir.config import LayerConfig  # noqa: PLC0415

    with open(os.path.join(folder, "plan.json")) as f:
        planned = json.load(f)
    budget, step = planned["budget_bytes"], planned["step"]
    prebuilt = os.environ.get("MOE_MLIR_PREBUILT", "")
    if os.path.abspath(folder) not in [os.path.abspath(p) for p in prebuilt.split(os.pathsep) if p]:
        os.environ["MOE_MLIR_PREBUILT"] = os.pathsep.join(p for p in (folder, prebuilt) if p)
    report: Dict[str, Any] = {
        "budget_bytes": budget,
        "step": step,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "layers": {},
    }
    passed = failed = 0
    for name, entry in planned["layers"].items():
        if names and name not in names:
            continue
        cfg = LayerConfig(**entry["config"])
        rep: Dict[str, Any] = {}
        ok = True
        for policy in POLICIES:
            t = entry[policy]["tokens"]
            try:
                r = run_ours(torch, cfg, policy, t, device, iters)
                r["planned_held_bytes"] = entry[policy]["held_bytes"]
                r["fits"] = device.type != "cuda" or r["held_bytes"] <= budget
                ok &= r["fits"]
            except Exception as e:  # noqa: BLE001
                r = {"tokens": t, "error": f"{type(e).__name__}: {e}"}
                ok = False
            rep[policy] = r
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            print(f"{name} ours {policy}: {json.dumps(r)}", flush=True)
        try:
            rep["hf"] = run_hf(
                torch,
                cfg,
                device,
                torch.bfloat16 if device.type == "cuda" else torch.float32,
                budget,
                step,
                rep["keep"].get("tokens", 0),
                iters,
            )
        except Exception as e:  # noqa: BLE001
            rep["hf"] = {"tokens": 0, "error": f"{type(e).__name__}: {e}"}
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"{name} HF grouped_mm: {json.dumps(rep['hf'])}", flush=True)
        report["layers"][name] = rep
        passed += ok
        failed += not ok
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "long_context.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(
        f"\nlargest T holding at most {budget / GIB:g} GiB from forward to backward "
        f"(multiples of {step}):"
    )
    print(
        f"{'layer':16s} {'ours keep':>10s} {'recompute':>10s} {'HF':>8s} {'keep/HF':>8s} "
        f"{'recomp/HF':>9s} {'ms keep':>8s} {'ms recomp':>9s} {'ms HF':>8s}"
    )
    for name, rep in report["layers"].items():
        tk, tr, th = (rep[p].get("tokens", 0) for p in ("keep", "recompute", "hf"))

        def ratio(a, b):
            return f"{a / b:.2f}" if a and b else "-"

        def ms(r):
            return f"{r['median_ms']:.1f}" if "median_ms" in r else "-"

        print(
            f"{name:16s} {tk:10d} {tr:10d} {th:8d} {ratio(tk, th):>8s} {ratio(tr, th):>9s} "
            f"{ms(rep['keep']):>8s} {ms(rep['recompute']):>9s} {ms(rep['hf']):>8s}"
        )
    print(f"{passed} passed, {failed} failed")
    if not report["layers"]:
        print(
            f"long_context.py: none of {', '.join(names or [])} is in "
            f"{os.path.join(folder, 'plan.json')}",
            file=sys.stderr,
        )
        return 1
    return 1 if failed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--prebuild", metavar="DIR", help="plan and compile ours into DIR (LLVM machine)"
    )
    p.add_argument("--run", metavar="DIR", help="run the plan of DIR (GPU machine)")
    p.add_argument(
        "--layers",
        default=os.path.join(ROOT, "gpu-inputs", "layers"),
        help="moe-compile manifests of the benchmark layers (NAME.json)",
    )
    p.add_argument("--only", default=",".join(DEFAULT_LAYERS))
    p.add_argument("--budget", default="4GiB")
    p.add_argument("--step", type=int, default=256)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    try:
        budget = parse_bytes(args.budget)
    except ValueError as e:
        print(f"long_context.py: {e}", file=sys.stderr)
        return 2
    if args.step < 1:
        print("long_context.py: --step must be at least 1", file=sys.stderr)
        return 2
    if bool(args.prebuild) == bool(args.run):
        print("long_context.py: give one of --prebuild DIR and --run DIR", file=sys.stderr)
        return 2
    if args.prebuild:
        return prebuild(args.prebuild, args.layers, names, budget, args.step)
    import torch  # noqa: PLC0415

    return run(args.run, names, torch.device(args.device), args.iters, args.out)


if __name__ == "__main__":
    sys.exit(main())
