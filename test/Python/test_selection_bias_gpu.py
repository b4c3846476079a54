"""The CUDA branch of moe_mlir.layer.update_selection_bias without a GPU: the sm_90a function
of moe.update_selection_bias that moe-compile builds (manifest, kernels, cache keys), found
again without moe-compile (own cache and MOE_MLIR_PREBUILT), and the branch's choice between
the compiled op and the torch rule (its fallback) with the compiled call stubbed on the CPU.
The bitwise check on a GPU is bench/train_check.py --layer-check."""

import os
import warnings

import numpy as np
import pytest

try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    if os.environ.get("CI"):
        raise
    pytest.skip("needs torch (scripts/install-deps.sh installs it)", allow_module_level=True)

from moe_mlir import compile_cache as cc  # noqa: E402
from moe_mlir import layer as L  # noqa: E402
from moe_mlir import reference as ref  # noqa: E402
from moe_mlir import selection_bias as sb  # noqa: E402


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.getbasetemp() / "moe_mlir_cache"
    monkeypatch.setenv("MOE_MLIR_CACHE", str(root))
    monkeypatch.delenv("MOE_MLIR_PREBUILT", raising=False)
    monkeypatch.setenv("MOE_MLIR_QUIET", "1")
    sb._KERNELS.clear()
    L._bias_update_warned.clear()
    return root


needs_compiler = pytest.mark.skipif(cc.find_moe_compile() is None, reason="no moe-compile")


def random_experts(T, k, E, seed):
    gen = torch.Generator().manual_seed(seed)
    ex = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(T)]).to(torch.int32)
    ex[: T // 2, 0] = 0  # skewed: loads differ, so the bias moves
    ex.view(-1)[::7] = -1
    return ex


@needs_compiler
def test_gpu_function_built_and_found_without_a_compiler(_cache, monkeypatch, tmp_path):
    """moe-compile of the op alone: forward takes bias [E] and experts [?, k] and returns the
    moved bias, backward takes nothing but its cotangent; the object holds both kernels. A
    machine without moe-compile finds it in its cache and through MOE_MLIR_PREBUILT; another
    rate or rule is another entry, and one that is not there is a NoCompilerError."""
    from moe_mlir import gpu

    entry = sb.build_gpu_selection_bias(8, 2, 1e-3, "sign", 64)
    obj = (entry.path / f"{entry.name}.o").read_bytes()
    for kernel in (b"moe_selection_bias_count", b"moe_selection_bias_update"):
        assert kernel in obj
    manifest = gpu.Manifest.load(str(entry.path / f"{entry.name}.json"))
    fwd, bwd = manifest.forward, manifest.entry("backward")
    assert fwd.max_tokens == 64
    assert [(p.name, p.role, p.dtype, tuple(p.shape)) for p in fwd.params] == [
        ("arg0", "input", "f32", (8,)),
        ("arg1", "input", "i32", (-1, 2)),
        ("result0", "output", "f32", (8,)),
    ]
    assert [(p.name, p.role) for p in bwd.params] == [("d_result0", "cotangent")]
    other = sb.build_gpu_selection_bias(8, 2, 1e-3, "proportional", 64)
    assert other.path != entry.path and other.name != entry.name
    assert sb.build_gpu_selection_bias(8, 2, 2e-3, "sign", 64).path != entry.path

    monkeypatch.setenv("MOE_COMPILE", "none")
    assert sb.build_gpu_selection_bias(8, 2, 1e-3, "sign", 64).path == entry.path
    monkeypatch.setenv("MOE_MLIR_PREBUILT", str(_cache))
    monkeypatch.setenv("MOE_MLIR_CACHE", str(tmp_path / "empty"))
    assert sb.build_gpu_selection_bias(8, 2, 1e-3, "sign", 64).path == entry.path
    with pytest.raises(cc.NoCompilerError, match="selection-bias update"):
        sb.build_gpu_selection_bias(8, 2, 1e-3, "sign", 128)


def test_gpu_function_refuses_what_it_cannot_run():
    with pytest.raises(NotImplementedError, match="at most 1024 experts"):
        sb.build_gpu_selection_bias(2048, 2, 1e-3, "sign", 64)
    with pytest.raises(ValueError, match="rule must be one of"):
        sb.build_gpu_selection_bias(8, 2, 1e-3, "median", 64)
    with pytest.raises(ValueError, match="rate must be a positive"):
        sb.build_gpu_selection_bias(8, 2, -1.0, "sign", 64)
    with pytest.raises(ValueError, match="max_tokens must be a positive"):
        sb.build_gpu_selection_bias(8, 2, 1e-3, "sign", 0)


def test_gpu_bound():
    assert sb.gpu_bound(37) == 64
    assert sb.gpu_bound(37, 48) == 48
    assert sb.gpu_bound(49, 48) == 64
    assert sb.gpu_bound(1) == 1


def _stub_gpu(monkeypatch):
    """gpu_update on CPU tensors by the NumPy reference; records its calls."""
    calls = []

    def fake(bias, experts, rate, rule, bound, entry=None):
        calls.append((bias.shape[0], experts.shape, rate, rule, bound, entry))
        new = ref.update_selection_bias(bias.numpy(), experts.numpy(), rate, rule)
        return torch.from_numpy(np.asarray(new))

    monkeypatch.setattr(sb, "gpu_update", fake)
    return calls


@needs_compiler
@pytest.mark.parametrize("rule", ["sign", "proportional"])
def test_cuda_branch_runs_the_compiled_op(monkeypatch, rule):
    """With moe-compile the branch builds the entry at T's power-of-two bound and runs it
    (no warning); the result is the op's."""
    calls = _stub_gpu(monkeypatch)
    bias = torch.randn(8, generator=torch.Generator().manual_seed(3))
    experts = random_experts(37, 2, 8, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = L._cuda_bias_update(bias, experts, 1e-3, rule, None)
    want = ref.update_selection_bias(bias.numpy(), experts.numpy(), 1e-3, rule)
    assert np.array_equal(new.numpy(), want) and not torch.equal(new, bias)
    assert len(calls) == 1 and calls[0][:5] == (8, (37, 2), 1e-3, rule, 64)
    assert calls[0][5] is not None and calls[0][5].path.is_dir()


def test_cuda_branch_falls_back_to_torch_with_a_warning(monkeypatch):
    """No moe-compile and nothing prebuilt: the torch rule (equal to the op bitwise), with
    one warning naming what to build; T = 0 keeps the bias without compiling anything."""
    calls = _stub_gpu(monkeypatch)
    monkeypatch.setenv("MOE_COMPILE", "none")
    bias = torch.randn(16, generator=torch.Generator().manual_seed(5))
    experts = random_experts(301, 4, 16, 6)
    with pytest.warns(RuntimeWarning, match="no prebuilt sm_90a selection-bias update"):
        new = L._cuda_bias_update(bias, experts, 1e-2, "proportional", None)
    want = ref.update_selection_bias(bias.numpy(), experts.numpy(), 1e-2, "proportional")
    assert np.array_equal(new.numpy(), want)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per shape
        L._cuda_bias_update(bias, experts, 1e-2, "proportional", None)
        empty = L._cuda_bias_update(bias, experts[:0], 1e-2, "proportional", None)
    assert torch.equal(empty, bias) and empty is not bias
    assert calls == []
