"""bench/check_layer.py on bench/emulate.py's stand-in (CPU, no GPU): the script passes a
correct layer and catches wrong numbers, wrong routing and non-determinism.

Skipped without torch (CI has none).
"""

import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import check_layer  # noqa: E402
import emulate  # noqa: E402
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
    """emulate.py's manifest with moe-compile's "expert_bias" key, which it lacks."""
    prefix = emulate.write_layer(cfg, str(tmp_path / "layer"))
    path = tmp_path / "layer.json"
    manifest = json.loads(path.read_text())
    manifest["layer"]["expert_bias"] = True
    assert "b_gate_up" in manifest["layer"]["inputs"]
    path.write_text(json.dumps(manifest))
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
