#!/usr/bin/env python3
"""Checks compiled layers of a dynamic token count on the GPU at several T against the fp32
torch reference (python/moe_mlir/torch_reference.py), forward and backward, as
bench/check_layer.py does for a layer of static T: random inputs and cotangents (never zeros),
random, all-to-one or skewed routing, the reference with our routing decisions, relative
Frobenius errors of out, router logits, dx and every weight gradient within 1e-2 (outputs) and
2e-2 (gradients); NaN fails; ours twice bitwise identical.

    python3 test/GPU/dynamic_layer_check.py --layer gpu-inputs/layers/gelu-dyn \\
        [--tokens 1,37,64] [--routing all] [--json out.json] [--emulate]

--tokens defaults to 1, 37 and the bound. --emulate runs bench/emulate.py's stand-in on the
CPU (checks this script, not the kernels). Exits 1 on any failure.
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
import torch  # noqa: E402
from moe_mlir import torch_reference as TR  # noqa: E402
from moe_mlir.gpu import torch_dtype  # noqa: E402


def check_at(layer, name, T, routing, opts):
    """One forward + backward of `layer` at T tokens against the reference: a result row."""
    device = torch.device(opts.device)
    cfg = dataclasses.replace(TR.config_from_manifest(layer.layer), tokens=T)
    gen = torch.Generator(device=device).manual_seed(opts.seed + T)
    args, _ = CL.make_inputs(torch, cfg, routing, gen, device)
    params = CL.forward_param_names(layer, cfg)
    inputs = {params[a]: t for a, t in args.items()}
    cot_specs = layer.manifest.backward.at(T).by_role("cotangent")
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
    differ = [p for p in fwd if p not in inputs and not CL.bits_equal(torch, fwd[p], fwd2[p])]
    differ += [p for p in grads if not CL.bits_equal(torch, grads[p], grads2[p])]
    if differ:
        failures.append(f"not bitwise identical across two runs: {', '.join(differ)}")
    saved = layer.manifest.forward.by_role("saved")
    experts = next((fwd[p.name] for p in saved if "expert" in p.name and p.dtype == "i32"), None)
    if experts is None or tuple(experts.shape) != (T, cfg.top_k):
        failures.append("the manifest saves no experts [T, k] i32")
        experts = None
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
    row = {"layer": name, "T": T, "routing": routing, "rel_error": errors}
    row.update(activation=cfg.activation, failures=failures, ok=not failures)
    status = "PASS" if not failures else "FAIL " + "; ".join(failures)
    errs = " ".join(f"{k} {v:.2e}" for k, v in errors.items())
    print(f"{status} {name} T={T} {routing} ({cfg.activation}): {errs}", flush=True)
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layer", action="append", required=True, help="DIR/NAME (repeatable)")
    p.add_argument("--tokens", default="", help="comma-separated T (default 1, 37, the bound)")
    p.add_argument("--routing", choices=CL.ROUTINGS + ("all",), default="random")
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
            if not bound:
                raise ValueError(f"{name} has a static token count (bench/check_layer.py)")
            tokens = [int(t) for t in opts.tokens.split(",")] if opts.tokens else [1, 37, bound]
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
