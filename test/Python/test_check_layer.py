"""bench/check_layer.py on bench/emulate.py's stand-in (CPU, no GPU): the script passes a
correct layer and catches wrong numbers, wrong routing and non-determinism.

Skipped without torch (CI has none).
"""

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


@pytest.mark.parametrize("cfg", [MIXTRAL_LIKE, DEEPSEEK_LIKE], ids=["mixtral", "deepseek"])
def test_correct_layer_passes_every_routing(tmp_path, cfg, capsys):
    assert run(tmp_path, cfg, "--routing", "all") == 0
    out = capsys.readouterr().out
    assert "3 passed, 0 failed" in out
    assert (tmp_path / "out" / "check_layer.json").exists()


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
