"""policy="offload": the CPU path (where it is the offload plan, which keeps H) equals keep
bitwise; the CUDA path's refusals; moe_mlir.offload's choice of what to prefetch; and
bench/offload_stack.py's usage. The copies themselves need CUDA (scripts/gpu/torch-check.sh,
step offload)."""

import os
import sys

import pytest

torch = pytest.importorskip("torch")

from moe_mlir import LayerConfig  # noqa: E402
from moe_mlir import layer as L  # noqa: E402
from moe_mlir.layer import MoELayer  # noqa: E402
from moe_mlir.offload import Offloaded, is_offloaded_name, previous_layer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MOE_MLIR_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.delenv("MOE_MLIR_PREBUILT", raising=False)
    monkeypatch.setenv("MOE_MLIR_QUIET", "1")


def test_offload_on_the_cpu_equals_keep_bitwise():
    cfg = LayerConfig(
        0, 32, 24, 4, 2, scoring="sigmoid", renormalize=True, router_bias=True, shared_ffn=16
    )
    torch.manual_seed(0)
    off = MoELayer(cfg, policy="offload", init_std=0.2)
    off.router_bias.normal_(0, 0.1)
    keep = MoELayer(cfg, policy="keep")
    keep.load_state_dict(off.state_dict())
    x = torch.randn(2, 9, 32)
    a, b = off(x), keep(x)
    assert torch.equal(a, b)
    (a * b.detach()).sum().backward()
    (b * a.detach()).sum().backward()
    for (n, p), (_, q) in zip(off.named_parameters(), keep.named_parameters()):
        assert torch.equal(p.grad, q.grad), n


def test_bad_policies():
    cfg = LayerConfig(0, 64, 64, 4, 2, renormalize=True)
    with pytest.raises(ValueError, match="'offload'"):
        MoELayer(cfg, policy="host")
    # CUDA offload moves every H and takes no budget: refused before anything compiles
    layer = MoELayer(cfg, policy="offload", memory_budget="1GiB")
    with pytest.raises(NotImplementedError, match="no memory_budget"):
        L.kernel_for(layer.spec_key, 16, torch.device("cuda"))


def test_what_is_offloaded():
    assert is_offloaded_name("moe.expert_ffn.h") and is_offloaded_name("moe.shared_expert.h")
    assert not is_offloaded_name("moe.dispatch.offsets")
    assert not is_offloaded_name("moe.router.weights")


def _entries(n):
    return [Offloaded(torch.empty(2)) for _ in range(n)]


def test_prefetch_goes_one_layer_back():
    # three layers of two offloaded tensors each (H and the shared expert's), forward order
    a, b, c = _entries(2), _entries(2), _entries(2)
    live = a + b + c
    # the last layer's backward comes first: it prefetches the layer before it
    assert previous_layer(live, c) == b
    b[0].h2d_done = b[1].h2d_done = object()  # prefetched
    assert previous_layer(live, b) == a
    assert previous_layer(live, a) == []
    # already prefetched tensors are not prefetched again
    assert previous_layer(live, c) == a
    # tensors the order does not hold
    assert previous_layer(live, _entries(1)) == []


def test_offload_stack_usage():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import offload_stack
    finally:
        sys.path.pop(0)
    assert offload_stack.main([]) == 2
    assert offload_stack.main(["--run", "x", "--depth", "0"]) == 2
