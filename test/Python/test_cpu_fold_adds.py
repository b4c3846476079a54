"""moe-fold-adds on the CPU path: a layer's adds folded into the ops that make one of their
parts (`accumulate`) compute what the adds computed, on random data. The CPU path lowers an op
with `accumulate` as the op followed by the add (docs/dialect.md, moe-fold-adds), so the
results are equal bit for bit."""

import numpy as np
import pytest

from moe_mlir import cpu

T, D, N, E, K, M = 37, 48, 40, 5, 2, 32

ROUTING = "#moe.routing<scoring = softmax, top_k = 2, renormalize = true>"
ACT = "{activation = #moe.activation<swiglu>}"

# DeepSeek's shape of adds: out = combine + the shared expert's y (the combine accumulates),
# dx = (the shared expert's + the experts') + the router's (the experts' gradient and the
# router's accumulate).
LAYER = f"""
func.func @layer(%x: tensor<{T}x{D}xf32>, %wr: tensor<{D}x{E}xf32>,
                 %wgu: tensor<{E}x{D}x{2 * N}xf32>, %wd: tensor<{E}x{N}x{D}xf32>,
                 %sgu: tensor<{D}x{2 * M}xf32>, %sd: tensor<{M}x{D}xf32>,
                 %dout: tensor<{T}x{D}xf32>)
    -> (tensor<{T}x{D}xf32>, tensor<{T}x{D}xf32>, tensor<{D}x{E}xf32>) {{
  %w, %e, %l = moe.router %x, %wr {{routing = {ROUTING}}}
      : tensor<{T}x{D}xf32>, tensor<{D}x{E}xf32>
      -> tensor<{T}x{K}xf32>, tensor<{T}x{K}xi32>, tensor<{T}x{E}xf32>
  %ids, %off, %rows = moe.dispatch %e {{num_experts = {E} : i64}}
      : tensor<{T}x{K}xi32> -> tensor<{T * K}xi32>, tensor<{E + 1}xi32>, tensor<{T}x{K}xi32>
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {ACT}
      : tensor<{T}x{D}xf32>, tensor<{T * K}xi32>, tensor<{E + 1}xi32>,
        tensor<{E}x{D}x{2 * N}xf32>, tensor<{E}x{N}x{D}xf32>
      -> tensor<{T * K}x{D}xf32>, tensor<{T * K}x{2 * N}xf32>
  %out = moe.combine %y, %w, %rows
      : tensor<{T * K}x{D}xf32>, tensor<{T}x{K}xf32>, tensor<{T}x{K}xi32> -> tensor<{T}x{D}xf32>
  %ys, %hs = moe.shared_expert %x, %sgu, %sd {ACT}
      : tensor<{T}x{D}xf32>, tensor<{D}x{2 * M}xf32>, tensor<{M}x{D}xf32>
      -> tensor<{T}x{D}xf32>, tensor<{T}x{2 * M}xf32>
  %sum = arith.addf %out, %ys : tensor<{T}x{D}xf32>
  %dxs, %dsgu, %dsd = moe.shared_expert_grad %x, %sgu, %sd, %hs, %dout {ACT}
      : tensor<{T}x{D}xf32>, tensor<{D}x{2 * M}xf32>, tensor<{M}x{D}xf32>,
        tensor<{T}x{2 * M}xf32>, tensor<{T}x{D}xf32>
      -> tensor<{T}x{D}xf32>, tensor<{D}x{2 * M}xf32>, tensor<{M}x{D}xf32>
  %dxe, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd,
      %h, %dout {ACT}
      : tensor<{T}x{D}xf32>, tensor<{T * K}xi32>, tensor<{E + 1}xi32>, tensor<{T}x{K}xi32>,
        tensor<{T}x{K}xf32>, tensor<{E}x{D}x{2 * N}xf32>, tensor<{E}x{N}x{D}xf32>,
        tensor<{T * K}x{2 * N}xf32>, tensor<{T}x{D}xf32>
      -> tensor<{T}x{D}xf32>, tensor<{T}x{K}xf32>, tensor<{E}x{D}x{2 * N}xf32>,
         tensor<{E}x{N}x{D}xf32>
  %partial = arith.addf %dxs, %dxe : tensor<{T}x{D}xf32>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {{routing = {ROUTING}}}
      : tensor<{T}x{D}xf32>, tensor<{D}x{E}xf32>, tensor<{T}x{E}xf32>, tensor<{T}x{K}xi32>,
        tensor<{T}x{K}xf32> -> tensor<{T}x{D}xf32>, tensor<{D}x{E}xf32>
  %dx = arith.addf %partial, %dxr : tensor<{T}x{D}xf32>
  return %sum, %dx, %dwr : tensor<{T}x{D}xf32>, tensor<{T}x{D}xf32>, tensor<{D}x{E}xf32>
}}
"""


def _moe_opt_or_skip():
    try:
        cpu.find_moe_opt()
    except cpu.ToolError as exc:
        pytest.skip(f"moe-opt missing: {exc}")
    present, missing = cpu.moe_opt_has_passes("moe-fold-adds")
    if not present:
        pytest.skip(f"moe-opt lacks {', '.join(missing)}")


def test_folded_adds_compute_the_adds():
    _moe_opt_or_skip()
    folded_ir = cpu.run_opt(LAYER, ["--moe-fold-adds"])
    # Every add folds: the combine, the experts' and the router's gradients accumulate.
    assert "arith.addf" not in folded_ir
    assert folded_ir.count("accumulate(") == 3
    plain = cpu.compile_mlir(LAYER)["layer"]
    folded = cpu.compile_mlir(folded_ir)["layer"]
    for seed in range(3):
        rng = np.random.default_rng(seed)
        args = [
            rng.standard_normal(shape).astype(np.float32)
            for shape in (
                (T, D),
                (D, E),
                (E, D, 2 * N),
                (E, N, D),
                (D, 2 * M),
                (M, D),
                (T, D),
            )
        ]
        expected = plain(*args)
        got = folded(*args)
        for name, a, b in zip(("out", "dx", "d_router_weight"), expected, got):
            assert np.isfinite(a).all(), name
            np.testing.assert_array_equal(b, a, err_msg=name)
