#!/usr/bin/env python3
"""Training fidelity by statistics: how far each bf16 implementation's loss curve is from the
same model trained all in f32, over seeds.

The models, sizes, data and optimizer are bench/train_check.py's (Mixtral-style and Qwen3-MoE-
style from config, AdamW lr 3e-4, a random bigram chain). For each model, precision (bf16
parameters, or mixed precision: f32 parameters with the forward under torch.autocast(bf16)) and
seed, four runs from the same initial weights on the same batches:

- fp32: HF eager experts, parameters and activations in f32, no autocast (the reference);
- moe_mlir: our layers (`moe_mlir.hf.replace_moe_blocks`);
- grouped_mm: HF's `grouped_mm` experts;
- eager: HF's eager experts (reported beside: HF's own spread).

The statistic of an implementation X is D(X) = mean over steps and seeds of |loss_X - loss_fp32|.
Ours passes when D(moe_mlir) <= --threshold (1.1) x D(grouped_mm) (+ --atol, 0 by default);
the ratio comes with each seed's ratio and a bootstrap interval over seeds (5-95 %), and
D(eager) / D(grouped_mm) beside it. For one seed (--drift-seed) the gradient of one step
(--drift-step, at the f32 run's weights before that step, on that step's batch) is compared
against f32 parameter group by parameter group (router, experts gate, up, down, attention
q/k/v/o, norms, embedding, lm_head): relative Frobenius error of each implementation, ours
beside HF's, so that a failure names the op whose gradient is off.

    python bench/train_fidelity.py --device cuda --out $OUT                  # every part
    python bench/train_fidelity.py --model mixtral --precision bf16 --out $OUT  # one part
    python bench/train_fidelity.py --merge DIR_OR_TGZ... --out DIR          # table + plots
    python bench/train_fidelity.py --estimate                               # H200 run time
    python bench/train_fidelity.py --model mixtral --precision bf16 --seeds 5-24 \
        --variants grouped_mm+f32_swiglu,grouped_mm+index_ties,moe_mlir+f32_logits --out $OUT

--variants runs diagnostic variants beside the three (VARIANTS: HF grouped_mm with one
property of ours, ours with f32 router logits), each reported against grouped_mm on the seeds
it ran, with the signed mean of loss - fp32 (the lag of a curve behind f32) and, for the
router variant, how often the k-th and (k+1)-th probabilities tie; they are not in the verdict.
A seed already in --out runs only the variants it lacks, against its stored f32 curve.

A part (model, precision) writes fidelity-MODEL-PRECISION.json to --out after each seed; a run
finds the seeds already in --out (same settings) and skips them, so a part cut off by a time
limit goes on where it stopped. Seeds of one part may come from several runs (--seeds 0-2 in
one, 3-4 in another): --merge reads every part file under the folders (or session.tgz
archives) it is given and writes train_fidelity.json, the table and the plots:
train_fidelity.png (every part: mean loss per implementation with its band over seeds, and
|loss - fp32| per step) and fidelity-MODEL-PRECISION.png. A run ends with the merge of its
own parts. Exit status: 0 when every part passes, 1 when one fails or lacks seeds, 2 on bad
arguments. Last line: "N passed, M failed" (one check per part).

The GPU run needs the prebuilt layers of train_check.py's full models (the same layers:
scripts/inputs/build-torch-cache.sh) and runs through `bash scripts/gpu/session.sh fidelity`
(scripts/gpu/torch-check.sh --only build,fidelity). Its run time on an H200 is estimated by
--estimate: about 10 minutes for everything (mixtral 2.7, qwen3 8.2 in one process each),
over the 8 minutes a call can give it, so it takes two calls (MOE_FIDELITY=mixtral,qwen3@3-4,
then qwen3@0-2) and a merge. `--size tiny --device cpu` runs the plumbing on the CPU path (f32
parameters there: the statistic is then between f32 runs); test/Python/test_train_fidelity.py
runs it.
"""

from __future__ import annotations

import argparse
import copy
import gc
import io
import json
import math
import os
import random
import re
import sys
import tarfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import train_check as tc  # noqa: E402

IMPLS = ("moe_mlir", "grouped_mm", "eager")  # compared against "fp32"
# Diagnostic variants (--variants): one implementation changed in one respect, each run beside
# the others on the same seeds, to find what moves a part's D. Reported apart (D and the
# signed mean of loss - fp32 against grouped_mm's on the same seeds), never in the verdict.
VARIANTS = {
    "grouped_mm+f32_swiglu": "HF grouped_mm with its SwiGLU in f32, rounded once to bf16 "
    "(forward and backward), as our kernels compute it",
    "grouped_mm+index_ties": "HF grouped_mm with its router's top-k taking the lowest index "
    "among equal probabilities (bf16 logits tie), as our router does",
    "moe_mlir+f32_logits": "ours with the router logits kept in f32 "
    '(router_logits_dtype="float32"): no ties, no rounded logits',
    "eager+bf16_boundary": "HF eager with its MoE block's output and the gradient into the "
    "block rounded to bf16, as our layer's are under autocast (in bf16 parameters: HF eager)",
    "grouped_mm+bf16_boundary": "HF grouped_mm with its MoE block's output and the gradient "
    "into the block rounded to bf16, as eager+bf16_boundary",
}
PRECISIONS = ("bf16", "amp")
BLOCK = 5  # seeds of the design: the blocks a long run is cut into for comparison
COLORS = {
    "fp32": (127, 127, 127),
    "grouped_mm": (31, 119, 180),
    "eager": (44, 160, 44),
    "moe_mlir": (255, 127, 14),
}
STYLES = {
    "fp32": dict(lw=2.4, ls="-"),
    "grouped_mm": dict(lw=1.2, ls="-"),
    "eager": dict(lw=1.2, ls=":"),
    "moe_mlir": dict(lw=1.2, ls="--"),
}
LABELS = {
    "fp32": "f32 reference",
    "grouped_mm": "HF grouped_mm",
    "eager": "HF eager",
    "moe_mlir": "moe_mlir (ours)",
}

# --------------------------------------------------------------------------- statistics


def parse_seeds(text: str):
    """ "0-4" or "0,2,5" or "1-2,7" -> sorted distinct seeds; ValueError on anything else."""
    seeds = set()
    for item in [s.strip() for s in text.split(",") if s.strip()]:
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not m:
            raise ValueError(f"bad seed list item {item!r} (want N or N-M)")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"bad seed range {item!r}")
        seeds.update(range(lo, hi + 1))
    if not seeds:
        raise ValueError("no seeds")
    return sorted(seeds)


def mean_abs_diff(curve, ref) -> float:
    """Mean over steps of |curve - ref|; inf when a value is not finite or the lengths differ."""
    if len(curve) != len(ref) or not curve:
        return math.inf
    total = 0.0
    for x, y in zip(curve, ref):
        if not (math.isfinite(x) and math.isfinite(y)):
            return math.inf
        total += abs(x - y)
    return total / len(curve)


def mean_diff(curve, ref) -> float:
    """Mean over steps of curve - ref (signed: > 0 where the curve trains slower than the
    reference); nan when a value is not finite or the lengths differ."""
    if len(curve) != len(ref) or not curve:
        return math.nan
    total = sum(x - y for x, y in zip(curve, ref))
    return total / len(curve) if math.isfinite(total) else math.nan


def ratio(a: float, b: float) -> float:
    """a / b, where 0 / 0 is 1 (two implementations both at the reference) and x / 0 is inf."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return math.inf
    if b == 0:
        return 1.0 if a == 0 else math.inf
    return a / b


def passes(d_ours: float, d_base: float, threshold: float = 1.1, atol: float = 0.0) -> bool:
    """The criterion: D(ours) <= threshold * D(base) + atol, both finite."""
    return math.isfinite(d_ours) and math.isfinite(d_base) and d_ours <= threshold * d_base + atol


def bootstrap_ratio(num, den, rounds: int = 2000, seed: int = 0):
    """5th and 95th percentiles of mean(num) / mean(den) over seeds drawn with replacement
    (`num`, `den`: one value per seed, paired)."""
    n = len(num)
    if n == 0:
        return [math.nan, math.nan]
    rng = random.Random(seed)
    values = []
    for _ in range(rounds):
        pick = [rng.randrange(n) for _ in range(n)]
        values.append(ratio(sum(num[i] for i in pick) / n, sum(den[i] for i in pick) / n))
    values.sort()
    return [values[int(0.05 * (rounds - 1))], values[int(0.95 * (rounds - 1))]]


def fidelity_stats(losses, threshold: float = 1.1, atol: float = 0.0, rounds: int = 2000):
    """The statistic of one part. `losses`: {impl: [per-seed loss curves]} with "fp32" and the
    IMPLS, the seeds in the same order for each. Returns D per implementation (mean over steps
    and seeds of |loss - fp32|), each seed's D, the per-step mean/min/max over seeds of
    |loss - fp32|, ours / grouped_mm and eager / grouped_mm with each seed's ratio and a
    bootstrap interval, and the verdict."""
    ref = losses["fp32"]
    seeds = len(ref)
    for impl in IMPLS:
        if len(losses[impl]) != seeds:
            raise ValueError(f"{impl}: {len(losses[impl])} seeds, fp32 has {seeds}")
    per_seed = {impl: [mean_abs_diff(c, r) for c, r in zip(losses[impl], ref)] for impl in IMPLS}
    mean = {impl: (sum(v) / len(v) if v else math.nan) for impl, v in per_seed.items()}
    per_step = {}
    for impl in IMPLS:
        steps = min((len(c) for c in losses[impl]), default=0)
        cols = [
            [abs(c[t] - r[t]) for c, r in zip(losses[impl], ref)]
            for t in range(min(steps, min((len(r) for r in ref), default=0)))
        ]
        per_step[impl] = {
            "mean": [sum(c) / len(c) for c in cols],
            "min": [min(c) for c in cols],
            "max": [max(c) for c in cols],
        }
    signed = {
        impl: sum(mean_diff(c, r) for c, r in zip(losses[impl], ref)) / seeds if seeds else math.nan
        for impl in IMPLS
    }
    out = {
        "seeds": seeds,
        "mean_abs_to_fp32": mean,
        "mean_to_fp32": signed,
        "per_seed_mean_abs_to_fp32": per_seed,
        "per_step_abs_to_fp32": per_step,
        "threshold": threshold,
        "atol": atol,
    }
    for key, impl in (("ratio", "moe_mlir"), ("eager_ratio", "eager")):
        out[key] = ratio(mean[impl], mean["grouped_mm"])
        out[key + "_per_seed"] = [
            ratio(a, b) for a, b in zip(per_seed[impl], per_seed["grouped_mm"])
        ]
        finite = all(math.isfinite(v) for v in per_seed[impl] + per_seed["grouped_mm"])
        out[key + "_interval"] = (
            bootstrap_ratio(per_seed[impl], per_seed["grouped_mm"], rounds)
            if finite
            else [math.inf, math.inf]
        )
        # the statistic over disjoint blocks of BLOCK seeds (in the given order): how a
        # verdict on that many seeds alone would have varied
        out[key + "_blocks"] = [
            ratio(sum(per_seed[impl][b : b + BLOCK]), sum(per_seed["grouped_mm"][b : b + BLOCK]))
            for b in range(0, seeds - BLOCK + 1, BLOCK)
        ]
    out["passed"] = bool(seeds) and passes(mean["moe_mlir"], mean["grouped_mm"], threshold, atol)
    return out


def variant_stats(part, rounds: int = 2000):
    """The diagnostic variants a part holds: for each, the seeds that ran it and, over those
    seeds, D and the signed mean of loss - fp32 of the variant, of grouped_mm and of ours,
    D(variant) / D(grouped_mm) with its bootstrap interval, and the summed tie counts of its
    runs (index_ties_router's). {} without variants."""
    out = {}
    for name in VARIANTS:
        seeds = sorted((s for s, r in part["seeds"].items() if name in r["losses"]), key=int)
        if not seeds:
            continue
        runs = [part["seeds"][s] for s in seeds]
        row = {"seeds": [int(s) for s in seeds]}
        per_seed = {}
        for impl in (name, "grouped_mm", "moe_mlir"):
            curves = [(r["losses"][impl], r["losses"]["fp32"]) for r in runs]
            per_seed[impl] = [mean_abs_diff(c, f) for c, f in curves]
            row[impl] = {
                "D": sum(per_seed[impl]) / len(seeds),
                "mean": sum(mean_diff(c, f) for c, f in curves) / len(seeds),
            }
        row["ratio"] = ratio(row[name]["D"], row["grouped_mm"]["D"])
        row["ratio_interval"] = bootstrap_ratio(per_seed[name], per_seed["grouped_mm"], rounds)
        ties = [r["ties"][name] for r in runs if name in r.get("ties", {})]
        if ties:
            row["ties"] = {k: sum(t[k] for t in ties) for k in ties[0]}
        out[name] = row
    return out


# --------------------------------------------------------------------------- models


def clone_model(base, experts: str, dtype, state=None):
    """A copy of the f32 `base` model (train_check.build_model's, so the same initial weights)
    with `experts` = "eager", "grouped_mm" or "moe_mlir" (blocks swapped) or one of VARIANTS,
    cast to `dtype`; `state`: a state_dict loaded first (the f32 run's weights at the drift
    step)."""
    impl, _, change = experts.partition("+")
    if impl not in IMPLS or (change and experts not in VARIANTS):
        known = ", ".join(IMPLS + tuple(VARIANTS))
        raise ValueError(f"experts must be one of {known}, got {experts!r}")
    model = copy.deepcopy(base)
    if state is not None:
        model.load_state_dict(state)
    model.config._experts_implementation = "eager" if impl == "eager" else "grouped_mm"
    model.to(dtype=dtype)
    model.train()
    if impl == "moe_mlir":
        from moe_mlir import hf  # noqa: PLC0415

        logits = "float32" if change == "f32_logits" else "auto"
        hf.replace_moe_blocks(model, router_logits_dtype=logits)
    elif change == "f32_swiglu":
        for module in model.modules():
            if hasattr(module, "gate_up_proj") and hasattr(module, "act_fn"):
                module._apply_gate = f32_swiglu(module.act_fn)
    elif change == "index_ties":
        for module in model.modules():
            if type(module).__name__.endswith("TopKRouter"):
                module.forward = index_ties_router(module)
    elif change == "bf16_boundary":
        for module in model.modules():
            if type(module).__name__.endswith("SparseMoeBlock"):
                module.forward = bf16_boundary(module.forward)
    return model


def bf16_boundary(forward):
    """`forward` (an MoE block's) with its output rounded to bf16 and the gradient reaching its
    input rounded to bf16, both kept in their dtype: what a layer computing in bf16 returns
    under autocast. Tensors already in bf16 pass unchanged."""
    import torch  # noqa: PLC0415

    class RoundValue(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.to(torch.bfloat16).to(t.dtype)

        @staticmethod
        def backward(ctx, grad):
            return grad

    class RoundGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.view_as(t)

        @staticmethod
        def backward(ctx, grad):
            return grad.to(torch.bfloat16).to(grad.dtype)

    def rounded(hidden_states, *args, **kwargs):
        out = forward(RoundGrad.apply(hidden_states), *args, **kwargs)
        if isinstance(out, tuple):
            return (RoundValue.apply(out[0]),) + out[1:]
        return RoundValue.apply(out)

    return rounded


def f32_swiglu(act):
    """HF's `_apply_gate` (act(gate) * up) computed in f32 and rounded once: its backward too
    rounds d(gate, up) once, from f32."""

    def apply_gate(gate_up):
        gate, up = gate_up.float().chunk(2, dim=-1)
        return (act(gate) * up).to(gate_up.dtype)

    return apply_gate


def index_ties_router(router):
    """The forward of HF's Mixtral or Qwen3-MoE router (softmax in f32 of the logits in the
    model's dtype, top-k, renormalised: Mixtral always, Qwen3 as configured; Qwen3 rounds the
    weights to the logits' dtype) with the top-k taking, among equal probabilities, the lowest
    index. Counts on `router.tie_counts` (a [3] tensor, on the device): tokens, tokens whose
    k-th and (k+1)-th probabilities are equal, and tokens whose set of experts differs from
    torch.topk's."""
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415

    qwen3 = type(router).__name__.startswith("Qwen3")
    renormalize = bool(getattr(router, "norm_topk_prob", True))
    k = router.top_k
    router.tie_counts = torch.zeros(3, dtype=torch.long, device=router.weight.device)

    def forward(hidden_states):
        x = hidden_states.reshape(-1, router.hidden_dim)
        logits = F.linear(x, router.weight)
        probs = torch.softmax(logits.float(), dim=-1)
        ranked, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        picks = order[:, :k]
        top = probs.gather(1, picks)
        with torch.no_grad():
            theirs = torch.topk(probs, k, dim=-1).indices.sort(dim=-1).values
            differ = (theirs != picks.sort(dim=-1).values).any(dim=-1)
            if k < probs.shape[-1]:
                tie = ranked[:, k - 1] == ranked[:, k]
            else:
                tie = torch.zeros_like(differ)
            tokens = torch.full((), x.shape[0], dtype=torch.long, device=x.device)
            router.tie_counts += torch.stack([tokens, tie.sum(), differ.sum()])
        if renormalize:
            top = top / top.sum(dim=-1, keepdim=True)
        if qwen3:
            top = top.to(logits.dtype)
        return logits, top, picks

    return forward


def tie_counts(model):
    """Summed `tie_counts` of index_ties_router's routers: {"tokens", "ties", "differ"} (token
    and layer pairs), or None without such a router."""
    counts = [m.tie_counts for m in model.modules() if hasattr(m, "tie_counts")]
    if not counts:
        return None
    total = [int(v) for v in sum(counts).tolist()]
    return dict(zip(("tokens", "ties", "differ"), total))


def precision_setup(precision: str, device):
    """(parameter dtype, autocast) of a precision: bf16 parameters on CUDA (the CPU path
    computes f32, so f32 there), f32 parameters under autocast(bf16) for amp."""
    import torch  # noqa: PLC0415

    if precision == "amp":
        return torch.float32, True
    if precision == "bf16":
        return (torch.bfloat16 if device.type == "cuda" else torch.float32), False
    raise ValueError(f"precision must be bf16 or amp, got {precision!r}")


# --------------------------------------------------------------------------- gradient drift


def param_group(name: str):
    """(group, layer) of a parameter name: layer None outside the decoder layers."""
    m = re.match(r"(?:model\.)?layers\.(\d+)\.(.*)", name)
    layer, rest = (int(m.group(1)), m.group(2)) if m else (None, name)
    rest = rest.removesuffix(".weight")
    known = {
        "model.embed_tokens": "embed",
        "model.norm": "norm.final",
        "lm_head": "lm_head",
        "input_layernorm": "norm.attn",
        "post_attention_layernorm": "norm.moe",
        "mlp.gate": "router",
        "mlp.experts.down_proj": "experts.down",
    }
    if rest in known:
        return known[rest], layer
    m = re.fullmatch(r"self_attn\.(\w+?)(?:_proj)?", rest)
    if m:
        return "attn." + m.group(1), layer
    return rest, layer


def grad_pieces(name: str, grad):
    """(group, layer, tensor) pieces of one parameter's gradient: the experts' gate_up_proj
    [E, 2n, d] splits into its gate rows and its up rows."""
    group, layer = param_group(name)
    if name.endswith("mlp.experts.gate_up_proj"):
        n = grad.shape[-2] // 2
        return [("experts.gate", layer, grad[..., :n, :]), ("experts.up", layer, grad[..., n:, :])]
    return [(group, layer, grad)]


GROUP_ORDER = [
    "router",
    "experts.gate",
    "experts.up",
    "experts.down",
    "norm.moe",
    "attn.q",
    "attn.k",
    "attn.v",
    "attn.o",
    "attn.q_norm",
    "attn.k_norm",
    "norm.attn",
    "embed",
    "norm.final",
    "lm_head",
]


def step_gradients(model, ids, autocast: bool):
    """Loss and {name: f32 gradient} of one forward + backward on `ids` (no optimizer step)."""
    import torch  # noqa: PLC0415

    model.zero_grad(set_to_none=True)
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.detach().float() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss.item()), grads


def gradient_errors(grads, ref):
    """Relative Frobenius error against `ref` per (group, layer) and per group (all layers):
    sqrt(sum |g - r|^2 / sum |r|^2). A gradient missing on one side counts as all wrong. Also,
    per group, the error's part along the reference, sum (g - r) r / sum r^2: near 0 for
    rounding noise, about minus the error for a gradient shrunk as a whole (a bias that
    steps add up, where noise averages out)."""
    acc = {}
    for name, r in ref.items():
        g = grads.get(name)
        ref_pieces = grad_pieces(name, r)
        pieces = grad_pieces(name, g) if g is not None else [None] * len(ref_pieces)
        for (group, layer, rp), gp in zip(ref_pieces, pieces):
            rp = rp.double()
            diff = gp[2].double() - rp if gp is not None else None
            err = float(diff.square().sum()) if diff is not None else math.inf
            along = float((diff * rp).sum()) if diff is not None else math.nan
            den = float(rp.square().sum())
            for key in ((group, layer), (group, None)):
                e, a, d = acc.get(key, (0.0, 0.0, 0.0))
                acc[key] = (e + err, a + along, d + den)
    by_group, by_layer, bias = {}, {}, {}
    for (group, layer), (e, a, d) in acc.items():
        rel = math.sqrt(e / d) if d > 0 else (0.0 if e == 0 else math.inf)
        if layer is None:
            by_group[group] = rel
            bias[group] = a / d if d > 0 else 0.0
        else:
            by_layer.setdefault(group, {})[str(layer)] = rel
    return by_group, by_layer, bias


def drift_table(base, state, ids, precision: str, device, variants=()):
    """Each implementation's (and variant's) gradient of one step (the f32 run's weights
    `state`, batch `ids`) against the f32 model's, group by group; also HF grouped_mm in f32
    (the floor: two f32 implementations)."""
    import torch  # noqa: PLC0415

    dtype, autocast = precision_setup(precision, device)
    model = clone_model(base, "eager", torch.float32, state)
    ref_loss, ref = step_gradients(model, ids, False)
    del model
    runs = [(impl, impl, dtype, autocast) for impl in IMPLS + tuple(variants)]
    runs.append(("fp32_grouped_mm", "grouped_mm", torch.float32, False))
    out = {"fp32_loss": ref_loss, "loss": {}, "groups": {}, "layers": {}, "bias": {}}
    for key, experts, run_dtype, run_autocast in runs:
        model = clone_model(base, experts, run_dtype, state)
        loss, grads = step_gradients(model, ids, run_autocast)
        out["loss"][key] = loss
        out["groups"][key], out["layers"][key], out["bias"][key] = gradient_errors(grads, ref)
        del model, grads
        free_memory(device)
    return out


def free_memory(device):
    import torch  # noqa: PLC0415

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- runs


def part_path(out: str, model: str, precision: str) -> str:
    return os.path.join(out, f"fidelity-{model}-{precision}.json")


def settings_of(args, name, device):
    size = tc.SIZES[args.size]
    return {
        "size": args.size,
        "steps": args.steps,
        "lr": args.lr,
        "batch": size["batch"],
        "seq": size["seq"],
        "device": device.type,
        "drift_step": args.drift_step,
        "drift_seed": args.drift_seed,
        "config": size[name],
    }


def load_part(path: str, settings):
    """The part file at `path` when its settings are `settings`, else None."""
    try:
        with open(path) as f:
            part = json.load(f)
    except (OSError, ValueError):
        return None
    return part if same_runs(part.get("settings"), settings) else None


def same_runs(a, b) -> bool:
    """Whether two parts' settings train the same runs: all but where the gradient comparison
    was taken (drift_step, drift_seed), which changes no loss curve."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    drift = ("drift_step", "drift_seed")
    return {k: v for k, v in a.items() if k not in drift} == {
        k: v for k, v in b.items() if k not in drift
    }


def run_parts(args, device, env) -> list:
    """Every (model, precision) part over the seeds; a part's file is written after each seed.
    The f32 reference run of a seed serves every precision of that model."""
    import torch  # noqa: PLC0415

    written = []
    for name in args.model:
        settings = settings_of(args, name, device)
        parts = {}
        for precision in args.precision:
            path = part_path(args.out, name, precision)
            part = None if args.fresh else load_part(path, settings)
            if part is None:
                part = {
                    "kind": "train_fidelity_part",
                    "model": name,
                    "precision": precision,
                    "settings": settings,
                    "env": env,
                    "seeds": {},
                    "drift": None,
                }
            elif part["seeds"]:
                print(f"{name} {precision}: seeds {sorted(part['seeds'], key=int)} from {path}")
            parts[precision] = (path, part)
            written.append(path)
        size = tc.SIZES[args.size]
        wanted = IMPLS + tuple(args.variants)
        for seed in args.seeds:
            # per precision, the runs this seed lacks (a seed run before without a variant
            # gets that variant alone, against its stored f32 curve)
            todo = {}
            for precision, (_, part) in parts.items():
                have = part["seeds"].get(str(seed), {}).get("losses", {})
                missing = [impl for impl in wanted if impl not in have]
                if missing:
                    todo[precision] = missing
            if not todo:
                continue
            t0 = time.perf_counter()
            base = tc.build_model(name, args.size, "eager", seed, device, torch.float32)
            batches = tc.make_batches(
                size[name]["vocab_size"], size["batch"], size["seq"], args.steps, seed + 1
            )
            warmup = min(3, args.steps - 1)
            fresh = [p for p in todo if str(seed) not in parts[p][1]["seeds"]]
            drift_here = seed == args.drift_seed and 1 <= args.drift_step <= args.steps
            drift_here = drift_here and bool(fresh)
            snapshot = {}

            def keep(step, model, ids, drift_here=drift_here, snapshot=snapshot):
                if drift_here and step == args.drift_step - 1:
                    snapshot["state"] = {
                        k: v.detach().clone() for k, v in model.state_dict().items()
                    }
                    snapshot["ids"] = ids

            seconds = {"build": time.perf_counter() - t0}
            ref_losses = None
            if fresh:
                t0 = time.perf_counter()
                model = clone_model(base, "eager", torch.float32)
                ref_losses = tc.train(model, batches, args.lr, device, warmup, False, hook=keep)[
                    "losses"
                ]
                seconds["fp32"] = time.perf_counter() - t0
                del model
                free_memory(device)
            for precision, missing in todo.items():
                path, part = parts[precision]
                dtype, autocast = precision_setup(precision, device)
                result = part["seeds"].get(str(seed))
                if result is None:
                    result = {"losses": {"fp32": ref_losses}, "seconds": dict(seconds)}
                for impl in missing:
                    t0 = time.perf_counter()
                    model = clone_model(base, impl, dtype)
                    r = tc.train(model, batches, args.lr, device, warmup, autocast)
                    result["losses"][impl] = r["losses"]
                    result["seconds"][impl] = time.perf_counter() - t0
                    if "peak_bytes" in r:
                        result.setdefault("peak_bytes", {})[impl] = r["peak_bytes"]
                    ties = tie_counts(model)
                    if ties is not None:
                        result.setdefault("ties", {})[impl] = ties
                    del model
                    free_memory(device)
                if precision in fresh and drift_here and "state" in snapshot:
                    t0 = time.perf_counter()
                    part["drift"] = dict(
                        drift_table(
                            base,
                            snapshot["state"],
                            snapshot["ids"],
                            precision,
                            device,
                            args.variants,
                        ),
                        seed=seed,
                        step=args.drift_step,
                    )
                    result["seconds"]["drift"] = time.perf_counter() - t0
                part["seeds"][str(seed)] = result
                with open(path + ".tmp", "w") as f:
                    json.dump(part, f, indent=1)
                os.replace(path + ".tmp", path)
                ref = result["losses"]["fp32"]
                d = {impl: mean_abs_diff(result["losses"][impl], ref) for impl in missing}
                print(
                    f"{name} {precision} seed {seed}: mean |loss - fp32| "
                    + ", ".join(f"{k} {v:.3e}" for k, v in d.items())
                    + f" ({sum(result['seconds'].values()):.1f} s)",
                    flush=True,
                )
            del base, snapshot
            free_memory(device)
    return written


# --------------------------------------------------------------------------- merge


def read_parts(sources):
    """Every part file under the folders, files or .tgz/.tar.gz archives in `sources`."""
    found = []
    for src in sources:
        if os.path.isdir(src):
            for dirpath, _, files in sorted(os.walk(src)):
                for f in sorted(files):
                    if re.fullmatch(r"fidelity-\w+-\w+\.json", f):
                        with open(os.path.join(dirpath, f)) as fh:
                            found.append((os.path.join(dirpath, f), json.load(fh)))
        elif re.search(r"\.(tgz|tar\.gz|tar)$", src):
            with tarfile.open(src) as tar:
                for member in tar.getmembers():
                    base = os.path.basename(member.name)
                    if member.isfile() and re.fullmatch(r"fidelity-\w+-\w+\.json", base):
                        data = tar.extractfile(member).read()
                        found.append((f"{src}:{member.name}", json.load(io.BytesIO(data))))
        elif os.path.isfile(src):
            with open(src) as fh:
                found.append((src, json.load(fh)))
        else:
            raise FileNotFoundError(f"no such folder, file or archive: {src}")
    return [(p, d) for p, d in found if d.get("kind") == "train_fidelity_part"]


def combine_parts(found):
    """Parts of the same model and precision (and settings, but where the gradient comparison
    was taken) joined seed by seed; a seed that two files hold is taken from the first; every
    gradient comparison is kept ("drifts"; "drift" is the first). Returns
    {(model, precision): part}."""
    parts, notes = {}, []
    for path, part in found:
        key = (part["model"], part["precision"])
        if key not in parts:
            drifts = [part["drift"]] if part.get("drift") else []
            parts[key] = dict(part, seeds=dict(part["seeds"]), sources=[path], drifts=drifts)
            continue
        have = parts[key]
        if not same_runs(have["settings"], part["settings"]):
            notes.append(f"{path}: other settings than {have['sources'][0]}, left out")
            continue
        have["sources"].append(path)
        if (part.get("env") or {}).get("device") != (have.get("env") or {}).get("device"):
            notes.append(
                f"{path}: ran on {part.get('env')}, {have['sources'][0]} on {have.get('env')}"
            )
        for seed, result in part["seeds"].items():
            if seed in have["seeds"]:
                notes.append(f"{path}: seed {seed} already from {have['sources'][0]}, left out")
            else:
                have["seeds"][seed] = result
        if part.get("drift") is not None:
            have["drifts"].append(part["drift"])
            if have.get("drift") is None:
                have["drift"] = part["drift"]
    return parts, notes


def summarize(parts, expected_seeds, threshold: float, atol: float):
    """The statistic of every part; a part lacking one of `expected_seeds` fails."""
    reports = []
    for (model, precision), part in sorted(parts.items(), key=lambda kv: part_order(kv[0])):
        seeds = sorted(part["seeds"], key=int)
        losses = {k: [part["seeds"][s]["losses"][k] for s in seeds] for k in ("fp32",) + IMPLS}
        stats = fidelity_stats(losses, threshold, atol)
        missing = [s for s in expected_seeds if str(s) not in part["seeds"]]
        rep = {
            "model": model,
            "precision": precision,
            "seeds": [int(s) for s in seeds],
            "missing_seeds": missing,
            "settings": part["settings"],
            "env": part.get("env"),
            "sources": part.get("sources", []),
            "stats": stats,
            "variants": variant_stats(part),
            "drift": part.get("drift"),
            "drifts": part.get("drifts") or ([part["drift"]] if part.get("drift") else []),
            "mean_loss": {
                k: [sum(c[t] for c in v) / len(v) for t in range(len(v[0]))] if v else []
                for k, v in losses.items()
            },
            "loss_band": {
                k: [
                    [min(c[t] for c in v) for t in range(len(v[0]))],
                    [max(c[t] for c in v) for t in range(len(v[0]))],
                ]
                if v
                else [[], []]
                for k, v in losses.items()
            },
            "seconds": {
                k: sum(part["seeds"][s]["seconds"].get(k, 0.0) for s in seeds)
                for k in ("build", "fp32") + IMPLS + ("drift",)
            },
        }
        rep["passed"] = stats["passed"] and not missing
        reports.append(rep)
    return reports


def part_order(key):
    model, precision = key
    order = {m: i for i, m in enumerate(("mixtral", "qwen3"))}
    return (
        order.get(model, 99),
        model,
        PRECISIONS.index(precision) if precision in PRECISIONS else 9,
    )


def fmt(v: float) -> str:
    return f"{v:.2e}" if math.isfinite(v) else str(v)


def print_report(reports) -> None:
    print(
        "\nmodel    precision seeds  D ours    D grouped_mm  D eager   ours/gmm  (90% bootstrap)"
        "      per seed               eager/gmm  verdict"
    )
    for rep in reports:
        s = rep["stats"]
        d = s["mean_abs_to_fp32"]
        lo, hi = s["ratio_interval"]
        per_seed = seed_ratios(s["ratio_per_seed"])
        verdict = "PASS" if rep["passed"] else "FAIL"
        if rep["missing_seeds"]:
            verdict += f" (missing seeds {rep['missing_seeds']})"
        print(
            f"{rep['model']:8s} {rep['precision']:9s} {len(rep['seeds']):5d}  {fmt(d['moe_mlir'])}  "
            f"{fmt(d['grouped_mm'])}      {fmt(d['eager'])}  {s['ratio']:8.3f}  "
            f"[{lo:.3f}, {hi:.3f}]  {per_seed:22s} {s['eager_ratio']:9.3f}  {verdict}"
        )
    print("\nmean of loss - f32 over steps and seeds (> 0: trains slower than f32)")
    for rep in reports:
        m = rep["stats"].get("mean_to_fp32")
        if m:
            print(
                f"{rep['model']:8s} {rep['precision']:9s} "
                + "  ".join(f"{impl} {m[impl]:+.2e}" for impl in IMPLS)
            )
    print(
        f"\neach disjoint block of {BLOCK} seeds alone (parts of {2 * BLOCK} seeds or more): "
        f"ours / grouped_mm, eager / grouped_mm, and how many blocks are over {reports[0]['stats']['threshold'] if reports else 1.1:g}"
    )
    for rep in reports:
        s = rep["stats"]
        blocks, eager = s.get("ratio_blocks") or [], s.get("eager_ratio_blocks") or []
        if len(blocks) < 2:
            continue
        bound = s["threshold"]
        print(
            f"{rep['model']:8s} {rep['precision']:9s} ours "
            + " ".join(f"{v:.2f}" for v in blocks)
            + f" ({sum(v > bound for v in blocks)} of {len(blocks)} over); eager "
            + " ".join(f"{v:.2f}" for v in eager)
            + f" ({sum(v > bound for v in eager)} of {len(eager)} over)"
        )
    for rep in reports:
        print_variants(rep)
    for rep, drift in [(r, d) for r in reports for d in r.get("drifts") or []]:
        g = drift["groups"]
        print(
            f"\n{rep['model']} {rep['precision']}: gradient of step {drift['step']} (seed "
            f"{drift['seed']}, the f32 run's weights) against f32, relative error per group"
        )
        # the error's part along f32's gradient (reports from before it have none)
        bias = drift.get("bias") or {}
        print(
            "group          ours      HF grouped_mm  HF eager  f32 grouped_mm  ours/grouped_mm"
            + ("   along f32: ours  grouped_mm  eager" if bias else "")
        )
        groups = [k for k in GROUP_ORDER if k in g["moe_mlir"]]
        groups += sorted(k for k in g["moe_mlir"] if k not in GROUP_ORDER)
        for k in groups:
            along = "".join(
                f"  {bias[impl].get(k, math.nan):+.2e}" for impl in IMPLS if impl in bias
            )
            print(
                f"{k:13s}  {fmt(g['moe_mlir'][k])}  {fmt(g['grouped_mm'][k])}       "
                f"{fmt(g['eager'][k])}  {fmt(g['fp32_grouped_mm'][k])}        "
                f"{ratio(g['moe_mlir'][k], g['grouped_mm'][k]):.3f}"
                + (f"            {along}" if along else "")
            )
        losses = drift["loss"]
        print(
            "loss - f32     "
            + "  ".join(
                f"{k} {losses[k] - drift['fp32_loss']:+.2e}" for k in IMPLS + ("fp32_grouped_mm",)
            )
        )
        worst = sorted(
            ((ratio(g["moe_mlir"][k], g["grouped_mm"][k]), k) for k in groups),
            reverse=True,
        )[:3]
        print(
            "furthest from f32 relative to HF grouped_mm: "
            + ", ".join(f"{k} {r:.2f}x" for r, k in worst)
        )
        for name in VARIANTS:
            if name in g:
                print(
                    f"{name} / grouped_mm: "
                    + ", ".join(f"{k} {ratio(g[name][k], g['grouped_mm'][k]):.2f}" for k in groups)
                )


def seed_ratios(values) -> str:
    """Each seed's ratio, or for many seeds their range, median and how many are over 1."""
    if len(values) <= 6:
        return " ".join(f"{v:.2f}" for v in values)
    v = sorted(values)
    over = sum(x > 1 for x in v)
    return f"{v[0]:.2f}..{v[-1]:.2f} med {v[len(v) // 2]:.2f} >1: {over}/{len(v)}"


def print_variants(rep) -> None:
    """The diagnostic variants' table of one part (nothing without variants)."""
    variants = rep.get("variants") or {}
    if not variants:
        return
    print(
        f"\n{rep['model']} {rep['precision']}: diagnostic variants (each against grouped_mm and "
        "ours on the seeds it ran; not in the verdict)"
    )
    print(
        "variant                 seeds  D variant  D gmm     D ours    variant/gmm (90%)"
        "         ours/gmm  mean: variant  gmm        ours       ties / differ of tokens"
    )
    for name, row in variants.items():
        lo, hi = row["ratio_interval"]
        ties = row.get("ties")
        tie_text = (
            f"{ties['ties'] / ties['tokens']:.2e} / {ties['differ'] / ties['tokens']:.2e}"
            if ties and ties["tokens"]
            else "-"
        )
        print(
            f"{name:23s} {len(row['seeds']):5d}  {fmt(row[name]['D'])}   "
            f"{fmt(row['grouped_mm']['D'])}  {fmt(row['moe_mlir']['D'])}  "
            f"{row['ratio']:6.3f} [{lo:.3f}, {hi:.3f}]  "
            f"{ratio(row['moe_mlir']['D'], row['grouped_mm']['D']):8.3f}  "
            f"{row[name]['mean']:+.2e}  {row['grouped_mm']['mean']:+.2e}  "
            f"{row['moe_mlir']['mean']:+.2e}  {tie_text}"
        )
    for name in variants:
        print(f"  {name}: {VARIANTS[name]}")


# --------------------------------------------------------------------------- plots


def write_plots(reports, out: str) -> list:
    """train_fidelity.png (every part) and fidelity-MODEL-PRECISION.png: the mean loss of each
    implementation with its min-max band over seeds, and |loss - fp32| per step (mean over
    seeds, band min-max). Without matplotlib: train_check.write_png's plain curves of the
    mean |loss - fp32|."""
    paths = []
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        plt = None
    groups = [("train_fidelity.png", reports)] + [
        (f"fidelity-{r['model']}-{r['precision']}.png", [r]) for r in reports
    ]
    for filename, reps in groups:
        if not reps:
            continue
        path = os.path.join(out, filename)
        if plt is None:
            series = [
                (
                    f"{r['model']} {r['precision']} {impl}",
                    r["stats"]["per_step_abs_to_fp32"][impl]["mean"],
                    COLORS[impl],
                )
                for r in reps
                for impl in IMPLS
            ]
            tc.write_png(path, series, title="|loss - fp32|")
            paths.append(path)
            continue
        fig, axes = plt.subplots(len(reps), 2, figsize=(12, 3.2 * len(reps)), squeeze=False)
        for (ax_loss, ax_diff), rep in zip(axes, reps):
            s = rep["stats"]
            steps = range(1, len(rep["mean_loss"]["fp32"]) + 1)
            for impl in ("fp32",) + IMPLS:
                color = tuple(c / 255 for c in COLORS[impl])
                lo, hi = rep["loss_band"][impl]
                ax_loss.plot(
                    steps, rep["mean_loss"][impl], color=color, label=LABELS[impl], **STYLES[impl]
                )
                ax_loss.fill_between(steps, lo, hi, color=color, alpha=0.12, lw=0)
            for impl in IMPLS:
                color = tuple(c / 255 for c in COLORS[impl])
                st = s["per_step_abs_to_fp32"][impl]
                label = f"{LABELS[impl]}: D = {fmt(s['mean_abs_to_fp32'][impl])}"
                ax_diff.plot(steps, st["mean"], color=color, label=label, **STYLES[impl])
                ax_diff.fill_between(steps, st["min"], st["max"], color=color, alpha=0.15, lw=0)
            values = [v for impl in IMPLS for v in s["per_step_abs_to_fp32"][impl]["min"]]
            if values and min(values) > 0 and all(math.isfinite(v) for v in values):
                ax_diff.set_yscale("log")
            name = f"{rep['model']}, {rep['precision']}, {len(rep['seeds'])} seeds"
            ax_loss.set_title(f"{name}: loss (mean, band min-max over seeds)", fontsize=9)
            bound = f"{s['threshold']:g}" + (f" + atol {s['atol']:g}" if s["atol"] else "")
            ax_diff.set_title(
                f"|loss - f32| (mean, min-max): D ours / grouped_mm {s['ratio']:.3f}, "
                f"{'pass' if rep['passed'] else 'fail'} (<= {bound})",
                fontsize=9,
            )
            for ax in (ax_loss, ax_diff):
                ax.set_xlabel("step")
                ax.legend(fontsize=7)
                ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


def merge(sources, out: str, expected_seeds, threshold: float, atol: float, only=None) -> int:
    """Reads the parts, prints the table, writes train_fidelity.json and the plots to `out`.
    `only`: the part files to take (a run's own); default every one found."""
    found = read_parts(sources)
    if only is not None:
        keep = {os.path.abspath(p) for p in only}
        found = [(p, d) for p, d in found if os.path.abspath(p) in keep]
    if not found:
        print(f"train_fidelity: no part files (fidelity-MODEL-PRECISION.json) in {sources}")
        return 1
    parts, notes = combine_parts(found)
    for note in notes:
        print("note:", note)
    reports = summarize(parts, expected_seeds, threshold, atol)
    print_report(reports)
    os.makedirs(out, exist_ok=True)
    plots = write_plots(reports, out)
    passed = sum(r["passed"] for r in reports)
    failed = len(reports) - passed
    result = {
        "threshold": threshold,
        "atol": atol,
        "expected_seeds": expected_seeds,
        "passed": failed == 0,
        "parts": reports,
        "plots": [os.path.basename(p) for p in plots],
    }
    with open(os.path.join(out, "train_fidelity.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {os.path.join(out, 'train_fidelity.json')} and {len(plots)} plots")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


# --------------------------------------------------------------------------- estimate

# Assumed sustained rates on an H200 for these small models (TFLOP/s of 6 x matmul parameters
# per token plus attention): bf16 runs, HF's grouped_mm under autocast (its experts then run in
# f32), runs all in f32 (no TF32); HF eager's per-expert loop costs launches per expert.
RATES = {"bf16": 50.0, "amp_hf": 28.0, "f32": 25.0}
LAUNCH_S = 12e-6  # per kernel launch of the eager experts' loop (about 30 a used expert and layer)
INIT_S_PER_PARAM = 12e-9  # random init on the CPU, cast and copies
START_S = 40.0  # a process: imports, CUDA context, loading the prebuilt layers
# (Calibration: this model gives 105 and 111 s for train_check.py --control --reference, one
# seed of both models in bf16 and in amp, which took 97 and 88 s on the H200.)


def step_flops(name: str, size: str) -> float:
    """FLOPs of one training step (forward + backward) of a model: 6 x the matmul parameters a
    token uses x tokens, plus the attention scores (causal, fwd + bwd)."""
    c, s = tc.SIZES[size][name], tc.SIZES[size]
    d, hd = c["hidden_size"], c["head_dim"]
    ffn = c.get("moe_intermediate_size", c["intermediate_size"])
    attn = d * hd * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"])
    experts = c["num_experts_per_tok"] * 3 * d * ffn
    router = d * c.get("num_local_experts", c.get("num_experts", 0))
    per_token = 6 * (c["num_hidden_layers"] * (attn + experts + router) + d * c["vocab_size"])
    per_token += c["num_hidden_layers"] * 6 * s["seq"] * c["num_attention_heads"] * hd
    return per_token * s["batch"] * s["seq"]


def param_count(name: str, size: str) -> int:
    c = tc.SIZES[size][name]
    d, hd = c["hidden_size"], c["head_dim"]
    ffn = c.get("moe_intermediate_size", c["intermediate_size"])
    experts = c.get("num_local_experts", c.get("num_experts", 0))
    attn = d * hd * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"])
    layer = attn + experts * 3 * d * ffn + d * experts
    return c["num_hidden_layers"] * layer + 2 * d * c["vocab_size"]


def estimate_seconds(name: str, precisions, seeds: int, steps: int, size: str = "full"):
    """Estimated seconds of one model's parts (the f32 run shared by its precisions) on an
    H200, start-up included; {"total": s, "per_seed": s}."""
    c = tc.SIZES[size][name]
    flops = step_flops(name, size) * steps
    experts = c.get("num_local_experts", c.get("num_experts", 0))
    used = min(experts, c["num_experts_per_tok"] * tc.SIZES[size]["batch"] * tc.SIZES[size]["seq"])
    launches = LAUNCH_S * 30 * used * c["num_hidden_layers"] * steps
    per_seed = flops / (RATES["f32"] * 1e12) + launches  # the f32 reference (eager experts)
    per_seed += INIT_S_PER_PARAM * param_count(name, size) * (1 + 3 * len(precisions))
    for precision in precisions:
        hf = RATES["bf16"] if precision == "bf16" else RATES["amp_hf"]
        per_seed += flops / (RATES["bf16"] * 1e12)  # ours: bf16 kernels in both
        per_seed += flops / (hf * 1e12)  # HF grouped_mm
        per_seed += flops / (hf * 1e12) + launches  # HF eager
    return {"per_seed": per_seed, "total": START_S + seeds * per_seed}


def print_estimate(models, precisions, seeds, steps, size) -> None:
    total = 0.0
    for name in models:
        e = estimate_seconds(name, precisions, len(seeds), steps, size)
        total += e["total"] - START_S
        print(
            f"estimate {name} {','.join(precisions)}: {e['per_seed']:.0f} s a seed, "
            f"{e['total']:.0f} s for {len(seeds)} seeds of {steps} steps "
            f"({step_flops(name, size) / 1e12:.2f} TFLOP a step, "
            f"{param_count(name, size) / 1e6:.0f} M parameters)"
        )
    print(f"estimate all: {START_S + total:.0f} s in one process on an H200")


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="mixtral,qwen3", help="comma-separated: mixtral,qwen3")
    p.add_argument("--precision", default="bf16,amp", help="comma-separated: bf16,amp")
    p.add_argument("--seeds", default="0-4", help="e.g. 0-4 or 0,2")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--size", choices=sorted(tc.SIZES), default="full")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--threshold", type=float, default=1.1, help="pass: D(ours) <= this x D(HF)")
    p.add_argument("--atol", type=float, default=0.0, help="added to the bound (CPU runs)")
    p.add_argument(
        "--drift-step",
        type=int,
        default=25,
        help="the step whose gradients are compared (1-based; 0: none)",
    )
    p.add_argument("--drift-seed", type=int, default=0)
    p.add_argument(
        "--variants",
        default="",
        help="comma-separated diagnostic variants to run beside (reported apart): "
        + ", ".join(VARIANTS),
    )
    p.add_argument("--fresh", action="store_true", help="ignore part files already in --out")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument(
        "--merge",
        nargs="*",
        metavar="SRC",
        help="merge the part files under SRC (folders, files, session.tgz; default --out) "
        "into --out and exit",
    )
    p.add_argument("--estimate", action="store_true", help="print the H200 run time and exit")
    args = p.parse_args(argv)
    try:
        args.model = [m for m in args.model.split(",") if m]
        args.precision = [x for x in args.precision.split(",") if x]
        args.seeds = parse_seeds(args.seeds)
        args.variants = [v for v in args.variants.split(",") if v]
        for v in args.variants:
            if v not in VARIANTS:
                raise ValueError(f"unknown variant {v!r} (known: {', '.join(VARIANTS)})")
        for m in args.model:
            if m not in ("mixtral", "qwen3"):
                raise ValueError(f"unknown model {m!r} (known: mixtral, qwen3)")
        for x in args.precision:
            if x not in PRECISIONS:
                raise ValueError(f"unknown precision {x!r} (known: bf16, amp)")
        if not args.model or not args.precision:
            raise ValueError("no model or no precision")
        if args.steps < 1:
            raise ValueError("--steps must be at least 1")
        if args.threshold <= 0 or args.atol < 0:
            raise ValueError("--threshold must be > 0 and --atol >= 0")
    except ValueError as e:
        print(f"train_fidelity: {e}")
        return 2
    if args.estimate:
        print_estimate(args.model, args.precision, args.seeds, args.steps, args.size)
        return 0
    if args.merge is not None:
        try:
            return merge(args.merge or [args.out], args.out, args.seeds, args.threshold, args.atol)
        except (OSError, ValueError, KeyError, tarfile.TarError) as e:
            print(f"train_fidelity: cannot merge: {type(e).__name__}: {e}")
            return 2
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    os.makedirs(args.out, exist_ok=True)
    env = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    print(
        "train_fidelity:",
        json.dumps(
            dict(
                env,
                size=args.size,
                steps=args.steps,
                seeds=args.seeds,
                models=args.model,
                precisions=args.precision,
                variants=args.variants,
            )
        ),
    )
    if args.size == "full":
        print_estimate(args.model, args.precision, args.seeds, args.steps, args.size)
    t0 = time.perf_counter()
    written = run_parts(args, device, env)
    print(f"runs: {time.perf_counter() - t0:.1f} s")
    return merge([args.out], args.out, args.seeds, args.threshold, args.atol, only=written)


if __name__ == "__main__":
    sys.exit(main())
