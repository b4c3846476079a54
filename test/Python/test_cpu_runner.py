"""The CPU runner (python/moe_mlir/cpu.py) on hand-written tensor functions lowered with
upstream mlir-opt in the calling convention of docs/cpu-path.md §3."""

import os

import numpy as np
import pytest

from moe_mlir import cpu
from moe_mlir.config import LayerConfig


def _tools_or_skip():
    try:
        return cpu.find_mlir_opt(), cpu.find_mlir_translate(), cpu.find_clang()
    except cpu.ToolError as exc:
        pytest.skip(f"LLVM 22 tools missing: {exc}")


@pytest.fixture(scope="module")
def mlir_opt():
    return _tools_or_skip()[0]


def compile_upstream(text, mlir_opt, **kw):
    return cpu.compile_mlir(text, cpu.UPSTREAM_CPU_PIPELINE, opt_tool=mlir_opt, **kw)


MATMUL = """
// A comment mentioning func.func @not_a_function(%a: tensor<1xf32>) is ignored.
func.func @matmul(%a: tensor<37x48xf32>, %b: tensor<48x5xf32>) -> tensor<37x5xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<37x5xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<37x5xf32>) -> tensor<37x5xf32>
  %m = linalg.matmul ins(%a, %b : tensor<37x48xf32>, tensor<48x5xf32>)
                     outs(%f : tensor<37x5xf32>) -> tensor<37x5xf32>
  return %m : tensor<37x5xf32>
}
"""

MIXED = """
func.func @mixed(%a: tensor<4x8xf32>, %b: tensor<8x3xf32>, %c: tensor<4xi32>)
    -> (tensor<4x3xf32>, tensor<f32>, tensor<4xi32>) {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4x3xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<4x3xf32>) -> tensor<4x3xf32>
  %m = linalg.matmul ins(%a, %b : tensor<4x8xf32>, tensor<8x3xf32>)
                     outs(%f : tensor<4x3xf32>) -> tensor<4x3xf32>
  %e0 = tensor.empty() : tensor<f32>
  %s0 = linalg.fill ins(%z : f32) outs(%e0 : tensor<f32>) -> tensor<f32>
  %s = linalg.reduce ins(%a : tensor<4x8xf32>) outs(%s0 : tensor<f32>) dimensions = [0, 1]
    (%in: f32, %acc: f32) {
      %r = arith.addf %in, %acc : f32
      linalg.yield %r : f32
    }
  %c2 = arith.muli %c, %c : tensor<4xi32>
  %c3 = arith.addi %c2, %c : tensor<4xi32>
  return %m, %s, %c3 : tensor<4x3xf32>, tensor<f32>, tensor<4xi32>
}

func.func @scalar_in(%a: tensor<f32>, %b: tensor<3xf32>) -> tensor<3xf32> {
  %e = tensor.empty() : tensor<3xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i) -> ()>, affine_map<(i) -> (i)>,
                                        affine_map<(i) -> (i)>],
                       iterator_types = ["parallel"]}
      ins(%a, %b : tensor<f32>, tensor<3xf32>) outs(%e : tensor<3xf32>) {
    ^bb0(%x: f32, %y: f32, %o: f32):
      %p = arith.mulf %x, %y : f32
      linalg.yield %p : f32
  } -> tensor<3xf32>
  return %r : tensor<3xf32>
}

func.func @dyn(%a: tensor<?x4xf32>, %h: tensor<4xf16>) -> (tensor<4xf32>, tensor<4xf16>) {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<4xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<4xf32>) -> tensor<4xf32>
  %s = linalg.reduce ins(%a : tensor<?x4xf32>) outs(%f : tensor<4xf32>) dimensions = [0]
    (%in: f32, %acc: f32) {
      %r = arith.addf %in, %acc : f32
      linalg.yield %r : f32
    }
  %h2 = arith.addf %h, %h : tensor<4xf16>
  return %s, %h2 : tensor<4xf32>, tensor<4xf16>
}

// Argument attributes (moe-generate-backward puts moe.saved on @f_backward's) reach the C
// interface's arguments.
func.func @with_attrs(%a: tensor<4xf32> {moe.saved = "a"}, %b: tensor<4xf32>)
    -> tensor<4xf32> attributes {moe.gradient_args = array<i64: 0>} {
  %c = arith.mulf %a, %b : tensor<4xf32>
  return %c : tensor<4xf32>
}

func.func private @helper(%a: tensor<4xf32>) -> tensor<4xf32> {
  return %a : tensor<4xf32>
}
"""


@pytest.fixture(scope="module")
def mixed(mlir_opt):
    return compile_upstream(MIXED, mlir_opt)


def test_matmul_matches_numpy(mlir_opt):
    f = cpu.compile_function(MATMUL, passes=cpu.UPSTREAM_CPU_PIPELINE, opt_tool=mlir_opt)
    assert f.name == "matmul"
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 48)).astype(np.float32)
    b = rng.standard_normal((48, 5)).astype(np.float32)
    (m,) = f(a, b)
    assert m.dtype == np.float32 and m.shape == (37, 5)
    np.testing.assert_allclose(m, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    (m2,) = f(a, b)
    assert m.tobytes() == m2.tobytes()  # deterministic


def test_multiple_results_rank0_and_i32(mixed):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 8)).astype(np.float32)
    b = rng.standard_normal((8, 3)).astype(np.float32)
    c = np.array([3, -2, 0, 7], np.int32)
    c_before = c.copy()
    m, s, c3 = mixed["mixed"](a, b, c)
    np.testing.assert_allclose(m, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    assert s.shape == () and s.dtype == np.float32
    np.testing.assert_allclose(s, a.astype(np.float64).sum(), rtol=1e-5)
    assert c3.dtype == np.int32
    np.testing.assert_array_equal(c3, c * c + c)
    # the function updates %c in place; the runner passed a copy
    np.testing.assert_array_equal(c, c_before)


def test_rank0_input(mixed):
    (r,) = mixed["scalar_in"](np.array(2.5, np.float32), np.array([1, 2, 3], np.float32))
    np.testing.assert_array_equal(r, [2.5, 5.0, 7.5])
    (r,) = mixed["scalar_in"](np.float32(-1), np.array([1, 2, 3], np.float32))
    np.testing.assert_array_equal(r, [-1, -2, -3])


def test_dynamic_input_dimension_and_f16(mixed):
    h = np.array([0.5, 1, 2, -3], np.float16)
    for rows in (0, 1, 9):
        a = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
        s, h2 = mixed["dyn"](a, h)
        np.testing.assert_allclose(s, a.sum(0))
        assert h2.dtype == np.float16
        np.testing.assert_array_equal(h2, h + h)


def test_argument_attributes(mixed):
    assert 'moe.saved = "a"' in mixed.lowered_ir
    assert mixed.signatures["with_attrs"].attr_int_array("moe.gradient_args") == [0]
    a = np.array([1, 2, 3, 4], np.float32)
    (c,) = mixed["with_attrs"](a, a)
    np.testing.assert_array_equal(c, a * a)


def test_input_validation(mixed):
    f = mixed["mixed"]
    a = np.zeros((4, 8), np.float32)
    b = np.zeros((8, 3), np.float32)
    c = np.zeros(4, np.int32)
    with pytest.raises(ValueError, match="takes 3 inputs, got 2"):
        f(a, b)
    with pytest.raises(ValueError, match="takes 3 inputs, got 4"):
        f(a, b, c, c)
    with pytest.raises(ValueError, match=r"input 1 .* has shape \(3, 8\), expected \(8, 3\)"):
        f(a, b.T.copy(), c)
    with pytest.raises(ValueError, match="input 0 .* has dtype float64, expected float32"):
        f(a.astype(np.float64), b, c)
    with pytest.raises(ValueError, match="input 2 .* has dtype int64, expected int32"):
        f(a, b, c.astype(np.int64))
    with pytest.raises(ValueError, match="shape"):
        f(a[None], b, c)
    with pytest.raises(ValueError, match="dtype"):
        f([[0.0] * 8] * 4, b, c)  # a list becomes float64
    with pytest.raises(ValueError, match="shape"):
        mixed["dyn"](np.zeros((3, 5), np.float32), np.zeros(4, np.float16))
    with pytest.raises(KeyError, match="no public function @helper"):
        mixed["helper"]
    with pytest.raises(KeyError, match="no public function @nope"):
        mixed["nope"]


def test_non_contiguous_inputs(mixed):
    big = np.arange(64, dtype=np.float32).reshape(8, 8)
    a = big[::2]  # strided view
    b = np.asfortranarray(np.arange(24, dtype=np.float32).reshape(8, 3))
    m, s, _ = mixed["mixed"](a, b, np.zeros(4, np.int32))
    np.testing.assert_allclose(m, a @ b)
    np.testing.assert_allclose(s, a.sum())


def test_low_level_call(mixed):
    mod = mixed.cpu
    assert "mixed" in mod.functions and "dyn" in mod.functions
    a = np.ones((4, 8), np.float32)
    b = np.ones((8, 3), np.float32)
    c = np.arange(4, dtype=np.int32)
    m, s, c3 = mod.call(
        "mixed", [a, b, c], [((4, 3), np.float32), ((), np.float32), ((4,), np.int32)]
    )
    np.testing.assert_array_equal(m, np.full((4, 3), 8.0))
    assert float(s) == 32.0
    with pytest.raises(ValueError, match="takes 6 memref arguments"):
        mod.call("mixed", [a, b], [((4, 3), np.float32), ((), np.float32), ((4,), np.int32)])
    with pytest.raises(ValueError, match="rank"):
        mod.call("mixed", [a, b, c], [((4, 3), np.float32), ((1,), np.float32), ((4,), np.int32)])
    with pytest.raises(ValueError, match="no function _mlir_ciface_nope"):
        mod.call("nope", [], [])
    with pytest.raises(ValueError, match="numpy array"):
        mod.call("mixed", [a, b, [0, 1, 2, 3]], [])


def test_results_not_turned_into_out_params_are_refused(mlir_opt):
    """Lowered without buffer-results-to-out-params, the C interface returns its results
    through a struct pointer; calling it with descriptors would read out of bounds."""
    pipeline = cpu.UPSTREAM_CPU_PIPELINE[0].replace(
        "buffer-results-to-out-params{modify-public-functions},", ""
    )
    mod = cpu.compile_mlir(MATMUL, [pipeline], opt_tool=mlir_opt)
    a = np.zeros((37, 48), np.float32)
    b = np.zeros((48, 5), np.float32)
    with pytest.raises(ValueError, match="calling convention"):
        mod["matmul"](a, b)


def test_signature_parser():
    text = """
    // func.func @commented(%a: tensor<1xf32>)
    module {
      func.func @f_backward(%arg0: tensor<37x48xf32> {foo.bar = 1 : i64}, %arg1: tensor<?x5xf32>,
                            %arg2: tensor<f32>)
          -> (tensor<37x48xf32>, tensor<48x5xf32> {x.y}) attributes {moe.gradient_args =
          array<i64: 0, 1, 3>, sym_visibility = "public", other = "a, b = c"} {
        return
      }
      func.func @f_forward(%arg0: tensor<2xi32>) -> tensor<2x2xbf16>
          attributes {moe.num_saved = 3 : i64} {
        return
      }
      func.func private @decl(tensor<?xf32>, index) -> (tensor<?xf32>, i32)
      func.func @none() {
        return
      }
    }
    """
    sigs = cpu.parse_functions(text)
    assert set(sigs) == {"f_backward", "f_forward", "decl", "none"}
    b = sigs["f_backward"]
    assert [t.shape for t in b.inputs] == [(37, 48), (None, 5), ()]
    assert [t.element for t in b.inputs] == ["f32", "f32", "f32"]
    assert [t.text for t in b.results] == ["tensor<37x48xf32>", "tensor<48x5xf32>"]
    assert b.attr_int_array("moe.gradient_args") == [0, 1, 3]
    assert b.attr("other") == '"a, b = c"'
    assert b.attr_int_array("missing") is None
    fwd = sigs["f_forward"]
    assert fwd.attr_int("moe.num_saved") == 3
    assert fwd.results[0].element == "bf16"
    with pytest.raises(cpu.UnsupportedTypeError, match="bf16"):
        _ = fwd.results[0].dtype
    d = sigs["decl"]
    assert d.visibility == "private" and d.is_declaration
    assert d.inputs[1].element is None and not d.inputs[1].is_tensor
    assert sigs["none"].inputs == [] and sigs["none"].results == []


def test_bf16_and_scalars_are_rejected_before_compiling():
    bf16 = """func.func @g(%a: tensor<4xbf16>) -> tensor<4xbf16> {
      return %a : tensor<4xbf16>
    }"""
    with pytest.raises(cpu.UnsupportedTypeError, match="bf16"):
        cpu.compile_function(bf16, opt_tool="/nonexistent/tool")
    scalar = """func.func @g(%a: f32) -> tensor<2xf32> {
      %e = tensor.empty() : tensor<2xf32>
      return %e : tensor<2xf32>
    }"""
    with pytest.raises(ValueError, match="only ranked tensors"):
        cpu.compile_function(scalar, opt_tool="/nonexistent/tool")


def test_tool_failures_carry_diagnostics(mlir_opt):
    bad = "func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n  return %b : tensor<4xf32>\n}\n"
    with pytest.raises(cpu.MoeOptError) as info:
        compile_upstream(bad, mlir_opt)
    assert "use of undeclared SSA value" in info.value.diagnostics
    assert "<stdin>:2" in str(info.value)
    with pytest.raises(cpu.CompileError, match="mlir-translate"):
        cpu.CpuModule("module { this is not llvm }")


def test_moe_opt_diagnostics():
    try:
        tool = cpu.find_moe_opt()
    except cpu.ToolError as exc:
        pytest.skip(str(exc))
    bad = """func.func @f(%x: tensor<4x8xf32>, %wr: tensor<8x2xf32>, %wgu: tensor<2x8x6xf32>,
                        %wd: tensor<2x3x8xf32>) -> tensor<4x8xf32> {
      %out, %logits = moe.layer %x, %wr, %wgu, %wd
          {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 3>}
          : tensor<4x8xf32>, tensor<8x2xf32>, tensor<2x8x6xf32>, tensor<2x3x8xf32>
            -> tensor<4x8xf32>, tensor<4x2xf32>
      return %out : tensor<4x8xf32>
    }"""
    with pytest.raises(cpu.MoeOptError, match=r"top_k \(3\) exceeds the number of experts \(2\)"):
        cpu.run_opt(bad, ["--moe-decompose"], tool)


def test_tool_env_vars(monkeypatch):
    monkeypatch.setenv("MOE_OPT", "/nonexistent/moe-opt")
    assert cpu.find_moe_opt() == "/nonexistent/moe-opt"
    with pytest.raises(cpu.MoeOptError, match="cannot run"):
        cpu.run_opt("module {}", ["--moe-decompose"])
    ok, missing = cpu.moe_opt_has_passes("moe-decompose")
    assert not ok and missing == ["moe-decompose"]
    monkeypatch.setenv("CLANG", "/nonexistent/clang")
    assert cpu.find_clang() == "/nonexistent/clang"
    monkeypatch.setenv("MLIR_TRANSLATE", "/nonexistent/mlir-translate")
    with pytest.raises(cpu.CompileError, match="cannot run"):
        cpu.CpuModule("module {}")
    monkeypatch.delenv("MOE_OPT")
    try:
        default = cpu.find_moe_opt()
    except cpu.ToolError:
        return
    assert os.path.basename(default) == "moe-opt"


def test_moe_opt_help_query():
    try:
        cpu.find_moe_opt()
    except cpu.ToolError as exc:
        pytest.skip(str(exc))
    ok, missing = cpu.moe_opt_has_passes("moe-decompose", "moe-training-pipeline")
    assert ok and missing == []
    ok, missing = cpu.moe_opt_has_passes("moe-decompose", "moe-no-such-pass")
    assert not ok and missing == ["moe-no-such-pass"]


# ----------------------------------------------------------- the layer contract, mocked

MOCK_CONFIG = LayerConfig(tokens=3, hidden=4, ffn=2, experts=2, top_k=1)

MOCK_LAYER = """
func.func @mock(%x: tensor<3x4xf32>, %wr: tensor<4x2xf32>, %wgu: tensor<2x4x4xf32>,
                %wd: tensor<2x2x4xf32>) -> (tensor<3x4xf32>, tensor<3x2xf32>) {
  %out, %logits, %s0, %s1 = call @mock_forward(%x, %wr, %wgu, %wd)
      : (tensor<3x4xf32>, tensor<4x2xf32>, tensor<2x4x4xf32>, tensor<2x2x4xf32>)
      -> (tensor<3x4xf32>, tensor<3x2xf32>, tensor<3x4xf32>, tensor<4x2xf32>)
  return %out, %logits : tensor<3x4xf32>, tensor<3x2xf32>
}
// out = 2x, logits = x wr; saves x and wr.
func.func @mock_forward(%x: tensor<3x4xf32>, %wr: tensor<4x2xf32>, %wgu: tensor<2x4x4xf32>,
                        %wd: tensor<2x2x4xf32>)
    -> (tensor<3x4xf32>, tensor<3x2xf32>, tensor<3x4xf32>, tensor<4x2xf32>)
    attributes {moe.num_saved = NUM_SAVED : i64} {
  %z = arith.constant 0.0 : f32
  %out = arith.addf %x, %x : tensor<3x4xf32>
  %e = tensor.empty() : tensor<3x2xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<3x2xf32>) -> tensor<3x2xf32>
  %l = linalg.matmul ins(%x, %wr : tensor<3x4xf32>, tensor<4x2xf32>)
                     outs(%f : tensor<3x2xf32>) -> tensor<3x2xf32>
  return %out, %l, %x, %wr : tensor<3x4xf32>, tensor<3x2xf32>, tensor<3x4xf32>, tensor<4x2xf32>
}
// dx = 2 dout + dl wr^T, dwr = x^T dl.
func.func @mock_backward(%x: tensor<3x4xf32>, %wr: tensor<4x2xf32>, %dout: tensor<3x4xf32>,
                         %dl: tensor<3x2xf32>) -> (tensor<3x4xf32>, tensor<4x2xf32>)
    attributes {moe.gradient_args = array<i64: 0, 1>} {
  %z = arith.constant 0.0 : f32
  %et = tensor.empty() : tensor<2x4xf32>
  %wrt = linalg.transpose ins(%wr : tensor<4x2xf32>) outs(%et : tensor<2x4xf32>)
      permutation = [1, 0]
  %e1 = tensor.empty() : tensor<3x4xf32>
  %f1 = linalg.fill ins(%z : f32) outs(%e1 : tensor<3x4xf32>) -> tensor<3x4xf32>
  %m1 = linalg.matmul ins(%dl, %wrt : tensor<3x2xf32>, tensor<2x4xf32>)
                      outs(%f1 : tensor<3x4xf32>) -> tensor<3x4xf32>
  %d2 = arith.addf %dout, %dout : tensor<3x4xf32>
  %dx = arith.addf %d2, %m1 : tensor<3x4xf32>
  %ex = tensor.empty() : tensor<4x3xf32>
  %xt = linalg.transpose ins(%x : tensor<3x4xf32>) outs(%ex : tensor<4x3xf32>)
      permutation = [1, 0]
  %e2 = tensor.empty() : tensor<4x2xf32>
  %f2 = linalg.fill ins(%z : f32) outs(%e2 : tensor<4x2xf32>) -> tensor<4x2xf32>
  %dwr = linalg.matmul ins(%xt, %dl : tensor<4x3xf32>, tensor<3x2xf32>)
                       outs(%f2 : tensor<4x2xf32>) -> tensor<4x2xf32>
  return %dx, %dwr : tensor<3x4xf32>, tensor<4x2xf32>
}
"""


def test_compiled_layer_plumbing_on_a_mock(mlir_opt):
    layer = cpu.CompiledLayer(
        MOCK_CONFIG,
        "mock",
        source=MOCK_LAYER.replace("NUM_SAVED", "2"),
        pre_passes=(),
        passes=cpu.UPSTREAM_CPU_PIPELINE,
        opt_tool=mlir_opt,
    )
    assert layer.gradient_names == ["x", "w_router"] and layer.num_saved == 2
    rng = np.random.default_rng(0)
    args = {
        name: rng.standard_normal(shape).astype(np.float32)
        for name, shape, _ in MOCK_CONFIG.arg_specs()
    }
    out, logits = layer(args)
    np.testing.assert_allclose(out, 2 * args["x"])
    out2, logits2, saved = layer.forward(*[args[n] for n in MOCK_CONFIG.arg_names()])
    assert len(saved) == 2 and out2.tobytes() == out.tobytes()
    np.testing.assert_allclose(logits2, args["x"] @ args["w_router"], rtol=1e-5)
    d_out = rng.standard_normal((3, 4)).astype(np.float32)
    d_logits = rng.standard_normal((3, 2)).astype(np.float32)
    grads = layer.backward(saved, d_out, d_logits)
    np.testing.assert_allclose(
        grads["x"], 2 * d_out + d_logits @ args["w_router"].T, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(grads["w_router"], args["x"].T @ d_logits, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="missing layer arguments"):
        layer({"x": args["x"]})
    with pytest.raises(ValueError, match="shape"):
        layer.backward(saved, d_out.T.copy(), d_logits)


def test_compiled_layer_contract_violation(mlir_opt):
    with pytest.raises(ValueError, match="moe.num_saved = 1"):
        cpu.CompiledLayer(
            MOCK_CONFIG,
            "mock",
            source=MOCK_LAYER.replace("NUM_SAVED", "1"),
            pre_passes=(),
            passes=cpu.UPSTREAM_CPU_PIPELINE,
            opt_tool=mlir_opt,
        )


def test_dynamic_results_take_their_shapes_from_the_caller():
    dyn = """func.func @g(%a: tensor<?xf32>) -> tensor<?xf32> {
      %b = arith.addf %a, %a : tensor<?xf32>
      return %b : tensor<?xf32>
    }"""
    g = cpu.compile_function(dyn)
    a = np.arange(5, dtype=np.float32)
    (b,) = g(a, result_shapes=[(5,)])
    assert np.array_equal(b, 2 * a)
    with pytest.raises(ValueError, match="dynamic shape: pass result_shapes"):
        g(a)
