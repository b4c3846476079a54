"""moe-plan-memory: the memory report of a training step is consistent (no two buffers of an
arena live at one op share a byte, the peak and the saved total add up) for every activation plan, on small
layers and on the example models; memory_plot turns the report into a PNG."""

import importlib.util
import os
import re

import pytest

from moe_mlir import cpu
from moe_mlir.config import LayerConfig
from moe_mlir.memory_plot import MatplotlibMissing, parse_report, parse_reports, plot_memory_report
from moe_mlir.mlir_text import layer_mlir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")
REQUIRED_PASSES = ("moe-plan-memory", "moe-offload", "moe-plan-activations")
POLICIES = ("keep", "recompute", "offload")


@pytest.fixture(scope="module", autouse=True)
def _require_passes():
    ok, missing = cpu.moe_opt_has_passes(*REQUIRED_PASSES)
    if not ok:
        pytest.skip("moe-opt --help does not list " + ", ".join(f"--{m}" for m in missing))


def plan(text, policy, alignment=256, budget=None):
    """(report text, moe.saved_bytes of the plan, bytes of x) of `text` through the pipeline."""
    options = f"policy={policy} report=false" + (f" memory-budget={budget}" if budget else "")
    passes = (
        "--moe-decompose",
        f"--moe-plan-activations={options}",
        "--moe-generate-backward",
        "--moe-offload",
        f"--moe-plan-memory=memory-report=- alignment={alignment}",
    )
    out = cpu.run_opt(text, passes)
    report = out[: out.index("module")]
    saved_bytes = int(re.search(r"moe\.saved_bytes = (\d+)", out).group(1))
    return report, saved_bytes


def x_bytes(text):
    """Bytes of the first argument (x) of the first function."""
    m = re.search(r"%\w+: tensor<(\d+)x(\d+)x(bf16|f16|f32)>", text)
    size = {"bf16": 2, "f16": 2, "f32": 4}[m.group(3)]
    return int(m.group(1)) * int(m.group(2)) * size


CONFIGS = [
    LayerConfig(tokens=37, hidden=48, ffn=40, experts=5, top_k=2, renormalize=True, shared_ffn=24),
    LayerConfig(tokens=64, hidden=32, ffn=16, experts=8, top_k=1),
    LayerConfig(tokens=5, hidden=8, ffn=8, experts=3, top_k=3, renormalize=True),
]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"T{c.tokens}E{c.experts}k{c.top_k}")
@pytest.mark.parametrize("alignment", [1, 256])
def test_small_layers(config, policy, alignment):
    text = layer_mlir(config, "layer")
    report_text, saved_bytes = plan(text, policy, alignment)
    reports = parse_reports(report_text)
    assert len(reports) == 1  # the pair; the source function is not a step of its own
    report = reports[0]
    report.check()
    assert report.forward == "layer_forward" and report.backward == "layer_backward"
    assert report.alignment == alignment
    # Each function's temporaries in its own arena; what it returns is the caller's.
    assert set(report.arenas) == {"layer_forward", "layer_backward"}
    assert report.in_arenas and all(b.offset is not None for b in report.in_arenas)
    # The saved buffers hold what the activation plan counts, less x (an argument).
    assert report.saved + x_bytes(text) == saved_bytes
    h = [b for b in report.buffers if b.name.endswith(".h")]
    if policy == "keep":
        assert h and all(b.saved for b in h)
        assert report.offloaded == 0
    elif policy == "recompute":
        assert not any(b.saved for b in h)
        assert "moe.checkpoint" not in report.ops
    else:
        assert report.host and report.offloaded == sum(b.size for b in h)
        # An offloaded h and a prefetched one are allocated apart: their copies run on
        # another stream.
        assert all(b.place == "apart" for b in h)
        assert all(b.place == "apart" for b in report.buffers if b.name == "moe.prefetch")
        for b in report.host:
            assert report.ops[b.first] == "moe.offload"
            assert report.ops[b.last] == "moe.prefetch"


@pytest.mark.parametrize("example", sorted(f for f in os.listdir(EXAMPLES) if f.endswith(".mlir")))
def test_example_models(example):
    with open(os.path.join(EXAMPLES, example)) as f:
        text = f.read()
    results = {}
    for policy in POLICIES:
        report_text, saved_bytes = plan(text, policy)
        report = parse_report(report_text)
        report.check()
        assert report.saved + x_bytes(text) == saved_bytes
        results[policy] = report
    keep, recompute, offload = (results[p] for p in POLICIES)
    # Recompute and offload keep the same on the device between forward and backward.
    assert recompute.saved == offload.saved < keep.saved
    assert offload.offloaded == keep.saved - offload.saved


def test_mixtral_numbers():
    """The numbers docs/memory.md quotes."""
    with open(os.path.join(EXAMPLES, "mixtral-8x7b.mlir")) as f:
        text = f.read()
    saved = {p: plan(text, p)[1] for p in POLICIES}
    assert saved == {"keep": 2014314532, "recompute": 135266340, "offload": 135266340}


def test_dynamic_tokens_plan_at_the_bound():
    """A layer of dynamic T with max_tokens = 64: the plan of the static layer of T = 64, each
    buffer that follows T with its bytes a token."""
    from moe_mlir.config import LayerConfig

    config = LayerConfig(tokens=64, hidden=32, ffn=16, experts=8, top_k=2, shared_ffn=24)
    fixed = layer_mlir(config, "layer")
    dynamic = fixed.replace("tensor<64x", "tensor<?x").replace(
        "activation = #moe.activation", "max_tokens = 64, activation = #moe.activation"
    )
    for policy in POLICIES:
        reports = []
        for text in (fixed, dynamic):
            report_text, _ = plan(text, policy)
            report = parse_report(report_text)
            report.check()
            reports.append(report)
        static, bounded = reports
        assert static.bound is None and bounded.bound == 64
        assert (bounded.peak, bounded.arenas, bounded.saved) == (
            static.peak,
            static.arenas,
            static.saved,
        )
        for a, b in zip(static.buffers, bounded.buffers):
            assert (a.name, a.size, a.offset, a.place) == (b.name, b.size, b.offset, b.place)
            # What follows T is `tokens x rows a token` at the bound.
            assert b.per_token == 0 or b.size == 64 * b.per_token
        assert any(b.per_token for b in bounded.buffers)


def test_a_report_that_overlaps_fails_the_check():
    report = parse_report(
        "moe-plan-memory: forward @f ops [0, 2], alignment 1 B\n"
        "op 0 a\nop 1 b\nop 2 func.return\n"
        "buffer 0 a: 8 B at offset 0 in @f, live [0, 1]\n"
        "buffer 1 b: 8 B at offset 4 in @f, live [1, 2]\n"
        "buffer 2 c: 8 B returned, live [1, 2]\n"
        "peak: 24 B (2e-08 GiB) at op 1\narena @f: 12 B (1e-08 GiB)\n"
    )
    with pytest.raises(AssertionError, match="overlap"):
        report.check()


@pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="matplotlib is not installed"
)
def test_png_timeline(tmp_path):
    text = layer_mlir(CONFIGS[0], "layer")
    report_text, _ = plan(text, "offload")
    path = plot_memory_report(report_text, str(tmp_path / "memory.png"))
    with open(path, "rb") as f:
        head = f.read(8)
    assert head == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(path) > 10000


def test_png_without_matplotlib_names_it(monkeypatch, tmp_path):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MatplotlibMissing, match="matplotlib"):
        plot_memory_report(
            "moe-plan-memory: forward @f ops [0, 0], alignment 1 B\nop 0 func.return\n"
            "peak: 0 B (0 GiB) at op 0\narena @f: 0 B (0 GiB)\n",
            str(tmp_path / "x.png"),
        )


def test_plot_plan_of_a_layer(tmp_path):
    """moe_mlir.memory: the plan of a layer, its step's memory report and the PNG."""
    pytest.importorskip("matplotlib")
    from moe_mlir.config import LayerConfig
    from moe_mlir.memory import memory_report, plan_activations, plot_plan

    cfg = LayerConfig(64, 64, 32, 4, 2, renormalize=True)
    keep = plan_activations(cfg, policy="keep")
    recompute = plan_activations(cfg, policy="recompute")
    assert recompute.planned_bytes < keep.planned_bytes
    text = memory_report(recompute)
    assert "peak" in text
    png = plot_plan(recompute, str(tmp_path / "plan.png"))
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
