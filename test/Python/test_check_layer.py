"""bench/check_layer.py on bench/emulate.py's stand-in (CPU, no GPU): the script passes a
correct layer and catches wrong numbers, wrong routing and non-determinism.

Skipped without torch (CI has none).
"""

import dataclasses
import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import check_layer  # noqa: E402
import emulate  # noqa: E402
from moe_mlir import compile_cache as cc  # noqa: E402
from moe_mlir import torch_reference as TR  # noqa: E402
from moe_mlir.config import LayerConfig  # noqa: E402

MIXTRAL_LIKE = LayerConfig(37, 128, 64, 8, 2, renormalize=True, dtype="bf16")
DEEPSEEK_LIKE = LayerConfig(
    37,
    256,
    128,
    16,
    4,
    scoring="sigmoid",
    router_bias=True,
    num_groups=4,
    topk_groups=2,
    scaling_factor=2.5,
    renormalize=True,
    shared_ffn=128,
    dtype="bf16",
)
# scripts/inputs/build-layers.sh's layers with expert biases (gpt-oss style)
BIAS = LayerConfig(37, 256, 192, 8, 2, renormalize=True, expert_bias=True, dtype="bf16")
BIAS_GELU_SHARED = LayerConfig(
    37,
    192,
    320,
    8,
    3,
    scoring="sigmoid",
    renormalize=True,
    router_bias=True,
    shared_ffn=192,
    activation="gelu",
    expert_bias=True,
    dtype="bf16",
)


def run(tmp_path, cfg, *extra):
    prefix = emulate.write_layer(cfg, str(tmp_path / "layer"))
    return check_layer.main(
        [
            "--emulate",
            "--device",
            "cpu",
            "--no-hf",
            "--layer",
            prefix,
            "--out",
            str(tmp_path / "out"),
            *extra,
        ]
    )


@pytest.mark.parametrize(
    "cfg",
    [MIXTRAL_LIKE, DEEPSEEK_LIKE, BIAS, BIAS_GELU_SHARED],
    ids=["mixtral", "deepseek", "bias", "bias-gelu-shared"],
)
def test_correct_layer_passes_every_routing(tmp_path, cfg, capsys):
    assert run(tmp_path, cfg, "--routing", "all") == 0
    out = capsys.readouterr().out
    assert "3 passed, 0 failed" in out
    assert (tmp_path / "out" / "check_layer.json").exists()


def write_bias_layer(tmp_path, cfg):
    """emulate.py's manifest, with moe-compile's "expert_bias" key."""
    prefix = emulate.write_layer(cfg, str(tmp_path / "layer"))
    manifest = json.loads((tmp_path / "layer.json").read_text())
    assert manifest["layer"]["expert_bias"] is True
    assert "b_gate_up" in manifest["layer"]["inputs"]
    return prefix


def test_bias_layer_compares_the_bias_gradients(tmp_path, capsys):
    prefix = write_bias_layer(tmp_path, BIAS)
    argv = ["--emulate", "--device", "cpu", "--layer", prefix, "--out", str(tmp_path / "out")]
    assert check_layer.main(argv) == 0
    out = capsys.readouterr().out
    assert "d_bgu" in out and "d_bd" in out
    data = json.loads((tmp_path / "out" / "check_layer.json").read_text())
    metrics = data["checks"][0]["metrics"]
    assert metrics["config"]["expert_bias"] is True
    assert metrics["rel_error"]["d_b_gate_up"] < 2e-2
    assert metrics["rel_error"]["d_b_down"] < 2e-2
    # HF Mixtral's experts have no biases: no transformers comparison, even without --no-hf
    assert not check_layer.hf_shaped(BIAS)
    assert "hf_out" not in metrics


@pytest.mark.parametrize("dropped", ["b_gate_up", "b_down"])
def test_bias_dropped_in_the_forward_fails(tmp_path, monkeypatch, capsys, dropped):
    """A forward that ignores one expert bias misses out by far more than the tolerance."""
    original = emulate.EmulatedLayer._call
    param = emulate.manifest_for(BIAS, "layer")["layer"]["inputs"][dropped]

    def without_bias(self, kind, ep, tensors, device, tokens=None):
        if kind == "forward":
            kept = tensors[param].clone()
            tensors[param].zero_()
            original(self, kind, ep, tensors, device, tokens)
            tensors[param].copy_(kept)
        else:
            original(self, kind, ep, tensors, device, tokens)

    monkeypatch.setattr(emulate.EmulatedLayer, "_call", without_bias)
    assert run(tmp_path, BIAS) == 1
    out = capsys.readouterr().out
    assert "out: relative error" in out
    data = json.loads((tmp_path / "out" / "check_layer.json").read_text())
    assert data["checks"][0]["metrics"]["rel_error"]["out"] > 0.1


@pytest.mark.parametrize("arg,label", [("b_gate_up", "d_b_gate_up"), ("b_down", "d_b_down")])
def test_wrong_bias_gradient_fails(tmp_path, monkeypatch, capsys, arg, label):
    cfg = BIAS_GELU_SHARED if arg == "b_down" else BIAS
    original = emulate.EmulatedLayer._call
    param = emulate.manifest_for(cfg, "layer")["layer"]["inputs"][arg]

    def scaled(self, kind, ep, tensors, device, tokens=None):
        original(self, kind, ep, tensors, device, tokens)
        if kind == "backward":
            tensors[f"d_{param}"].mul_(1.1)

    monkeypatch.setattr(emulate.EmulatedLayer, "_call", scaled)
    assert run(tmp_path, cfg) == 1
    assert f"{label}: relative error" in capsys.readouterr().out


def test_wrong_gradient_fails(tmp_path, monkeypatch, capsys):
    original = emulate.EmulatedLayer._call

    def scaled(self, kind, ep, tensors, device, tokens=None):
        original(self, kind, ep, tensors, device, tokens)
        if kind == "backward":
            tensors["d_arg3"].mul_(1.1)  # w_down

    monkeypatch.setattr(emulate.EmulatedLayer, "_call", scaled)
    assert run(tmp_path, MIXTRAL_LIKE) == 1
    assert "d_w_down: relative error" in capsys.readouterr().out


def test_wrong_routing_fails(tmp_path, monkeypatch, capsys):
    def shifted(self, kind, ep, tensors, device, tokens=None):
        if kind == "backward":
            return original(self, kind, ep, tensors, device, tokens)
        named = self._named(tensors)
        own = TR.forward(self.cfg, named, requires_grad=False).experts
        ref = TR.forward(self.cfg, named, experts=(own + 1) % self.cfg.experts, requires_grad=False)
        tensors["result0"].copy_(ref.out)
        tensors["result1"].copy_(ref.logits)
        tensors["moe.router.experts"].copy_(ref.experts)

    original = emulate.EmulatedLayer._call
    monkeypatch.setattr(emulate.EmulatedLayer, "_call", shifted)
    assert run(tmp_path, MIXTRAL_LIKE) == 1
    assert "beyond near-ties" in capsys.readouterr().out


def test_nondeterminism_fails(tmp_path, monkeypatch, capsys):
    original = emulate.EmulatedLayer._call
    calls = {"n": 0}

    def noisy(self, kind, ep, tensors, device, tokens=None):
        original(self, kind, ep, tensors, device, tokens)
        if kind == "forward":
            calls["n"] += 1
            if calls["n"] == 2:
                tensors["result0"].view(torch.int16)[0, 0] += 1

    monkeypatch.setattr(emulate.EmulatedLayer, "_call", noisy)
    assert run(tmp_path, MIXTRAL_LIKE) == 1
    assert "not bitwise identical across two runs: result0" in capsys.readouterr().out


def test_transformers_block_agrees_with_the_mapping(tmp_path, capsys):
    pytest.importorskip("transformers")
    prefix = emulate.write_layer(MIXTRAL_LIKE, str(tmp_path / "layer"))
    assert (
        check_layer.main(
            ["--emulate", "--device", "cpu", "--layer", prefix, "--out", str(tmp_path / "out")]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "1 passed, 0 failed" in out
    import json

    data = json.loads((tmp_path / "out" / "check_layer.json").read_text())
    metrics = data["checks"][0]["metrics"]
    assert metrics["hf_out"] < 1e-2 and metrics["hf_d_w_gate_up"] < 2e-2


# --------------------------------------------------------------------------- moe-compile manifests

needs_compiler = pytest.mark.skipif(cc.find_moe_compile() is None, reason="no moe-compile")


def compiled_manifest(tmp_path, monkeypatch, cfg, max_tokens=None):
    """moe-compile's NAME.json of `cfg` (through the compile cache, in tmp_path) at
    tmp_path/NAME.json; returns tmp_path/NAME."""
    monkeypatch.setenv("MOE_MLIR_CACHE", str(tmp_path / "cache"))
    entry = cc.build_gpu_entry(cfg, cc.BuildOptions(max_tokens=max_tokens))
    prefix = tmp_path / "compiled"
    os.symlink(entry.path / f"{entry.name}.json", f"{prefix}.json")
    return str(prefix)


def params_of(manifest, kind):
    return [
        (p["name"], p["role"], p["dtype"], p["shape"], p.get("of"), p.get("forward_param"))
        for p in manifest["entry_points"][kind]["params"]
    ]


@needs_compiler
def test_compiled_bias_shared_expert_bias_layer_passes(tmp_path, monkeypatch, capsys):
    """A manifest of moe-compile with a router bias (the backward takes none: it has no
    gradient), a shared expert and expert biases: the stand-in runs it and every routing
    passes; emulate.py's own manifest is the same."""
    prefix = compiled_manifest(tmp_path, monkeypatch, BIAS_GELU_SHARED)
    real = json.loads(open(prefix + ".json").read())
    inputs = real["layer"]["inputs"]
    bias = inputs["bias"]
    assert bias in {p[0] for p in params_of(real, "forward")}
    assert bias not in {p[0] for p in params_of(real, "backward")}
    assert {"shared_w_gate_up", "b_gate_up", "b_down"} <= set(inputs)
    mine = emulate.manifest_for(BIAS_GELU_SHARED, real["name"])
    for kind in ("forward", "backward"):
        assert params_of(mine, kind) == params_of(real, kind)
    assert mine["layer"]["inputs"] == inputs

    argv = ["--emulate", "--device", "cpu", "--no-hf", "--layer", prefix]
    assert check_layer.main(argv + ["--routing", "all", "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "3 passed, 0 failed" in out
    data = json.loads((tmp_path / "out" / "check_layer.json").read_text())
    for check in data["checks"]:
        errors = check["metrics"]["rel_error"]
        for label in ("d_shared_w_gate_up", "d_shared_w_down", "d_b_gate_up", "d_b_down"):
            assert errors[label] < 2e-2


@needs_compiler
def test_stand_in_runs_a_compiled_dynamic_layer_at_the_call_tokens(tmp_path, monkeypatch):
    """A dynamic-T manifest (router bias, shared expert, expert biases, GELU): the stand-in
    computes at the T of the call, its saved dispatch is the reference's, and its gradients
    (none of the bias) are the reference's with its experts."""
    from moe_mlir import reference as R

    cfg = dataclasses.replace(BIAS_GELU_SHARED, tokens=32)
    layer = emulate.EmulatedLayer(None, compiled_manifest(tmp_path, monkeypatch, cfg, 32) + ".json")
    assert layer.manifest.max_tokens == 32
    T = 13
    at = dataclasses.replace(cfg, tokens=T)
    gen = torch.Generator().manual_seed(5)
    args, _ = check_layer.make_inputs(torch, at, "random", gen, torch.device("cpu"))
    params = check_layer.forward_param_names(layer, at)
    fwd = layer.forward({params[a]: t for a, t in args.items()})
    assert tuple(fwd["result0"].shape) == (T, cfg.hidden)
    d_out = torch.randn((T, cfg.hidden), generator=gen).to(torch.bfloat16)
    grads = layer.backward(fwd, {"d_result0": d_out})
    experts = fwd["moe.router.experts"]
    ref, ref_grads = TR.forward_backward(at, args, d_out, None, experts=experts)
    assert torch.equal(experts.long(), ref.experts)
    assert check_layer.rel_error(torch, fwd["result0"], ref.out) < 1e-2
    token_ids, offsets, rows = R.dispatch(experts.numpy(), cfg.experts)
    assert fwd["moe.dispatch.offsets"].tolist() == offsets.tolist()
    assert fwd["moe.dispatch.rows"].tolist() == rows.tolist()
    assert fwd["moe.dispatch.token_ids"].tolist() == token_ids.tolist()
    named = check_layer.grads_by_arg(layer, params, grads)
    assert "router_bias" not in named
    assert set(named) == set(ref_grads)
    for arg, g in named.items():
        assert tuple(g.shape) == tuple(ref_grads[arg].shape)
        assert check_layer.rel_error(torch, g, ref_grads[arg]) < 2e-2, arg
