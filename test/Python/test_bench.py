"""bench/bench.py as a dry run on bench/emulate.py's stand-in (CPU): the table, the JSON, and
skipping a configuration whose files are missing. Skipped without torch (CI has none)."""

import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import bench  # noqa: E402
import emulate  # noqa: E402
from moe_mlir.config import LayerConfig  # noqa: E402


def test_dry_run(tmp_path, capsys):
    emulate.write_layer(
        LayerConfig(64, 64, 32, 8, 2, renormalize=True, dtype="bf16"),
        str(tmp_path / "mixtral-8x7b"),
    )
    rc = bench.main(
        [
            "--emulate",
            "--device",
            "cpu",
            "--layers-dir",
            str(tmp_path),
            "--ceiling-size",
            "64",
            "--iters",
            "5",
            "--warmup",
            "1",
            "--no-hf",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "SKIP olmoe-1b-7b" in out and "1 passed, 0 failed" in out
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    mixtral = report["configs"][0]
    assert mixtral["ours"]["check"]["ok"]
    assert len(mixtral["ours"]["times_ms"]) == 5
    assert mixtral["floor_saved_bytes"] == 2 * 64 * 64 + 4 * 64 * 2 * 32 + 12 * 64 * 2
    assert mixtral["useful_flops"] == 18.0 * 64 * 2 * 64 * 32 + 6.0 * 64 * 64 * 8


def test_sustained_ceiling(tmp_path, capsys):
    """--sustained-ceiling: the matmul timed again after that long, and each layer's
    fraction of it printed and kept in the JSON."""
    emulate.write_layer(
        LayerConfig(64, 64, 32, 8, 2, renormalize=True, dtype="bf16"),
        str(tmp_path / "mixtral-8x7b"),
    )
    rc = bench.main(
        [
            "--emulate",
            "--device",
            "cpu",
            "--layer",
            str(tmp_path / "mixtral-8x7b"),
            "--ceiling-size",
            "64",
            "--iters",
            "5",
            "--warmup",
            "1",
            "--no-hf",
            "--sustained-ceiling",
            "0.05",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    sustained = report["sustained_ceiling"]
    assert sustained["after_s"] == 0.05 and sustained["tflops"] > 0
    ours = report["configs"][0]["ours"]
    assert ours["fraction_of_sustained_ceiling"] == pytest.approx(
        ours["tflops"] / sustained["tflops"]
    )
    assert (
        f"of the sustained ceiling ({sustained['tflops']:.0f} TFLOP/s after 0.05 s of matmuls): "
        f"mixtral-8x7b {ours['fraction_of_sustained_ceiling']:.2f}" in out
    )


def test_iters_below_five_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--iters", "3"])


@pytest.mark.parametrize("seconds", ["-1", "nan"])
def test_negative_sustained_ceiling_is_refused(capsys, seconds):
    with pytest.raises(SystemExit):
        bench.main(["--sustained-ceiling", seconds])
    assert "--sustained-ceiling must be 0 or more seconds" in capsys.readouterr().err


def test_hf_deepseek_block_computes_our_layer():
    """The DeepseekV3MoE baseline gets our weights in its layout: its output equals the fp32
    reference of the same layer (sigmoid + bias, groups, scaling, shared expert)."""
    pytest.importorskip("transformers")
    from moe_mlir import torch_reference as TR

    cfg = LayerConfig(
        16,
        64,
        32,
        8,
        2,
        renormalize=True,
        dtype="bf16",
        scoring="sigmoid",
        router_bias=True,
        num_groups=4,
        topk_groups=2,
        scaling_factor=2.5,
        shared_ffn=32,
    )
    assert bench.hf_full_block_applies(cfg)
    gen = torch.Generator().manual_seed(3)
    args = bench.make_args(torch, cfg, torch.device("cpu"), gen)
    args["router_bias"] = args["router_bias"] * 10  # decisive for the choice

    class Opts:
        hf_implementation = "eager"

    block = bench.hf_deepseek_block(torch, cfg, args, torch.device("cpu"), Opts).float()
    ours = TR.forward(cfg, {k: v.float() for k, v in args.items()}, requires_grad=False)
    hf = block(args["x"].float().view(1, cfg.tokens, cfg.hidden)).view(cfg.tokens, cfg.hidden)
    err = (hf - ours.out).norm() / ours.out.norm()
    assert err < 1e-4, err


def test_dry_run_with_peers(tmp_path, capsys):
    """The HF block (eager experts on the CPU) timed beside ours with its ratio; a peer that
    cannot run (Liger without its package, or without a GPU) is an error in its entry, and
    the run goes on."""
    pytest.importorskip("transformers")
    emulate.write_layer(
        LayerConfig(64, 64, 32, 8, 2, renormalize=True, dtype="bf16"),
        str(tmp_path / "mixtral-8x7b"),
    )
    rc = bench.main(
        [
            "--emulate",
            "--device",
            "cpu",
            "--layers-dir",
            str(tmp_path),
            "--layer",
            str(tmp_path / "mixtral-8x7b"),
            "--ceiling-size",
            "64",
            "--iters",
            "5",
            "--warmup",
            "1",
            "--hf-implementation",
            "eager",
            "--peer",
            "liger",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    entry = json.loads((tmp_path / "out" / "bench.json").read_text())["configs"][0]
    assert entry["hf"]["tflops"] > 0
    assert entry["ours_over_hf_time"] == pytest.approx(
        entry["ours"]["median_ms"] / entry["hf"]["median_ms"]
    )
    assert ("liger" in entry) != ("liger_error" in entry)
    if "liger_error" in entry:
        assert "Liger failed" in out


def test_useful_flops_count_the_shared_expert():
    # routed experts, a shared expert on every token, the router
    assert bench.useful_flops(8, 64, 32, 4, 2, shared=16) == (
        18.0 * 8 * 2 * 64 * 32 + 18.0 * 8 * 64 * 16 + 6.0 * 8 * 64 * 4
    )
    assert bench.useful_flops(8, 64, 32, 4, 2) == 18.0 * 8 * 2 * 64 * 32 + 6.0 * 8 * 64 * 4
    # a non-gated FFN: two GEMMs a row, not three
    assert bench.useful_flops(8, 64, 32, 4, 2, shared=16, gated=False) == (
        12.0 * 8 * 2 * 64 * 32 + 12.0 * 8 * 64 * 16 + 6.0 * 8 * 64 * 4
    )
    assert "deepseek-v3-routed" in bench.ROUTED_LAYERS


def test_offload_compiled_digest_tells_bitwise_equality():
    """bench/offload_compiled.py compares the stacks' gradients by digest (they are too large
    to keep): equal bits give equal digests, in any chunking; one changed element does not."""
    torch = pytest.importorskip("torch")
    import offload_compiled  # noqa: PLC0415

    g = torch.Generator().manual_seed(0)
    for t in (
        torch.randn(300, 70, generator=g).to(torch.bfloat16),
        torch.randn(40, 9, generator=g),
    ):
        assert offload_compiled.digest(torch, t) == offload_compiled.digest(torch, t.clone())
        assert offload_compiled.digest(torch, t, chunk=1000) == offload_compiled.digest(
            torch, t.clone(), chunk=7
        )
        u = t.clone()
        u.view(-1)[5] = u.view(-1)[6]
        if not torch.equal(u, t):
            assert offload_compiled.digest(torch, u) != offload_compiled.digest(torch, t)
        # the same bits in another order differ too (the position-weighted sum)
        v = t.clone().view(-1).flip(0).view(t.shape)
        if not torch.equal(v, t):
            assert offload_compiled.digest(torch, v) != offload_compiled.digest(torch, t)


def test_recompute_timed_beside_the_kept_layer(tmp_path, capsys):
    """--recompute: NAME-recompute checked and timed in the same process right after NAME,
    its ratio to the kept layer and the best peer's ratio to it in the JSON and the table; a
    configuration without NAME-recompute says so and still passes."""
    pytest.importorskip("transformers")
    cfg = LayerConfig(64, 64, 32, 8, 2, renormalize=True, dtype="bf16")
    emulate.write_layer(cfg, str(tmp_path / "mixtral-8x7b"))
    emulate.write_layer(cfg, str(tmp_path / "mixtral-8x7b-recompute"))
    emulate.write_layer(LayerConfig(32, 64, 32, 4, 1, dtype="bf16"), str(tmp_path / "olmoe-1b-7b"))
    rc = bench.main(
        [
            "--emulate",
            "--device",
            "cpu",
            "--layer",
            str(tmp_path / "mixtral-8x7b"),
            "--layer",
            str(tmp_path / "olmoe-1b-7b"),
            "--recompute",
            "--ceiling-size",
            "64",
            "--iters",
            "5",
            "--warmup",
            "1",
            "--hf-implementation",
            "eager",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    mixtral, olmoe = json.loads((tmp_path / "out" / "bench.json").read_text())["configs"]
    rec = mixtral["ours_recompute"]
    assert rec["check"]["ok"] and len(rec["times_ms"]) == 5
    assert mixtral["recompute_over_kept"] == pytest.approx(
        rec["median_ms"] / mixtral["ours"]["median_ms"]
    )
    assert mixtral["best_peer_over_recompute_time"] == pytest.approx(
        mixtral["hf"]["median_ms"] / rec["median_ms"]
    )
    assert (
        f"mixtral-8x7b: H recomputed {rec['median_ms']:.2f} ms, "
        f"{mixtral['recompute_over_kept']:.2f}x the kept layer (target <= 1.25)"
    ) in out
    assert "olmoe-1b-7b-recompute.json missing" in olmoe["recompute_skipped"]
    assert "olmoe-1b-7b: H recomputed not timed" in out
    assert "ours_recompute" not in olmoe and "2 passed, 0 failed" in out


def test_recompute_of_another_layer_fails(tmp_path, capsys):
    """A NAME-recompute compiled for another configuration is an error of that configuration
    (exit 1), never a ratio between two different layers."""
    emulate.write_layer(
        LayerConfig(64, 64, 32, 8, 2, renormalize=True, dtype="bf16"),
        str(tmp_path / "mixtral-8x7b"),
    )
    emulate.write_layer(
        LayerConfig(64, 64, 32, 8, 1, renormalize=True, dtype="bf16"),
        str(tmp_path / "mixtral-8x7b-recompute"),
    )
    rc = bench.main(
        [
            "--emulate",
            "--device",
            "cpu",
            "--layer",
            str(tmp_path / "mixtral-8x7b"),
            "--recompute",
            "--no-hf",
            "--ceiling-size",
            "64",
            "--iters",
            "5",
            "--warmup",
            "1",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 1, out
    entry = json.loads((tmp_path / "out" / "bench.json").read_text())["configs"][0]
    assert "is not the same layer as mixtral-8x7b" in entry["recompute_error"]
    assert "recompute_over_kept" not in entry and "0 passed, 1 failed" in out


def test_best_peer_does_the_same_work():
    """The best peer is the fastest of Liger and the HF block, and the HF block is
    DeepseekV3MoE (hf_full) where it ran, never the faster Mixtral block beside it, which
    has no shared expert (power_floor.py reads the same rule from here)."""
    assert bench.best_peer_ms({"hf": {"median_ms": 60.0}, "hf_full": {"median_ms": 66.0}}) == 66.0
    assert bench.best_peer_ms({"hf": {"median_ms": 20.0}, "liger": {"median_ms": 16.5}}) == 16.5
    assert bench.best_peer_ms({"hf_error": "RuntimeError: x"}) is None
