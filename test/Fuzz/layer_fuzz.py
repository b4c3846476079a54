#!/usr/bin/env python3
"""Structure-aware fuzzing of the compiler: random but well-formed `moe.layer` modules through
every pipeline and moe-compile.

Mutating the text of known-good tests rarely gets past the parser and the verifiers; these
modules do, by construction, and then probe what the passes assume: every routing option,
shared experts, router bias, capacity factors (on layers the GPU path takes too), the three
element types and the four activations (gelu_tanh too; non-gated experts on GPU-bound layers),
expert biases, dynamic dimensions, sizes at and past every limit (zero, one, 2^31, 2^62, d and
n off the GPU's tiles), extra returns (logits, an argument returned as it is), several
functions, moe.update_selection_bias functions (alone, or as the forward and empty backward
pair moe-compile takes), and layers inside a nested module. The choices added after the first
ones (gelu_tanh, non-gated and capacity on GPU-bound layers, expert biases, the bias updates)
come from a second generator of the same seed, so a seed keeps the layers it gave before.
Each module runs through:

    moe-opt --moe-decompose [--moe-generate-backward]
    moe-opt --moe-decompose --moe-plan-activations=policy=P --moe-generate-backward
            --moe-offload --moe-plan-memory             (P: auto, keep, recompute, offload)
    moe-opt --moe-decompose --moe-generate-backward --moe-lower-to-cpu-pipeline
    moe-opt --moe-training-pipeline[=chip=sm_90a format=isa]
    moe-compile --format=isa

with verification after each pass turned off, so that IR a pass breaks is found by parsing
its output again. A run fails on a crash (a signal, "LLVM ERROR", a sanitizer report), a tool
that fails without a diagnostic, a tool that takes longer than --timeout and then twice that
again, or output that does not parse and verify. Failing modules are kept in --out with the command that failed.

    python3 test/Fuzz/layer_fuzz.py --build build --seconds 60 [--seed N] [--out DIR]

The last line is "N passed, M failed" (one per module); the exit status is 1 on any failure.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional, Tuple

ELEMENTS = ("f32", "bf16", "f16")
ACTIVATIONS = ("swiglu", "gelu", "silu")
HUGE = (2**31, 2**31 - 1, 2**62, 4611686018427387904)


def pick_size(rng: random.Random, small: Tuple[int, ...], dynamic: bool) -> str:
    """A dimension: mostly small and valid, sometimes 0, a limit, past a limit, or `?`."""
    roll = rng.random()
    if dynamic and roll < 0.1:
        return "?"
    if roll < 0.15:
        return str(rng.choice((0, 1) + HUGE))
    if roll < 0.25:
        return str(rng.choice((63, 65, 65536, 65600, 131072)))
    return str(rng.choice(small))


def tensor(dims: List[str], element: str) -> str:
    return "tensor<" + "".join(f"{d}x" for d in dims) + element + ">"


def mul(a: str, b: int) -> str:
    return "?" if a == "?" else str(int(a) * b)


def random_layer(
    rng: random.Random, name: str, ext: Optional[random.Random] = None
) -> Tuple[str, List[str]]:
    """One func.func holding a moe.layer, and its arguments' types. A third of the layers fit
    the GPU path (bf16, d and n multiples of 64), a third the CPU path (any options), and a
    third are sized at and past the limits (and often invalid). `ext` makes the later choices
    (gelu_tanh, non-gated experts and capacity factors on GPU-bound layers, expert biases)
    without moving `rng`'s draws."""
    ext = ext or random.Random(0)
    mode = rng.choice(("gpu", "cpu", "limits"))
    dynamic = mode != "gpu" and rng.random() < 0.3
    if mode == "limits":
        tokens = pick_size(rng, (1, 2, 3, 8, 37, 64, 100), dynamic)
        d = pick_size(rng, (4, 8, 16, 48, 64, 128), dynamic)
        n = pick_size(rng, (4, 8, 40, 64, 128), dynamic)
        experts = rng.choice((1, 2, 3, 4, 5, 8, 16, 64, 256, 1024, 1025))
        top_k = rng.choice((1, 2, min(experts, 4), experts, experts + 1))
    else:
        tokens = "?" if dynamic and rng.random() < 0.5 else str(rng.choice((1, 2, 7, 37, 64)))
        tiles = (64, 128) if mode == "gpu" else (4, 8, 16, 48)
        d, n = str(rng.choice(tiles)), str(rng.choice(tiles))
        if dynamic and rng.random() < 0.3:
            n = "?"
        experts = rng.choice((1, 2, 4, 8, 16, 64))
        top_k = rng.randint(1, min(experts, 8))
    element = "bf16" if mode == "gpu" else rng.choice(ELEMENTS)
    activation = "swiglu" if mode == "gpu" else rng.choice(ACTIVATIONS)
    if mode == "gpu" and ext.random() < 0.4:  # the GPU path's non-gated experts
        activation = ext.choice(("silu", "gelu", "gelu_tanh"))
    elif activation in ("gelu", "silu") and ext.random() < 0.4:
        activation = "gelu_tanh"
    scoring = rng.choice(("softmax", "sigmoid"))
    routing = [f"scoring = {scoring}", f"top_k = {top_k}"]
    if rng.random() < 0.5:
        routing.append("renormalize = true")
    if rng.random() < 0.3:
        groups = rng.choice((1, 2, 4, 8, 3) if mode == "limits" else (1, 2, 4))
        if mode != "limits" and experts % groups:
            groups = 1
        routing.append(f"num_groups = {groups}")
        top = rng.choice((1, 2, groups, groups + 1) if mode == "limits" else (1, groups))
        routing.append(f"topk_groups = {top}")
    if rng.random() < 0.2:
        routing.append(f"scaling_factor = {rng.choice(('2.5', '1.0', '0.0', '-1.0'))}")
    if rng.random() < 0.2:
        routing.append("round_logits = true")
    attrs = [f"activation = #moe.activation<{activation}>"]
    if mode != "gpu" and rng.random() < 0.15:
        attrs.append(f"capacity_factor = {rng.choice(('1.0', '1.25', '0.5', '0.0'))} : f64")
    elif mode == "gpu" and ext.random() < 0.3:
        attrs.append(f"capacity_factor = {ext.choice(('0.75', '1.0', '1.25', '0.25'))} : f64")
    attrs.append("routing = #moe.routing<" + ", ".join(routing) + ">")

    width = mul(n, 2) if activation == "swiglu" else n
    x_t = tensor([tokens, d], element)
    wr_t = tensor([d, str(experts)], element)
    wgu_t = tensor([str(experts), d, width], element)
    wd_t = tensor([str(experts), n, d], element)
    args = [("x", x_t), ("w_router", wr_t)]
    extras = ""
    if scoring == "sigmoid" and rng.random() < 0.5:
        bias_t = tensor([str(experts)], "f32")
        args.append(("bias", bias_t))
        extras += f" bias(%bias : {bias_t})"
    args += [("w_gate_up", wgu_t), ("w_down", wd_t)]
    if rng.random() < 0.25:
        m = pick_size(rng, (8, 64), dynamic) if mode == "limits" else str(rng.choice((64, 128)))
        sgu_t = tensor([d, mul(m, 2) if activation == "swiglu" else m], element)
        sd_t = tensor([m, d], element)
        args += [("shared_gate_up", sgu_t), ("shared_down", sd_t)]
        extras += f" shared(%shared_gate_up, %shared_down : {sgu_t}, {sd_t})"
    # Expert biases: the CPU path runs them; the GPU path their forward only, and refuses
    # the rest with a diagnostic.
    if ext.random() < (0.15 if mode == "gpu" else 0.2):
        bgu_t = tensor([str(experts), width], element)
        bd_t = tensor([str(experts), d], element)
        args += [("b_gate_up", bgu_t), ("b_down", bd_t)]
        extras += f" expert_bias(%b_gate_up, %b_down : {bgu_t}, {bd_t})"
    out_t = x_t
    logits_t = tensor([tokens, str(experts)], "f32")
    results = [("%out", out_t)]
    if rng.random() < 0.7:
        results.append(("%logits", logits_t))
    if rng.random() < 0.2:  # an argument returned as it is
        results.append(("%w_router", wr_t))
    if rng.random() < 0.1:
        results.append(("%x", x_t))
    params = ", ".join(f"%{a}: {t}" for a, t in args)
    main = ", ".join(t for a, t in args if a in ("x", "w_router", "w_gate_up", "w_down"))
    text = (
        f"func.func @{name}({params}) -> ({', '.join(t for _, t in results)}) {{\n"
        f"  %out, %logits = moe.layer %x, %w_router, %w_gate_up, %w_down{extras}\n"
        f"      {{{', '.join(attrs)}}}\n"
        f"      : {main} -> {out_t}, {logits_t}\n"
        f"  return {', '.join(v for v, _ in results)} : {', '.join(t for _, t in results)}\n"
        f"}}\n"
    )
    return text, [t for _, t in args]


def selection_bias_update(rng: random.Random, name: str) -> str:
    """moe.update_selection_bias on a bias [E] and experts [T, k]: a function returning it,
    or the forward (nothing saved) and empty backward pair moe-compile compiles it as."""
    experts = rng.choice((8, 1, 64, 256, 1024, 1025))
    tokens = rng.choice(("?", "?", "1", "37", "0", str(2**31)))
    top_k = rng.choice((2, 1, 8))
    # mostly valid; 0 and -1 the attribute refuses
    rate = rng.choice(("1.0e-3", "1.0e-2", "1.0", "2.5e-4") * 4 + ("0.0", "-1.0"))
    rule = rng.choice(("sign", "proportional"))
    b_t, e_t = tensor([str(experts)], "f32"), tensor([tokens, str(top_k)], "i32")
    attrs = []
    if tokens == "?" or rng.random() < 0.2:
        attrs.append(f"moe.max_tokens = {rng.choice((64, 1, 65536, 2**30))} : i64")
    pair = rng.random() < 0.5
    fwd_attrs = attrs + (["moe.num_saved = 0 : i64"] if pair else [])
    text = (
        f"func.func @{name}{'_forward' if pair else ''}(%b: {b_t}, %e: {e_t}) -> {b_t}"
        + (f" attributes {{{', '.join(fwd_attrs)}}}" if fwd_attrs else "")
        + " {\n"
        f"  %r = moe.update_selection_bias %b, %e {{rate = {rate} : f64, "
        f"rule = #moe.bias_update<{rule}>}} : {b_t}, {e_t} -> {b_t}\n"
        f"  return %r : {b_t}\n}}\n"
    )
    if pair:
        bwd_attrs = attrs + ["moe.gradient_args = array<i64>"]
        text += (
            f"func.func @{name}_backward(%d: {b_t}) attributes {{{', '.join(bwd_attrs)}}} {{\n"
            f"  return\n}}\n"
        )
    return text


def random_module(rng: random.Random, ext: Optional[random.Random] = None) -> str:
    ext = ext or random.Random(0)
    functions = [random_layer(rng, f"layer{i}", ext)[0] for i in range(rng.choice((1, 1, 1, 2, 3)))]
    # moe.update_selection_bias: beside the layers (moe-generate-backward refuses a plain
    # one, so the GPU pipelines stop there) or, a third of those times, alone.
    if ext.random() < 0.25:
        updates = [
            selection_bias_update(ext, f"selection_bias{i}") for i in range(ext.choice((1, 2)))
        ]
        functions = updates if ext.random() < 0.33 else functions + updates
    body = "\n".join(functions)
    if rng.random() < 0.1:
        inner = "\n".join("    " + line for line in body.splitlines())
        return f"module {{\n  module @inner {{\n{inner}\n  }}\n}}\n"
    return body


PIPELINES = [
    ["--moe-decompose"],
    ["--moe-decompose", "--moe-generate-backward"],
    *[
        [
            "--moe-decompose",
            f"--moe-plan-activations=policy={policy}",
            "--moe-generate-backward",
            "--moe-offload",
            "--moe-plan-memory",
        ]
        for policy in ("auto", "keep", "recompute", "offload")
    ],
    ["--moe-decompose", "--moe-generate-backward", "--moe-lower-to-cpu-pipeline"],
    ["--moe-training-pipeline"],
    ["--moe-training-pipeline=chip=sm_90a format=isa"],
]
CRASH_SIGNS = (
    "LLVM ERROR",
    "Stack dump",
    "AddressSanitizer",
    "UndefinedBehaviorSanitizer",
    "runtime error:",
    "LeakSanitizer",
    "PLEASE submit a bug report",
)


def run(cmd: List[str], timeout: float, stdin: Optional[str] = None):
    """The finished process, or None when it ran out of time twice: once with `timeout`, then
    with twice that (a busy machine starves a run now and then; a hang stays a hang)."""
    for limit in (timeout, 2 * timeout):
        try:
            return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=limit)
        except subprocess.TimeoutExpired:
            continue
    return None


def check(module: str, tools: dict, timeout: float, workdir: Path, seen: dict) -> Optional[str]:
    """Why the module breaks a tool, or None. `seen` counts how far modules got: verified
    (the first pipeline ran), and through each tool."""
    source = workdir / "layer.mlir"
    source.write_text(module)
    for passes in PIPELINES:
        cmd = [tools["moe-opt"], str(source), "--verify-each=false", *passes]
        proc = run(cmd, timeout)
        if proc is None:
            return f"timed out after {timeout} s and again after {2 * timeout} s: {' '.join(cmd)}"
        problem = judge(proc, cmd)
        if problem:
            return problem
        if proc.returncode == 0:
            key = " ".join(passes)
            seen[key] = seen.get(key, 0) + 1
            again = run([tools["moe-opt"], "-"], timeout, proc.stdout)
            if (
                again is None
                or again.returncode != 0
                or any(s in again.stderr for s in CRASH_SIGNS)
            ):
                why = "timed out" if again is None else again.stderr.strip()[:2000]
                return f"{' '.join(cmd)} succeeded with output that does not verify:\n{why}"
    out = workdir / "out"
    out.mkdir(exist_ok=True)
    cmd = [tools["moe-compile"], str(source), "-o", str(out / "layer"), "--format=isa"]
    proc = run(cmd, timeout * 2)
    if proc is None:
        return f"timed out after {timeout * 2} s and again after {timeout * 4} s: {' '.join(cmd)}"
    if proc.returncode == 0:
        seen["moe-compile"] = seen.get("moe-compile", 0) + 1
    return judge(proc, cmd)


def judge(proc, cmd) -> Optional[str]:
    text = proc.stderr
    if proc.returncode < 0 or proc.returncode >= 128 or any(s in text for s in CRASH_SIGNS):
        return f"crashed (exit {proc.returncode}): {' '.join(cmd)}\n{text[-4000:]}"
    if proc.returncode != 0 and "error" not in text:
        return f"failed without a diagnostic (exit {proc.returncode}): {' '.join(cmd)}"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build", help="the build folder with bin/moe-opt")
    ap.add_argument("--seconds", type=float, default=60.0, help="the time budget")
    ap.add_argument("--runs", type=int, default=0, help="stop after this many modules (0: none)")
    ap.add_argument("--seed", type=int, default=None, help="the first module's seed")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds a tool may take")
    ap.add_argument("--out", default=None, help="where failing modules are kept")
    opts = ap.parse_args(argv)
    bin_dir = Path(opts.build) / "bin"
    tools = {t: str(bin_dir / t) for t in ("moe-opt", "moe-compile")}
    for tool, path in tools.items():
        if not os.access(path, os.X_OK):
            ap.error(f"{path} not found: build {tool} first")
    seed = opts.seed if opts.seed is not None else int(time.time())
    out = Path(opts.out or tempfile.mkdtemp(prefix="layer-fuzz-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"layer-fuzz: seeds from {seed}, {opts.seconds:g} s, failures into {out}", flush=True)
    start = time.monotonic()
    passed = failed = 0
    seen: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        while time.monotonic() - start < opts.seconds and not (
            opts.runs and passed + failed >= opts.runs
        ):
            module = random_module(random.Random(seed), random.Random(f"ext-{seed}"))
            problem = check(module, tools, opts.timeout, Path(tmp), seen)
            if problem:
                failed += 1
                (out / f"seed-{seed}.mlir").write_text(module)
                (out / f"seed-{seed}.txt").write_text(problem + "\n")
                print(f"FAIL seed {seed}: {problem.splitlines()[0]}", flush=True)
            else:
                passed += 1
            seed += 1
    elapsed = time.monotonic() - start
    print(f"layer-fuzz: {passed + failed} modules in {elapsed:.0f} s; succeeded, of them:")
    for key in [" ".join(p) for p in PIPELINES] + ["moe-compile"]:
        print(f"  {seen.get(key, 0):5d}  {key}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
