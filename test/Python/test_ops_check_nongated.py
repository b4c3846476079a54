"""test/GPU/ops_check.py without a GPU: its activation references against the CPU path's
(python/moe_mlir/reference.py, torch_reference.py), the activation it reads from a harness's
VARIANT file, and its expert checks run end to end on the CPU against a stand-in library whose
host functions are reference.py's (the CPU library's semantics), for SwiGLU and the non-gated
activations: shapes, argument order and the `act` argument as the GPU checks pass them."""

import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "test", "GPU"))
sys.path.insert(0, os.path.join(ROOT, "python"))

import ops_check as oc  # noqa: E402
from moe_mlir import reference as ref  # noqa: E402
from moe_mlir import torch_reference as TR  # noqa: E402

# ops_check's activation names -> reference.py's
CPU_NAMES = {"swiglu": "swiglu", "silu": "silu", "gelu_erf": "gelu", "gelu_tanh": "gelu_tanh"}


@pytest.fixture(autouse=True)
def _cpu_swiglu(monkeypatch):
    monkeypatch.setattr(oc, "DEV", "cpu")
    monkeypatch.setattr(oc, "RESULTS", [])
    yield
    oc.set_activation("swiglu")


def _h(rows, width, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, width, generator=g) * 3


@pytest.mark.parametrize("act", ["swiglu", "silu", "gelu_erf", "gelu_tanh"])
def test_act_ref_is_the_cpu_paths_activation(act):
    h = _h(67, 192)
    ours = oc.act_ref(h, act)
    np.testing.assert_allclose(
        ours.numpy(), ref.activation(h.numpy(), CPU_NAMES[act]), rtol=2e-6, atol=2e-6
    )
    torch.testing.assert_close(ours, TR.activation(h, CPU_NAMES[act]), rtol=0, atol=0)


def test_gelu_tanh_is_the_kernels_formula_and_not_erf():
    """x·sigmoid(2u), u = √(2/π)(x + 0.044715x³) (docs/gpu-kernels.md §2.2.1)."""
    h = _h(53, 128).double()
    u = (2 / torch.pi) ** 0.5 * (h + 0.044715 * h**3)
    torch.testing.assert_close(
        oc.act_ref(h, "gelu_tanh"), (h * torch.sigmoid(2 * u)).float(), rtol=1e-5, atol=1e-6
    )
    assert (oc.act_ref(h, "gelu_tanh") - oc.act_ref(h, "gelu_erf")).abs().max() > 1e-4


def test_up_width_and_act_codes():
    assert oc.up_width(192, "swiglu") == 384
    for act in ("silu", "gelu_erf", "gelu_tanh"):
        assert oc.up_width(192, act) == 192
    oc.set_activation("gelu_tanh")
    assert (oc.ACT, oc.ACT_CODE, oc.up_width(64)) == ("gelu_tanh", 3, 64)
    oc.set_activation("silu")
    assert oc.ACT_CODE == 2
    with pytest.raises(ValueError, match="activation must be one of"):
        oc.set_activation("gelu")


def _variant(*configs):
    if not configs:
        return "library: moe-opt --moe-gpu-emit-library\n"
    return f"library: moe-opt --moe-gpu-emit-library=configs={','.join(configs)}\n"


def test_activation_of_variant():
    assert oc.activation_of_variant(_variant()) == "swiglu"
    assert oc.activation_of_variant(_variant("down:stages=2")) == "swiglu"
    for act in ("silu", "gelu_erf", "gelu_tanh"):
        text = _variant(f"up:b=w_mn:activation={act}", f"dact:activation={act}")
        assert oc.activation_of_variant(text) == act
    text = _variant(
        "expert_ffn.up:b=w_mn:activation=silu", "expert_combine_grad.dact:activation=silu"
    )
    assert oc.activation_of_variant(text) == "silu"
    with pytest.raises(ValueError, match="one activation, both"):
        oc.activation_of_variant(_variant("up:b=w_mn:activation=silu"))
    with pytest.raises(ValueError, match="one activation, both"):
        oc.activation_of_variant(_variant("up:b=w_mn:activation=silu", "dact:activation=gelu_erf"))
    with pytest.raises(ValueError, match="unknown activation"):
        oc.activation_of_variant(_variant("up:activation=relu", "dact:activation=relu"))


class CpuLib:
    """The host functions ops_check's expert checks call, computed by reference.py (fp32
    numpy) into the outputs' dtypes; `act` must be the library's moe.activation code."""

    def __init__(self, act):
        self.act = CPU_NAMES[act]
        self.code = oc.ACT_CODES[act]
        self.called = set()

    def has(self, name):
        return name in ("combine_acc", "expert_combine_grad_acc")

    def _act(self, code):
        assert code == self.code, f"act {code}, the library's is {self.code}"
        return self.act

    def call(self, name, *a):
        self.called.add(name)
        n = [
            t.float().numpy() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
            for t in a
        ]
        n = [t.numpy() if isinstance(t, torch.Tensor) else t for t in n]

        def put(out, value, add=False):
            value = torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32))
            if add:
                value = out.float() + value
            out.copy_(value.to(out.dtype))

        if name == "dispatch":
            tid, off, rows = ref.dispatch(n[0], a[2].numel() - 1)
            for out, v in zip(a[1:], (tid, off, rows)):
                out.copy_(torch.from_numpy(v))
        elif name in ("expert_ffn", "expert_ffn_h"):
            y, h = ref.expert_ffn(*n[:5], self._act(a[5]))
            if name == "expert_ffn":
                put(a[6], y)
            put(a[-1], h)
        elif name in ("combine", "combine_acc"):
            put(a[3], ref.combine(*n[:3]), add=name == "combine_acc")
        elif name in ("expert_combine_grad", "expert_combine_grad_acc"):
            dx, dw, dwgu, dwd = ref.expert_combine_grad(*n[:9], self._act(a[9]))
            put(a[10], dx, add=name.endswith("_acc"))
            for out, v in zip(a[11:], (dw, dwgu, dwd)):
                put(out, v)
        elif name == "expert_ffn_grad":
            for out, v in zip(a[8:], ref.expert_ffn_grad(*n[:7], self._act(a[7]))):
                put(out, v)
        elif name in ("shared_expert", "shared_expert_h"):
            y, h = ref.shared_expert(*n[:3], self._act(a[3]))
            if name == "shared_expert":
                put(a[4], y)
            put(a[-1], h)
        elif name == "shared_expert_grad":
            for out, v in zip(a[6:], ref.shared_expert_grad(*n[:5], self._act(a[5]))):
                put(out, v)
        elif name == "combine_grad":
            dy, dw = ref.combine_grad(*n[:4])
            put(a[4], dy)
            put(a[5], dw)
        elif name in ("router", "router_grad"):  # T = 0 only (run_empty)
            assert a[0].shape[0] == 0
            if name == "router_grad":
                a[-1].zero_()
        else:
            raise AssertionError(f"no stand-in for {name}")


@pytest.mark.parametrize("act", ["swiglu", "silu", "gelu_erf"])
def test_expert_checks_pass_on_the_cpu_library(act):
    """Every expert check at small odd shapes, random, skewed and all-to-one routing, passes
    against the CPU library: ops_check's torch references are the CPU path's."""
    oc.set_activation(act)
    torch.manual_seed(1)
    lib = CpuLib(act)
    assert oc.run_ffn(lib, 37, 128, 192, 5, 2, "skewed")
    assert oc.run_ffn(lib, 21, 192, 320, 6, 3, "all-to-one")
    assert oc.run_ffn(lib, 1, 64, 64, 4, 2, "random")
    assert oc.run_ffn(lib, 30, 64, 128, 4, 1, "counts=7,0,20,3")
    assert oc.run_shared(lib, 19, 64, 192)
    assert oc.run_expert_ffn_grad(lib, 17, 64, 128, 4, 2, "skewed")
    assert oc.run_expert_ffn_grad(lib, 17, 64, 128, 4, 2, "random", True)
    assert oc.run_split_vs_fused(lib, 17, 64, 128, 4, 2, "random")
    assert oc.run_empty(lib)
    assert oc.RESULTS and all(r["ok"] for r in oc.RESULTS)
    assert {"expert_ffn", "expert_ffn_h", "expert_combine_grad_acc", "shared_expert_grad"} <= (
        lib.called
    )


def test_a_wrong_activation_fails_the_checks():
    """The silu references against a gelu library: the forward and gradients fail (the checks
    can tell the activations apart at these scales)."""
    oc.set_activation("silu")
    torch.manual_seed(2)
    lib = CpuLib("gelu_erf")
    lib.code = oc.ACT_CODES["silu"]
    assert not oc.run_ffn(lib, 37, 128, 192, 5, 2, "random")
    failed = {r["check"].rsplit(" ", 1)[-1] for r in oc.RESULTS if not r["ok"]}
    assert {"y", "combine", "dx", "d_w_gate_up", "d_w_down", "d_weights"} <= failed


def test_steps_of_a_nongated_library_are_the_experts():
    names = ["add", "dispatch", "ffn-small", "router", "shared", "ffn-grad", "split-vs-fused"]
    names += ["empty-t0", "ep-pack", "router-grad-acc", "combine-grad"]
    kept = [s for s in names if s.startswith(oc.EXPERT_STEPS)]
    assert kept == ["ffn-small", "shared", "ffn-grad", "split-vs-fused", "empty-t0"]
