#!/usr/bin/env python3
"""Check a compiled layer on the GPU against the fp32 torch reference (docs/benchmarks.md).

For each `--layer DIR/NAME` (NAME.so + NAME.json) and each routing variant:

- random inputs: x ~ N(0, 1), weights N(0, 0.02^2), selection bias N(0, 0.01^2), expert
  biases (with expert_bias) b_gate_up N(0, 0.1^2) and b_down N(0, 0.01^2); random cotangents
  for out and the router logits (never zeros);
- our forward + backward, then the fp32 reference (python/moe_mlir/torch_reference.py) with
  our experts forced; relative Frobenius errors ||ours - ref|| / ||ref|| of out, router logits,
  dx, d_w_router, d_w_gate_up, d_w_down (and the shared expert's, the expert biases') against
  1e-2 (outputs) and 2e-2 (gradients); NaN fails;
- our experts against the reference's own routing: differences are allowed only at near-ties
  (selection scores within --tie-tol), and counted;
- the dispatch offsets, when saved, against the experts' token counts;
- ours run twice: every output, saved tensor and gradient bitwise identical;
- for a Mixtral-shaped layer (softmax, renormalised, no bias, groups, scaling, shared expert or
  expert biases), transformers' MixtralSparseMoeBlock (grouped_mm experts) with the same
  weights and our routing decisions, d_logits = 0 on both sides.

Routing variants: `random`; `all-to-one` (one expert is every token's first pick, through a
constant input feature and a large router column, and the selection bias when there is one);
`skewed` (half the experts get no token).

Prints one table last, writes JSON to $OUT (or --out), exits 1 on any failure, 2 on bad usage.

    python3 bench/check_layer.py --layer gpu-inputs/layers/t37 --routing all
    python3 bench/check_layer.py --layer gpu-inputs/layers/tiny --ours-only   # for sanitizers
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

OUT_TOL = 1e-2
GRAD_TOL = 2e-2
ROUTINGS = ("random", "all-to-one", "skewed")

# Numbers in the table and JSON under these names (reference key -> our label).
GRAD_LABELS = {
    "x": "dx",
    "w_router": "d_w_router",
    "w_gate_up": "d_w_gate_up",
    "w_down": "d_w_down",
    "shared_gate_up": "d_shared_w_gate_up",
    "shared_down": "d_shared_w_down",
    "b_gate_up": "d_b_gate_up",
    "b_down": "d_b_down",
}


def log(msg: str) -> None:
    print(msg, flush=True)


def import_torch(device: str):
    """torch, or None after saying why it cannot run on `device` (cuda or cpu)."""
    try:
        import torch
    except ImportError:
        log("error: PyTorch is not installed")
        return None
    if device == "cuda" and not torch.cuda.is_available():
        log("error: torch sees no CUDA device")
        return None
    return torch


def sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def open_layer(layer_path: str, opts):
    """The compiled layer, or its emulation (bench/emulate.py) for dry runs without a GPU."""
    if opts.emulate:
        from emulate import EmulatedLayer

        return EmulatedLayer(
            layer_path + ".so", layer_path + ".json", require_cuda=opts.device == "cuda"
        )
    from moe_mlir.gpu import CompiledLayer

    return CompiledLayer(layer_path + ".so", layer_path + ".json")


@dataclasses.dataclass
class Check:
    layer: str
    routing: str
    metrics: Dict[str, Any] = dataclasses.field(default_factory=dict)
    failures: List[str] = dataclasses.field(default_factory=list)
    notes: List[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.failures

    def fail(self, msg: str) -> None:
        log(f"    FAIL {msg}")
        self.failures.append(msg)

    def note(self, msg: str) -> None:
        log(f"    {msg}")
        self.notes.append(msg)


# --------------------------------------------------------------------------- inputs


def make_inputs(torch, cfg, routing: str, gen, device) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Layer arguments by LayerConfig name (bf16, the selection bias f32) and what the variant
    did."""
    T, d, n, E, k = cfg.tokens, cfg.hidden, cfg.ffn, cfg.experts, cfg.top_k

    def normal(shape, std, dtype=torch.bfloat16):
        return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std).to(
            dtype
        )

    x = normal((T, d), 1.0).float()
    wr = normal((d, E), 0.02).float()
    info: Dict[str, Any] = {}
    bias = torch.randn((E,), generator=gen, device=device) * 0.01 if cfg.router_bias else None
    if routing == "all-to-one":
        # A constant feature times a large router column: +10 on the winner's logit, about
        # 9 standard deviations above the others' (std 0.02 * sqrt(d)).
        winner = E - 1
        x[:, 0] = 2.0
        wr[0, :] = 0.0
        wr[0, winner] = 5.0
        if bias is not None:
            bias[winner] = 5.0
        info["winner"] = winner
    elif routing == "skewed":
        # Every other expert gets a -10 logit (and a negative bias): never picked while the
        # others suffice (k <= E/2, and with groups each kept group keeps half its experts).
        dead = list(range(1, E, 2))
        live = E - len(dead)
        size = E // cfg.num_groups
        if k > live or (cfg.num_groups > 1 and k > cfg.topk_groups * (size - size // 2)):
            dead = dead[: max(0, E - k)][:1]  # at least one expert without a token
        x[:, 0] = 2.0
        wr[0, :] = 0.0
        for e in dead:
            wr[0, e] = -5.0
            if bias is not None:
                bias[e] = -1.0
        info["dead_experts"] = dead
    args: Dict[str, Any] = {"x": x.to(torch.bfloat16), "w_router": wr.to(torch.bfloat16)}
    if bias is not None:
        args["router_bias"] = bias.float().contiguous()
    args["w_gate_up"] = normal((E, d, cfg.gate_up_width), 0.02)
    args["w_down"] = normal((E, n, d), 0.02)
    if cfg.has_shared:
        args["shared_gate_up"] = normal((d, cfg.shared_gate_up_width), 0.02)
        args["shared_down"] = normal((cfg.shared_ffn, d), 0.02)
    if cfg.expert_bias:
        # Of the order of what they are added to (H about 0.3, y 0.015 to 0.05 with these
        # weights): either bias dropped moves out by 10% or more, ten times OUT_TOL.
        args["b_gate_up"] = normal((E, cfg.gate_up_width), 0.1)
        args["b_down"] = normal((E, d), 0.01)
    return args, info


def forward_param_names(layer, cfg) -> Dict[str, str]:
    """LayerConfig argument name -> forward parameter name ("x" -> "arg0")."""
    from moe_mlir.torch_reference import INPUT_ALIASES

    fwd_inputs = [p.name for p in layer.manifest.forward.by_role("input")]
    mapping: Dict[str, str] = {}
    for name, param in layer.manifest.input_names.items():
        canon = INPUT_ALIASES.get(name, name)
        if param in fwd_inputs:
            mapping[canon] = param
    wanted = [name for name, _, _ in cfg.arg_specs()]
    if set(wanted) <= set(mapping):
        return {w: mapping[w] for w in wanted}
    # No usable names: the manifest's input order is the layer's argument order.
    if len(fwd_inputs) != len(wanted):
        raise ValueError(
            f"the manifest's forward has {len(fwd_inputs)} inputs, the layer "
            f"config {len(wanted)} ({', '.join(wanted)})"
        )
    return dict(zip(wanted, fwd_inputs))


def find_saved(layer, *, contains: str, dtype: str, shape: Tuple[int, ...]) -> Optional[str]:
    cands = [
        p
        for p in layer.manifest.forward.by_role("saved")
        if p.dtype == dtype and tuple(p.shape) == tuple(shape)
    ]
    for p in cands:
        if contains in p.name:
            return p.name
    return None


# --------------------------------------------------------------------------- comparisons


def rel_error(torch, ours, ref) -> float:
    a = ours.detach().double()
    b = ref.detach().double()
    if not bool(torch.isfinite(a).all()):
        return float("nan")
    den = float(torch.linalg.vector_norm(b))
    num = float(torch.linalg.vector_norm(a - b))
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def bits_equal(torch, a, b) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype in (torch.bfloat16, torch.float16):
        return torch.equal(a.view(torch.int16), b.view(torch.int16))
    if a.dtype == torch.float32:
        return torch.equal(a.view(torch.int32), b.view(torch.int32))
    return torch.equal(a, b)


def compare_routing(torch, check: Check, ours, own, c, tie_tol: float) -> None:
    """Position-wise: where our pick differs from the reference's own, the two experts'
    selection scores must be within tie_tol (a near-tie that rounding may flip)."""
    ours = ours.long()
    own = own.long()
    diff = ours != own
    tokens = int(diff.any(dim=1).sum())
    if tokens == 0:
        check.metrics["routing_mismatch_tokens"] = 0
        check.metrics["routing_near_ties"] = 0
        return
    gap = (c.gather(1, ours) - c.gather(1, own)).abs()
    gap = torch.where(diff, gap, torch.zeros_like(gap))
    worst = gap.max(dim=1).values
    ties = int(((worst <= tie_tol) & diff.any(dim=1)).sum())
    real = tokens - ties
    check.metrics["routing_mismatch_tokens"] = tokens
    check.metrics["routing_near_ties"] = ties
    check.metrics["routing_worst_gap"] = float(worst.max())
    if real:
        t = int(torch.argmax(worst))
        check.fail(
            f"experts differ from the reference's routing on {real} token(s) beyond "
            f"near-ties (token {t}: ours {ours[t].tolist()}, reference "
            f"{own[t].tolist()}, score gap {float(worst[t]):.3g} > {tie_tol:g})"
        )
    else:
        check.note(f"experts differ on {ties} token(s), all near-ties (gap <= {tie_tol:g})")


def check_dispatch(torch, check: Check, fwd, layer, cfg, experts) -> None:
    name = find_saved(layer, contains="offsets", dtype="i32", shape=(cfg.experts + 1,))
    if name is None:
        return
    offsets = fwd[name].long()
    counts = torch.bincount(experts.long().flatten(), minlength=cfg.experts)[: cfg.experts]
    want = torch.zeros(cfg.experts + 1, dtype=torch.long, device=offsets.device)
    want[1:] = torch.cumsum(counts, 0)
    if not torch.equal(offsets, want):
        check.fail(
            f"{name} {offsets.tolist()[:12]}... does not match the experts' token "
            f"counts {want.tolist()[:12]}..."
        )
    else:
        check.metrics["dispatch_offsets_ok"] = True


def hf_shaped(cfg) -> bool:
    return (
        cfg.scoring == "softmax"
        and cfg.renormalize
        and not cfg.router_bias
        and cfg.num_groups == 1
        and float(cfg.scaling_factor) == 1.0
        and not cfg.has_shared
        and cfg.activation == "swiglu"
        and not cfg.expert_bias  # MixtralSparseMoeBlock's experts have no biases
    )


def grads_by_arg(layer, params: Dict[str, str], grads: Dict[str, Any]) -> Dict[str, Any]:
    """Gradients keyed by LayerConfig argument name ("x", ...), from the manifest's "of"."""
    inv = {param: arg for arg, param in params.items()}
    out = {}
    for spec in layer.manifest.backward.by_role("gradient"):
        of = spec.of or (spec.name[2:] if spec.name.startswith("d_") else spec.name)
        out[inv.get(of, of)] = grads[spec.name]
    return out


def compare_hf(
    torch,
    check: Check,
    cfg,
    args,
    layer,
    fwd,
    params,
    experts,
    d_out,
    d_out_name: str,
    implementation: str,
    routing: str,
) -> None:
    """transformers' MixtralSparseMoeBlock with our weights and routing decisions."""
    device = args["x"].device
    try:
        import torch.nn.functional as F
        from transformers import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    except Exception as e:  # noqa: BLE001 - any import problem means: skip, and say why
        check.note(f"transformers comparison skipped: {type(e).__name__}: {e}")
        return
    T, d, n, E, k = cfg.tokens, cfg.hidden, cfg.ffn, cfg.experts, cfg.top_k
    hc = MixtralConfig(
        hidden_size=d, intermediate_size=n, num_local_experts=E, num_experts_per_tok=k
    )
    hc._experts_implementation = implementation
    block = MixtralSparseMoeBlock(hc).to(device=args["x"].device, dtype=torch.bfloat16)
    with torch.no_grad():
        # HF: gate.weight [E, d]; gate_up_proj [E, 2n, d] (gate rows first); down_proj [E, d, n].
        block.gate.weight.copy_(args["w_router"].t())
        block.experts.gate_up_proj.copy_(args["w_gate_up"].transpose(1, 2))
        block.experts.down_proj.copy_(args["w_down"].transpose(1, 2))
    forced = experts.long()

    def gate_forward(hidden_states):
        hidden_states = hidden_states.reshape(-1, d)
        logits = F.linear(hidden_states, block.gate.weight)
        probs = torch.softmax(logits.float(), dim=-1)
        top = probs.gather(1, forced)
        top = top / top.sum(dim=-1, keepdim=True)
        return logits, top, forced

    # HF's own routing first (bf16 logits), for the record.
    with torch.no_grad():
        _, _, hf_idx = block.gate(args["x"])
    same = int((torch.sort(hf_idx, 1).values == torch.sort(forced, 1).values).all(1).sum())
    check.metrics["hf_own_routing_same_tokens"] = same
    block.gate.forward = gate_forward
    x = args["x"].detach().clone().requires_grad_(True)
    out = block(x.view(1, T, d)).view(T, d)
    out.backward(d_out)
    sync(torch, device)
    # Ours again with d_logits = 0 (a missing cotangent is zeros): HF has no logits output.
    ours_named = grads_by_arg(layer, params, layer.backward(fwd, {d_out_name: d_out}))
    sync(torch, device)
    pairs = [
        ("hf_out", fwd["result0"], out),
        ("hf_dx", ours_named.get("x"), x.grad),
        ("hf_d_w_router", ours_named.get("w_router"), block.gate.weight.grad.t()),
        (
            "hf_d_w_gate_up",
            ours_named.get("w_gate_up"),
            block.experts.gate_up_proj.grad.transpose(1, 2),
        ),
        ("hf_d_w_down", ours_named.get("w_down"), block.experts.down_proj.grad.transpose(1, 2)),
    ]
    for label, ours_t, hf_t in pairs:
        if ours_t is None or hf_t is None:
            check.note(f"{label}: nothing to compare")
            continue
        err = rel_error(torch, ours_t, hf_t)
        check.metrics[label] = err
        tol = OUT_TOL if label == "hf_out" else GRAD_TOL
        if not err <= tol:  # NaN fails
            msg = f"{label}: ours vs transformers {err:.3g} > {tol:g}"
            if routing == "random":
                check.fail(msg)
            else:
                # A saturated router (all-to-one, skewed) has a tiny router gradient that
                # HF's bf16 logits round away; the fp32 reference is the judge there.
                check.note(msg + " (not judged: saturated router)")


# --------------------------------------------------------------------------- one check


def run_check(torch, layer_path: str, routing: str, opts) -> Check:
    from moe_mlir import torch_reference as TR
    from moe_mlir.gpu import torch_dtype

    name = os.path.basename(layer_path)
    check = Check(layer=name, routing=routing)
    start = time.time()
    layer = open_layer(layer_path, opts)
    cfg = TR.config_from_manifest(layer.layer)
    device = (
        torch.device("cuda", torch.cuda.current_device())
        if opts.device == "cuda"
        else torch.device(opts.device)
    )
    check.metrics["config"] = dict(
        T=cfg.tokens,
        d=cfg.hidden,
        n=cfg.ffn,
        E=cfg.experts,
        k=cfg.top_k,
        scoring=cfg.scoring,
        renormalize=cfg.renormalize,
        groups=cfg.num_groups,
        topk_groups=cfg.topk_groups,
        scaling=cfg.scaling_factor,
        bias=cfg.router_bias,
        shared_n=cfg.shared_ffn,
        expert_bias=cfg.expert_bias,
    )
    check.metrics["workspace_bytes"] = {
        "forward": layer.workspace_bytes("forward"),
        "backward": layer.workspace_bytes("backward"),
    }
    gen = torch.Generator(device=device)
    gen.manual_seed(opts.seed)
    args, info = make_inputs(torch, cfg, routing, gen, device)
    check.metrics.update(info)
    params = forward_param_names(layer, cfg)
    inputs = {params[a]: t for a, t in args.items()}
    cot_specs = layer.manifest.backward.at(cfg.tokens).by_role("cotangent")
    cots = {}
    for spec in cot_specs:
        shape = tuple(spec.shape)
        scale = 1.0 if spec.of in (None, "result0") else 0.1
        cots[spec.name] = (torch.randn(shape, generator=gen, device=device) * scale).to(
            torch_dtype(spec.dtype)
        )
    d_out_name = next((s.name for s in cot_specs if s.of == "result0"), cot_specs[0].name)
    d_log_name = next((s.name for s in cot_specs if s.of == "result1"), None)

    log(f"  {name} [{routing}] forward + backward ...")
    fwd = layer.forward(inputs)
    grads = layer.backward(fwd, cots)
    sync(torch, device)
    experts_name = find_saved(layer, contains="expert", dtype="i32", shape=(cfg.tokens, cfg.top_k))
    experts = fwd[experts_name].long() if experts_name else None

    for label, tensors in (("forward", fwd), ("gradients", grads)):
        for pname, t in tensors.items():
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                check.fail(f"{label} {pname} has NaN or inf")
    if experts is not None:
        bad = int(((experts < 0) | (experts >= cfg.experts)).sum())
        if bad:
            check.fail(f"{bad} experts outside [0, {cfg.experts})")
        elif cfg.top_k > 1 and bool((torch.sort(experts, 1).values.diff(dim=1) == 0).any()):
            check.fail("a token picked the same expert twice")
    if opts.ours_only:
        check.seconds = time.time() - start
        return check

    # Bitwise determinism: everything again.
    fwd2 = layer.forward(inputs)
    grads2 = layer.backward(fwd2, cots)
    sync(torch, device)
    differ = [p for p in list(fwd) if p not in inputs and not bits_equal(torch, fwd[p], fwd2[p])]
    differ += [p for p in grads if not bits_equal(torch, grads[p], grads2[p])]
    check.metrics["bitwise_identical"] = not differ
    if differ:
        check.fail(f"not bitwise identical across two runs: {', '.join(differ)}")
    del fwd2, grads2

    # The reference, with our routing decisions.
    if experts is None:
        check.note("the manifest saves no experts [T,k] i32: the reference routes itself")
    ref, ref_grads = TR.forward_backward(
        cfg, args, cots[d_out_name], cots[d_log_name] if d_log_name else None, experts=experts
    )
    errors = {"out": rel_error(torch, fwd["result0"], ref.out)}
    if "result1" in fwd:
        errors["router_logits"] = rel_error(torch, fwd["result1"], ref.logits)
    grad_of = grads_by_arg(layer, params, grads)
    for arg, label in GRAD_LABELS.items():
        if arg in ref_grads:
            if arg not in grad_of:
                check.fail(f"no gradient of {arg} in the manifest")
                continue
            errors[label] = rel_error(torch, grad_of[arg], ref_grads[arg])
    check.metrics["rel_error"] = errors
    for label, err in errors.items():
        tol = OUT_TOL if label in ("out", "router_logits") else GRAD_TOL
        if not err <= tol:
            check.fail(f"{label}: relative error {err:.3g} > {tol:g}")

    # Our routing against the reference's own choice.
    if experts is not None:
        own = TR.select_experts(ref.selection_scores, cfg.top_k, cfg.num_groups, cfg.topk_groups)
        compare_routing(torch, check, experts, own, ref.selection_scores, opts.tie_tol)
        check_dispatch(torch, check, fwd, layer, cfg, experts)
        counts = torch.bincount(experts.flatten(), minlength=cfg.experts)
        check.metrics["experts_without_tokens"] = int((counts == 0).sum())
        check.metrics["max_tokens_per_expert"] = int(counts.max())
        if routing == "all-to-one":
            hit = int((experts[:, 0] == info["winner"]).sum())
            check.metrics["tokens_to_winner"] = hit
            if hit != cfg.tokens:
                check.fail(
                    f"all-to-one: only {hit} of {cfg.tokens} tokens picked expert "
                    f"{info['winner']} first"
                )
        if routing == "skewed" and int((counts == 0).sum()) == 0:
            check.fail("skewed: every expert got a token")

    if hf_shaped(cfg) and not opts.no_hf and experts is not None:
        compare_hf(
            torch,
            check,
            cfg,
            args,
            layer,
            fwd,
            params,
            experts,
            cots[d_out_name],
            d_out_name,
            opts.hf_implementation,
            routing,
        )
    check.seconds = time.time() - start
    return check


# --------------------------------------------------------------------------- main


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.2e}"
    return "-" if v is None else str(v)


def print_table(checks: List[Check]) -> None:
    cols = [
        "out",
        "router_logits",
        "dx",
        "d_w_router",
        "d_w_gate_up",
        "d_w_down",
        "d_shared_w_gate_up",
        "d_shared_w_down",
    ]
    short = ["out", "logits", "dx", "d_wr", "d_wgu", "d_wd", "d_sgu", "d_sd"]
    # The expert biases' columns only where a layer has them.
    if any("d_b_gate_up" in c.metrics.get("rel_error", {}) for c in checks):
        cols += ["d_b_gate_up", "d_b_down"]
        short += ["d_bgu", "d_bd"]
    head = f"{'layer':<22} {'routing':<10} " + " ".join(f"{s:>8}" for s in short)
    head += f" {'ties':>5} {'bits':>4} {'hf_out':>8} {'result':>6}"
    log("")
    log(head)
    log("-" * len(head))
    for c in checks:
        errs = c.metrics.get("rel_error", {})
        row = f"{c.layer[:22]:<22} {c.routing:<10} "
        row += " ".join(f"{fmt(errs.get(k)):>8}" for k in cols)
        ties = c.metrics.get("routing_near_ties")
        bits = c.metrics.get("bitwise_identical")
        row += f" {fmt(ties):>5} {('yes' if bits else 'no') if bits is not None else '-':>4}"
        row += f" {fmt(c.metrics.get('hf_out')):>8} {'PASS' if c.passed else 'FAIL':>6}"
        log(row)
    log(
        f"tolerances: out/logits {OUT_TOL:g}, gradients {GRAD_TOL:g} (relative Frobenius, fp32 "
        f"reference with our routing)"
    )


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--layer",
        action="append",
        required=True,
        help="DIR/NAME of NAME.so + NAME.json (repeatable)",
    )
    p.add_argument(
        "--routing",
        action="append",
        choices=ROUTINGS + ("all",),
        help="routing variant (repeatable; default random; 'all' = every one)",
    )
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument(
        "--tie-tol",
        type=float,
        default=1e-4,
        help="selection-score gap below which a different pick is a near-tie",
    )
    p.add_argument(
        "--ours-only",
        action="store_true",
        help="run our forward + backward once and check finiteness only (for compute-sanitizer)",
    )
    p.add_argument("--no-hf", action="store_true", help="skip the transformers comparison")
    p.add_argument("--hf-implementation", default="grouped_mm")
    p.add_argument(
        "--out",
        default=os.environ.get("OUT", "/tmp/moe-check-out"),
        help="folder for the JSON (default $OUT)",
    )
    p.add_argument("--json-name", default="check_layer.json")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    p.add_argument(
        "--emulate",
        action="store_true",
        help="dry run: bench/emulate.py's stand-in instead of NAME.so (only "
        "NAME.json is read); checks this script, not the kernels",
    )
    opts = p.parse_args(argv)
    routings = opts.routing or ["random"]
    if "all" in routings:
        routings = list(ROUTINGS)

    torch = import_torch(opts.device)
    if torch is None:
        return 2
    # The reference is fp32: no TF32 in its matmuls.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    checks: List[Check] = []
    fatal = False
    for layer_path in opts.layer:
        layer_path = layer_path[:-3] if layer_path.endswith(".so") else layer_path
        for routing in routings:
            log(f"== {os.path.basename(layer_path)} [{routing}]")
            if fatal:
                c = Check(layer=os.path.basename(layer_path), routing=routing)
                c.fail("not run: an earlier check left the CUDA context unusable")
                checks.append(c)
                continue
            try:
                c = run_check(torch, layer_path, routing, opts)
            except Exception as e:  # noqa: BLE001 - one check failing must not stop the rest
                c = Check(layer=os.path.basename(layer_path), routing=routing)
                c.fail(f"{type(e).__name__}: {e}")
                log(traceback.format_exc())
                text = str(e)
                if (
                    "illegal" in text
                    or "KERNEL_FAULT" in text
                    or "CUDA error" in text
                    or "unspecified launch failure" in text
                ):
                    fatal = True
            checks.append(c)
            log(f"   {'PASS' if c.passed else 'FAIL'} in {c.seconds:.1f} s")

    os.makedirs(opts.out, exist_ok=True)
    path = os.path.join(opts.out, opts.json_name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(
            {
                "tolerances": {"output": OUT_TOL, "gradient": GRAD_TOL},
                "device": (torch.cuda.get_device_name() if opts.device == "cuda" else opts.device),
                "emulated": opts.emulate,
                "torch": torch.__version__,
                "checks": [dataclasses.asdict(c) | {"passed": c.passed} for c in checks],
            },
            f,
            indent=1,
            default=str,
        )
    print_table(checks)
    failed = sum(not c.passed for c in checks)
    log(f"json: {path}")
    log(f"{len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
