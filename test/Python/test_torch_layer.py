"""moe_mlir.layer (MoELayer, the torch.library custom ops) and moe_mlir.compile_cache on the CPU
path, plus what of the CUDA path runs without a GPU (config checks, sm_90a cache entries, the
fake implementations under FakeTensorMode). CI installs torch (scripts/install-deps.sh): there a
missing torch fails instead of skipping."""

import dataclasses
import os
import shutil

import numpy as np
import pytest

try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    if os.environ.get("CI"):
        raise
    pytest.skip("needs torch (scripts/install-deps.sh installs it)", allow_module_level=True)

from moe_mlir import LayerConfig  # noqa: E402
from moe_mlir import compile_cache as cc  # noqa: E402
from moe_mlir import layer as L  # noqa: E402
from moe_mlir import torch_reference as TR  # noqa: E402
from moe_mlir.layer import MoELayer  # noqa: E402


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.getbasetemp() / "moe_mlir_cache"
    monkeypatch.setenv("MOE_MLIR_CACHE", str(root))
    monkeypatch.delenv("MOE_MLIR_PREBUILT", raising=False)
    monkeypatch.setenv("MOE_MLIR_QUIET", "1")
    return root


def rel(a, b):
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


CONFIGS = {
    "softmax": LayerConfig(0, 32, 24, 4, 2, renormalize=True),
    "deepseek": LayerConfig(
        0,
        32,
        16,
        8,
        2,
        scoring="sigmoid",
        renormalize=True,
        router_bias=True,
        num_groups=4,
        topk_groups=2,
        scaling_factor=2.5,
        shared_ffn=16,
    ),
    "gelu-capacity": LayerConfig(0, 24, 16, 4, 1, activation="gelu", capacity_factor=4.0),
}


def reference_grads(cfg, layer, x, d_out):
    inputs = {"x": x.detach().float()}
    inputs.update({n: p.detach().float() for n, p in layer.named_parameters()})
    if cfg.router_bias:
        inputs["router_bias"] = layer.router_bias.float()
    tcfg = dataclasses.replace(cfg, tokens=x.shape[0])
    ref, grads = TR.forward_backward(tcfg, inputs, d_out.float())
    return ref, grads


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_forward_backward_match_the_torch_reference(name):
    cfg = CONFIGS[name]
    torch.manual_seed(0)
    layer = MoELayer(cfg, init_std=0.2)
    if cfg.router_bias:
        layer.router_bias.normal_(0, 0.1)
    x = torch.randn(3, 7, cfg.hidden, requires_grad=True)
    out, logits = layer(x, return_router_logits=True)
    assert out.shape == x.shape and logits.shape == (21, cfg.experts)
    d_out = torch.randn_like(out)
    out.backward(d_out)
    ref, grads = reference_grads(
        cfg, layer, x.reshape(-1, cfg.hidden), d_out.reshape(-1, cfg.hidden)
    )
    assert rel(out.reshape(-1, cfg.hidden), ref.out) < 1e-5
    assert rel(logits, ref.logits) < 1e-5
    assert rel(x.grad.reshape(-1, cfg.hidden), grads["x"]) < 1e-5
    for n, p in layer.named_parameters():
        assert rel(p.grad, grads[n]) < 1e-5, n
    assert "router_bias" not in dict(layer.named_parameters())


def test_bf16_on_the_cpu_is_computed_in_f32():
    cfg = CONFIGS["softmax"]
    torch.manual_seed(1)
    layer = MoELayer(cfg, init_std=0.2).bfloat16()
    x = torch.randn(10, cfg.hidden).bfloat16().requires_grad_(True)
    out = layer(x)
    assert out.dtype == torch.bfloat16
    out.float().square().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and layer.w_down.grad.dtype == torch.bfloat16
    ref32 = MoELayer(cfg)
    ref32.load_state_dict({k: v.float() for k, v in layer.state_dict().items()})
    assert rel(out.float(), ref32(x.detach().float())) < 1e-2


def test_autocast_on_the_cpu_gives_f32_gradients_to_f32_parameters():
    """Mixed precision (f32 parameters under torch.autocast): the layer casts to its compute
    type with autograd casts; y keeps x's dtype and the f32 parameters get f32 gradients equal
    to those of the same layer without autocast (the CPU path computes in f32 either way)."""
    cfg = CONFIGS["deepseek"]
    torch.manual_seed(4)
    layer = MoELayer(cfg, init_std=0.2)
    layer.router_bias.normal_(0, 0.1)
    x = torch.randn(9, cfg.hidden)
    d_out = torch.randn(9, cfg.hidden)
    plain = layer(x)
    plain.backward(d_out)
    want = {n: p.grad.clone() for n, p in layer.named_parameters()}
    layer.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.float32 and torch.equal(out, plain)
    out.backward(d_out)
    for n, p in layer.named_parameters():
        assert p.grad.dtype == torch.float32 and torch.equal(p.grad, want[n]), n
    # A bf16 activation (what autocast's own ops return) with the f32 parameters.
    xb = x.bfloat16().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outb = layer(xb)
    assert outb.dtype == torch.bfloat16
    outb.float().sum().backward()
    assert xb.grad.dtype == torch.bfloat16
    assert rel(outb.float(), layer(xb.detach().float())) < 1e-2
    # Outside autocast the dtypes must still agree.
    with pytest.raises(TypeError, match="share a dtype"):
        layer(xb)


def test_cuda_autocast_casts_to_bf16_and_refuses_f16(monkeypatch):
    """The CUDA side of autocast without a GPU: FakeTensorMode, with torch told that CUDA
    autocast is on (it is disabled on a machine without CUDA)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cfg = LayerConfig(0, 64, 64, 4, 2, renormalize=True)
    seen = []

    def layer_forward(spec, x, *weights):
        seen.append([t.dtype for t in (x, *weights) if t is not None])
        return [x.new_empty(x.shape), x.new_empty((x.shape[0], cfg.experts), dtype=torch.float32)]

    monkeypatch.setattr(L, "layer_forward", layer_forward)
    real = L._autocast_dtype
    monkeypatch.setattr(L, "_autocast_dtype", lambda device: torch.bfloat16)
    with FakeTensorMode():
        layer = MoELayer(cfg, device="cuda", dtype=torch.float32)
        x = torch.empty(2, 8, 64, device="cuda")
        out, logits = layer(x, return_router_logits=True)
        assert out.shape == x.shape and out.dtype == torch.float32
        assert logits.dtype == torch.float32
    assert seen == [[torch.bfloat16] * 4]
    # What decides it (torch's own state patched, no autocast region entered: entering one
    # with the patch in place would leave CUDA autocast switched on).
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda kind=None: kind == "cuda")
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda kind: torch.bfloat16)
    assert real(torch.device("cuda")) == torch.bfloat16
    assert real(torch.device("cpu")) is None
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda kind: torch.float16)
    with pytest.raises(TypeError, match="bfloat16 only"):
        real(torch.device("cuda"))


def test_torch_compile_fullgraph_matches_eager():
    cfg = CONFIGS["deepseek"]
    torch.manual_seed(2)
    layer = MoELayer(cfg, init_std=0.2)
    x = torch.randn(12, cfg.hidden)
    xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    eager = layer(xe)
    eager.square().sum().backward()
    g_eager = {n: p.grad.clone() for n, p in layer.named_parameters()}
    layer.zero_grad(set_to_none=True)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    out = compiled(xc)
    out.square().sum().backward()
    assert torch.equal(out, eager)
    assert torch.equal(xc.grad, xe.grad)
    for n, p in layer.named_parameters():
        assert torch.equal(p.grad, g_eager[n]), n


def test_opcheck():
    cfg = CONFIGS["softmax"]
    layer = MoELayer(cfg, init_std=0.2)
    w = layer.layer_weights()
    args = (
        layer.spec_key,
        torch.randn(5, cfg.hidden),
        w["w_router"].detach(),
        None,
        w["w_gate_up"].detach(),
        w["w_down"].detach(),
        None,
        None,
        None,
        None,
    )
    torch.library.opcheck(
        torch.ops.moe_mlir.layer_forward.default,
        args,
        test_utils=("test_schema", "test_faketensor"),
    )


def test_bad_input_raises_before_any_kernel(monkeypatch):
    cfg = CONFIGS["softmax"]
    layer = MoELayer(cfg)
    calls = []
    monkeypatch.setattr(L, "kernel_for", lambda *a, **k: calls.append(a))
    with pytest.raises(ValueError, match=r"expected \[\.\.\., 32\]"):
        layer(torch.randn(4, 31))
    with pytest.raises(TypeError, match="float32"):
        layer(torch.randn(4, 32, dtype=torch.float64))
    with pytest.raises(TypeError, match="share a dtype"):
        layer(torch.randn(4, 32).bfloat16())
    with pytest.raises(ValueError, match="no tokens"):
        layer(torch.randn(0, 32))
    with pytest.raises(TypeError, match="torch.Tensor"):
        layer([1.0] * 32)
    assert calls == []


def test_build_options_are_single_values():
    """policy and memory_budget go into a pass option string: a value that carries another
    option along (a report file, a second budget) is refused, not passed on."""
    for bad in ("1GiB policy=keep", "1GiB memory-report=/tmp/x", "2 GiB", "GiB", "-1B", ""):
        with pytest.raises(ValueError, match="memory_budget"):
            cc.BuildOptions(memory_budget=bad)
        with pytest.raises(ValueError, match="memory_budget"):
            MoELayer(CONFIGS["softmax"], memory_budget=bad)
    for bad in ("keep memory-report=/tmp/x", "frugal", "auto "):
        with pytest.raises(ValueError, match="policy"):
            cc.BuildOptions(policy=bad)
    for good in ("2GiB", "512MiB", "1000000", "1.5KiB", "3B"):
        assert cc.BuildOptions(memory_budget=good).memory_budget == good


def test_build_options_gpu_kernels():
    """num_sms and kernel_configs go to moe-compile and into the key only when set: the
    layers compiled without them keep their keys."""
    assert cc.BuildOptions().as_dict() == {"memory_budget": None, "policy": "auto"}
    opts = cc.BuildOptions(num_sms=114, kernel_configs=["expert_ffn.down:stages=2"])
    assert opts.kernel_configs == ("expert_ffn.down:stages=2",)
    assert opts.as_dict()["num_sms"] == 114
    assert opts.as_dict()["kernel_configs"] == ["expert_ffn.down:stages=2"]
    for bad in (-1, 2000, True, "132"):
        with pytest.raises(ValueError, match="num_sms"):
            cc.BuildOptions(num_sms=bad)
    for bad in ("down:stages=2", ["down"], ["down:stages=2 --policy=keep"], [3]):
        with pytest.raises(ValueError, match="kernel_configs"):
            cc.BuildOptions(kernel_configs=bad)
    layer = MoELayer(CONFIGS["softmax"], num_sms=114, kernel_configs=["dact:dact_unroll=8"])
    assert (layer.options.num_sms, layer.options.kernel_configs) == (114, ("dact:dact_unroll=8",))
    base = cc.config_key(CONFIGS["softmax"], "sm_90a", cc.BuildOptions())
    assert cc.config_key(CONFIGS["softmax"], "sm_90a", layer.options) != base


def test_bad_configs():
    with pytest.raises(ValueError, match="top_k"):
        MoELayer(LayerConfig(0, 32, 32, 4, 5))
    with pytest.raises(ValueError, match="policy"):
        MoELayer(CONFIGS["softmax"], policy="host")
    with pytest.raises(NotImplementedError, match="swiglu.*multiple of 64|multiple of 64"):
        L.check_gpu_config(LayerConfig(0, 96, 64, 4, 2))
    # Every limit a layer breaks is named, in one message; gelu and silu experts run, and
    # capacity factors.
    with pytest.raises(NotImplementedError, match="hidden .d. = 96 is not a multiple"):
        L.check_gpu_config(LayerConfig(0, 96, 64, 4, 2, activation="gelu", capacity_factor=1.0))
    L.check_gpu_config(LayerConfig(0, 64, 64, 4, 2, activation="gelu", capacity_factor=1.0))
    for activation in ("gelu", "silu"):
        L.check_gpu_config(LayerConfig(0, 64, 64, 4, 2, activation=activation))
    L.check_gpu_config(LayerConfig(0, 128, 64, 4, 2, shared_ffn=64))
    with pytest.raises(ValueError, match="CUDA .*CPU.*not on meta"):
        L.kernel_for(MoELayer(CONFIGS["softmax"]).spec_key, 4, torch.device("meta"))


def test_cache_is_reused_without_a_compiler(_cache, monkeypatch, tmp_path):
    cfg = dataclasses.replace(CONFIGS["softmax"], tokens=9)
    layer = cc.get_cpu_layer(cfg)
    entries = list((_cache / "cpu").glob("*/*/meta.json"))
    key = cc.config_key(cfg, "cpu", cc.BuildOptions())
    assert any(key in str(e) for e in entries)
    # No moe-opt: the entry is loaded, nothing compiles.
    monkeypatch.setenv("MOE_OPT", "none")
    again = cc.get_cpu_layer(cfg)
    x = torch.randn(9, 32).numpy()
    args = {n: torch.randn(s).numpy() * 0.3 for n, s, _ in cfg.arg_specs() if n != "x"}
    args["x"] = x
    assert (layer(args)[0] == again(args)[0]).all()
    # A prebuilt folder (read-only use) and an empty writable cache.
    prebuilt = tmp_path / "prebuilt"
    shutil.copytree(_cache, prebuilt)
    monkeypatch.setenv("MOE_MLIR_PREBUILT", str(prebuilt))
    monkeypatch.setenv("MOE_MLIR_CACHE", str(tmp_path / "empty"))
    assert (cc.get_cpu_layer(cfg)(args)[0] == again(args)[0]).all()
    with pytest.raises(cc.NoCompilerError, match="no moe-opt"):
        cc.get_cpu_layer(dataclasses.replace(cfg, tokens=1013))


def test_config_key_depends_on_config_target_and_options():
    cfg = dataclasses.replace(CONFIGS["softmax"], tokens=8)
    keys = {
        cc.config_key(cfg, "cpu", cc.BuildOptions()),
        cc.config_key(dataclasses.replace(cfg, tokens=9), "cpu", cc.BuildOptions()),
        cc.config_key(cfg, "sm_90a", cc.BuildOptions()),
        cc.config_key(cfg, "cpu", cc.BuildOptions(memory_budget="1MiB")),
    }
    assert len(keys) == 4
    assert cc.config_key(cfg, "cpu", cc.BuildOptions()) == cc.config_key(
        dataclasses.replace(cfg), "cpu", cc.BuildOptions()
    )


def test_progress_is_printed_for_slow_compiles(capsys, monkeypatch):
    import time

    monkeypatch.delenv("MOE_MLIR_QUIET")
    with cc.Progress("layer X", after=0.05, every=0.05):
        time.sleep(0.2)
    err = capsys.readouterr().err
    assert "moe_mlir: compiling layer X" in err and "still compiling" in err
    assert "compiled in" in err
    with cc.Progress("layer Y", after=5.0):
        pass
    assert capsys.readouterr().err == ""


def test_memory_budget_on_the_cpu_path():
    cfg = LayerConfig(0, 32, 24, 4, 2, renormalize=True, shared_ffn=16)
    torch.manual_seed(3)
    keep = MoELayer(cfg, init_std=0.2)
    recompute = MoELayer(cfg, policy="recompute")
    recompute.load_state_dict(keep.state_dict())
    x = torch.randn(6, 32)
    assert torch.equal(keep(x), recompute(x))
    plan = keep.memory_plan(64)
    assert plan.keep_bytes > plan.recompute_bytes > 0
    assert "keep" in plan.report() and "recompute" in plan.report()
    with pytest.raises(ValueError, match="memory-budget"):
        MoELayer(cfg, memory_budget="1B").memory_plan(64)


def test_cuda_path_without_a_gpu(_cache, monkeypatch):
    """sm_90a entry built with moe-compile, then found again without a compiler (the GPU
    machine's situation); the fake forward gives the manifest's shapes under FakeTensorMode."""
    if cc.find_moe_compile() is None:
        pytest.skip("no moe-compile")
    from torch._subclasses.fake_tensor import FakeTensorMode

    cfg = LayerConfig(0, 64, 64, 4, 2, renormalize=True)
    # MoELayer's layer for 16 tokens: T dynamic up to 16.
    bounded = cc.BuildOptions(max_tokens=16)
    entry = cc.build_gpu_entry(dataclasses.replace(cfg, tokens=16, dtype="bf16"), bounded)
    assert (entry.path / f"{entry.name}.o").is_file()
    monkeypatch.setenv("MOE_COMPILE", "none")
    found = cc.find_gpu_entry(dataclasses.replace(cfg, tokens=16, dtype="bf16"), bounded)
    assert found.path == entry.path
    with pytest.raises(cc.NoCompilerError, match="build-torch-cache"):
        cc.find_gpu_entry(
            dataclasses.replace(cfg, tokens=17, dtype="bf16"), cc.BuildOptions(max_tokens=32)
        )
    layer = MoELayer(cfg)
    with FakeTensorMode():
        fl = MoELayer(cfg, device="cuda", dtype=torch.bfloat16)
        x = torch.empty(4, 4, 64, device="cuda", dtype=torch.bfloat16)
        out, logits = fl(x, return_router_logits=True)
        assert out.shape == (4, 4, 64) and out.dtype == torch.bfloat16
        assert logits.shape == (16, 4) and logits.dtype == torch.float32
        # 9 tokens: the layer of bound 16 serves them, no other is compiled.
        out, logits = fl(x.reshape(16, 64)[:9], return_router_logits=True)
        assert out.shape == (9, 64) and logits.shape == (9, 4)
        with pytest.raises(TypeError, match="bfloat16 only"):
            fl(torch.empty(16, 64, device="cuda"))
    assert layer is not None


def _saved_params(entry):
    from moe_mlir import gpu

    manifest = gpu.Manifest.load(str(entry.path / f"{entry.name}.json"))
    return [p.name for p in manifest.forward.by_role("saved")]


def test_cuda_memory_plan_reaches_moe_compile(_cache):
    """policy / memory_budget build their own sm_90a entries through moe-compile: recompute
    saves no H, a roomy budget keeps it, one nothing meets is an error with moe-compile's
    diagnostic."""
    if cc.find_moe_compile() is None:
        pytest.skip("no moe-compile")
    from moe_mlir.cpu import CompileError

    cfg = LayerConfig(16, 64, 64, 4, 2, renormalize=True, dtype="bf16")
    keep = cc.build_gpu_entry(cfg)
    recompute = cc.build_gpu_entry(cfg, cc.BuildOptions(policy="recompute"))
    assert recompute.path != keep.path
    assert "moe.expert_ffn.h" in _saved_params(keep)
    assert "moe.expert_ffn.h" not in _saved_params(recompute)
    roomy = cc.build_gpu_entry(cfg, cc.BuildOptions(memory_budget="1GiB"))
    assert roomy.path not in (keep.path, recompute.path)
    assert _saved_params(roomy) == _saved_params(keep)
    with pytest.raises(CompileError, match="smallest budget"):
        cc.build_gpu_entry(cfg, cc.BuildOptions(memory_budget="1B"))


def _bounds(layer):
    """The bounds of the compiled layers of `layer`'s spec (CPU)."""
    return sorted(b for (key, b, t) in L._KERNELS if key == layer.spec_key and t == "cpu")


def test_one_compiled_layer_serves_every_token_count_up_to_its_bound():
    """The first T (5) compiles the layer of bound 8, which serves 1..8 without compiling
    again; 9 compiles the one of bound 16. Each T gives bitwise what the layer compiled for
    exactly that T gives."""
    from moe_mlir import cpu

    cfg = dataclasses.replace(CONFIGS["softmax"], experts=5, hidden=40)  # a spec of its own
    torch.manual_seed(3)
    layer = MoELayer(cfg, init_std=0.2)
    weights = {n: p.detach().numpy() for n, p in layer.named_parameters()}
    for tokens, bounds in ((5, [8]), (8, [8]), (1, [8]), (3, [8]), (9, [8, 16]), (16, [8, 16])):
        x = torch.randn(tokens, cfg.hidden)
        out, logits = layer(x, return_router_logits=True)
        assert _bounds(layer) == bounds, tokens
        fixed = cpu.CompiledLayer(dataclasses.replace(cfg, tokens=tokens), "fixed")
        f_out, f_logits = fixed({"x": x.numpy(), **weights})
        assert np.array_equal(out.detach().numpy(), f_out), tokens
        assert np.array_equal(logits.detach().numpy(), f_logits), tokens


def test_max_tokens_is_the_first_bound():
    cfg = dataclasses.replace(CONFIGS["softmax"], experts=6, hidden=48)
    layer = MoELayer(cfg, init_std=0.2, max_tokens=20)
    layer(torch.randn(3, cfg.hidden))
    assert _bounds(layer) == [20]
    layer(torch.randn(20, cfg.hidden))
    assert _bounds(layer) == [20]
    layer(torch.randn(21, cfg.hidden))  # past it: the next power of two
    assert _bounds(layer) == [20, 32]
    with pytest.raises(ValueError, match="max_tokens must be a positive integer"):
        MoELayer(cfg, max_tokens=0)


def test_torch_compile_dynamic_compiles_the_graph_once():
    """torch.compile(dynamic=True): the token count stays symbolic (the fake implementations
    give shapes in T), one graph serves T = 6, 7 and 11 with eager's results and gradients."""
    import torch._dynamo

    cfg = CONFIGS["deepseek"]
    torch.manual_seed(4)
    layer = MoELayer(cfg, init_std=0.2, max_tokens=16)
    torch._dynamo.reset()
    counts = {"frames": 0}

    def backend(gm, example_inputs):
        counts["frames"] += 1
        from torch._dynamo.backends.common import aot_autograd
        from functorch.compile import make_boxed_func

        return aot_autograd(fw_compiler=lambda g, _: make_boxed_func(g.forward))(gm, example_inputs)

    compiled = torch.compile(layer, backend=backend, dynamic=True, fullgraph=True)
    for tokens in (6, 7, 11):
        x = torch.randn(tokens, cfg.hidden)
        xe, xc = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        eager = layer(xe)
        eager.square().sum().backward()
        g_eager = {n: p.grad.clone() for n, p in layer.named_parameters()}
        layer.zero_grad(set_to_none=True)
        out = compiled(xc)
        out.square().sum().backward()
        assert torch.equal(out, eager), tokens
        assert torch.equal(xc.grad, xe.grad), tokens
        for n, p in layer.named_parameters():
            assert torch.equal(p.grad, g_eager[n]), (tokens, n)
        layer.zero_grad(set_to_none=True)
    assert counts["frames"] == 1
    assert _bounds(layer) == [16]


def test_mark_dynamic_keeps_the_token_count_symbolic():
    """torch._dynamo.mark_dynamic on the token dimension: one graph for T = 5 and 9, eager's
    results; the layers behind it are those of bounds 8 and 16, as in eager mode."""
    import torch._dynamo

    cfg = dataclasses.replace(CONFIGS["softmax"], experts=7, hidden=56)  # a spec of its own
    torch.manual_seed(5)
    layer = MoELayer(cfg, init_std=0.2)
    torch._dynamo.reset()
    frames = []

    def backend(gm, example_inputs):
        frames.append(gm)
        return gm.forward

    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    for tokens in (5, 9):
        x = torch.randn(tokens, cfg.hidden)
        torch._dynamo.mark_dynamic(x, 0)
        with torch.no_grad():
            assert torch.equal(compiled(x), layer(x)), tokens
    assert len(frames) == 1
    assert _bounds(layer) == [8, 16]


def test_a_bounded_layer_is_keyed_by_its_bound_not_its_tokens():
    """The cache entry of a layer of dynamic token count is the bound's, whatever T the
    config that asks for it holds (the prebuilt entries of the GPU machine rely on it)."""
    cfg = dataclasses.replace(CONFIGS["softmax"], dtype="bf16")
    bounded = cc.BuildOptions(max_tokens=256)
    keys = {
        cc.config_key(dataclasses.replace(cfg, tokens=t), "sm_90a", bounded) for t in (1, 200, 256)
    }
    assert len(keys) == 1
    assert (
        cc.config_key(dataclasses.replace(cfg, tokens=200), "sm_90a", cc.BuildOptions()) not in keys
    )


@pytest.mark.parametrize("factor", [0.5, 1.0, 1.25])
def test_capacity_layer_reports_its_dropped_pairs(factor):
    """With a capacity factor, `last_dropped` is T * k minus the pairs the NumPy reference's
    dispatch keeps, on routing that sends most tokens to expert 0 (so pairs drop); the
    output and gradients match the NumPy reference layer, which drops the same pairs."""
    from moe_mlir import reference as R

    cfg = LayerConfig(0, 32, 24, 4, 2, renormalize=True, capacity_factor=factor)
    torch.manual_seed(3)
    layer = MoELayer(cfg, init_std=0.2)
    with torch.no_grad():
        layer.w_router[:, 0] += 0.5  # skewed: expert 0 is most tokens' first choice
    x = torch.randn(37, cfg.hidden, requires_grad=True)
    out, logits = layer(x, return_router_logits=True)
    weights = {n: p.detach().numpy() for n, p in layer.named_parameters()}
    tcfg = dataclasses.replace(cfg, tokens=37)
    ref_out, ref_logits, cache = R.layer_forward(tcfg, x.detach().numpy(), **weights)
    dropped = int((cache.rows < 0).sum())
    assert dropped == 37 * 2 - int(cache.offsets[-1])
    assert isinstance(layer.last_dropped, torch.Tensor) and layer.last_dropped.dim() == 0
    assert layer.last_dropped.item() == dropped
    if factor < 1.25:
        assert dropped > 0
    d_out = torch.randn_like(out)
    out.backward(d_out)
    grads = dict(zip(R.layer_gradient_names(tcfg), R.layer_backward(tcfg, cache, d_out.numpy())))
    assert rel(out, torch.from_numpy(ref_out)) < 1e-5
    assert rel(x.grad, torch.from_numpy(grads["x"])) < 1e-5
    for n, p in layer.named_parameters():
        assert rel(p.grad, torch.from_numpy(grads[n])) < 1e-5, n
    assert not hasattr(MoELayer(CONFIGS["softmax"]), "last_dropped")


def test_cuda_path_takes_a_capacity_factor(_cache):
    """The CUDA branch passes capacity_factor through: the sm_90a entry of a capacity layer
    is built by moe-compile (its dispatch calls the capacity host function) and a fake
    forward on CUDA gives the shapes and a 0-d dropped count."""
    if cc.find_moe_compile() is None:
        pytest.skip("no moe-compile")
    from torch._subclasses.fake_tensor import FakeTensorMode

    cfg = LayerConfig(0, 64, 64, 4, 2, renormalize=True, capacity_factor=1.25)
    L.check_gpu_config(cfg)
    bounded = cc.BuildOptions(max_tokens=16)
    entry = cc.build_gpu_entry(dataclasses.replace(cfg, tokens=16, dtype="bf16"), bounded)
    dropless = cc.build_gpu_entry(
        dataclasses.replace(cfg, tokens=16, dtype="bf16", capacity_factor=None), bounded
    )
    assert entry.path != dropless.path
    kernel = b"moe_dispatch_place_capacity"
    assert kernel in (entry.path / f"{entry.name}.o").read_bytes()
    assert kernel not in (dropless.path / f"{dropless.name}.o").read_bytes()
    assert "moe.dispatch.offsets" in _saved_params(entry)
    with FakeTensorMode():
        fl = MoELayer(cfg, device="cuda", dtype=torch.bfloat16)
        x = torch.empty(9, 64, device="cuda", dtype=torch.bfloat16)
        out, logits = fl(x, return_router_logits=True)
        assert out.shape == (9, 64) and logits.shape == (9, 4)
        assert fl.last_dropped.shape == () and fl.last_dropped.device.type == "cuda"
