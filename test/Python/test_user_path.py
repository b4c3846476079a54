"""bench/user_path.py on the CPU: the gradients of a shared HF block read back in the compiler's
layout equal the copied layer's (the bitwise comparison the GPU run makes), what the profiler
comparison counts as extra, and bad usage. Skipped without torch or transformers."""

import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import user_path  # noqa: E402
from moe_mlir import hf  # noqa: E402


def test_grads_in_layout_share_equals_copy():
    """A small Mixtral block through from_hf_block, shared and copied, on the CPU path: the
    same output, and the shared block's gradients (HF layout) read back in the compiler's
    layout equal the copy's own, bit for bit."""
    torch.manual_seed(0)
    block = user_path.make_block(
        torch,
        "mixtral",
        dict(hidden_size=64, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2),
    )
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.2)
    share, copy = hf.from_hf_block(block), hf.from_hf_block(block, weights="copy")
    x = torch.randn(24, 64)
    d_out = torch.randn(24, 64)
    got = {}
    for name, layer in (("share", share), ("copy", copy)):
        xx = x.clone().requires_grad_(True)
        out = layer(xx)
        out.backward(d_out)
        got[name] = {"out": out.detach(), "x": xx.grad, **user_path.grads_in_layout(layer)}
    assert set(got["share"]) == {"out", "x", "w_router", "w_gate_up", "w_down"}
    for n, t in got["copy"].items():
        assert got["share"][n].shape == t.shape, n
        assert torch.equal(got["share"][n].contiguous(), t), n


def test_extras_counts_what_the_user_path_adds():
    bare = {
        "kernels": {"moe_gemm": [4, 1000.0], "fill": [1, 2.0]},
        "host": {"aten::empty": 10},
    }
    user = {
        "kernels": {"moe_gemm": [4, 1001.0], "fill": [2, 5.0], "elementwise_copy": [3, 700.0]},
        "host": {"aten::empty": 12, "aten::copy_": 3, "cudaStreamSynchronize": 0},
    }
    ex = user_path.extras(bare, user)
    assert [k["name"] for k in ex["kernels"]] == ["elementwise_copy", "fill"]
    assert ex["kernels"][0] == {"name": "elementwise_copy", "calls": 3, "us": 700.0}
    assert ex["kernel_us"] == pytest.approx(703.0)
    assert ex["host_calls"] == {"aten::empty": 2, "aten::copy_": 3}


def test_bad_usage(capsys):
    with pytest.raises(SystemExit):
        user_path.main(["--configs", "nope"])
    assert "unknown configuration" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        user_path.main(["--iters", "3"])


def test_prebuild_configs_are_the_hf_blocks_layers():
    """--prebuild reads each block's layer config from meta tensors (no weights allocated):
    the four configurations of docs/benchmarks.md."""
    sizes = {}
    for name, (T, kind, kw) in user_path.CONFIGS.items():
        with torch.device("meta"):
            block = user_path.make_block(torch, kind, kw)
        cfg, options = user_path.layer_entry_config(hf.config_from_hf_block(block), T)
        sizes[name] = (cfg.tokens, cfg.hidden, cfg.ffn, cfg.experts, cfg.top_k, cfg.shared_ffn)
        assert options.max_tokens == T and cfg.dtype == "bf16"
    assert sizes == {
        "mixtral-8x7b": (16384, 4096, 14336, 8, 2, 0),
        "olmoe-1b-7b": (16384, 2048, 1024, 64, 8, 0),
        "qwen3-30b-a3b": (16384, 2048, 768, 128, 8, 0),
        "deepseek-v3": (8192, 7168, 2048, 256, 8, 2048),
    }


def test_copied_layer_gradients_are_not_copied(monkeypatch):
    """The gradients the compiled backward returns become the parameters' .grad as they are
    (autograd steals them): the module adds no gradient copy, neither for its own parameters
    nor for a shared HF block's, which from_hf_block stores in the compiler's layout."""
    from moe_mlir import layer as L

    returned = []
    real = L._Kernel.backward

    def spy(self, *a, **kw):
        grads = real(self, *a, **kw)
        returned.extend(g.data_ptr() for g in grads)
        return grads

    monkeypatch.setattr(L._Kernel, "backward", spy)
    block = user_path.make_block(
        torch,
        "mixtral",
        dict(hidden_size=64, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2),
    )
    for weights in ("copy", "share"):
        layer = hf.from_hf_block(block, weights=weights)
        returned.clear()
        layer(torch.randn(16, 64)).backward(torch.randn(16, 64))
        params = (
            [layer.w_gate_up, layer.w_down]
            if weights == "copy"
            else [block.experts.gate_up_proj, block.experts.down_proj]
        )
        stolen = [p.grad.data_ptr() in returned for p in params]
        assert stolen == [True, True], weights
        for p in block.parameters():
            p.grad = None
