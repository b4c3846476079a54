#!/usr/bin/env python3
"""Checks compiled layers with a capacity factor (token dropping: each expert keeps its first
ceil(capacity_factor * T * k / E) pairs in token order, the call's T) on the GPU against the
fp32 torch reference (python/moe_mlir/torch_reference.py, which drops the same pairs),
forward and backward: random inputs and cotangents (never zeros), random, all-to-one or
skewed routing (bench/check_layer.py's variants; skewed and all-to-one overfill the live
experts, so pairs drop), the reference with our routing decisions; relative Frobenius errors
of out, router logits, dx and every weight gradient within 1e-2 (outputs) and 2e-2
(gradients); NaN fails; ours twice bitwise identical; the pairs our dispatch dropped (saved
rows of -1) exactly those the reference's dispatch (reference.py) drops on our routing, and
some dropped under skewed and all-to-one routing once T * k exceeds what the live experts keep.

The manifest does not carry the capacity factor: give it (--capacity-factor, the layer's).

    python3 test/GPU/capacity_layer_check.py --layer gpu-inputs/layers/capacity-t37 \\
        --capacity-factor 0.75 [--tokens 1,37,64] [--routing all] [--json out.json] [--emulate]

A layer of dynamic T runs at --tokens (default 1, 37 and its bound), one of static T at its T.
--emulate runs bench/emulate.py's stand-in on the CPU (checks this script, not the kernels; it
saves no dispatch rows). Exits 1 on any failure.
"""

import argparse
import dataclasses
import json
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "python"))
import check_layer as CL  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from moe_mlir import reference as R  # noqa: E402
from moe_mlir import torch_reference as TR  # noqa: E402
from moe_mlir.gpu import torch_dtype  # noqa: E402


def saved(layer, fwd, name, T, k):
    for p in layer.manifest.forward.by_role("saved"):
        if p.name == name and p.dtype == "i32" and tuple(fwd[p.name].shape) == (T, k):
            return fwd[p.name]
    return None


def check_at(layer, name, T, routing, opts):
    """One forward + backward of `layer` at T tokens against the reference: a result row."""
    device = torch.device(opts.device)
    base = TR.config_from_manifest(layer.layer)
    cfg = dataclasses.replace(base, tokens=T, capacity_factor=opts.capacity_factor).validate()
    if opts.emulate:  # the stand-in computes with its own config: give it the drops and T
        layer.cfg = cfg
    gen = torch.Generator(device=device).manual_seed(opts.seed + T)
    args, info = CL.make_inputs(torch, cfg, routing, gen, device)
    params = CL.forward_param_names(layer, cfg)
    inputs = {params[a]: t for a, t in args.items()}
    backward = layer.manifest.backward
    cot_specs = (backward.at(T) if layer.manifest.max_tokens else backward).by_role("cotangent")
    cots = {
        s.name: (
            torch.randn(tuple(s.shape), generator=gen, device=device)
            * (1.0 if s.of in (None, "result0") else 0.1)
        ).to(torch_dtype(s.dtype))
        for s in cot_specs
    }
    d_out = next((s.name for s in cot_specs if s.of == "result0"), cot_specs[0].name)
    d_log = next((s.name for s in cot_specs if s.of == "result1"), None)
    fwd = layer.forward(inputs)
    grads = layer.backward(fwd, cots)
    fwd2 = layer.forward(inputs)
    grads2 = layer.backward(fwd2, cots)
    failures = []
    # The queue's rows past offsets[E] belong to no expert: with drops, the activations saved
    # there (H) are never written, so only the rows the experts own must match.
    offsets = next((fwd[p] for p in fwd if p == "moe.dispatch.offsets"), None)
    owned = int(offsets[-1]) if offsets is not None else T * cfg.top_k

    def same(p):
        a, b = fwd[p], fwd2[p]
        if a.is_floating_point() and a.dim() >= 1 and a.shape[0] == T * cfg.top_k:
            a, b = a[:owned], b[:owned]
        return CL.bits_equal(torch, a, b)

    differ = [p for p in fwd if p not in inputs and not same(p)]
    differ += [p for p in grads if not CL.bits_equal(torch, grads[p], grads2[p])]
    if differ:
        failures.append(f"not bitwise identical across two runs: {', '.join(differ)}")
    experts = saved(layer, fwd, "moe.router.experts", T, cfg.top_k)
    if experts is None:
        failures.append("the manifest saves no experts [T, k] i32")
    # The reference's dispatch on our routing: the pairs that must drop.
    want_rows = None
    if experts is not None:
        _, _, want_rows = R.dispatch(experts.cpu().numpy(), cfg.experts, cfg.capacity)
    dropped = None if want_rows is None else int((want_rows < 0).sum())
    rows = None if opts.emulate else saved(layer, fwd, "moe.dispatch.rows", T, cfg.top_k)
    if rows is not None and want_rows is not None:
        ours = rows.cpu().numpy() < 0
        if not np.array_equal(ours, want_rows < 0):
            failures.append(
                f"dropped pairs differ from the reference's: ours {int(ours.sum())}, "
                f"the reference {dropped}, {int((ours != (want_rows < 0)).sum())} differ"
            )
    elif not opts.emulate:
        failures.append("the manifest saves no dispatch rows [T, k] i32")
    # Pigeonholes: skewed routing puts T * k pairs on the live experts, all-to-one T on one.
    live = cfg.experts - len(info.get("dead_experts", []))
    must = {"skewed": T * cfg.top_k > live * cfg.capacity, "all-to-one": T > cfg.capacity}
    if must.get(routing) and dropped == 0:
        failures.append(f"{routing} routing dropped no pair (capacity {cfg.capacity})")
    ref, ref_grads = TR.forward_backward(
        cfg, args, cots[d_out], cots[d_log] if d_log else None, experts=experts
    )
    errors = {"out": CL.rel_error(torch, fwd["result0"], ref.out)}
    if "result1" in fwd:
        errors["router_logits"] = CL.rel_error(torch, fwd["result1"], ref.logits)
    grad_of = CL.grads_by_arg(layer, params, grads)
    for arg, label in CL.GRAD_LABELS.items():
        if arg in ref_grads:
            if arg not in grad_of:
                failures.append(f"no gradient of {arg} in the manifest")
                continue
            errors[label] = CL.rel_error(torch, grad_of[arg], ref_grads[arg])
    for label, err in errors.items():
        tol = CL.OUT_TOL if label in ("out", "router_logits") else CL.GRAD_TOL
        if not err <= tol:  # NaN fails
            failures.append(f"{label}: relative error {err:.3g} > {tol:g}")
    row = {"layer": name, "T": T, "routing": routing, "capacity": cfg.capacity}
    row.update(dropped=dropped, rel_error=errors, failures=failures, ok=not failures)
    status = "PASS" if not failures else "FAIL " + "; ".join(failures)
    errs = " ".join(f"{k} {v:.2e}" for k, v in errors.items())
    print(
        f"{status} {name} T={T} {routing} (capacity {cfg.capacity}, {dropped} of "
        f"{T * cfg.top_k} pairs dropped): {errs}",
        flush=True,
    )
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layer", action="append", required=True, help="DIR/NAME (repeatable)")
    p.add_argument(
        "--capacity-factor", type=float, required=True, help="the layers' capacity factor"
    )
    p.add_argument("--tokens", default="", help="dynamic T: comma-separated (default 1, 37, bound)")
    p.add_argument("--routing", choices=CL.ROUTINGS + ("all",), default="all")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--json")
    p.add_argument("--emulate", action="store_true", help="bench/emulate.py's stand-in (CPU)")
    opts = p.parse_args(argv)
    opts.device = "cpu" if opts.emulate else "cuda"
    routings = list(CL.ROUTINGS) if opts.routing == "all" else [opts.routing]
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    for path in opts.layer:
        name = os.path.basename(path)
        try:
            layer = CL.open_layer(path, opts)
            bound = layer.manifest.max_tokens
            if bound:
                tokens = [int(t) for t in opts.tokens.split(",")] if opts.tokens else [1, 37, bound]
            else:
                tokens = [int(layer.layer["T"])]
            for T in tokens:
                for routing in routings:
                    rows.append(check_at(layer, name, T, routing, opts))
        except Exception as exc:  # one broken layer must not hide the others
            print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
            rows.append({"layer": name, "error": str(exc), "ok": False})
    n_ok = sum(r["ok"] for r in rows)
    print(f"{n_ok} passed, {len(rows) - n_ok} failed")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if rows and n_ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
