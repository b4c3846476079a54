"""`python -m moe_mlir run`: .npy in, .npy out, and clear errors for bad input."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from moe_mlir import cpu
from moe_mlir import reference as ref
from moe_mlir.config import LayerConfig
from moe_mlir.mlir_text import layer_mlir

PYTHON_DIR = Path(__file__).resolve().parents[2] / "python"

pytestmark = pytest.mark.skipif(
    not cpu.moe_opt_has_passes("moe-lower-to-cpu-pipeline", "moe-generate-backward")[0],
    reason="moe-opt lacks the CPU pipeline",
)


def run_cli(*args):
    env = dict(os.environ, PYTHONPATH=str(PYTHON_DIR))
    return subprocess.run(
        [sys.executable, "-m", "moe_mlir", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_forward_from_npy_files(tmp_path):
    config = LayerConfig(tokens=9, hidden=16, ffn=8, experts=4, top_k=2, renormalize=True)
    module = tmp_path / "layer.mlir"
    module.write_text(layer_mlir(config, "layer"))
    rng = np.random.default_rng(3)
    shapes = {"x": (9, 16), "w_router": (16, 4), "w_gate_up": (4, 16, 16), "w_down": (4, 8, 16)}
    arrays = {k: rng.standard_normal(s).astype(np.float32) * 0.5 for k, s in shapes.items()}
    paths = []
    for name, array in arrays.items():
        np.save(tmp_path / f"{name}.npy", array)
        paths.append(tmp_path / f"{name}.npy")
    result = run_cli(
        "run", module, "--function", "layer", "--inputs", *paths, "--out", tmp_path / "out"
    )
    assert result.returncode == 0, result.stderr
    out = np.load(tmp_path / "out" / "layer_0.npy")
    logits = np.load(tmp_path / "out" / "layer_1.npy")
    expected_out, expected_logits, _ = ref.layer_forward(config, **arrays)
    assert np.linalg.norm(out - expected_out) <= 1e-4 * np.linalg.norm(expected_out)
    assert np.linalg.norm(logits - expected_logits) <= 1e-4 * np.linalg.norm(expected_logits)


def test_missing_inputs_after_pre_passes(tmp_path):
    config = LayerConfig(tokens=5, hidden=16, ffn=8, experts=4, top_k=1)
    module = tmp_path / "layer.mlir"
    module.write_text(layer_mlir(config, "layer"))
    result = run_cli(
        "run",
        module,
        "--function",
        "layer_forward",
        "--pre-passes=--moe-decompose,--moe-generate-backward",
        "--inputs",
        "--out",
        tmp_path / "out",
    )
    assert result.returncode == 2
    assert "error: @layer_forward takes 4 inputs, got 0" in result.stderr, result.stderr


def test_wrong_shape_is_a_clear_error(tmp_path):
    config = LayerConfig(tokens=9, hidden=16, ffn=8, experts=4, top_k=2)
    module = tmp_path / "layer.mlir"
    module.write_text(layer_mlir(config, "layer"))
    paths = []
    for name, shape in [
        ("x", (9, 15)),
        ("w_router", (16, 4)),
        ("w_gate_up", (4, 16, 16)),
        ("w_down", (4, 8, 16)),
    ]:
        np.save(tmp_path / f"{name}.npy", np.ones(shape, np.float32))
        paths.append(tmp_path / f"{name}.npy")
    result = run_cli("run", module, "--inputs", *paths, "--out", tmp_path / "out")
    assert result.returncode == 2
    assert result.stderr.startswith("error:")
    assert (
        "@layer input 0 (tensor<9x16xf32>) has shape (9, 15), expected (9, 16)" in result.stderr
    ), result.stderr


def test_out_of_range_index_inputs_are_refused(tmp_path):
    """A function whose token ids and offsets are inputs: a token id past T (or negative), or
    offsets past the end, used to read and write out of bounds and kill the process. The CLI
    now says which input holds what, and exits 2."""
    module = tmp_path / "experts.mlir"
    module.write_text(
        """
func.func @experts(%x: tensor<6x8xf32>, %ids: tensor<12xi32>, %offsets: tensor<5xi32>,
                   %wgu: tensor<4x8x16xf32>, %wd: tensor<4x8x8xf32>)
    -> (tensor<12x8xf32>, tensor<12x16xf32>) {
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<6x8xf32>, tensor<12xi32>, tensor<5xi32>, tensor<4x8x16xf32>, tensor<4x8x8xf32>
      -> tensor<12x8xf32>, tensor<12x16xf32>
  return %y, %h : tensor<12x8xf32>, tensor<12x16xf32>
}
"""
    )
    rng = np.random.default_rng(4)
    good = {
        "x": rng.standard_normal((6, 8)).astype(np.float32),
        "ids": np.array([0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5], np.int32),
        "offsets": np.array([0, 3, 6, 9, 12], np.int32),
        "wgu": rng.standard_normal((4, 8, 16)).astype(np.float32),
        "wd": rng.standard_normal((4, 8, 8)).astype(np.float32),
    }

    def run(**changes):
        paths = []
        for name, array in {**good, **changes}.items():
            np.save(tmp_path / f"{name}.npy", array)
            paths.append(tmp_path / f"{name}.npy")
        return run_cli("run", module, "--inputs", *paths, "--out", tmp_path / "out")

    assert run().returncode == 0
    bad_ids = good["ids"].copy()
    bad_ids[4] = 2**31 - 1
    result = run(ids=bad_ids)
    assert result.returncode == 2, result.stderr
    assert (
        "@experts input 1 (token_ids of 'moe.expert_ffn') holds token id 2147483647, "
        "outside [0, 6) tokens" in result.stderr
    ), result.stderr
    bad_ids[4] = -1
    assert "holds token id -1" in run(ids=bad_ids).stderr
    result = run(offsets=np.array([0, 3, 6, 9, 40], np.int32))
    assert result.returncode == 2
    assert "input 2 (offsets of 'moe.expert_ffn') ends at 40, past the 12 token ids" in (
        result.stderr
    ), result.stderr
    assert "must not decrease" in run(offsets=np.array([0, 6, 3, 9, 12], np.int32)).stderr
    assert "must start at 0" in run(offsets=np.array([2, 3, 6, 9, 12], np.int32)).stderr
