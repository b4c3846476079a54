"""bench/megablocks_peer.py on the CPU: our weights in MegaBlocks' layout ([E*n, d] blocks) and
back, MegaBlocks' dMoE semantics (written from its source) in plain torch against our fp32
reference (output and gradients; SiLU and SwiGLU, renormalised or not, k = 1 to 3), the check's
verdict, which configurations each side runs (a SiLU layer: "not run by moe-mlir"), the grid,
and dry runs: without megablocks, and with a stand-in package of its API. Skipped without
torch."""

import json
import os
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import emulate  # noqa: E402
import megablocks_peer as mb  # noqa: E402
from moe_mlir import torch_reference as TR  # noqa: E402
from moe_mlir.config import LayerConfig  # noqa: E402


def layer_args(cfg, seed=5):
    gen = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(cfg.tokens, cfg.hidden, generator=gen),
        "w_router": torch.randn(cfg.hidden, cfg.experts, generator=gen) * 0.3,
        "w_gate_up": torch.randn(cfg.experts, cfg.hidden, cfg.gate_up_width, generator=gen) * 0.1,
        "w_down": torch.randn(cfg.experts, cfg.ffn, cfg.hidden, generator=gen) * 0.1,
    }


@pytest.mark.parametrize("activation", ["swiglu", "silu"])
def test_layout_puts_expert_e_at_rows_e_n(activation):
    cfg = LayerConfig(5, 16, 12, 4, 2, activation=activation)
    a = layer_args(cfg)
    w = mb.to_megablocks(torch, a["w_router"], a["w_gate_up"], a["w_down"], cfg.gated)
    E, n, d = cfg.experts, cfg.ffn, cfg.hidden
    assert w["router"].shape == (E, d) and w["w1"].shape == (E * n, d)
    assert w["w2"].shape == (E * n, d) and all(
        t.is_contiguous() for t in w.values() if t is not None
    )
    assert (w["v1"] is not None) == cfg.gated
    for e in range(E):
        for i in range(n):
            assert torch.equal(w["w1"][e * n + i], a["w_gate_up"][e, :, i])
            if cfg.gated:
                assert torch.equal(w["v1"][e * n + i], a["w_gate_up"][e, :, n + i])
            assert torch.equal(w["w2"][e * n + i], a["w_down"][e, i])
    back = mb.from_megablocks(torch, w["router"], w["w1"], w["v1"], w["w2"], E)
    for name in ("w_router", "w_gate_up", "w_down"):
        assert torch.equal(back[name], a[name])
    with pytest.raises(ValueError, match="does not match"):
        mb.to_megablocks(torch, a["w_router"], a["w_gate_up"], a["w_down"], not cfg.gated)


@pytest.mark.parametrize("activation", ["swiglu", "silu"])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_megablocks_semantics_compute_our_layer(activation, renormalize, k):
    """MegaBlocks' dMoE (softmax, top-k or max, divided by the L1 norm when renormalising) on
    our weights in its layout is our layer: the same experts, output and, converted back, the
    same gradients as the fp32 reference."""
    cfg = LayerConfig(40, 32, 24, 8, k, renormalize=renormalize, activation=activation)
    a = layer_args(cfg)
    w = {
        name: (t.clone().requires_grad_(True) if t is not None else None)
        for name, t in mb.to_megablocks(
            torch, a["w_router"], a["w_gate_up"], a["w_down"], cfg.gated
        ).items()
    }
    x = a["x"].clone().requires_grad_(True)
    out, experts, _ = mb.reference(
        torch, x, w["router"], w["w1"], w["v1"], w["w2"], k, mb.normalize_p(cfg), "silu"
    )
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    out.backward(d_out)
    ref, grads = TR.forward_backward(cfg, a, d_out)
    assert torch.equal(experts.sort(1).values, ref.experts.sort(1).values)
    torch.testing.assert_close(out, ref.out, rtol=1e-5, atol=1e-5)
    mine = mb.from_megablocks(
        torch,
        w["router"].grad,
        w["w1"].grad,
        w["v1"].grad if cfg.gated else None,
        w["w2"].grad,
        cfg.experts,
    )
    torch.testing.assert_close(x.grad, grads["x"], rtol=1e-4, atol=1e-5)
    for name in ("w_router", "w_gate_up", "w_down"):
        torch.testing.assert_close(mine[name], grads[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("activation", ["swiglu", "silu"])
def test_check_passes_megablocks_and_fails_a_wrong_layout(activation):
    """The check's errors (sonic.reference_errors over expert_slices), given MegaBlocks'
    routing, pass its exact result and fail the same layer with the wrong expert blocks."""
    import sonic

    cfg = LayerConfig(64, 32, 16, 8, 2, renormalize=True, activation=activation)
    a = layer_args(cfg, seed=11)
    d_out = torch.randn(cfg.tokens, cfg.hidden, generator=torch.Generator().manual_seed(2))

    def run(w1_of):
        w = mb.to_megablocks(torch, a["w_router"], a["w_gate_up"], a["w_down"], cfg.gated)
        w["w1"] = w1_of(w["w1"])
        w = {k: (v.requires_grad_(True) if v is not None else None) for k, v in w.items()}
        x = a["x"].clone().requires_grad_(True)
        out, experts, _ = mb.reference(
            torch, x, w["router"], w["w1"], w["v1"], w["w2"], 2, 1, "silu"
        )
        out.backward(d_out)
        got = {"out": out.detach(), "x": x.grad, "w_router": w["router"].grad.t()}
        v1g = w["v1"].grad if cfg.gated else None
        grads = mb.expert_slices(torch, cfg.experts, w["w1"].grad, v1g, w["w2"].grad)
        return sonic.reference_errors(torch, cfg, a, experts, d_out, got, grads)

    good = run(lambda t: t)
    assert sonic.verdict(good), good
    assert max(good.values()) < 1e-5
    # the blocks as [d, E*n] read as [E*n, d]: each expert gets another's rows
    n, d, E = cfg.ffn, cfg.hidden, cfg.experts
    bad = run(lambda t: t.view(E, n, d).flip(0).reshape(E * n, d).contiguous())
    assert not sonic.verdict(bad) and bad["out"] > 0.1, bad


def refuse_silu(monkeypatch):
    """Our sm_90a path as it was before it ran non-gated SiLU: check_gpu_config refusing it."""
    import moe_mlir.layer

    real = moe_mlir.layer.check_gpu_config

    def check(cfg):
        if cfg.activation == "silu":
            raise NotImplementedError(
                "the CUDA path of moe_mlir does not run this layer: activation 'silu' is not "
                "one of ['swiglu'] (activations: the expert GEMMs' epilogues compute SwiGLU)"
            )
        real(cfg)

    monkeypatch.setattr(moe_mlir.layer, "check_gpu_config", check)


def test_which_layers_run_where(monkeypatch):
    swiglu = LayerConfig(8, 512, 2048, 8, 2, dtype="bf16")
    assert mb.applies(swiglu, "grouped") is None and mb.applies(swiglu, "sparse") is None
    assert mb.ours_applies(swiglu) is None
    # what the contract refuses, with its reason (d not a multiple of the kernels' tile)
    odd = LayerConfig(8, 100, 2048, 8, 2, activation="silu", dtype="bf16")
    assert mb.applies(odd, "grouped") is None
    why = mb.ours_applies(odd)
    assert why.startswith("not run by moe-mlir: ") and "hidden (d) = 100" in why
    refuse_silu(monkeypatch)
    silu = LayerConfig(8, 512, 2048, 8, 2, activation="silu", dtype="bf16")
    assert mb.ours_applies(silu).startswith("not run by moe-mlir: ")
    qwen = LayerConfig(8, 2048, 768, 128, 8, renormalize=True, dtype="bf16")
    assert mb.applies(qwen, "sparse") is None and mb.normalize_p(qwen) == 1
    assert mb.normalize_p(swiglu) is None
    assert "n % 128" in mb.applies(LayerConfig(8, 512, 704, 8, 2), "sparse")
    assert mb.applies(LayerConfig(8, 512, 704, 8, 2), "grouped") is None
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
    assert "softmax top-k" in mb.applies(deepseek, "grouped")
    assert "dropless" in mb.applies(LayerConfig(8, 64, 128, 8, 2, capacity_factor=1.0), "grouped")
    assert "unknown" in mb.applies(swiglu, "dense")


def test_grid():
    g = mb.grid((16384, 65536))
    assert len(g) == 2 * 3 * 2 * 2 * 2
    for name, cfg in g.items():
        assert cfg.ffn == 4 * cfg.hidden and cfg.scoring == "softmax" and not cfg.renormalize
        assert mb.config_from_name(name) == cfg
    assert mb.config_from_name("mixtral-8x7b") is None
    assert mb.select(type("O", (), {"configs": "", "tokens": "32768"})())[:4] == list(
        mb.BENCH_CONFIGS
    )


def test_ratios_and_peak():
    entry = {
        "ours": {
            "median_ms": 10.0,
            "saved_bytes_torch": 100,
            "saved_bytes_manifest": 80,
            "peak_bytes_torch": 300,
            "workspace_bytes": {"forward": 50, "backward": 100},
        },
        "megablocks_grouped": {
            "median_ms": 20.0,
            "saved_bytes_torch": 400,
            "peak_bytes_torch": 800,
        },
    }
    mb.ratios(entry, "grouped")
    r = entry["ours_over_megablocks_grouped"]
    assert r == {"time": 0.5, "saved": 0.25, "saved_manifest": 0.2, "peak": 0.5}
    entry["megablocks_sparse"] = {"check": {"ok": False}}
    mb.ratios(entry, "sparse")
    assert "ours_over_megablocks_sparse" not in entry


def _emulated(tmp_path):
    emulate.write_layer(
        LayerConfig(64, 64, 128, 8, 2, renormalize=True, dtype="bf16"),
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
    emulate.write_layer(
        mb.config_from_name("mb-t64-d128-n512-e8-k2-swiglu"),
        str(tmp_path / "mb-t64-d128-n512-e8-k2-swiglu"),
    )
    return [
        "--emulate",
        "--device",
        "cpu",
        "--layers-dir",
        str(tmp_path),
        "--configs",
        "mixtral-8x7b,deepseek-v3,mb-t64-d128-n512-e8-k2-swiglu,mb-t64-d128-n512-e8-k1-silu,"
        "qwen3-30b-a3b",
        "--iters",
        "5",
        "--warmup",
        "1",
        "--out",
        str(tmp_path / "out"),
    ]


def test_dry_run_without_megablocks(tmp_path, capsys, monkeypatch):
    """Without the package each MegaBlocks run is an error in its entry and the run goes on;
    ours runs where a layer exists; a SiLU grid layer says why ours does not run; deepseek-v3
    says why MegaBlocks does not; a configuration with neither layer nor grid name is
    skipped."""
    monkeypatch.setitem(sys.modules, "megablocks", None)
    refuse_silu(monkeypatch)
    rc = mb.main(_emulated(tmp_path) + ["--impl", "grouped"])
    out = capsys.readouterr().out
    assert rc == 1, out
    configs = {
        c["name"]: c
        for c in json.loads((tmp_path / "out" / "megablocks.json").read_text())["configs"]
    }
    mixtral = configs["mixtral-8x7b"]
    assert mixtral["ours"]["check"]["ok"] and "megablocks_grouped_error" in mixtral
    assert "softmax top-k" in configs["deepseek-v3"]["megablocks_grouped_skipped"]
    silu = configs["mb-t64-d128-n512-e8-k1-silu"]
    assert silu["ours_skipped"].startswith("not run by moe-mlir: ") and "ours" not in silu
    assert silu["config"]["activation"] == "silu" and "megablocks_grouped_error" in silu
    assert "ours" in configs["mb-t64-d128-n512-e8-k2-swiglu"]
    assert "no grid name" in configs["qwen3-30b-a3b"]["skipped"]
    assert "not run by moe-mlir" in out and "passed" in out.splitlines()[-1]


STAND_IN = {
    "__init__.py": "",
    "_version.py": "__version__ = '0.10.0-stand-in'\n",
    "layers/__init__.py": "",
    "layers/arguments.py": """
        import dataclasses
        from typing import Any, Callable, Optional
        import torch

        @dataclasses.dataclass
        class Arguments:
            hidden_size: int = 1024
            ffn_hidden_size: int = 4096
            bias: bool = True
            return_bias: bool = True
            activation_fn: Optional[Callable] = None
            moe_num_experts: int = 1
            moe_top_k: int = 1
            moe_normalize_expert_weights: Optional[float] = None
            moe_loss_weight: float = 0.1
            memory_optimized_mlp: bool = False
            mlp_type: str = "mlp"
            mlp_impl: str = "sparse"
            fp16: bool = True
            bf16: bool = False
            device: Any = None
            init_method: Any = None
            output_layer_init_method: Any = None
            shared_expert_hidden_size: Optional[int] = None

            def __post_init__(self):
                if self.mlp_impl == "sparse":
                    raise ValueError("Sparse MLP is not supported with triton >=3.2.0.")
                if self.shared_expert_hidden_size is None:
                    self.shared_expert_hidden_size = self.ffn_hidden_size
    """,
    "layers/dmoe.py": """
        import sys
        import torch
        import megablocks_peer as ref  # MegaBlocks' semantics, as the tests hold them

        class _Router(torch.nn.Module):
            def __init__(self, a):
                super().__init__()
                self.layer = torch.nn.Linear(a.hidden_size, a.moe_num_experts, bias=False,
                                             dtype=torch.bfloat16, device=a.device)

            def forward(self, x):
                scores = self.layer(x.view(-1, x.shape[-1])).softmax(dim=-1)
                if self.k == 1:
                    w, e = scores.max(dim=-1, keepdim=True)
                else:
                    w, e = torch.topk(scores, self.k, dim=-1)
                return scores, w, e

        class _MLP(torch.nn.Module):
            def __init__(self, a):
                super().__init__()
                shape = (a.moe_num_experts * a.ffn_hidden_size, a.hidden_size)
                mk = lambda: torch.nn.Parameter(torch.empty(shape, dtype=torch.bfloat16,
                                                            device=a.device))
                self.w1, self.w2 = mk(), mk()
                if a.mlp_type == "glu":
                    self.v1 = mk()

        class _Experts(torch.nn.Module):
            def __init__(self, a):
                super().__init__()
                self.mlp = _MLP(a)

        class dMoE(torch.nn.Module):
            def __init__(self, a):
                super().__init__()
                self.args = a
                self.router = _Router(a)
                self.router.k = a.moe_top_k
                self.experts = _Experts(a)

            def forward(self, x):
                a, m = self.args, self.experts.mlp
                _, _, experts = self.router(x)  # the hook sees this call
                out, got, _ = ref.reference(
                    torch, x.view(-1, x.shape[-1]), self.router.layer.weight, m.w1,
                    getattr(m, "v1", None), m.w2, a.moe_top_k,
                    a.moe_normalize_expert_weights, "silu")
                assert torch.equal(got, experts)
                return out.view(x.shape)
    """,
}


def test_dry_run_with_a_stand_in(tmp_path, capsys, monkeypatch):
    """A stand-in package with MegaBlocks' API (Arguments and its sparse refusal, dMoE's
    router.layer, experts.mlp.w1/v1/w2, the router's (scores, weights, experts)) computing its
    semantics: the block's weights, its routing hook, the check and the timing run on the
    CPU; 'sparse' passes the refusal and says so; SiLU runs MegaBlocks alone."""
    pkg = tmp_path / "site" / "megablocks"
    for rel, text in STAND_IN.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(textwrap.dedent(text))

    def ours(name):
        return name == "megablocks" or name.startswith("megablocks.")

    real = {k: v for k, v in sys.modules.items() if ours(k)}
    for name in real:
        del sys.modules[name]
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    refuse_silu(monkeypatch)
    argv = _emulated(tmp_path)
    i = argv.index("--configs")
    argv[i + 1] = "mixtral-8x7b,mb-t64-d128-n512-e8-k1-silu"
    try:
        rc = mb.main(argv)
    finally:  # the stand-in's modules must not outlive the test
        for name in [k for k in sys.modules if ours(k)]:
            del sys.modules[name]
        sys.modules.update(real)
    out = capsys.readouterr().out
    assert rc == 0, out
    report = json.loads((tmp_path / "out" / "megablocks.json").read_text())
    assert report["megablocks"] == "0.10.0-stand-in"
    mixtral, silu = report["configs"]
    for impl in ("grouped", "sparse"):
        res = mixtral[f"megablocks_{impl}"]
        assert res["check"]["ok"] and res["check"]["out"] < 1e-2, res["check"]
        assert res["median_ms"] > 0 and res["moe_normalize_expert_weights"] == 1
        assert res["forced_past_triton_check"] == (impl == "sparse")
        assert mixtral[f"ours_over_megablocks_{impl}"]["time"] > 0
        assert silu[f"megablocks_{impl}"]["check"]["ok"]
        assert "mlp_type=mlp" in silu[f"megablocks_{impl}"]["implementation"]
    assert "ours" not in silu and silu["ours_skipped"].startswith("not run by moe-mlir")


def _report(impl, rows):
    """A report as one implementation's run writes it: (name, ours ms, MegaBlocks ms, time,
    saved, peak) a configuration, None for one skipped."""
    configs = []
    for name, ours, theirs, *ratios in rows:
        if ours is None:
            configs.append({"name": name, f"megablocks_{impl}_skipped": "no layer of this kind"})
            continue
        configs.append(
            {
                "name": name,
                "ours": {"median_ms": ours},
                f"megablocks_{impl}": {"median_ms": theirs},
                f"ours_over_megablocks_{impl}": dict(zip(("time", "saved", "peak"), ratios)),
            }
        )
    return {"impls": [impl], "configs": configs}


def test_merge_prints_the_docs_table(tmp_path, capsys):
    """--merge: one row a configuration from the runs of both implementations, ours timed in
    each (grouped's run first), each ratio "grouped / sparse", a grid name as the docs write
    it, a skipped configuration with its reason; bad files are argument errors."""
    grouped = _report(
        "grouped",
        [
            ("mixtral-8x7b", 55.6, 57.6, 0.966, 0.455, 0.75),
            ("deepseek-v3", None, None),
            ("mb-t32768-d2048-n8192-e8-k2-silu", 23.58, 22.61, 1.043, 0.43, 0.52),
        ],
    )
    sparse = _report(
        "sparse",
        [
            ("mixtral-8x7b", 55.5, 103.3, 0.537, 0.45, 0.74),
            ("deepseek-v3", None, None),
            ("mb-t32768-d2048-n8192-e8-k2-silu", 22.61, 34.54, 0.655, 0.43, 0.51),
        ],
    )
    paths = []
    for name, rep in (("s.json", sparse), ("g.json", grouped)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(rep))
    assert mb.main(["--merge", *map(str, paths)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith(
        "| config | ours ms (grouped / sparse run) | grouped ms | sparse ms |"
    )
    assert lines[2] == (
        "| mixtral-8x7b | 55.60 / 55.50 | 57.60 | 103.30 | 0.97 / 0.54 | 0.46 / 0.45 | 0.75 / 0.74 |"
    )
    assert lines[3] == "| deepseek-v3 | no layer of this kind | | | | | |"
    assert lines[4].startswith(
        "| d 2048, E 8, k 2, SiLU | 23.58 / 22.61 | 22.61 | 34.54 | 1.04 / 0.66 |"
    )
    assert len(lines) == 5
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(SystemExit):
        mb.main(["--merge", str(bad)])
    with pytest.raises(SystemExit):
        mb.main(["--merge", str(tmp_path / "missing.json")])


def test_list(capsys):
    assert mb.main(["--list", "--tokens", "16384"]) == 0
    names = capsys.readouterr().out.split()
    assert names[:4] == list(mb.BENCH_CONFIGS) and len(names) == 4 + 24
    assert "mb-t16384-d2048-n8192-e16-k2-silu" in names


def test_real_megablocks_block_holds_our_weights():
    """With megablocks built (scripts/dev/build-megablocks.sh SITE, SITE on PYTHONPATH): its
    Arguments (the sparse refusal passed) and dMoE take our weights; its kernels need a GPU,
    so only the construction runs here."""
    pytest.importorskip("megablocks_ops")
    pytest.importorskip("megablocks.layers.dmoe")
    for activation in ("swiglu", "silu"):
        cfg = LayerConfig(64, 128, 256, 8, 2, renormalize=True, activation=activation, dtype="bf16")
        a = {k: v.to(torch.bfloat16) for k, v in layer_args(cfg).items()}
        w = mb.to_megablocks(torch, a["w_router"], a["w_gate_up"], a["w_down"], cfg.gated)
        for impl in mb.IMPLS:
            block = mb.MegaBlocksBlock(torch, cfg, a, impl)
            mlp = block.moe.experts.mlp
            assert block.moe.router.args.moe_normalize_expert_weights == 1
            assert block.moe.experts.args.mlp_type == ("glu" if cfg.gated else "mlp")
            assert torch.equal(block.moe.router.layer.weight, w["router"])
            assert torch.equal(mlp.w1, w["w1"]) and torch.equal(mlp.w2, w["w2"])
            if cfg.gated:
                assert torch.equal(mlp.v1, w["v1"])
            assert len(block.parameters()) == (4 if cfg.gated else 3)
