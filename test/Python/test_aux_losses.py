"""The auxiliary losses reach the user: moe_mlir.aux_losses (moe.aux_loss / moe.aux_loss_grad
compiled through the CPU path) and MoELayer(x, return_aux_losses=True), against torch
autograd on random data (f32, CPU path); the CUDA branch's shapes under FakeTensorMode. CI
installs torch (scripts/install-deps.sh): there a missing torch fails instead of skipping."""

import dataclasses
import inspect
import os

import pytest

try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    if os.environ.get("CI"):
        raise
    pytest.skip("needs torch (scripts/install-deps.sh installs it)", allow_module_level=True)

from moe_mlir import LayerConfig  # noqa: E402
from moe_mlir import compile_cache as cc  # noqa: E402
from moe_mlir import torch_reference as TR  # noqa: E402
from moe_mlir.aux_losses import aux_losses  # noqa: E402
from moe_mlir.layer import MoELayer  # noqa: E402


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.getbasetemp() / "moe_mlir_cache"
    monkeypatch.setenv("MOE_MLIR_CACHE", str(root))
    monkeypatch.delenv("MOE_MLIR_PREBUILT", raising=False)
    monkeypatch.setenv("MOE_MLIR_QUIET", "1")
    return root


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def torch_aux(logits, experts, scoring):
    """load_balance and z_loss in torch autograd (docs/dialect.md, moe.aux_loss)."""
    T, E = logits.shape
    k = experts.shape[1]
    flat = experts.reshape(-1).long()
    counts = torch.bincount(flat[(flat >= 0) & (flat < E)], minlength=E)[:E].float()
    f = counts / (T * k)
    if scoring == "softmax":
        p = torch.softmax(logits, -1)
    else:
        s = torch.sigmoid(logits)
        p = s / s.sum(-1, keepdim=True)
    lb = E * (f * p.mean(0)).sum()
    z = (torch.logsumexp(logits, -1) ** 2).mean()
    return lb, z


def routing(T, E, k, mode, gen):
    """[T, k] experts: random distinct, or skewed (most to expert 0)."""
    ex = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)])
    if mode == "skewed":
        ex[: (3 * T) // 4, 0] = 0
        ex[: (3 * T) // 4, 1:] = torch.arange(1, k)[None, :] if k > 1 else ex[: (3 * T) // 4, 1:]
    return ex.to(torch.int32)


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("mode", ["random", "skewed"])
@pytest.mark.parametrize("T,E,k", [(37, 8, 2), (5, 4, 1), (64, 16, 4)])
def test_aux_losses_match_torch_autograd(scoring, mode, T, E, k):
    gen = torch.Generator().manual_seed(T * E + k)
    logits = (2.0 * torch.randn(T, E, generator=gen)).requires_grad_()
    experts = routing(T, E, k, mode, gen)
    lb, z = aux_losses(logits, experts, scoring)
    assert lb.shape == z.shape == () and lb.dtype == z.dtype == torch.float32
    ref = logits.detach().clone().requires_grad_()
    rlb, rz = torch_aux(ref, experts, scoring)
    assert rel(lb, rlb) <= 1e-5 and rel(z, rz) <= 1e-5
    a, b = 0.7, -1.3
    (a * lb + b * z).backward()
    (a * rlb + b * rz).backward()
    assert rel(logits.grad, ref.grad) <= 1e-5
    # int64 experts give the same values
    lb64, z64 = aux_losses(logits.detach(), experts.long(), scoring)
    assert float(lb64) == float(lb.detach()) and float(z64) == float(z.detach())


def test_aux_losses_without_tokens():
    logits = torch.zeros(0, 4, requires_grad=True)
    lb, z = aux_losses(logits, torch.zeros(0, 2, dtype=torch.int32))
    assert float(lb.detach()) == 0.0 and float(z.detach()) == 0.0
    (lb + z).backward()
    assert logits.grad.shape == (0, 4)


def test_aux_losses_refuse_bad_inputs():
    logits = torch.randn(6, 4)
    experts = torch.zeros(6, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="scoring must be one of"):
        aux_losses(logits, experts, "relu")
    with pytest.raises(ValueError, match="logits must be a float32 tensor"):
        aux_losses(logits.double(), experts)
    with pytest.raises(ValueError, match="logits must be a float32 tensor"):
        aux_losses(logits[0], experts)
    with pytest.raises(ValueError, match="experts must be an integer tensor"):
        aux_losses(logits, experts.float())
    with pytest.raises(ValueError, match="expected \\[T, k\\]"):
        aux_losses(logits, experts[:5])
    with pytest.raises(ValueError, match="is more than E"):
        aux_losses(logits, torch.zeros(6, 5, dtype=torch.int32))
    for bad in (-1, 4, 2**40):
        with pytest.raises(ValueError, match="outside \\[0, 4\\)"):
            aux_losses(logits, torch.full((6, 2), bad, dtype=torch.int64))


# --------------------------------------------------------------------------- MoELayer

CONFIGS = {
    "softmax": LayerConfig(0, 32, 24, 4, 2, renormalize=True),
    "sigmoid-k1": LayerConfig(0, 16, 8, 8, 1, scoring="sigmoid"),
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
}


def make_layer(cfg, seed, **options):
    torch.manual_seed(seed)
    layer = MoELayer(cfg, init_std=0.3, **options)
    if cfg.router_bias:
        with torch.no_grad():
            layer.router_bias.copy_(0.5 * torch.randn(cfg.experts))
    return layer


@pytest.mark.parametrize("policy", ["auto", "recompute"])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_layer_aux_losses_match_torch_autograd(name, policy):
    """(y.sum() + a lb + b z).backward() on the layer against the torch reference layer with
    the aux losses in torch autograd: values and every gradient."""
    cfg = CONFIGS[name]
    layer = make_layer(cfg, 3, policy=policy)
    T = 37
    x = torch.randn(T, cfg.hidden, requires_grad=True)
    y, lb, z = layer(x, return_aux_losses=True)
    a, b = 30.0, 3.0  # large enough to move the router's gradient visibly
    (y.sum() + a * lb + b * z).backward()

    inputs = {"x": x.detach()}
    inputs.update({n: p.detach() for n, p in layer.named_parameters()})
    if cfg.router_bias:
        inputs["router_bias"] = layer.router_bias
    ref = TR.forward(dataclasses.replace(cfg, tokens=T), inputs)
    rlb, rz = torch_aux(ref.logits, ref.experts, cfg.scoring)
    assert rel(y, ref.out) <= 1e-5
    assert rel(lb, rlb) <= 1e-5 and rel(z, rz) <= 1e-5
    (ref.out.sum() + a * rlb + b * rz).backward()
    assert rel(x.grad, ref.inputs["x"].grad) <= 1e-4
    for n, p in layer.named_parameters():
        assert rel(p.grad, ref.inputs[n].grad) <= 1e-4, n
    # the aux losses moved the router's gradient (the check above is not vacuous)
    plain = make_layer(cfg, 3, policy=policy)
    plain(x.detach()).sum().backward()
    assert rel(plain.w_router.grad, layer.w_router.grad) > 1e-2


def test_layer_aux_losses_with_logits_and_dropped_skewed_routing():
    """A capacity factor dropping most of a skewed routing: the aux losses count the
    router's choices (dropped pairs too), and their gradient is x^T dL (router) and
    dL w_router^T (x) on top of the layer's own, dL from torch autograd."""
    cfg = LayerConfig(0, 16, 8, 4, 2, renormalize=True, capacity_factor=0.5)
    layer = make_layer(cfg, 5)
    with torch.no_grad():
        layer.w_router[:, 0] += 2.0  # most tokens pick expert 0
    T = 41
    x = torch.randn(T, cfg.hidden) + 1.0
    x1 = x.clone().requires_grad_()
    y, logits, lb, z = layer(x1, return_router_logits=True, return_aux_losses=True)
    assert int(layer.last_dropped) > 0
    a, b = 0.9, 0.2
    (y.sum() + a * lb + b * z).backward()
    g_router, g_x = layer.w_router.grad.clone(), x1.grad.clone()

    layer.zero_grad()
    x2 = x.clone().requires_grad_()
    y2 = layer(x2)
    y2.sum().backward()
    assert torch.equal(y, y2)

    ref_logits = (x @ layer.w_router.detach()).requires_grad_()
    assert rel(logits, ref_logits) <= 1e-5
    experts = TR.select_experts(TR.scores(ref_logits.detach(), "softmax"), 2)
    assert (experts[:, 0] == 0).float().mean() > 0.5
    rlb, rz = torch_aux(ref_logits, experts, "softmax")
    assert rel(lb, rlb) <= 1e-5 and rel(z, rz) <= 1e-5
    (a * rlb + b * rz).backward()
    d = ref_logits.grad
    assert rel(g_router - layer.w_router.grad, x.t() @ d) <= 1e-4
    assert rel(g_x - x2.grad, d @ layer.w_router.detach().t()) <= 1e-4


def test_layer_aux_losses_bf16_input_and_shapes():
    cfg = CONFIGS["softmax"]
    layer = make_layer(cfg, 7).bfloat16()
    x = torch.randn(2, 5, cfg.hidden, dtype=torch.bfloat16)
    y, lb, z = layer(x, return_aux_losses=True)
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    assert lb.dtype == z.dtype == torch.float32 and lb.shape == ()
    _, logits = layer(x, return_router_logits=True)
    experts = TR.select_experts(TR.scores(logits, "softmax"), cfg.top_k)
    rlb, rz = torch_aux(logits, experts, "softmax")
    assert rel(lb, rlb) <= 1e-5 and rel(z, rz) <= 1e-5
    (y.float().sum() + lb + z).backward()
    assert layer.w_router.grad is not None and torch.isfinite(layer.w_router.grad).all()


def test_cuda_branch_gives_aux_loss_shapes(_cache):
    """Without a GPU: the sm_90a entry's saved tensors hold the router's weights, experts and
    logits consecutively (what the layer reads its choices from), and a fake forward on CUDA
    with return_aux_losses gives two 0-d f32 tensors on CUDA."""
    if cc.find_moe_compile() is None:
        pytest.skip("no moe-compile")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from moe_mlir import gpu

    cfg = LayerConfig(0, 64, 64, 4, 2, renormalize=True)
    bounded = cc.BuildOptions(max_tokens=16)
    entry = cc.build_gpu_entry(dataclasses.replace(cfg, tokens=16, dtype="bf16"), bounded)
    manifest = gpu.Manifest.load(str(entry.path / f"{entry.name}.json"))
    names = [p.name for p in manifest.forward.by_role("saved")]
    at = names.index("moe.router.weights")
    assert names[at : at + 3] == ["moe.router.weights", "moe.router.experts", "moe.router.logits"]
    with FakeTensorMode():
        fl = MoELayer(cfg, device="cuda", dtype=torch.bfloat16, max_tokens=16)
        x = torch.empty(9, 64, device="cuda", dtype=torch.bfloat16)
        y, logits, lb, z = fl(x, return_router_logits=True, return_aux_losses=True)
        assert y.shape == (9, 64) and logits.shape == (9, 4)
        for t in (lb, z):
            assert t.shape == () and t.dtype == torch.float32 and t.device.type == "cuda"


def test_layer_aux_losses_under_torch_compile():
    """fullgraph torch.compile traces the aux ops (fake implementations, no host read): the
    same values and router gradient as eager."""
    cfg = CONFIGS["softmax"]
    layer = make_layer(cfg, 11)
    x = torch.randn(37, cfg.hidden)
    compiled = torch.compile(lambda t: layer(t, return_aux_losses=True), fullgraph=True)
    grads = []
    for fn in (compiled, lambda t: layer(t, return_aux_losses=True)):
        layer.zero_grad()
        y, lb, z = fn(x)
        (y.sum() + 10.0 * lb + z).backward()
        grads.append((y.detach(), lb.detach(), z.detach(), layer.w_router.grad.clone()))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_aux_ops_look_the_layer_bound_up_themselves():
    """MoELayer hands the aux ops its spec key, and the ops look the layer's token bound up in
    their implementation, which torch.compile does not trace: the layer table is behind a
    lock that Dynamo cannot enter (a fullgraph compile of a CUDA layer with aux losses
    failed on it). Without a key the op's own bound stands."""
    from moe_mlir import aux_losses as A
    from moe_mlir.layer import kernel_for

    layer = MoELayer(CONFIGS["softmax"], max_tokens=48)
    logits = torch.randn(20, CONFIGS["softmax"].experts)
    assert A._layer_bound(layer.spec_key, logits, 0) == 48
    assert (
        A._layer_bound(layer.spec_key, logits, 0)
        == kernel_for(layer.spec_key, 20, logits.device).bound
    )
    assert A._layer_bound("", logits, 7) == 7
    # the traced part of MoELayer's aux losses does not reach the table any more
    src = inspect.getsource(MoELayer._aux_losses)
    assert "kernel_for" not in src and "self.spec_key" in src


def test_gpu_aux_function_built_and_found_without_a_compiler(_cache, monkeypatch):
    """The CUDA branch's function: moe-compile of moe.aux_loss alone gives an sm_90a entry
    whose forward takes logits and experts and returns the two 0-d losses, and whose
    backward (moe.aux_loss_grad) gives d_logits from their cotangents; compile_for(T, "cuda")
    builds it at the layer's bound, and a machine without moe-compile finds it again."""
    if cc.find_moe_compile() is None:
        pytest.skip("no moe-compile")
    from moe_mlir import aux_losses as A
    from moe_mlir import gpu

    layer = MoELayer(LayerConfig(0, 64, 64, 8, 2, scoring="sigmoid"), max_tokens=48)
    assert layer.compile_for(20, "cuda") == 48
    entry = A.build_gpu_aux(8, 2, "sigmoid", 48)
    obj = (entry.path / f"{entry.name}.o").read_bytes()
    for kernel in (b"moe_aux_counts", b"moe_aux_finish", b"moe_aux_loss_grad"):
        assert kernel in obj
    manifest = gpu.Manifest.load(str(entry.path / f"{entry.name}.json"))
    fwd, bwd = manifest.forward, manifest.entry("backward")
    assert fwd.max_tokens == 48
    assert [(p.name, p.role, p.dtype, tuple(p.shape)) for p in fwd.params] == [
        ("arg0", "input", "f32", (-1, 8)),
        ("arg1", "input", "i32", (-1, 2)),
        ("result0", "output", "f32", ()),
        ("result1", "output", "f32", ()),
    ]
    assert [(p.name, p.role) for p in bwd.params] == [
        ("arg0", "saved"),
        ("arg1", "saved"),
        ("d_result0", "cotangent"),
        ("d_result1", "cotangent"),
        ("d_arg0", "gradient"),
    ]
    monkeypatch.setenv("MOE_COMPILE", "none")
    assert A.build_gpu_aux(8, 2, "sigmoid", 48).path == entry.path
    with pytest.raises(cc.NoCompilerError, match="aux-loss function"):
        A.build_gpu_aux(8, 2, "softmax", 48)
    with pytest.raises(NotImplementedError, match="at most 1024 experts"):
        A.build_gpu_aux(2048, 2, "softmax", 48)
