#!/usr/bin/env python3
"""Training check: small Mixtral-style and Qwen3-MoE-style models built from config
(random init, no downloads), N AdamW steps with moe-mlir layers (`moe_mlir.hf.replace_moe_blocks`)
against the same model with Hugging Face's `grouped_mm` experts; same init, same data.

Prints the loss of every step for both, the largest |difference| (passes at --tol, 1e-2), tokens
per second and peak memory of each; writes train_check.json and train_check.png (both loss
curves) to --out.

Sizes (--size full, the H200 run; every GEMM dimension a multiple of 64 as the GPU path needs):

| model | hidden | expert FFN | experts | top-k | router | layers | heads (kv) | vocab | batch x seq |
|---|---|---|---|---|---|---|---|---|---|
| mixtral | 1024 | 1024 | 8 | 2 | softmax, renormalised | 4 | 16 (4), head 64 | 8192 | 4 x 1024 |
| qwen3 | 1024 | 768 | 64 | 8 | softmax, renormalised | 4 | 16 (4), head 64 | 8192 | 4 x 1024 |

bf16 parameters and activations on CUDA (the GPU path computes bf16; `--precision amp`: f32
parameters with the forward under torch.autocast(bf16), and `--reference` adds the model all in
f32, each run's distance to it reported), AdamW (lr 3e-4, weight
decay 0.01). Data: token sequences of a fixed random bigram chain (80 % follow the chain, 20 %
random), so that the loss falls; one fixed batch per step, the same for both runs.
`--size tiny --device cpu` (f32, 3 steps; amp with the control and the reference) is what
test/Python/test_hf_blocks.py runs.

    python bench/train_check.py --device cuda --out $OUT          # needs MOE_MLIR_PREBUILT and
                                                                  # MOE_RUNTIME_LIB (see
                                                                  # scripts/gpu/torch-check.sh)
Last line: "N passed, M failed" (one check per model).
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import struct
import sys
import time
import warnings
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402

SIZES = {
    "full": {
        "mixtral": dict(
            vocab_size=8192,
            hidden_size=1024,
            intermediate_size=1024,
            num_local_experts=8,
            num_experts_per_tok=2,
            num_hidden_layers=4,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=64,
        ),
        "qwen3": dict(
            vocab_size=8192,
            hidden_size=1024,
            moe_intermediate_size=768,
            intermediate_size=2048,
            num_experts=64,
            num_experts_per_tok=8,
            norm_topk_prob=True,
            num_hidden_layers=4,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=64,
        ),
        "batch": 4,
        "seq": 1024,
    },
    "tiny": {
        "mixtral": dict(
            vocab_size=128,
            hidden_size=64,
            intermediate_size=64,
            num_local_experts=4,
            num_experts_per_tok=2,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
        ),
        "qwen3": dict(
            vocab_size=128,
            hidden_size=64,
            moe_intermediate_size=64,
            intermediate_size=128,
            num_experts=8,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
        ),
        "batch": 2,
        "seq": 16,
    },
}


def model_config(name: str, size: str):
    """The transformers config of one model (max_position_embeddings covers the sequence)."""
    from transformers import MixtralConfig, Qwen3MoeConfig  # noqa: PLC0415

    kwargs = dict(SIZES[size][name])
    kwargs["max_position_embeddings"] = max(SIZES[size]["seq"], 64)
    kwargs.update(
        bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False
    )
    cls = {"mixtral": MixtralConfig, "qwen3": Qwen3MoeConfig}[name]
    return cls(**kwargs)


def build_model(name: str, size: str, experts: str, seed: int, device, dtype):
    """The causal LM, seeded (the same initial weights for every `experts` and `dtype`: they
    are drawn in f32, then cast); `experts` = "grouped_mm" or "eager" (HF's two expert
    implementations) or "moe_mlir" (blocks swapped)."""
    from transformers import MixtralForCausalLM, Qwen3MoeForCausalLM  # noqa: PLC0415

    cfg = model_config(name, size)
    cfg._experts_implementation = "eager" if experts == "eager" else "grouped_mm"
    cls = {"mixtral": MixtralForCausalLM, "qwen3": Qwen3MoeForCausalLM}[name]
    torch.manual_seed(seed)
    model = cls(cfg)
    model.to(device=device, dtype=dtype)
    model.train()
    if experts == "moe_mlir":
        from moe_mlir import hf  # noqa: PLC0415

        hf.replace_moe_blocks(model)
    elif experts not in ("grouped_mm", "eager"):
        raise ValueError(f"experts must be grouped_mm, eager or moe_mlir, got {experts!r}")
    return model


def make_batches(vocab: int, batch: int, seq: int, steps: int, seed: int):
    """`steps` batches [batch, seq] of a fixed random bigram chain, on the CPU."""
    g = torch.Generator().manual_seed(seed)
    nxt = torch.randperm(vocab, generator=g)
    out = []
    for _ in range(steps):
        ids = torch.empty(batch, seq, dtype=torch.long)
        ids[:, 0] = torch.randint(0, vocab, (batch,), generator=g)
        follow = torch.rand(batch, seq, generator=g) < 0.8
        rand = torch.randint(0, vocab, (batch, seq), generator=g)
        for t in range(1, seq):
            ids[:, t] = torch.where(follow[:, t], nxt[ids[:, t - 1]], rand[:, t])
        out.append(ids)
    return out


def train(model, batches, lr: float, device, warmup: int, autocast: bool = False, hook=None):
    """AdamW over the batches; per-step losses, tokens/s after `warmup` steps, peak bytes.
    `autocast`: mixed precision, the forward under torch.autocast(bf16) (f32 parameters).
    `hook(step, model, ids)`, when given, runs before each step's forward (0-based step)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    losses, t0 = [], None
    tokens = 0
    for step, ids in enumerate(batches):
        if step == warmup:
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        ids = ids.to(device)
        if hook is not None:
            hook(step, model, ids)
        with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.item()))
        if t0 is not None:
            tokens += ids.numel()
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0 if t0 is not None else float("nan")
    result = {
        "losses": losses,
        "tokens_per_s": tokens / elapsed if tokens else float("nan"),
        "timed_steps": len(batches) - warmup,
    }
    if cuda:
        result["peak_bytes"] = int(torch.cuda.max_memory_allocated())
        result["peak_bytes_above_start"] = int(torch.cuda.max_memory_allocated() - base)
    return result


# --------------------------------------------------------------------------- PNG, no matplotlib


def write_png(path: str, series, title: str = "", width: int = 900, height: int = 500) -> None:
    """Loss curves as a PNG: matplotlib when it is installed, else a small rasteriser
    (`series`: list of (label, [values], (r, g, b)))."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415

        fig, ax = plt.subplots(figsize=(width / 100, height / 100), dpi=100)
        for label, values, color in series:
            ax.plot(
                range(1, len(values) + 1),
                values,
                label=label,
                color=tuple(c / 255 for c in color),
                linewidth=1.2,
            )
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.set_title(title)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return
    except ImportError:
        pass
    pix = bytearray(b"\xff" * (width * height * 3))
    m = 40
    values = [v for _, vs, _ in series for v in vs if math.isfinite(v)] or [0.0, 1.0]
    lo, hi = min(values), max(values)
    hi = hi if hi > lo else lo + 1.0
    n = max(len(vs) for _, vs, _ in series)

    def put(x, y, c):
        if 0 <= x < width and 0 <= y < height:
            i = (y * width + x) * 3
            pix[i : i + 3] = bytes(c)

    def line(x0, y0, x1, y1, c):
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for s in range(steps + 1):
            x = round(x0 + (x1 - x0) * s / steps)
            y = round(y0 + (y1 - y0) * s / steps)
            for dx in (0, 1):
                put(x + dx, y, c)

    line(m, height - m, width - m, height - m, (0, 0, 0))
    line(m, m, m, height - m, (0, 0, 0))
    for _, vs, color in series:
        pts = [
            (
                m + (width - 2 * m) * i / max(n - 1, 1),
                height - m - (height - 2 * m) * (v - lo) / (hi - lo),
            )
            for i, v in enumerate(vs)
        ]
        for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
            line(round(x0), round(y0), round(x1), round(y1), color)
    raw = b"".join(b"\x00" + bytes(pix[y * width * 3 : (y + 1) * width * 3]) for y in range(height))

    def chunk(kind, data):
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)))
        f.write(chunk(b"IDAT", zlib.compress(raw, 9)))
        f.write(chunk(b"IEND", b""))


# --------------------------------------------------------------------------- layers

# Layers that --layer-check runs on CUDA against moe_mlir.torch_reference (fp32), besides the
# training models: a Mixtral-like one and a DeepSeek-V3-like one (sigmoid + bias, groups,
# scaling, shared expert).
CHECK_LAYERS = {
    "softmax-t256": dict(tokens=256, hidden=256, ffn=128, experts=8, top_k=2, renormalize=True),
    "deepseek-t200": dict(
        tokens=200,
        hidden=256,
        ffn=128,
        experts=16,
        top_k=4,
        scoring="sigmoid",
        renormalize=True,
        router_bias=True,
        num_groups=4,
        topk_groups=2,
        scaling_factor=2.5,
        shared_ffn=128,
    ),
}


# The selection-bias updates --layer-check compares with the torch rule (rate of each rule), for
# the CHECK_LAYERS with a router bias; prebuilt at the layer's bound.
SELECTION_BIAS_RATES = {"sign": 1e-3, "proportional": 1e-2}


def training_layer_configs(size: str, router_logits_dtype: str = "auto"):
    """The LayerConfig (bf16, T = batch * seq) of every MoE block of the training models,
    read from the models themselves (built on the meta device, no memory);
    `router_logits_dtype` as `moe_mlir.hf.replace_moe_blocks` takes it."""
    import dataclasses  # noqa: PLC0415
    from transformers import MixtralForCausalLM, Qwen3MoeForCausalLM  # noqa: PLC0415
    from moe_mlir import hf  # noqa: PLC0415

    tokens = SIZES[size]["batch"] * SIZES[size]["seq"]
    configs = {}
    for name, cls in (("mixtral", MixtralForCausalLM), ("qwen3", Qwen3MoeForCausalLM)):
        with torch.device("meta"):
            model = cls(model_config(name, size))
        for _, module in model.named_modules():
            if type(module).__name__ in hf.SUPPORTED_BLOCKS:
                cfg = hf.config_from_hf_block(module, router_logits_dtype=router_logits_dtype)
                configs[name] = dataclasses.replace(cfg, tokens=tokens, dtype="bf16")
    return configs


def prebuild(folder: str, size: str) -> int:
    """Compiles, with moe-compile, the sm_90a cache entries the device run needs (the training
    models' layers, also with f32 router logits for train_fidelity.py's moe_mlir+f32_logits,
    and CHECK_LAYERS) into `folder` (MOE_MLIR_CACHE layout)."""
    from moe_mlir import compile_cache as cc  # noqa: PLC0415
    from moe_mlir.config import LayerConfig  # noqa: PLC0415

    os.environ["MOE_MLIR_CACHE"] = os.path.abspath(folder)
    configs = dict(training_layer_configs(size))
    for name, cfg in training_layer_configs(size, "float32").items():
        configs[name + "+f32_logits"] = cfg
    for name, kw in CHECK_LAYERS.items():
        configs[name] = LayerConfig(**kw, dtype="bf16")
    failed = 0
    for name, cfg in configs.items():
        t0 = time.time()
        try:
            # MoELayer runs the layer of dynamic token count at the bound its T rounds to.
            options = cc.BuildOptions(max_tokens=cc.default_bound(cfg.tokens))
            entry = cc.build_gpu_entry(cfg, options)
            if name in CHECK_LAYERS:  # the aux-loss function of return_aux_losses
                from moe_mlir.aux_losses import build_gpu_aux  # noqa: PLC0415

                build_gpu_aux(cfg.experts, cfg.top_k, cfg.scoring, options.max_tokens)
            if name in CHECK_LAYERS and cfg.router_bias:  # update_selection_bias on CUDA
                from moe_mlir.selection_bias import build_gpu_selection_bias  # noqa: PLC0415

                for rule, rate in SELECTION_BIAS_RATES.items():
                    build_gpu_selection_bias(cfg.experts, cfg.top_k, rate, rule, options.max_tokens)
            print(f"PASS {name}: {entry.path} ({time.time() - t0:.1f} s)")
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    print(f"{len(configs) - failed} passed, {failed} failed")
    return 1 if failed else 0


def aux_check(layer, cfg, x, mode) -> list:
    """return_aux_losses (the sm_90a aux-loss function on CUDA): load_balance and z_loss
    against torch in f32 on the layer's own logits and routing (1e-4); their gradient alone
    (a * lb + b * z backward, no cotangent of out) in the router weight and x against x^T dL
    and dL w_router^T, dL from torch autograd (2e-2). The failures' names, empty when it
    passes."""
    from moe_mlir import torch_reference as TR  # noqa: PLC0415

    fn = layer if mode == "eager" else torch.compile(layer, fullgraph=True)
    a, b = 30.0, 3.0
    try:
        xx = x.clone().requires_grad_(True)
        layer.zero_grad(set_to_none=True)
        _, logits, lb, z = fn(xx, return_router_logits=True, return_aux_losses=True)
        (a * lb + b * z).backward()
        ref_logits = logits.detach().float().requires_grad_(True)
        c = TR.scores(ref_logits.detach(), cfg.scoring)
        if cfg.router_bias:
            c = c + layer.router_bias.float()
        experts = TR.select_experts(c, cfg.top_k, cfg.num_groups, cfg.topk_groups)
        counts = torch.bincount(experts.reshape(-1), minlength=cfg.experts).float()
        p = TR.scores(ref_logits, cfg.scoring)
        if cfg.scoring == "sigmoid":
            p = p / p.sum(-1, keepdim=True)
        rlb = cfg.experts * (counts / experts.numel() * p.mean(0)).sum()
        rz = (torch.logsumexp(ref_logits, -1) ** 2).mean()
        (a * rlb + b * rz).backward()
        dl = ref_logits.grad
        want = {
            "load_balance": (lb, rlb, 1e-4),
            "z_loss": (z, rz, 1e-4),
            "d_w_router": (layer.w_router.grad, x.float().t() @ dl, 2e-2),
            "d_x": (xx.grad, dl @ layer.w_router.detach().float().t(), 2e-2),
        }
        worst = {
            k: float((o.detach().float() - r.detach()).norm() / r.detach().norm().clamp_min(1e-30))
            for k, (o, r, _) in want.items()
        }
        bad = [k for k, v in worst.items() if not math.isfinite(v) or v > want[k][2]]
        print(
            f"{'FAIL' if bad else 'PASS'} layer {cfg.tokens}x{cfg.experts} aux losses ({mode}): "
            + ", ".join(f"{k} {v:.2e}" for k, v in worst.items())
        )
    except Exception as e:  # noqa: BLE001
        bad = [f"{type(e).__name__}: {e}"]
        print(f"FAIL layer {cfg.tokens}x{cfg.experts} aux losses ({mode}): {bad[0]}")
    return bad


def selection_bias_check(layer, cfg, x) -> list:
    """update_selection_bias on CUDA (the compiled sm_90a op) against the op's rule in torch on
    the same device, bitwise, for both rules: on the layer's own routing after a forward
    (MoELayer.update_selection_bias, in place), on random and skewed routing with -1 entries,
    and with T = 0. The failures' names, empty when it passes."""
    from moe_mlir import selection_bias as sb  # noqa: PLC0415
    from moe_mlir.layer import _torch_bias_update, update_selection_bias  # noqa: PLC0415

    bad = []
    E, k, T = cfg.experts, cfg.top_k, cfg.tokens
    gen = torch.Generator().manual_seed(1)
    random = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)])
    skewed = random.clone()
    skewed[: (3 * T) // 4, 0] = 0
    for r in (random, skewed):
        r.view(-1)[::7] = -1
    for rule, rate in SELECTION_BIAS_RATES.items():
        what = f"layer {cfg.tokens}x{E} selection bias ({rule})"
        try:
            # The compiled op itself, so a missing entry fails here instead of falling back.
            bound = sb.gpu_bound(T)
            entry = sb.build_gpu_selection_bias(E, k, rate, rule, bound)
            with torch.no_grad():
                layer(x)
            experts = layer.last_experts()
            before = layer.router_bias.detach().clone()
            want = {"layer": _torch_bias_update(before, experts, rate, rule)}
            with warnings.catch_warnings():  # the torch fallback's warning fails the check
                warnings.simplefilter("error", RuntimeWarning)
                got = {"layer": layer.update_selection_bias(rate=rate, rule=rule).detach().clone()}
            layer.router_bias.copy_(before)
            bias = torch.randn(E, generator=gen).to(x.device)
            for label, ex in (("random", random), ("skewed", skewed)):
                ex = ex.to(device=x.device, dtype=torch.int32)
                want[label] = _torch_bias_update(bias, ex, rate, rule)
                got[label] = sb.gpu_update(bias, ex, rate, rule, bound, entry)
            empty = torch.zeros(0, k, dtype=torch.int32, device=x.device)
            want["T=0"], got["T=0"] = bias, update_selection_bias(bias, empty, rate=rate, rule=rule)
            wrong = [n for n in want if not torch.equal(got[n], want[n])]
            moved = [n for n in want if n != "T=0" and not torch.equal(want[n], bias)]
            if not moved:
                wrong.append("no case moves the bias")
            print(
                f"{'FAIL' if wrong else 'PASS'} {what}: "
                + (
                    f"bitwise the torch rule on {', '.join(want)}"
                    if not wrong
                    else "differs from the torch rule on " + ", ".join(wrong)
                )
            )
            bad += [f"{rule}: {n}" for n in wrong]
        except Exception as e:  # noqa: BLE001
            bad.append(f"{type(e).__name__}: {e}")
            print(f"FAIL {what}: {bad[-1]}")
    return bad


def layer_check(device) -> int:
    """CHECK_LAYERS through MoELayer (eager and torch.compile) against the fp32 torch reference
    with the same routing: docs/benchmarks.md's tolerances (1e-2 output, 2e-2 gradients); and an
    f32 copy under torch.autocast against the bf16 layer (bitwise)."""
    from moe_mlir import torch_reference as TR  # noqa: PLC0415
    from moe_mlir.config import LayerConfig  # noqa: PLC0415
    from moe_mlir.layer import MoELayer  # noqa: PLC0415

    passed = failed = 0
    for name, kw in CHECK_LAYERS.items():
        cfg = LayerConfig(**kw)
        torch.manual_seed(0)
        layer = MoELayer(cfg).to(device=device, dtype=torch.bfloat16)
        if cfg.router_bias:
            layer.router_bias.normal_(0, 0.1)
        x = torch.randn(cfg.tokens, cfg.hidden, device=device).to(torch.bfloat16)
        d_out = torch.randn(cfg.tokens, cfg.hidden, device=device).to(torch.bfloat16)
        for mode in ("eager", "compile"):
            fn = layer if mode == "eager" else torch.compile(layer, fullgraph=True)
            xx = x.clone().requires_grad_(True)
            layer.zero_grad(set_to_none=True)
            try:
                out, logits = fn(xx, return_router_logits=True)
                out.backward(d_out)
                ours = {"out": out.float(), "x": xx.grad.float()}
                ours.update({n: p.grad.float() for n, p in layer.named_parameters()})
                inputs = {"x": x.float()}
                inputs.update({n: p.detach().float() for n, p in layer.named_parameters()})
                if cfg.router_bias:
                    inputs["router_bias"] = layer.router_bias.float()
                # Our routing decisions, from our logits (the same routing for both sides).
                c = TR.scores(logits.detach().float(), cfg.scoring)
                if cfg.router_bias:
                    c = c + inputs["router_bias"]
                experts = TR.select_experts(c, cfg.top_k, cfg.num_groups, cfg.topk_groups)
                ref, grads = TR.forward_backward(
                    cfg, inputs, d_out.float(), torch.zeros_like(logits), experts=experts
                )
                grads["out"] = ref.out
                worst = {}
                for key, val in ours.items():
                    want = grads[key].to(val.device)
                    worst[key] = float((val - want).norm() / want.norm().clamp_min(1e-30))
                bad = [
                    k
                    for k, v in worst.items()
                    if not math.isfinite(v) or v > (1e-2 if k == "out" else 2e-2)
                ]
                status = "FAIL" if bad else "PASS"
                print(
                    f"{status} layer {name} ({mode}): "
                    + ", ".join(f"{k} {v:.2e}" for k, v in worst.items())
                )
            except Exception as e:  # noqa: BLE001
                bad = [f"{type(e).__name__}: {e}"]
                print(f"FAIL layer {name} ({mode}): {bad[0]}")
            passed += not bad
            failed += bool(bad)
        for mode in ("eager", "compile"):
            bad = aux_check(layer, cfg, x, mode)
            passed += not bad
            failed += bool(bad)
        if cfg.router_bias and device.type == "cuda":
            bad = selection_bias_check(layer, cfg, x)
            passed += not bad
            failed += bool(bad)
        # Mixed precision: an f32 copy of the layer under torch.autocast(bf16) computes the
        # same bf16 kernels on the same rounded values, so its output and gradients are the
        # bf16 layer's, bit for bit, in f32 (on CUDA: the CPU path computes bf16 in f32).
        if device.type != "cuda":
            continue
        try:
            master = copy.deepcopy(layer).float()
            xa = x.float().requires_grad_(True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out_a = master(xa)
            out_a.backward(d_out.float())
            xb = x.clone().requires_grad_(True)
            layer.zero_grad(set_to_none=True)
            out_b = layer(xb)
            out_b.backward(d_out)
            same = {
                "out": out_a.dtype == torch.float32 and torch.equal(out_a, out_b.float()),
                "x": torch.equal(xa.grad, xb.grad.float()),
            }
            for (n, pa), (_, pb) in zip(master.named_parameters(), layer.named_parameters()):
                same[n] = pa.grad.dtype == torch.float32 and torch.equal(pa.grad, pb.grad.float())
            bad = [k for k, v in same.items() if not v]
            print(
                f"{'FAIL' if bad else 'PASS'} layer {name} (autocast, f32 parameters): "
                + (
                    "bitwise the bf16 layer's output and gradients"
                    if not bad
                    else "differs from the bf16 layer in " + ", ".join(bad)
                )
            )
        except Exception as e:  # noqa: BLE001
            bad = [f"{type(e).__name__}: {e}"]
            print(f"FAIL layer {name} (autocast, f32 parameters): {bad[0]}")
        passed += not bad
        failed += bool(bad)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


# --------------------------------------------------------------------------- main


# The runs of one model: (key, experts, parameter dtype, autocast).
# "fp32" (--reference): HF's eager experts, all in f32 and without autocast, the most exact of
# the implementations: how far each bf16 run is from it says whose rounding a difference is.
def planned_runs(args, dtype):
    amp = args.precision == "amp"
    runs = [("grouped_mm", "grouped_mm", dtype, amp), ("moe_mlir", "moe_mlir", dtype, amp)]
    if args.control:
        runs.append(("eager", "eager", dtype, amp))
    if args.reference:
        runs.append(("fp32", "eager", torch.float32, False))
    return runs


def max_abs_diff(a, b):
    return max(abs(x - y) for x, y in zip(a, b)) if a and b else float("nan")


def first_step_over(a, b, tol):
    """The first step (1-based) whose |a - b| exceeds tol, or None."""
    return next((i + 1 for i, (x, y) in enumerate(zip(a, b)) if abs(x - y) > tol), None)


def run_model(name, args, device, dtype):
    size = SIZES[args.size]
    vocab = size[name]["vocab_size"]
    batches = make_batches(
        vocab, args.batch or size["batch"], args.seq or size["seq"], args.steps, args.seed + 1
    )
    results = {}
    # With --control, HF's eager experts too: two correct bf16 implementations of the same
    # model, whose loss difference is the noise floor the 1e-2 check is read against
    # (top-k routing flips on near-ties amplify rounding differences over the steps).
    for key, experts, run_dtype, autocast in planned_runs(args, dtype):
        model = build_model(name, args.size, experts, args.seed, device, run_dtype)
        results[key] = train(
            model, batches, args.lr, device, min(args.warmup, args.steps - 1), autocast
        )
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    a, b = results["grouped_mm"]["losses"], results["moe_mlir"]["losses"]
    diffs = [abs(x - y) for x, y in zip(a, b)]
    worst = max(diffs) if diffs else float("nan")
    ok = (
        bool(diffs)
        and all(math.isfinite(x) and math.isfinite(y) for x, y in zip(a, b))
        and worst <= args.tol
    )
    out = {
        "model": name,
        "config": SIZES[args.size][name],
        "batch": args.batch or size["batch"],
        "seq": args.seq or size["seq"],
        "precision": args.precision,
        "results": results,
        "loss_diffs": diffs,
        "max_abs_diff": worst,
        "first_step_over_tol": first_step_over(a, b, args.tol),
        "tol": args.tol,
        "passed": ok,
    }
    if "eager" in results:
        out["control_max_abs_diff"] = max_abs_diff(a, results["eager"]["losses"])
    if "fp32" in results:
        ref = results["fp32"]["losses"]
        out["max_abs_diff_to_fp32"] = {
            k: max_abs_diff(r["losses"], ref) for k, r in results.items() if k != "fp32"
        }
        out["mean_abs_diff_to_fp32"] = {
            k: sum(abs(x - y) for x, y in zip(r["losses"], ref)) / max(len(ref), 1)
            for k, r in results.items()
            if k != "fp32"
        }
        # Beside the 1e-2 check (which decides the exit status): is ours any further from
        # the f32 model than HF's own bf16 runs are?
        far = out["max_abs_diff_to_fp32"]
        hf_worst = max(v for k, v in far.items() if k != "moe_mlir")
        out["no_further_from_fp32_than_hf"] = far["moe_mlir"] <= hf_worst
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="mixtral,qwen3")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--size", choices=sorted(SIZES), default="full")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--dtype",
        choices=("bf16", "f32"),
        default=None,
        help="default: bf16 on CUDA, f32 on the CPU",
    )
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--seq", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=3, help="steps not timed")
    p.add_argument("--tol", type=float, default=1e-2)
    p.add_argument(
        "--control",
        action="store_true",
        help="also train with HF eager experts and report max |grouped_mm - eager| "
        "(the noise floor between two correct implementations)",
    )
    p.add_argument(
        "--reference",
        action="store_true",
        help="also train the model all in f32 (HF eager experts, no autocast) and "
        "report each run's distance to it",
    )
    p.add_argument(
        "--precision",
        choices=("bf16", "amp"),
        default="bf16",
        help="bf16: bf16 parameters and activations (default); amp: f32 parameters "
        "with the forward under torch.autocast(bf16), mixed precision",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument(
        "--prebuild",
        metavar="DIR",
        help="compile the sm_90a layers the device run needs into DIR and exit "
        "(the LLVM machine; scripts/inputs/build-torch-cache.sh)",
    )
    p.add_argument(
        "--layer-check",
        action="store_true",
        help="check MoELayer (eager and torch.compile) against the fp32 torch "
        "reference on --device and exit",
    )
    args = p.parse_args(argv)
    if args.prebuild:
        return prebuild(args.prebuild, args.size)
    device = torch.device(args.device)
    if args.layer_check:
        return layer_check(device)
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[
        args.dtype or ("bf16" if device.type == "cuda" and args.precision == "bf16" else "f32")
    ]
    if args.precision == "amp" and dtype != torch.float32:
        print("train_check: --precision amp trains f32 parameters (--dtype f32)")
        return 2
    os.makedirs(args.out, exist_ok=True)
    import transformers  # noqa: PLC0415

    env = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype),
        "precision": args.precision,
        "steps": args.steps,
        "lr": args.lr,
        "size": args.size,
    }
    print("train_check:", json.dumps(env))
    reports, passed, failed = [], 0, 0
    for name in [m for m in args.models.split(",") if m]:
        if name not in SIZES[args.size]:
            print(f"unknown model {name!r} (known: mixtral, qwen3)")
            return 2
        try:
            rep = run_model(name, args, device, dtype)
        except Exception as e:  # report and go on with the next model
            import traceback  # noqa: PLC0415

            traceback.print_exc()
            rep = {"model": name, "passed": False, "error": f"{type(e).__name__}: {e}"}
        reports.append(rep)
        passed += rep["passed"]
        failed += not rep["passed"]
        if "results" in rep:
            a = rep["results"]["grouped_mm"]["losses"]
            b = rep["results"]["moe_mlir"]["losses"]
            c = rep["results"].get("eager", {}).get("losses")
            r = rep["results"].get("fp32", {}).get("losses")
            print(
                f"\n{name}: step  hf_grouped_mm   moe_mlir    |diff|"
                + ("   hf_eager  |eager-grouped_mm|" if c else "")
                + ("      fp32" if r else "")
            )
            for i, (x, y) in enumerate(zip(a, b)):
                extra = f"  {c[i]:12.6f}  {abs(c[i] - x):.2e}" if c else ""
                extra += f"  {r[i]:12.6f}" if r else ""
                print(f"{name}: {i + 1:4d}  {x:12.6f} {y:12.6f}  {abs(x - y):.2e}{extra}")
    with open(os.path.join(args.out, "train_check.json"), "w") as f:
        json.dump({"env": env, "models": reports}, f, indent=1)
    series = []
    colors = [((31, 119, 180), (255, 127, 14)), ((44, 160, 44), (214, 39, 40))]
    for rep, (c1, c2) in zip([r for r in reports if "results" in r], colors * 4):
        series.append((f"{rep['model']} HF grouped_mm", rep["results"]["grouped_mm"]["losses"], c1))
        series.append((f"{rep['model']} moe_mlir", rep["results"]["moe_mlir"]["losses"], c2))
        if "fp32" in rep["results"]:
            series.append(
                (f"{rep['model']} HF f32", rep["results"]["fp32"]["losses"], (127, 127, 127))
            )
    if series:
        write_png(
            os.path.join(args.out, "train_check.png"),
            series,
            title=f"loss, {args.steps} AdamW steps ({env['device']}, {args.precision})",
        )
    print(
        "\nmodel    max|dloss|  control  tokens/s HF  tokens/s ours  ours/HF  peak GiB HF  "
        "peak GiB ours"
    )
    for rep in reports:
        if "results" not in rep:
            print(f"{rep['model']:8s} ERROR {rep['error']}")
            continue
        hf_r, ours = rep["results"]["grouped_mm"], rep["results"]["moe_mlir"]

        def gib(r):
            return f"{r['peak_bytes'] / 2**30:11.3f}" if "peak_bytes" in r else "          -"

        ctl = rep.get("control_max_abs_diff")
        ctl = f"{ctl:.2e}" if ctl is not None else "       -"
        print(
            f"{rep['model']:8s} {rep['max_abs_diff']:.2e}  {ctl}  {hf_r['tokens_per_s']:11.0f}  "
            f"{ours['tokens_per_s']:13.0f}  {ours['tokens_per_s'] / hf_r['tokens_per_s']:7.3f}"
            f"  {gib(hf_r)}  {gib(ours)}  {'PASS' if rep['passed'] else 'FAIL'}"
        )
    for rep in reports:
        # Whose rounding a difference is: each run's distance to the all-f32 run.
        for stat in ("max", "mean"):
            far = rep.get(f"{stat}_abs_diff_to_fp32")
            if far:
                print(
                    f"{rep['model']:8s} {stat} |loss - fp32|: "
                    + ", ".join(f"{k} {v:.2e}" for k, v in far.items())
                )
        if "no_further_from_fp32_than_hf" in rep:
            far = rep["max_abs_diff_to_fp32"]
            hf_worst = max(v for k, v in far.items() if k != "moe_mlir")
            print(
                f"{rep['model']:8s} ours no further from fp32 than HF's runs: "
                f"{'yes' if rep['no_further_from_fp32_than_hf'] else 'no'} "
                f"(ours {far['moe_mlir']:.2e}, HF worst {hf_worst:.2e})"
            )
        if "first_step_over_tol" in rep:
            print(
                f"{rep['model']:8s} first step with |diff| > {rep['tol']:g}: "
                f"{rep['first_step_over_tol'] or 'none'}"
            )
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
