#!/usr/bin/env python3
"""`MoELayer(ep_group=...)` on CUDA against the same layer without expert parallelism, with a
NCCL group of one rank (docs/distributed.md).

Each case builds the non-EP `MoELayer` and the expert-parallel one (`ep_group` the NCCL group,
`max_tokens` its bound) on CUDA in bf16 with the same weights, runs forward and backward of
both on the same random x and cotangents (of out and of the router logits), and checks:

- out and the logits bitwise equal (each row meets the same GEMM tiles and the same combine);
- the gradients of x and of every weight within docs/benchmarks.md's bf16 tolerance, max
  |a - b| / max |b| <= 2e-2 (the staged backward computes the routing weights' gradient as <dout, y>
  where the unsplit one fuses it as <dA, A>, and sums x's rows per token in slot order);
- `last_dropped` all zeros (the capacity holds every row);

and prints the step time of both (median of --steps after --warmup, CUDA events, no check).
The cases: `small` (d=256, n=128, E=8, k=2, T = 256 and 100 under a bound of 256) with an f32
copy under torch.autocast(bf16) (out and gradients bitwise the bf16 layer's), a capacity of
64 rows met (T = 16: bitwise) and exceeded (T = 256: CapacityError; with overflow="drop",
`last_dropped` = T k - 64); `chunk` (the small layer with ep_chunk_tokens = 64: four
chunks, each with its own dispatch, at T = 256, 100 and 3); `deepseek` (sigmoid scores, a router bias, groups, a shared
expert; T = 200); `mixtral-8x7b` (the benchmark configuration, T = 16384); `hf` (a
two-layer Mixtral on CUDA with `replace_moe_blocks(ep_group=...)`: the loss within 1e-2 of
the original model's, the experts' gradients finite and non-zero).

The GPU machine has no moe-compile: `--prebuild DIR` (the LLVM machine,
scripts/inputs/build-ep-layers.sh) compiles every case's layers into DIR, a compile cache
(MOE_MLIR_CACHE layout) the run finds through MOE_MLIR_PREBUILT; the run first looks every
case's layers up (no GPU needed: a missing entry fails there), then needs CUDA and
MOE_RUNTIME_LIB.
Prints one line a check and "N passed, M failed" last; JSON to $OUT/ep_layer_check.json.

    python3 bench/ep_layer_check.py --prebuild /tmp/ep-torch-cache          # LLVM machine
    MOE_MLIR_PREBUILT=... MOE_RUNTIME_LIB=... python3 bench/ep_layer_check.py  # GPU machine
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import traceback
from typing import Any, Callable, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from moe_mlir.config import LayerConfig  # noqa: E402
from moe_mlir.layer import MoELayer  # noqa: E402

SMALL = LayerConfig(0, 256, 128, 8, 2, renormalize=True)
MIXTRAL = LayerConfig(0, 4096, 14336, 8, 2, renormalize=True)
# DeepSeek-V3-like (bench/train_check.py's deepseek-t200): sigmoid scores with a router bias,
# groups, scaling and a shared expert; the router bias, an argument between two with
# gradients, has none.
DEEPSEEK = LayerConfig(
    0,
    256,
    128,
    16,
    4,
    scoring="sigmoid",
    renormalize=True,
    router_bias=True,
    num_groups=4,
    topk_groups=2,
    scaling_factor=2.5,
    shared_ffn=128,
)
TOLERANCE = 2e-2  # docs/benchmarks.md's bf16 gradient tolerance
# The EP layers of the small configuration beside the default capacity (T k): 64 rows a
# rank, with overflow "error" and "drop".
CAPACITY = 64
HF_TOKENS = (2, 64)  # batch, sequence
HF_BOUND = 256

results: List[Dict[str, Any]] = []
times: List[Dict[str, Any]] = []


def record(kind: str, name: str, ok: bool, **detail) -> None:
    results.append({"kind": kind, "name": name, "ok": ok, **detail})
    print(f"{'PASS' if ok else 'FAIL'} {kind} {name} {json.dumps(detail)}", flush=True)


def rel(a, b) -> float:
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def layers(config: LayerConfig, bound: int, device, dtype, **ep):
    """The non-EP layer and the expert-parallel one (one rank: every expert) with the same
    weights."""
    torch.manual_seed(0)
    plain = MoELayer(config, max_tokens=bound, device=device, dtype=dtype)
    staged = MoELayer(
        config, ep_group="default", max_tokens=bound, device=device, dtype=dtype, **ep
    )
    if config.router_bias:
        with torch.no_grad():
            plain.router_bias.normal_(0.0, 0.1)
    staged.load_state_dict(plain.state_dict())
    return plain, staged


def step(layer, x, d_out, d_logits):
    """out, logits and the gradients of x and of every parameter."""
    layer.zero_grad(set_to_none=True)
    xx = x.clone().requires_grad_(True)
    out, logits = layer(xx, return_router_logits=True)
    torch.autograd.backward([out, logits], [d_out, d_logits])
    grads = {"x": xx.grad}
    grads.update({n: p.grad for n, p in layer.named_parameters()})
    return out, logits, grads


def inputs(config: LayerConfig, tokens: int, dtype=torch.bfloat16):
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, config.hidden, device="cuda", generator=gen).to(dtype)
    d_out = (0.1 * torch.randn(tokens, config.hidden, device="cuda", generator=gen)).to(dtype)
    d_logits = 0.1 * torch.randn(tokens, config.experts, device="cuda", generator=gen)
    return x, d_out, d_logits


def compare(name: str, plain, staged, tokens: int) -> None:
    x, d_out, d_logits = inputs(plain.config, tokens)
    p_out, p_logits, p_grads = step(plain, x, d_out, d_logits)
    s_out, s_logits, s_grads = step(staged, x, d_out, d_logits)
    torch.cuda.synchronize()
    record(
        "forward-bitwise",
        f"{name} T={tokens}",
        bool(torch.equal(p_out, s_out) and torch.equal(p_logits, s_logits)),
    )
    worst = {k: rel(s_grads[k], g) for k, g in p_grads.items()}
    record(
        "gradients",
        f"{name} T={tokens}",
        all(v <= TOLERANCE for v in worst.values()),
        rel={k: float(f"{v:.3g}") for k, v in worst.items()},
    )
    dropped = staged.last_dropped
    record(
        "dropped",
        f"{name} T={tokens}",
        bool(dropped.is_cuda and int(dropped.abs().sum()) == 0),
        shape=list(dropped.shape),
    )


def timing(name: str, plain, staged, tokens: int, args) -> None:
    x, d_out, d_logits = inputs(plain.config, tokens)
    runs: Dict[str, Callable] = {
        "ep": lambda: step(staged, x, d_out, d_logits),
        "plain": lambda: step(plain, x, d_out, d_logits),
    }
    spent: Dict[str, List[float]] = {k: [] for k in runs}
    for i in range(args.warmup + args.steps):
        for key in ("ep", "plain") if i % 2 == 0 else ("plain", "ep"):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            runs[key]()
            end.record()
            end.synchronize()
            if i >= args.warmup:
                spent[key].append(start.elapsed_time(end))
    ep_ms, plain_ms = statistics.median(spent["ep"]), statistics.median(spent["plain"])
    print(
        f"INFO step {name} T={tokens}: MoELayer(ep_group) {ep_ms:.3f} ms, MoELayer "
        f"{plain_ms:.3f} ms, ratio {ep_ms / plain_ms:.4f}",
        flush=True,
    )
    times.append({"name": f"{name} T={tokens}", "ep_ms": ep_ms, "plain_ms": plain_ms})


def autocast_case() -> None:
    """An f32 copy of the EP layer under torch.autocast(bf16): the bf16 layer's output and
    gradients, bit for bit, in f32."""
    _, staged = layers(SMALL, 256, "cuda", torch.bfloat16)
    master = copy.deepcopy(staged).float()
    x, d_out, d_logits = inputs(SMALL, 200)
    b_out, b_logits, b_grads = step(staged, x, d_out, d_logits)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        a_out, a_logits, a_grads = step(master, x.float(), d_out.float(), d_logits)
    same = {"out": a_out.dtype == torch.float32 and torch.equal(a_out, b_out.float())}
    same["logits"] = torch.equal(a_logits, b_logits)
    for k, g in b_grads.items():
        same[k] = a_grads[k].dtype == torch.float32 and torch.equal(a_grads[k], g.float())
    record(
        "autocast", "small T=200", all(same.values()), differ=[k for k, v in same.items() if not v]
    )


def capacity_cases() -> None:
    from moe_mlir.distributed import CapacityError

    plain, staged = layers(SMALL, 256, "cuda", torch.bfloat16, ep_capacity=CAPACITY)
    compare(f"small capacity={CAPACITY}", plain, staged, 16)  # 32 rows: within
    x, d_out, d_logits = inputs(SMALL, 256)
    try:
        staged(x)
        record("capacity-error", "small T=256", False, error="no CapacityError")
    except CapacityError as e:
        record("capacity-error", "small T=256", "capacity of 64" in str(e))
    _, drop = layers(SMALL, 256, "cuda", torch.bfloat16, ep_capacity=CAPACITY, ep_overflow="drop")
    out, logits, grads = step(drop, x, d_out, d_logits)
    expect = 256 * SMALL.top_k - CAPACITY
    got = drop.last_dropped.tolist()
    finite = all(bool(t.isfinite().all()) for t in (out, *grads.values()))
    record("capacity-drop", "small T=256", got == [[expect]] and finite, dropped=got)


def hf_model(device, dtype):
    import transformers  # noqa: PLC0415

    cfg = transformers.MixtralConfig(
        vocab_size=128,
        hidden_size=SMALL.hidden,
        intermediate_size=SMALL.ffn,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        num_local_experts=SMALL.experts,
        num_experts_per_tok=SMALL.top_k,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(cfg).to(device=device, dtype=dtype)


def hf_case() -> None:
    from moe_mlir import hf  # noqa: PLC0415

    model = hf_model("cuda", torch.bfloat16)
    ours = copy.deepcopy(model)
    names = hf.replace_moe_blocks(ours, ep_group="default", max_tokens=HF_BOUND)
    torch.manual_seed(1)
    ids = torch.randint(0, 128, HF_TOKENS, device="cuda")
    ref = model(input_ids=ids, labels=ids).loss
    got = ours(input_ids=ids, labels=ids).loss
    got.backward()
    layer = ours.get_submodule(names[0])
    grads = [layer.w_gate_up.grad, layer.w_down.grad]
    sane = all(
        g is not None and bool(g.isfinite().all()) and float(g.abs().sum()) > 0 for g in grads
    )
    diff = abs(float(got) - float(ref)) / abs(float(ref))
    record(
        "hf",
        "mixtral 2 layers",
        bool(layer.expert_parallel and diff <= 1e-2 and sane),
        loss=float(got),
        reference=float(ref),
        rel=diff,
    )


CASES = ("small", "capacity", "autocast", "chunk", "deepseek", "mixtral-8x7b", "hf")
CHUNK = 64  # ep_chunk_tokens of the chunk case: 4 chunks of the bound 256


def case_layers(case: str, device, dtype) -> List[Any]:
    """(MoELayer, T) of each layer `case` runs, on `device` (meta: no memory), for the
    compile cache: their entries are what the run needs prebuilt."""
    if case in ("small", "autocast"):
        return [(layer, 256) for layer in layers(SMALL, 256, device, dtype)]
    if case == "capacity":
        plain, staged = layers(SMALL, 256, device, dtype, ep_capacity=CAPACITY)
        _, drop = layers(SMALL, 256, device, dtype, ep_capacity=CAPACITY, ep_overflow="drop")
        return [(plain, 256), (staged, 256), (drop, 256)]
    if case == "chunk":
        _, staged = layers(SMALL, 256, device, dtype, ep_chunk_tokens=CHUNK)
        return [(staged, 256)]  # the small case's plain layer beside it
    if case == "deepseek":
        return [(layer, 256) for layer in layers(DEEPSEEK, 256, device, dtype)]
    if case == "mixtral-8x7b":
        return [(layer, 16384) for layer in layers(MIXTRAL, 16384, device, dtype)]
    from moe_mlir import hf  # noqa: PLC0415

    with torch.device(device):
        model = hf_model(device, dtype)
    hf.replace_moe_blocks(model, ep_group="default", max_tokens=HF_BOUND)
    # The blocks share one config: the first stands for all.
    return [(next(m for m in model.modules() if isinstance(m, MoELayer)), HF_BOUND)]


def compile_cases(cases: List[str], what: str) -> int:
    """compile_for(T, "cuda") of every layer of `cases`: with moe-compile, builds the entries
    into MOE_MLIR_CACHE; without it (the GPU machine), finds them in MOE_MLIR_PREBUILT (or
    fails, saying so). Needs no GPU. Returns the failures."""
    failed = 0
    for case in cases:
        try:
            for layer, tokens in case_layers(case, "meta", torch.bfloat16):
                layer.compile_for(tokens, "cuda")
            record(what, case, True)
        except Exception as e:  # noqa: BLE001
            failed += 1
            record(what, case, False, error=f"{type(e).__name__}: {e}"[:600])
    return failed


def finish(args) -> int:
    if dist.is_initialized():
        dist.destroy_process_group()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "ep_layer_check.json"), "w") as f:
        json.dump({"checks": results, "times": times}, f, indent=1)
    failed = sum(not r["ok"] for r in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help=f"comma-separated cases of {', '.join(CASES)}")
    ap.add_argument("--prebuild", default="", help="compile the layers into this cache folder")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/moe-gpu-out"))
    args = ap.parse_args()
    wanted = [c for c in CASES if not args.only or c in args.only.split(",")]
    cuda = torch.cuda.is_available() and not args.prebuild
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    if args.prebuild:
        os.environ["MOE_MLIR_CACHE"] = os.path.abspath(args.prebuild)
    if cuda:
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", rank=0, world_size=1)
    else:  # the layers' options alone: a group of one rank without NCCL
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    if compile_cases(wanted, "prebuild" if args.prebuild else "prebuilt") or args.prebuild:
        return finish(args)
    if not cuda:
        record("cuda", "device", False, error="no CUDA device: the checks run on the GPU machine")
        return finish(args)
    for case in wanted:
        try:
            if case == "small":
                plain, staged = layers(SMALL, 256, "cuda", torch.bfloat16)
                for tokens in (256, 100):
                    compare("small", plain, staged, tokens)
                timing("small", plain, staged, 256, args)
            elif case == "capacity":
                capacity_cases()
            elif case == "autocast":
                autocast_case()
            elif case == "chunk":
                plain, staged = layers(SMALL, 256, "cuda", torch.bfloat16, ep_chunk_tokens=CHUNK)
                for tokens in (256, 100, 3):
                    compare(f"small ep_chunk_tokens={CHUNK}", plain, staged, tokens)
                timing(f"small ep_chunk_tokens={CHUNK}", plain, staged, 256, args)
            elif case == "deepseek":
                plain, staged = layers(DEEPSEEK, 256, "cuda", torch.bfloat16)
                compare(case, plain, staged, 200)
            elif case == "mixtral-8x7b":
                plain, staged = layers(MIXTRAL, 16384, "cuda", torch.bfloat16)
                compare(case, plain, staged, 16384)
                timing(case, plain, staged, 16384, args)
                del plain, staged
            elif case == "hf":
                hf_case()
        except Exception as e:  # noqa: BLE001
            record("error", case, False, error=f"{type(e).__name__}: {e}"[:400])
            traceback.print_exc()
        torch.cuda.empty_cache()
    return finish(args)


if __name__ == "__main__":
    sys.exit(main())
