"""test/GPU/ops_check.py's expert-bias checks without a GPU: the bias-ffn checks run end to end
on the CPU against a stand-in library whose expert_ffn is reference.py's with the biases (the
CPU path's semantics), gated and not; a stand-in that drops a bias fails them; the VARIANT
file's bias configs; gen_ops_harness.py wraps a biased expert_ffn with the biases after the
weights."""

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "test", "GPU"))
sys.path.insert(0, os.path.join(ROOT, "python"))

import gen_ops_harness as gh  # noqa: E402
import ops_check as oc  # noqa: E402
from moe_mlir import reference as ref  # noqa: E402

CPU_NAMES = {"swiglu": "swiglu", "gelu_erf": "gelu"}


@pytest.fixture(autouse=True)
def _cpu(monkeypatch):
    monkeypatch.setattr(oc, "DEV", "cpu")
    monkeypatch.setattr(oc, "RESULTS", [])
    yield
    oc.set_activation("swiglu")


class CpuBiasLib:
    """dispatch, expert_ffn and expert_ffn_h of a --bias library by reference.py (fp32 numpy);
    `drop` names a bias the stand-in leaves out."""

    def __init__(self, act, drop=None):
        self.act = CPU_NAMES[act]
        self.code = oc.ACT_CODES[act]
        self.drop = drop
        self.called = set()

    def call(self, name, *a):
        self.called.add(name)
        n = [t.float().numpy() if t.is_floating_point() else t.numpy() for t in a[:7]]
        if name == "dispatch":
            tid, off, rows = ref.dispatch(n[0], a[2].numel() - 1)
            for out, v in zip(a[1:], (tid, off, rows)):
                out.copy_(torch.from_numpy(v))
            return
        assert name in ("expert_ffn", "expert_ffn_h"), name
        assert a[7] == self.code
        bgu, bd = n[5], n[6]
        if self.drop == "b_gate_up":
            bgu = np.zeros_like(bgu)
        if self.drop == "b_down":
            bd = np.zeros_like(bd)
        y, h = ref.expert_ffn(*n[:5], self.act, bgu, bd)
        if name == "expert_ffn":
            a[8].copy_(torch.from_numpy(y).to(a[8].dtype))
        a[-1].copy_(torch.from_numpy(h).to(a[-1].dtype))


@pytest.mark.parametrize("act", ["swiglu", "gelu_erf"])
def test_bias_checks_pass_on_the_cpu_library(act):
    oc.set_activation(act)
    torch.manual_seed(1)
    lib = CpuBiasLib(act)
    assert oc.run_bias_ffn(lib, 37, 128, 192, 5, 2, "skewed")
    assert oc.run_bias_ffn(lib, 1, 64, 64, 5, 2, "random")
    assert oc.run_bias_ffn(lib, 29, 64, 128, 4, 3, "all-to-one")
    assert oc.RESULTS and all(r["ok"] for r in oc.RESULTS)
    assert lib.called == {"dispatch", "expert_ffn", "expert_ffn_h"}


@pytest.mark.parametrize("drop,fails", [("b_gate_up", {"h", "y"}), ("b_down", {"y"})])
def test_a_dropped_bias_fails_the_checks(drop, fails):
    torch.manual_seed(2)
    assert not oc.run_bias_ffn(CpuBiasLib("swiglu", drop), 37, 128, 192, 4, 2, "random")
    failed = {r["check"].rsplit(" ", 1)[-1] for r in oc.RESULTS if not r["ok"]}
    assert failed == fails


def _variant(*configs):
    return f"library: moe-opt --moe-gpu-emit-library=configs={','.join(configs)}\n"


def test_bias_of_variant():
    assert not oc.bias_of_variant("library: moe-opt --moe-gpu-emit-library\n")
    assert not oc.bias_of_variant(_variant("up:b=w_mn:activation=silu", "dact:activation=silu"))
    assert oc.bias_of_variant(_variant("expert_ffn.up:bias=true", "expert_ffn.down:bias=true"))
    text = _variant(
        "up:b=w_mn:activation=gelu_erf",
        "dact:activation=gelu_erf",
        "expert_ffn.up:bias=true",
        "expert_ffn.down:bias=true",
    )
    assert oc.bias_of_variant(text) and oc.activation_of_variant(text) == "gelu_erf"
    with pytest.raises(ValueError, match="up and down need it both"):
        oc.bias_of_variant(_variant("expert_ffn.up:bias=true"))
    with pytest.raises(ValueError, match="only expert_ffn's GEMMs"):
        oc.bias_of_variant(_variant("shared_expert.up:bias=true"))


def test_harness_wraps_the_biases_after_the_weights():
    plain = "\n".join(
        f"  func.func private @__moe_gpu_{name}(%arg0: !gpu.async.token, "
        + ", ".join(f"%arg{i + 1}: {t}" for i, (_, t) in enumerate(args))
        + ") -> !gpu.async.token {"
        for name, args in (("expert_ffn", gh.BIAS_OPS["expert_ffn"]),)
    )
    assert gh.arg_types(plain, "expert_ffn")[6:8] == [gh.B2, gh.B2]
    assert [a for a, _ in gh.BIAS_OPS["expert_ffn"]][5:8] == ["b_gate_up", "b_down", "act"]
    assert gh.arg_types(plain, "expert_ffn_h") is None


MOE_OPT = os.environ.get("MOE_OPT", os.path.join(ROOT, "build", "bin", "moe-opt"))


@pytest.mark.skipif(not os.path.exists(MOE_OPT), reason="needs moe-opt")
def test_harness_of_the_bias_library(tmp_path):
    """build-ops-harness.sh --bias's library: gen_ops_harness.py wraps its expert_ffn and
    expert_ffn_h with the biases, the plain library's without."""
    configs = "--moe-gpu-emit-library=configs=expert_ffn.up:bias=true,expert_ffn.down:bias=true"
    for option, biased in ((configs, True), ("--moe-gpu-emit-library", False)):
        lib = tmp_path / "library.mlir"
        subprocess.run(
            [MOE_OPT, option, "-o", str(lib)], input=b"module {}", check=True, capture_output=True
        )
        out = subprocess.run(
            [sys.executable, os.path.join(ROOT, "test", "GPU", "gen_ops_harness.py"), str(lib)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        for name in ("expert_ffn", "expert_ffn_h"):
            head = out[out.index(f"func.func @op_{name}(") :].split("\n", 1)[0]
            assert ("%b_gate_up: memref<?x?xbf16>, %b_down: memref<?x?xbf16>" in head) == biased
