"""bench/train_fidelity.py: the statistic and the pass rule on synthetic loss curves (passing,
failing, at the bound, non-finite, all at the reference), the parameter groups of the gradient
table, merging parts seed by seed; and the whole run at tiny size on the CPU path (two seeds,
both precisions, the drift table, JSON and PNG, the resumed run, a merge from a .tgz and one
that lacks a seed); the diagnostic variants: their statistics, HF's router with index ties and
the SwiGLU in f32 on crafted inputs, and a run that adds variants to stored seeds. The
statistic needs no torch; the run skips without torch and
transformers (CI installs them: there a missing one fails)."""

import json
import math
import os
import random
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
try:
    import train_fidelity as tf
finally:
    sys.path.pop(0)


def curves(seeds=5, steps=50, seed=0):
    """A falling loss curve per seed with bf16-like noise around it."""
    rng = random.Random(seed)
    return [
        [4.0 * math.exp(-t / 30) + 5.0 + 0.05 * s + rng.gauss(0, 1e-3) for t in range(steps)]
        for s in range(seeds)
    ]


def offset(ref, scale, seed):
    """`ref` with |noise| of mean about `scale` added (random sign), per step."""
    rng = random.Random(seed)
    return [[x + rng.choice((-1, 1)) * scale * rng.uniform(0.5, 1.5) for x in c] for c in ref]


def test_the_statistic_passes_and_fails():
    ref = curves()
    gm = offset(ref, 4e-3, 1)
    losses = {"fp32": ref, "grouped_mm": gm, "eager": offset(ref, 5e-3, 2)}
    # Ours as far as HF: passes, ratio near 1, its interval within the seeds' ratios.
    s = tf.fidelity_stats(dict(losses, moe_mlir=offset(ref, 4e-3, 3)))
    assert s["passed"] and 0.8 < s["ratio"] < 1.2
    lo, hi = s["ratio_interval"]
    assert min(s["ratio_per_seed"]) <= lo <= s["ratio"] <= hi <= max(s["ratio_per_seed"])
    assert 1.0 < s["eager_ratio"] < 1.5
    # five seeds are one block, whose ratio is the whole statistic's
    assert s["ratio_blocks"] == [pytest.approx(s["ratio"])] and len(s["eager_ratio_blocks"]) == 1
    d = s["mean_abs_to_fp32"]
    want = sum(abs(x - y) for c, r in zip(gm, ref) for x, y in zip(c, r)) / (5 * 50)
    assert d["grouped_mm"] == pytest.approx(want, rel=1e-12)
    assert len(s["per_step_abs_to_fp32"]["moe_mlir"]["mean"]) == 50
    # Ours twice as far: fails, and every seed says so.
    s = tf.fidelity_stats(dict(losses, moe_mlir=offset(ref, 8e-3, 3)))
    assert not s["passed"] and 1.7 < s["ratio"] < 2.3
    assert s["ratio_interval"][0] > 1.1 and all(r > 1.1 for r in s["ratio_per_seed"])
    # A NaN in one of ours' steps fails, whatever the rest.
    bad = [list(c) for c in losses["grouped_mm"]]
    bad[2][40] = math.nan
    s = tf.fidelity_stats(dict(losses, moe_mlir=bad))
    assert not s["passed"] and s["ratio"] == math.inf
    # Everything at the reference (as on the CPU path in f32): 0 / 0 is 1, a pass.
    s = tf.fidelity_stats({k: ref for k in ("fp32", "moe_mlir", "grouped_mm", "eager")})
    assert s["passed"] and s["ratio"] == 1.0 and s["mean_abs_to_fp32"]["moe_mlir"] == 0.0
    with pytest.raises(ValueError, match="seeds"):
        tf.fidelity_stats(dict(losses, moe_mlir=ref[:4]))
    # twelve seeds: two blocks of five in seed order (the last two in none), each its own ratio
    ref12 = curves(seeds=12, steps=10)
    gm12 = offset(ref12, 4e-3, 1)
    ours12 = [offset([c], 4e-3 if i < 5 else 8e-3, i)[0] for i, c in enumerate(ref12)]
    s = tf.fidelity_stats({"fp32": ref12, "grouped_mm": gm12, "eager": gm12, "moe_mlir": ours12})
    first, second = s["ratio_blocks"]
    assert 0.7 < first < 1.3 and 1.6 < second < 2.4 and s["eager_ratio_blocks"] == [1.0, 1.0]


def test_the_pass_rule():
    assert tf.passes(1.1e-3, 1e-3) and tf.passes(1.0999e-3, 1e-3)
    assert not tf.passes(1.1002e-3, 1e-3)
    assert tf.passes(0.0, 0.0) and not tf.passes(1e-9, 0.0)
    assert tf.passes(1e-9, 0.0, atol=1e-6) and tf.passes(2e-3, 1e-3, threshold=2.0)
    assert not tf.passes(math.nan, 1e-3) and not tf.passes(1e-3, math.inf)
    assert tf.ratio(0.0, 0.0) == 1.0 and tf.ratio(1.0, 0.0) == math.inf
    assert tf.mean_abs_diff([1.0, 2.0], [1.5, 1.0]) == 0.75
    assert tf.mean_abs_diff([1.0], [1.0, 2.0]) == math.inf
    assert tf.parse_seeds("0-4") == [0, 1, 2, 3, 4] and tf.parse_seeds("3,1-2,3") == [1, 2, 3]
    for bad in ("", "a", "4-2", "1-"):
        with pytest.raises(ValueError):
            tf.parse_seeds(bad)


def test_parameter_groups_and_merging():
    assert tf.param_group("model.layers.3.mlp.gate.weight") == ("router", 3)
    assert tf.param_group("model.layers.0.mlp.experts.down_proj") == ("experts.down", 0)
    assert tf.param_group("model.layers.1.self_attn.k_proj.weight") == ("attn.k", 1)
    assert tf.param_group("model.layers.1.self_attn.q_norm.weight") == ("attn.q_norm", 1)
    assert tf.param_group("model.layers.2.post_attention_layernorm.weight") == ("norm.moe", 2)
    assert tf.param_group("lm_head.weight") == ("lm_head", None)
    assert tf.param_group("model.embed_tokens.weight") == ("embed", None)

    def part(seeds, settings=1):
        return {
            "kind": "train_fidelity_part",
            "model": "mixtral",
            "precision": "bf16",
            "settings": {"s": settings},
            "seeds": {str(s): {"tag": s} for s in seeds},
            "drift": None,
        }

    parts, notes = tf.combine_parts(
        [("a", part([0, 1])), ("b", part([1, 2])), ("c", part([3], settings=2))]
    )
    (p,) = parts.values()
    assert sorted(p["seeds"]) == ["0", "1", "2"] and p["sources"] == ["a", "b"]
    assert len(notes) == 2 and "seed 1" in notes[0] and "settings" in notes[1]
    # Where the gradient comparison was taken changes no curve: such parts join, and each
    # comparison is kept.
    a = dict(part([0]), settings={"s": 1, "drift_seed": 0, "drift_step": 25}, drift={"seed": 0})
    b = dict(part([5]), settings={"s": 1, "drift_seed": 5, "drift_step": 40}, drift={"seed": 5})
    c = dict(part([6]), settings={"s": 2, "drift_seed": 5, "drift_step": 40})
    parts, notes = tf.combine_parts([("a", a), ("b", b), ("c", c)])
    (p,) = parts.values()
    assert sorted(p["seeds"]) == ["0", "5"] and p["drift"] == {"seed": 0}
    assert p["drifts"] == [{"seed": 0}, {"seed": 5}] and "settings" in notes[0]
    assert tf.same_runs({"s": 1, "drift_step": 2}, {"s": 1}) and not tf.same_runs({"s": 1}, None)


def test_variant_statistics():
    """A variant is held against grouped_mm and ours on the seeds it ran (seed 2 lacks it),
    with D, the signed mean of loss - fp32 and the summed tie counts."""
    ref = curves(seeds=3, steps=10)
    gm = [[x + 1e-3 for x in c] for c in ref]
    ours = [[x + 3e-3 for x in c] for c in ref]
    var = [[x - 2e-3 for x in c] for c in ref]
    part = {"seeds": {}}
    for s in range(3):
        losses = {"fp32": ref[s], "grouped_mm": gm[s], "moe_mlir": ours[s], "eager": gm[s]}
        run = {"losses": losses}
        if s < 2:
            losses["grouped_mm+index_ties"] = var[s]
            run["ties"] = {"grouped_mm+index_ties": {"tokens": 100, "ties": 3, "differ": s}}
        part["seeds"][str(s)] = run
    stats = tf.variant_stats(part)
    assert list(stats) == ["grouped_mm+index_ties"]
    row = stats["grouped_mm+index_ties"]
    assert row["seeds"] == [0, 1]
    assert row["grouped_mm+index_ties"]["D"] == pytest.approx(2e-3)
    assert row["grouped_mm+index_ties"]["mean"] == pytest.approx(-2e-3)
    assert row["moe_mlir"]["mean"] == pytest.approx(3e-3)
    assert row["ratio"] == pytest.approx(2.0) and row["ratio_interval"] == pytest.approx([2, 2])
    assert row["ties"] == {"tokens": 200, "ties": 6, "differ": 1}
    assert tf.variant_stats({"seeds": {"0": {"losses": {"fp32": ref[0]}}}}) == {}
    assert tf.mean_diff([1.0, 2.0], [0.5, 2.5]) == 0.0 and math.isnan(tf.mean_diff([1.0], []))
    assert tf.seed_ratios([1.5, 0.5]) == "1.50 0.50"
    assert tf.seed_ratios([0.9, 1.2, 1.1, 1.3, 0.8, 1.4, 1.0]) == "0.80..1.40 med 1.10 >1: 4/7"


def needs_torch():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the machine
        if os.environ.get("CI"):
            raise
        pytest.skip("needs torch and transformers (scripts/install-deps.sh installs them)")


def test_index_ties_router_takes_the_lowest_index():
    """On bf16 logits with ties at the k-th pick the variant's router picks the lowest index,
    counts the tie, and counts a differing pick exactly where torch.topk chose otherwise;
    elsewhere it is HF's router (Mixtral renormalises; Qwen3 also rounds the weights)."""
    needs_torch()
    import torch
    from transformers import MixtralConfig, Qwen3MoeConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    torch.manual_seed(0)
    E, d = 6, 8
    mixtral = MixtralTopKRouter(
        MixtralConfig(hidden_size=d, num_local_experts=E, num_experts_per_tok=2)
    )
    qwen3 = Qwen3MoeTopKRouter(
        Qwen3MoeConfig(hidden_size=d, num_experts=E, num_experts_per_tok=2, norm_topk_prob=False)
    )
    for router in (mixtral, qwen3):
        # rows 1 and 4 and 5 equal: every token ties experts 1, 4 and 5
        w = torch.randn(E, d)
        w[4] = w[1]
        w[5] = w[1]
        x = torch.randn(64, d)
        x = x * torch.sign(x @ (w[1] - w[0]))[:, None]  # expert 1 (and 4, 5) above expert 0
        with torch.no_grad():
            router.weight.copy_(w.to(torch.bfloat16).float())
        router.to(torch.bfloat16)
        xb = x.to(torch.bfloat16)
        want_logits, want_w, want_i = router(xb)
        forward = tf.index_ties_router(router)
        logits, weights, picks = forward(xb)
        assert torch.equal(logits, want_logits)
        probs = torch.softmax(logits.detach().float(), dim=-1)
        for t in range(x.shape[0]):
            order = sorted(range(E), key=lambda e: (-float(probs[t, e]), e))
            assert picks[t].tolist() == order[:2], t
        top = probs.gather(1, picks)
        if router is mixtral:
            assert weights.dtype == torch.float32
            assert torch.allclose(weights, top / top.sum(-1, keepdim=True))
        else:
            assert weights.dtype == torch.bfloat16 and torch.equal(weights, top.to(torch.bfloat16))
        # the same weights where torch.topk picked the same experts
        same = (want_i.sort(-1).values == picks.sort(-1).values).all(-1)
        assert same.any()
        tokens, ties, differ = router.tie_counts.tolist()
        ranked = probs.sort(dim=-1, descending=True).values
        assert tokens == 64 and ties == int((ranked[:, 1] == ranked[:, 2]).sum()) > 0
        assert differ == int((~same).sum())


def test_f32_swiglu_rounds_once():
    """The variant's gate: act(gate) * up in f32 from bf16 inputs, rounded once; its gradient
    is f32 autograd's, rounded once."""
    needs_torch()
    import torch

    torch.manual_seed(1)
    gate_up = torch.randn(32, 16).to(torch.bfloat16).requires_grad_()
    dout = torch.randn(32, 8).to(torch.bfloat16)
    out = tf.f32_swiglu(torch.nn.functional.silu)(gate_up)
    out.backward(dout)
    ref_in = gate_up.detach().float().requires_grad_()
    g, u = ref_in.chunk(2, dim=-1)
    ref = torch.nn.functional.silu(g) * u
    ref.backward(dout.float())
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref.detach().to(torch.bfloat16))
    assert torch.equal(gate_up.grad, ref_in.grad.to(torch.bfloat16))
    with pytest.raises(ValueError, match="one of"):
        tf.clone_model(None, "grouped_mm+fast", torch.float32)
    with pytest.raises(ValueError, match="one of"):
        tf.clone_model(None, "eager+f32_swiglu", torch.float32)


def test_bf16_boundary_rounds_the_output_and_the_input_gradient():
    """The variant's block: its f32 output rounded to bf16 (the gradient passing as is), the
    gradient into its input rounded to bf16; a tuple's first element alone; bf16 unchanged."""
    needs_torch()
    import torch

    torch.manual_seed(2)
    w = torch.randn(16, 16)

    def block(h, scale=1.0):
        return h @ w * scale

    x = torch.randn(8, 16, requires_grad=True)
    dout = torch.randn(8, 16)
    out = tf.bf16_boundary(block)(x, scale=0.5)
    out.backward(dout)
    assert out.dtype == torch.float32
    assert torch.equal(out, (x @ w * 0.5).to(torch.bfloat16).float())
    assert torch.equal(x.grad, (dout @ w.t() * 0.5).to(torch.bfloat16).float())
    pair = tf.bf16_boundary(lambda h: (block(h), "logits"))(x)
    assert pair[1] == "logits" and torch.equal(pair[0], block(x).to(torch.bfloat16).float())
    xb = torch.randn(8, 16).to(torch.bfloat16)
    assert torch.equal(tf.bf16_boundary(lambda h: h * 3)(xb), xb * 3)


def test_estimate_splits_the_run():
    """The estimate that makes the GPU step run one model a call: the whole run is over 8
    minutes, each model's part under."""
    full = {m: tf.estimate_seconds(m, ["bf16", "amp"], 5, 50) for m in ("mixtral", "qwen3")}
    assert sum(e["total"] for e in full.values()) - tf.START_S > 480
    assert full["qwen3"]["total"] > full["mixtral"]["total"] > 0
    assert tf.step_flops("qwen3", "full") > tf.step_flops("mixtral", "full") > 1e12


def test_tiny_run_on_the_cpu(tmp_path, tmp_path_factory, monkeypatch, capsys):
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the machine
        if os.environ.get("CI"):
            raise
        pytest.skip("needs torch and transformers (scripts/install-deps.sh installs them)")
    import train_check as tc

    # test_hf_blocks.py's cache: its training check compiles the same tiny layers
    monkeypatch.setenv("MOE_MLIR_CACHE", str(tmp_path_factory.getbasetemp() / "hf_cache"))
    monkeypatch.delenv("MOE_MLIR_PREBUILT", raising=False)
    monkeypatch.setenv("MOE_MLIR_QUIET", "1")
    # A clone of the f32 base model is train_check.build_model's model.
    base = tc.build_model("qwen3", "tiny", "eager", 0, torch.device("cpu"), torch.float32)
    want = tc.build_model("qwen3", "tiny", "grouped_mm", 0, torch.device("cpu"), torch.bfloat16)
    got = tf.clone_model(base, "grouped_mm", torch.bfloat16)
    assert got.config._experts_implementation == "grouped_mm"
    assert base.config._experts_implementation == "eager"
    for (n, a), (_, b) in zip(want.state_dict().items(), got.state_dict().items()):
        assert a.dtype == b.dtype and torch.equal(a, b), n

    out = tmp_path / "out"
    argv = [
        "--size", "tiny", "--device", "cpu", "--model", "mixtral", "--seeds", "0-1",
        "--steps", "2", "--drift-step", "2", "--atol", "1e-3", "--out", str(out),
    ]  # fmt: skip
    assert tf.main(argv) == 0
    data = json.loads((out / "train_fidelity.json").read_text())
    assert data["passed"] and [(p["model"], p["precision"]) for p in data["parts"]] == [
        ("mixtral", "bf16"),
        ("mixtral", "amp"),
    ]
    for p in data["parts"]:
        s = p["stats"]
        assert p["seeds"] == [0, 1] and s["seeds"] == 2 and p["passed"]
        assert set(s["mean_abs_to_fp32"]) == {"moe_mlir", "grouped_mm", "eager"}
        assert all(len(p["mean_loss"][k]) == 2 for k in ("fp32", "moe_mlir"))
        drift = p["drift"]
        assert drift["step"] == 2 and drift["seed"] == 0
        for impl in ("moe_mlir", "grouped_mm", "eager", "fp32_grouped_mm"):
            groups = drift["groups"][impl]
            for g in ("router", "experts.gate", "experts.up", "experts.down", "attn.q", "lm_head"):
                assert math.isfinite(groups[g]), (impl, g)
            assert sorted(drift["layers"][impl]["router"]) == ["0", "1"]
    amp = data["parts"][1]
    # Under autocast the bf16 runs differ from f32, a little; in f32 (the CPU's bf16 part)
    # ours is within f32 rounding of the reference.
    assert 0 < amp["stats"]["mean_abs_to_fp32"]["grouped_mm"] < 5e-2
    assert data["parts"][0]["stats"]["mean_abs_to_fp32"]["moe_mlir"] < 1e-4
    assert 0 < amp["drift"]["groups"]["moe_mlir"]["experts.down"] < 5e-2
    for name in ("train_fidelity.png", "fidelity-mixtral-bf16.png", "fidelity-mixtral-amp.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    # Run again: the seeds come from the part files, nothing trains.
    capsys.readouterr()
    assert tf.main(argv) == 0
    log = capsys.readouterr().out
    assert "seeds ['0', '1'] from" in log and "seed 0:" not in log
    # A merge from a session archive; one that expects a third seed fails.
    with tarfile.open(tmp_path / "session.tgz", "w:gz") as tar:
        tar.add(out, arcname="session/fidelity")
    merged = tmp_path / "merged"
    assert tf.main(["--merge", str(tmp_path / "session.tgz"), "--seeds", "0-1",
                    "--atol", "1e-3", "--out", str(merged)]) == 0  # fmt: skip
    again = json.loads((merged / "train_fidelity.json").read_text())
    assert [p["stats"]["ratio"] for p in again["parts"]] == [
        p["stats"]["ratio"] for p in data["parts"]
    ]
    assert tf.main(["--merge", str(out), "--seeds", "0-2", "--out", str(merged)]) == 1
    assert json.loads((merged / "train_fidelity.json").read_text())["parts"][0][
        "missing_seeds"
    ] == [2]
    assert tf.main(["--merge", str(tmp_path / "nothing"), "--out", str(merged)]) == 2
    # Variants added to the stored seeds: only they train, against the stored f32 curves; in
    # f32 (the CPU path) they are HF grouped_mm exactly.
    capsys.readouterr()
    variants = "grouped_mm+f32_swiglu,grouped_mm+index_ties"
    assert tf.main(argv + ["--precision", "bf16", "--variants", variants]) == 0
    log = capsys.readouterr().out
    assert "seed 0: mean |loss - fp32| grouped_mm+f32_swiglu" in log
    assert "moe_mlir" not in log.split("seed 0:")[1].split("\n")[0]
    assert "diagnostic variants" in log
    data = json.loads((out / "train_fidelity.json").read_text())
    (part,) = [p for p in data["parts"] if p["precision"] == "bf16"]
    for name in variants.split(","):
        row = part["variants"][name]
        assert row["seeds"] == [0, 1] and row[name]["D"] == row["grouped_mm"]["D"]
    ties = part["variants"]["grouped_mm+index_ties"]["ties"]
    assert ties["tokens"] > 0 and ties["differ"] == 0
    stored = json.loads((out / "fidelity-mixtral-bf16.json").read_text())["seeds"]["0"]["losses"]
    assert stored["grouped_mm+f32_swiglu"] == stored["grouped_mm"]
    assert tf.main(["--variants", "moe_mlir+fast"]) == 2
    assert tf.main(["--model", "llama"]) == 2 and tf.main(["--precision", "fp8"]) == 2
