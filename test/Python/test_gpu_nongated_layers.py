"""Non-gated experts (silu, gelu, gelu_tanh) on the CUDA path without a GPU: MoELayer builds
their sm_90a layers through the compile cache (n-wide W_gate_up in the manifest), and
test/GPU/dynamic_layer_check.py, which checks the dynamic-T layers of
scripts/inputs/build-layers.sh on the GPU, runs end to end on bench/emulate.py's stand-in."""

import dataclasses
import json
import os
import sys

import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "test", "GPU"))

from moe_mlir import compile_cache as cc  # noqa: E402
from moe_mlir import gpu  # noqa: E402
from moe_mlir.config import LayerConfig  # noqa: E402
from moe_mlir.layer import MoELayer, check_gpu_config  # noqa: E402

needs_compiler = pytest.mark.skipif(cc.find_moe_compile() is None, reason="no moe-compile")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MOE_MLIR_CACHE", str(tmp_path_factory.getbasetemp() / "ng_cache"))


@needs_compiler
@pytest.mark.parametrize(
    "act,shared", [("silu", 0), ("gelu", 64), ("silu", 64), ("gelu", 0), ("gelu_tanh", 64)]
)
def test_moe_layer_builds_a_nongated_cuda_layer(act, shared):
    cfg = LayerConfig(0, 64, 128, 4, 2, renormalize=True, shared_ffn=shared, activation=act)
    check_gpu_config(dataclasses.replace(cfg, tokens=16, dtype="bf16"))
    layer = MoELayer(cfg)
    assert layer.w_gate_up.shape == (4, 64, 128)
    assert layer.compile_for(20, "cuda") == 32
    at_bound = dataclasses.replace(cfg, tokens=32, dtype="bf16")
    entry = cc.find_gpu_entry(at_bound, cc.BuildOptions(max_tokens=32))
    assert (entry.path / f"{entry.name}.o").stat().st_size > 0
    manifest = gpu.Manifest.load(str(entry.path / f"{entry.name}.json"))
    assert manifest.layer["activation"] == act and manifest.max_tokens == 32
    shapes = {p.name: tuple(p.shape) for p in manifest.forward.by_role("input")}
    assert shapes[manifest.layer["inputs"]["w_gate_up"]] == (4, 64, 128)
    if shared:
        names = manifest.layer["inputs"]
        shared_gate_up = names.get("shared_gate_up", names.get("shared_w_gate_up"))
        assert shapes[shared_gate_up] == (64, 64)
    saved = {p.name: tuple(p.shape) for p in manifest.forward.by_role("saved")}
    assert saved["moe.expert_ffn.h"] == (-1, 128)  # H is n wide, its rows follow T


@needs_compiler
def test_dynamic_layer_check_on_the_stand_in(tmp_path, monkeypatch):
    """The script's whole path (inputs at each T, forward, backward twice, the reference with
    the layer's experts, gradients by the manifest's names) on the stand-in, which computes
    the reference itself at the T it is called with, in bf16: every check passes."""
    import dynamic_layer_check as dlc
    import emulate

    cfg = LayerConfig(64, 128, 192, 8, 2, activation="gelu", dtype="bf16")
    entry = cc.build_gpu_entry(cfg, cc.BuildOptions(max_tokens=64))
    prefix = str(tmp_path / "gelu-dyn")
    for ext in ("json", "o"):
        os.symlink(entry.path / f"{entry.name}.{ext}", f"{prefix}.{ext}")
    call = emulate.EmulatedLayer._call

    def at_tokens(self, kind, ep, tensors, device, tokens=None):
        self.cfg = dataclasses.replace(self.cfg, tokens=tokens or self.cfg.tokens)
        return call(self, kind, ep, tensors, device, tokens)

    monkeypatch.setattr(emulate.EmulatedLayer, "_call", at_tokens)
    out = tmp_path / "rows.json"
    argv = ["--emulate", "--layer", prefix, "--routing", "all", "--json", str(out)]
    assert dlc.main(argv) == 0
    rows = json.loads(out.read_text())
    assert sorted({(r["T"], r["routing"]) for r in rows}) == sorted(
        (T, r) for T in (1, 37, 64) for r in ("random", "all-to-one", "skewed")
    )
    for row in rows:
        assert row["activation"] == "gelu"
        assert set(row["rel_error"]) >= {"out", "dx", "d_w_gate_up", "d_w_down", "d_w_router"}
        assert all(v < 4e-3 for v in row["rel_error"].values())  # bf16 outputs
    # a layer of static T is refused with the script to use instead
    static = cc.build_gpu_entry(dataclasses.replace(cfg, tokens=37))
    prefix = str(tmp_path / "gelu-t37")
    os.symlink(static.path / f"{static.name}.json", f"{prefix}.json")
    assert dlc.main(["--emulate", "--layer", prefix]) == 1
