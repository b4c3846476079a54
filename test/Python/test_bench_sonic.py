"""bench/sonic.py on the CPU: our weights in SonicMoE's layout (gate/up rows interleaved) and
back, SonicMoE's documented semantics in plain torch against our fp32 reference (output and
gradients, both routings), the check's verdict, and which configurations it skips; bench.py
--peer sonic and --sonic-shapes as a dry run. Skipped without torch."""

import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import bench  # noqa: E402
import emulate  # noqa: E402
import sonic  # noqa: E402
from moe_mlir import torch_reference as TR  # noqa: E402
from moe_mlir.config import LayerConfig  # noqa: E402


def layer_args(cfg, seed=5):
    gen = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(cfg.tokens, cfg.hidden, generator=gen),
        "w_router": torch.randn(cfg.hidden, cfg.experts, generator=gen) * 0.3,
        "w_gate_up": torch.randn(cfg.experts, cfg.hidden, 2 * cfg.ffn, generator=gen) * 0.1,
        "w_down": torch.randn(cfg.experts, cfg.ffn, cfg.hidden, generator=gen) * 0.1,
    }


def test_interleave_puts_gate_at_even_rows():
    cfg = LayerConfig(5, 16, 12, 4, 2, renormalize=True)
    a = layer_args(cfg)
    w = sonic.to_sonic(torch, a["w_router"], a["w_gate_up"], a["w_down"])
    n = cfg.ffn
    assert w["c_fc"].shape == (4, 2 * n, 16) and w["c_fc"].is_contiguous()
    assert w["c_proj"].shape == (4, 16, n) and w["router"].shape == (4, 16)
    for e in range(cfg.experts):
        for i in range(n):
            assert torch.equal(w["c_fc"][e, 2 * i], a["w_gate_up"][e, :, i])
            assert torch.equal(w["c_fc"][e, 2 * i + 1], a["w_gate_up"][e, :, n + i])
        assert torch.equal(w["c_proj"][e], a["w_down"][e].t())
    back = sonic.from_sonic(torch, w["router"], w["c_fc"], w["c_proj"])
    for name in ("w_router", "w_gate_up", "w_down"):
        assert torch.equal(back[name], a[name])


@pytest.mark.parametrize("renormalize", [True, False])
def test_sonic_semantics_compute_our_layer(renormalize):
    """SonicMoE's layer (softmax over the top-k logits; or the top-k of a softmax, not
    renormalised) on our weights in its layout is our layer: the same output and, converted
    back, the same gradients as the fp32 reference, with the same experts chosen."""
    cfg = LayerConfig(40, 32, 24, 8, 3, renormalize=renormalize)
    a = layer_args(cfg)
    w = {
        k: v.clone().requires_grad_(True)
        for k, v in sonic.to_sonic(
            torch, **{"w_router": a["w_router"], "w_gate_up": a["w_gate_up"], "w_down": a["w_down"]}
        ).items()
    }
    x = a["x"].clone().requires_grad_(True)
    flags = sonic.routing_flags(cfg)
    out, experts, _ = sonic.reference(
        torch, x, w["router"], w["c_fc"], w["c_proj"], cfg.top_k, *flags
    )
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    out.backward(d_out)
    ref, grads = TR.forward_backward(cfg, a, d_out)
    assert torch.equal(experts.sort(1).values, ref.experts.sort(1).values)
    torch.testing.assert_close(out, ref.out, rtol=1e-5, atol=1e-5)
    mine = sonic.from_sonic(torch, w["router"].grad, w["c_fc"].grad, w["c_proj"].grad)
    torch.testing.assert_close(x.grad, grads["x"], rtol=1e-4, atol=1e-5)
    for name in ("w_router", "w_gate_up", "w_down"):
        torch.testing.assert_close(mine[name], grads[name], rtol=1e-4, atol=1e-5)


def _expert_grads_of(w_grads):
    def get(e):
        t = w_grads["c_fc"][e].t()
        return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1), w_grads["c_proj"][e].t()

    return get


@pytest.mark.parametrize("renormalize", [True, False])
def test_check_passes_sonic_and_fails_a_wrong_layout(renormalize):
    """reference_errors, given SonicMoE's routing, passes its exact result and fails the same
    block run with gate and up concatenated instead of interleaved (a layout mistake)."""
    cfg = LayerConfig(64, 32, 16, 8, 2, renormalize=renormalize)
    a = layer_args(cfg, seed=11)
    flags = sonic.routing_flags(cfg)
    d_out = torch.randn(cfg.tokens, cfg.hidden, generator=torch.Generator().manual_seed(2))

    def run(c_fc_of):
        w = sonic.to_sonic(torch, a["w_router"], a["w_gate_up"], a["w_down"])
        w["c_fc"] = c_fc_of(w["c_fc"])
        w = {k: v.requires_grad_(True) for k, v in w.items()}
        x = a["x"].clone().requires_grad_(True)
        out, experts, _ = sonic.reference(
            torch, x, w["router"], w["c_fc"], w["c_proj"], cfg.top_k, *flags
        )
        out.backward(d_out)
        got = {"out": out.detach(), "x": x.grad, "w_router": w["router"].grad.t()}
        grads = {"c_fc": w["c_fc"].grad, "c_proj": w["c_proj"].grad}
        return sonic.reference_errors(torch, cfg, a, experts, d_out, got, _expert_grads_of(grads))

    good = run(lambda c: c)
    assert sonic.verdict(good), good
    assert max(good.values()) < 1e-5
    # HF's concatenated rows [gate; up] read as interleaved
    n = cfg.ffn
    concat = torch.cat([a["w_gate_up"][..., :n], a["w_gate_up"][..., n:]], -1).transpose(1, 2)
    bad = run(lambda c: concat.contiguous())
    assert not sonic.verdict(bad) and bad["out"] > 0.1, bad
    nan = dict(good, w_down=float("nan"))
    assert not sonic.verdict(nan)


def test_which_layers_sonic_runs():
    assert sonic.applies(LayerConfig(8, 64, 32, 8, 2, renormalize=True)) is None
    assert sonic.routing_flags(LayerConfig(8, 64, 32, 8, 2, renormalize=True)) == (True, False)
    olmoe = LayerConfig(8, 64, 32, 64, 8, renormalize=False)
    assert sonic.applies(olmoe) is None and sonic.routing_flags(olmoe) == (False, False)
    deepseek = LayerConfig(
        8,
        64,
        32,
        16,
        4,
        scoring="sigmoid",
        renormalize=True,
        router_bias=True,
        num_groups=4,
        topk_groups=2,
        scaling_factor=2.5,
        shared_ffn=32,
    )
    assert "softmax top-k" in sonic.applies(deepseek)
    routed = LayerConfig(
        8,
        64,
        32,
        16,
        4,
        scoring="sigmoid",
        renormalize=True,
        router_bias=True,
        num_groups=4,
        topk_groups=2,
        scaling_factor=2.5,
    )
    assert sonic.applies(routed)
    assert "GLU" in sonic.applies(LayerConfig(8, 64, 32, 8, 2, activation="gelu"))
    for name, (T, d, n, E, k) in sonic.SHAPES.items():
        assert name == f"sonic-t{T}-d{d}-n{n}-e{E}-k{k}"


def test_dry_run_peer_sonic(tmp_path, capsys):
    """--peer sonic: without the package (or a GPU) SonicMoE is an error in its entry and the
    run goes on; a deepseek-style layer is skipped with the reason; --sonic-shapes adds
    SonicMoE's shapes (missing here: skipped)."""
    emulate.write_layer(
        LayerConfig(64, 64, 32, 8, 2, renormalize=True, dtype="bf16"),
        str(tmp_path / "mixtral-8x7b"),
    )
    emulate.write_layer(
        LayerConfig(
            16,
            64,
            32,
            8,
            2,
            scoring="sigmoid",
            renormalize=True,
            router_bias=True,
            num_groups=4,
            topk_groups=2,
            scaling_factor=2.5,
            shared_ffn=32,
            dtype="bf16",
        ),
        str(tmp_path / "deepseek-v3"),
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
            "--layer",
            str(tmp_path / "deepseek-v3"),
            "--ceiling-size",
            "64",
            "--iters",
            "5",
            "--warmup",
            "1",
            "--no-hf",
            "--peer",
            "sonic",
            "--sonic-shapes",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    configs = json.loads((tmp_path / "out" / "bench.json").read_text())["configs"]
    mixtral, deepseek = configs[0], configs[1]
    assert ("sonic" in mixtral) != ("sonic_error" in mixtral)
    assert "softmax top-k" in deepseek["sonic_skipped"]
    assert "SonicMoE not run" in out
    assert [c["name"] for c in configs[2:]] == list(sonic.SHAPES)
    assert all("skipped" in c for c in configs[2:])


def test_best_peer_counts_sonic_only_when_timed():
    entry = {"hf": {"median_ms": 20.0}, "sonic": {"median_ms": 9.5}}
    assert bench.best_peer_ms(entry) == 9.5
    # a SonicMoE that failed its check has no time: not a peer
    entry["sonic"] = {"check": {"ok": False}}
    assert bench.best_peer_ms(entry) == 20.0
    e = {"ours": {"median_ms": 10.0}, "useful_flops": 1e12}
    assert bench.time_peer(e, "sonic", "SonicMoE", lambda: {"check": {"ok": False}}) is None
    assert "ours_over_sonic_time" not in e and e["sonic"]["check"]["ok"] is False
