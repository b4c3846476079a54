"""scripts/dev/ablate_generator.py: each timing-only ablation still applies to the generator,
changes the weight-gradient kernels the way its name says and no other kernel, and a
generator it no longer fits is refused with a message."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "dev", "ablate_generator.py")
WGRAD = ("moe_gemm_wgrad_gather", "moe_gemm_wgrad_gather_a")


def load_script():
    spec = importlib.util.spec_from_file_location("ablate_generator_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def library(generator, tmp_path):
    out = tmp_path / (os.path.basename(generator) + ".mlir")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOE_GEMM_")}
    subprocess.run([sys.executable, generator, "-o", str(out)], env=env, check=True)
    return out.read_text()


def kernel_bodies(text):
    heads = list(re.finditer(r"^    gpu\.func @(\w+)\(", text, re.M))
    return {
        m.group(1): text[m.start() : (heads[i + 1].start() if i + 1 < len(heads) else len(text))]
        for i, m in enumerate(heads)
    }


@pytest.fixture(scope="module")
def default_kernels(tmp_path_factory):
    return kernel_bodies(library(load_script().GENERATOR, tmp_path_factory.mktemp("default")))


def ablated(tmp_path, default_kernels, kind):
    """The kernels of ablation `kind`'s library, and the names of those it changed."""
    generator = tmp_path / f"gen_{kind}.py"
    subprocess.run([sys.executable, SCRIPT, kind, str(generator)], check=True)
    kernels = kernel_bodies(library(str(generator), tmp_path))
    assert kernels.keys() == default_kernels.keys()
    return kernels, {name for name in kernels if kernels[name] != default_kernels[name]}


@pytest.mark.parametrize("kind", ["nostore", "nostm", "nowait", "noepi", "nomma"])
def test_ablation_changes_only_the_weight_gradients(tmp_path, default_kernels, kind):
    kernels, changed = ablated(tmp_path, default_kernels, kind)
    # the router's weight gradient (wgrad_rows, no box stores) is a varlen-K GEMM too
    assert set(WGRAD) <= changed <= set(WGRAD) | {"moe_gemm_wgrad_rows"}, changed
    body = kernels["moe_gemm_wgrad_gather_a"]
    default = default_kernels["moe_gemm_wgrad_gather_a"]
    ops = dict(
        stores="nvvm.cp.async.bulk.tensor.global.shared.cta",
        stmatrix="nvvm.stmatrix",
        wgmma="nvvm.wgmma.mma_async",
    )
    counts = {key: body.count(op) for key, op in ops.items()}
    expected = {key: default.count(op) for key, op in ops.items()}
    assert expected["stores"] == 4
    # only these two remove what is counted; nostm and noepi keep it behind a never-true test
    expected.update({"nostore": dict(stores=0), "nomma": dict(wgmma=0)}.get(kind, {}))
    assert counts == expected
    if kind == "nowait":
        assert body.count("nvvm.cp.async.bulk.wait_group 0 {read}") == 0
        assert default.count("nvvm.cp.async.bulk.wait_group 0 {read}") == 1
    if kind in ("nostm", "noepi"):
        # the epilogue (or the staging) behind a test no real value passes, so ptxas keeps
        # the wgmma that feed it
        assert "arith.constant 12345.0 : f32" in body and "arith.cmpf oeq" in body
        assert "arith.constant 12345.0 : f32" not in default


@pytest.mark.parametrize("kind", ["dact-noepi", "dact-nomma"])
def test_dact_ablation_changes_only_the_dswiglu_gemms(tmp_path, default_kernels, kind):
    kernels, changed = ablated(tmp_path, default_kernels, kind)
    assert changed == {"moe_gemm_dact_gather", "moe_gemm_dact_rows"}, changed
    for name in changed:
        body, default = kernels[name], default_kernels[name]
        wgmma = "nvvm.wgmma.mma_async"
        assert default.count(wgmma) > 0
        if kind == "dact-nomma":
            assert body.count(wgmma) == 0
            # the epilogue still reads H and writes dH and w·a (of a zero accumulator)
            assert body.count("vector.store") == default.count("vector.store") > 0
        else:
            assert body.count(wgmma) == default.count(wgmma)
            assert "arith.constant 12345.0 : f32" in body and "arith.cmpf oeq" in body
            assert "arith.constant 12345.0 : f32" not in default


def test_unknown_kind_and_drifted_generator_are_refused(tmp_path):
    proc = subprocess.run(
        [sys.executable, SCRIPT, "nothing", str(tmp_path / "x.py")], capture_output=True, text=True
    )
    assert proc.returncode != 0 and "unknown ablation 'nothing'" in proc.stderr
    assert not (tmp_path / "x.py").exists()
    module = load_script()
    with pytest.raises(SystemExit, match="nostore: the generator has 0 copies"):
        module.ablate("def gen(): pass\n", "nostore")
    proc = subprocess.run([sys.executable, SCRIPT, "nomma"], capture_output=True, text=True)
    assert proc.returncode != 0 and "usage: ablate_generator.py KIND OUT.py" in proc.stderr
