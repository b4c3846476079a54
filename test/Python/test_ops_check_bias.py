"""test/GPU/ops_check.py's expert-bias checks without a GPU: the bias-ffn checks run end to end
on the CPU against a stand-in library whose expert_ffn is reference.py's with the biases (the
CPU path's semantics), gated and not; a stand-in that drops a bias fails them; the VARIANT
file's bias configs; gen_ops_harness.py wraps a biased expert_ffn with the biases after the
weights. The bias-grad checks (the backward host functions with biases) against a stand-in
whose backward is reference.py's hand-written one, H made in torch or by the stand-in's biased
expert_ffn: they pass, a wrong bias gradient or a missing function fails them, and main()
runs them for the default and the --bias libraries."""

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
    for alone in ("expert_ffn.up:bias=true", "expert_ffn.down:bias=true"):
        with pytest.raises(ValueError, match="up and down need it both"):
            oc.bias_of_variant(_variant(alone))
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


# --------------------------------------------------------------------------- bias-grad

# gen_ops_harness.py's memref types -> (rank, dtype)
HARNESS_TYPES = {
    gh.B2: (2, torch.bfloat16),
    gh.B3: (3, torch.bfloat16),
    gh.F2: (2, torch.float32),
    gh.I1: (1, torch.int32),
    gh.I2: (2, torch.int32),
}
BIAS_GRAD_FAULTS = {
    # d_weights without <dout[t], b_down[e]>
    "d_weights": {"d_weights"},
    # d_b_down summing dout's rows without the routing weights (ffn_grad_bias: dy is right)
    "d_b_down": {"d_b_down"},
    # d_b_gate_up of the plain rows' dH, the bias gradients of a neighbouring expert
    "d_b_gate_up": {"d_b_gate_up"},
    # _acc overwriting dx
    "acc": {"dx accumulated"},
}


class CpuBiasGradLib:
    """The expert backward host functions, plain and with biases, and the biased or plain
    expert_ffn, by reference.py (fp32 NumPy, its hand-written backward): the CPU path's
    semantics. Arguments are taken by gen_ops_harness.py's lists (names, ranks, dtypes);
    `fault` is one of BIAS_GRAD_FAULTS, `missing` host functions the library lacks."""

    def __init__(self, act, bias_forward=False, fault=None, missing=()):
        self.act = CPU_NAMES[act]
        self.code = oc.ACT_CODES[act]
        self.bias_forward = bias_forward
        self.fault = fault
        self.missing = set(missing)
        self.called = set()

    def has(self, name):
        return name not in self.missing

    def _args(self, name, a):
        if self.bias_forward and name in gh.BIAS_OPS:
            spec = gh.BIAS_OPS[name]
        else:
            spec = gh.OPS.get(name) or gh.OPTIONAL_OPS[name]
        assert len(spec) == len(a), name
        args = {}
        for (arg, ty), v in zip(spec, a):
            if ty == "i32":
                assert isinstance(v, int), (name, arg)
                args[arg] = v
                continue
            rank, dtype = HARNESS_TYPES[ty]
            assert v.dim() == rank and v.dtype == dtype, (name, arg, v.shape, v.dtype)
            args[arg] = v
        return args

    def call(self, name, *a):
        assert name == "expert_ffn" or name.startswith(("expert_combine_grad", "expert_ffn_grad"))
        assert self.has(name), name
        self.called.add(name)
        g = self._args(name, a)
        assert g.get("act", self.code) == self.code
        n = {
            k: (v.float() if v.is_floating_point() else v).numpy()
            for k, v in g.items()
            if isinstance(v, torch.Tensor)
        }
        bias = name.startswith("expert_") and "b_gate_up" in g
        if name == "expert_ffn":
            biases = (n["b_gate_up"], n["b_down"]) if bias else ()
            args = [n[k] for k in ("x", "token_ids", "offsets", "wgu", "wd")]
            y, h = ref.expert_ffn(*args, self.act, *biases)
            self._write(g["y"], y)
            self._write(g["h"], h)
            return
        common = [n[k] for k in ("x", "token_ids", "offsets")]
        if name.startswith("expert_combine_grad"):
            args = common + [n[k] for k in ("rows", "weights", "wgu", "wd", "h", "dout")]
            bd = n.get("b_down")  # None in the plain function
            dx, dw, dwgu, dwd, dbgu, dbd = ref.expert_combine_grad(
                *args, self.act, bd=bd, bias=True
            )
            if self.fault == "d_weights":  # without <dout[t], b_down[e]>
                dw = ref.expert_combine_grad(*args, self.act)[1]
            if self.fault == "d_b_down" and bias:
                dbd = self._unweighted_dbd(n)
            self._write(g["d_weights"], dw)
        else:
            dx, dwgu, dwd, dbgu, dbd = ref.expert_ffn_grad(
                *common, n["wgu"], n["wd"], n["h"], n["dy"], self.act, bias=True
            )
        if self.fault == "d_b_gate_up":
            dbgu = np.roll(dbgu, 1, axis=0)
        if name.endswith("_acc") and self.fault != "acc":
            dx = dx + n["dx"]
        self._write(g["dx"], dx)
        self._write(g["d_wgu"], dwgu)
        self._write(g["d_wd"], dwd)
        if bias:
            self._write(g["d_b_gate_up"], dbgu)
            self._write(g["d_b_down"], dbd)

    @staticmethod
    def _unweighted_dbd(n):
        off, tid = n["offsets"], n["token_ids"]
        dbd = np.zeros_like(n["b_down"])
        for e in range(dbd.shape[0]):
            dbd[e] = n["dout"][tid[off[e] : off[e + 1]]].sum(0)
        return dbd

    @staticmethod
    def _write(out, value):
        out.copy_(torch.from_numpy(np.ascontiguousarray(value)).to(out.dtype))


BIAS_GRAD_SHAPES = [
    (37, 128, 128, 4, 2, "random"),
    (37, 64, 192, 6, 2, "skewed"),
    (1, 64, 64, 4, 2, "random"),
    (53, 64, 64, 6, 3, "all-to-one"),
    (300, 64, 64, 8, 2, "dropped"),
]


@pytest.mark.parametrize("forward", [False, True])
@pytest.mark.parametrize("act", ["swiglu", "gelu_erf"])
def test_bias_grad_checks_pass_on_the_cpu_library(act, forward):
    """The autograd references against reference.py's hand-written backward: every shape
    and routing passes, with the dropped slots', empty experts' and bitwise checks run."""
    oc.set_activation(act)
    torch.manual_seed(3)
    lib = CpuBiasGradLib(act, bias_forward=forward)
    for shape in BIAS_GRAD_SHAPES:
        assert oc.run_bias_grad(lib, *shape, forward=forward), shape
        assert oc.run_bias_ffn_grad(lib, *shape, forward=forward), shape
    checks = [r["check"] for r in oc.RESULTS]
    assert all(r["ok"] for r in oc.RESULTS)
    assert any("dropped slots are 0" in c for c in checks)
    assert any("experts without rows are 0" in c for c in checks)
    assert sum("bitwise twice" in c for c in checks) == 2 * len(BIAS_GRAD_SHAPES)
    for what in ("d_b_gate_up", "d_b_down", "d_weights", "dx accumulated"):
        assert any(c.endswith(" " + what) for c in checks), what
    called = {
        "expert_combine_grad_bias",
        "expert_combine_grad_bias_acc",
        "expert_combine_grad",
        "expert_ffn_grad_bias",
        "expert_ffn_grad",
    }
    assert lib.called == called | ({"expert_ffn"} if forward else set())


@pytest.mark.parametrize("fault", sorted(BIAS_GRAD_FAULTS))
def test_a_wrong_bias_gradient_fails_the_checks(fault):
    torch.manual_seed(4)
    lib = CpuBiasGradLib("swiglu", fault=fault)
    assert not oc.run_bias_grad(lib, 37, 128, 128, 4, 2, "random")
    failed = {r["check"].split(" random swiglu ", 1)[1] for r in oc.RESULTS if not r["ok"]}
    assert failed == BIAS_GRAD_FAULTS[fault]


def test_the_ffn_grad_checks_see_a_wrong_d_b_gate_up():
    torch.manual_seed(5)
    lib = CpuBiasGradLib("swiglu", fault="d_b_gate_up")
    assert not oc.run_bias_ffn_grad(lib, 37, 64, 64, 4, 2, "skewed")
    failed = {r["check"].split(" skewed swiglu ", 1)[1] for r in oc.RESULTS if not r["ok"]}
    assert failed == {"d_b_gate_up", "bias gradients of experts without rows are 0"}


def test_a_library_without_the_functions_fails_by_name():
    lib = CpuBiasGradLib("swiglu", missing=("expert_combine_grad_bias_acc",))
    assert not oc.run_bias_grad(lib, 37, 64, 64, 4, 2, "random")
    assert [(r["check"], r["ok"]) for r in oc.RESULTS] == [
        ("bias-grad T=37 d=64 n=64 E=4 k=2 random swiglu expert_combine_grad_bias_acc", False)
    ]
    assert not lib.called
    assert oc.run_bias_ffn_grad(lib, 37, 64, 64, 4, 2, "random")


def test_bias_grad_steps():
    quick = oc.bias_grad_steps(None, True, False)
    full = oc.bias_grad_steps(None, False, True)
    assert all(name.startswith("bias-grad-") for name, _ in full)
    assert {name for name, _ in quick} < {name for name, _ in full}
    assert not any("t1000" in name for name, _ in quick)
    assert any("dropped" in name for name, _ in quick)
    assert any(name.startswith("bias-grad-ffn-") for name, _ in quick)


def test_bias_grad_bench_calls_both_functions(capsys):
    """The bias-grad bench (--only=bias-grad-bench) calls the plain and the biased backward
    with the harness's arguments (the stand-in checks their names, ranks and dtypes) and
    prints their medians."""
    lib = CpuBiasGradLib("swiglu")
    assert oc.bench_bias_grad(lib, 37, 64, 64, 4, 2, reps=2)
    assert lib.called == {"expert_combine_grad", "expert_combine_grad_bias"}
    out = capsys.readouterr().out
    assert "BENCH bias-grad-bench T=37 d=64 n=64 E=4 k=2 swiglu: expert_combine_grad" in out
    (result,) = oc.RESULTS
    assert set(result["ms"]) == {"plain", "bias"} and all(v >= 0 for v in result["ms"].values())


@pytest.mark.parametrize("variant", [None, "gelu_erf"])
def test_main_runs_the_bias_grad_steps(monkeypatch, tmp_path, variant, capsys):
    """ops_check.py --quick --only=bias-grad: the default library's list (H made in torch)
    and a --bias library's (H of its biased expert_ffn) both hold the steps."""
    act = variant or "swiglu"
    lib = CpuBiasGradLib(act, bias_forward=variant is not None)
    monkeypatch.setattr(oc, "Lib", lambda path: lib)
    monkeypatch.setattr(oc, "BIAS", False)
    argv = ["ops_check.py", "--lib", "none.so", "--quick", "--only=bias-grad"]
    if variant:
        configs = ["expert_ffn.up:bias=true", "expert_ffn.down:bias=true"]
        if variant != "swiglu":
            configs += [f"up:b=w_mn:activation={act}", f"dact:activation={act}"]
        (tmp_path / "VARIANT").write_text(_variant(*configs))
        argv += ["--variant", str(tmp_path / "VARIANT")]
    monkeypatch.setattr(sys, "argv", argv)
    assert oc.main() == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out
    steps = oc.bias_grad_steps(None, True, False)
    assert sum(r["check"].endswith(" bitwise twice") for r in oc.RESULTS) == len(steps)
    assert ("expert_ffn" in lib.called) == (variant is not None)
    assert all(r["check"].startswith("bias-grad") for r in oc.RESULTS)


def test_harness_wraps_the_bias_gradients():
    """The backward host functions with biases: the biases after dout (dy), their gradients
    at the end, the rest as the plain function's."""
    for name, plain, after in (
        ("expert_combine_grad_bias", "expert_combine_grad", "dout"),
        ("expert_combine_grad_bias_acc", "expert_combine_grad", "dout"),
        ("expert_ffn_grad_bias", "expert_ffn_grad", "dy"),
    ):
        args = gh.OPTIONAL_OPS[name]
        names = [a for a, _ in args]
        at = names.index(after) + 1
        assert names[at : at + 2] == ["b_gate_up", "b_down"]
        assert names[-2:] == ["d_b_gate_up", "d_b_down"]
        assert args[:at] + args[at + 2 : -2] == gh.OPS[plain]
        assert {t for _, t in args[at : at + 2] + args[-2:]} == {gh.B2}


@pytest.mark.skipif(not os.path.exists(MOE_OPT), reason="needs moe-opt")
@pytest.mark.parametrize("biased", [False, True])
def test_harness_of_the_bias_gradients(tmp_path, biased):
    """Both libraries have the backward host functions with biases, with the parameter types
    the harness's wrappers pass."""
    option = "--moe-gpu-emit-library"
    if biased:
        option += "=configs=expert_ffn.up:bias=true,expert_ffn.down:bias=true"
    lib = subprocess.run(
        [MOE_OPT, option], input=b"module {}", check=True, capture_output=True
    ).stdout.decode()
    for name in (
        "expert_combine_grad_bias",
        "expert_combine_grad_bias_acc",
        "expert_ffn_grad_bias",
    ):
        want = ["!gpu.async.token"] + [t for _, t in gh.OPTIONAL_OPS[name]]
        assert gh.arg_types(lib, name) == want, name
    path = tmp_path / "library.mlir"
    path.write_text(lib)
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "test", "GPU", "gen_ops_harness.py"), str(path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "func.func @op_expert_combine_grad_bias_acc(" in out
    assert "func.func @op_expert_ffn_grad_bias(" in out
