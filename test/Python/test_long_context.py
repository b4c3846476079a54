"""bench/long_context.py (the long-context measurement): the search for the largest token
count under a budget, byte counts, and the plan + prebuild against the compiled layers'
manifests (sm_90a entries, as on the LLVM machine), then the run step on the CPU path."""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import long_context as LC  # noqa: E402


@pytest.mark.parametrize(
    "per_token,fixed,budget,step,hint",
    [
        (1000, 0, 10**6, 8, 16),
        (1000, 5000, 10**6, 8, 100000),
        (3, 7, 100, 1, 1),
        (1000, 0, 999, 1, 4),
        (1, 0, 10**9, 256, 256),
    ],
)
def test_largest_tokens_matches_a_linear_scan(per_token, fixed, budget, step, hint):
    calls = []

    def held(t):
        calls.append(t)
        return fixed + per_token * t

    want = max((t for t in range(step, budget + 2 * step, step) if held(t) <= budget), default=0)
    calls.clear()
    assert LC.largest_tokens(held, budget, step, hint) == want
    assert len(calls) < 80  # a search, not a scan


def test_parse_bytes():
    assert LC.parse_bytes("4GiB") == 4 << 30
    assert LC.parse_bytes("512MiB") == 512 << 20
    assert LC.parse_bytes("1000B") == LC.parse_bytes("1000") == 1000
    for bad in ("4GB", "-1GiB", "0", "many"):
        with pytest.raises(ValueError, match="byte count"):
            LC.parse_bytes(bad)


def test_bad_usage(capsys):
    assert LC.main(["--budget", "4GB", "--run", "x"]) == 2
    assert LC.main(["--prebuild", "a", "--run", "b"]) == 2
    assert LC.main([]) == 2
    assert "one of --prebuild" in capsys.readouterr().err


def test_prebuild_matches_the_compiled_layers_then_runs_on_the_cpu(tmp_path, monkeypatch):
    """The plan's bytes (moe-opt) are the compiled layers' saved tensors + x + outputs, for
    both policies; the run step reads plan.json and runs ours at the planned T (CPU path)."""
    from moe_mlir import compile_cache as cc

    if cc.find_moe_compile() is None:
        pytest.skip("no moe-compile")
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("MOE_MLIR_QUIET", "1")
    monkeypatch.setenv("MOE_MLIR_CACHE", str(tmp_path / "cache"))
    layers = tmp_path / "layers"
    layers.mkdir()
    (layers / "tiny.json").write_text(
        json.dumps(
            {
                "layer": {
                    "T": 64,
                    "d": 64,
                    "n": 64,
                    "E": 4,
                    "k": 2,
                    "scoring": "softmax",
                    "renormalize": True,
                }
            }
        )
    )
    folder = tmp_path / "lc"
    assert (
        LC.main(
            [
                "--prebuild",
                str(folder),
                "--layers",
                str(layers),
                "--only",
                "tiny",
                "--budget",
                "200KiB",
                "--step",
                "8",
            ]
        )
        == 0
    )
    plan = json.loads((folder / "plan.json").read_text())
    tiny = plan["layers"]["tiny"]
    assert plan["budget_bytes"] == 200 << 10
    for policy in LC.POLICIES:
        assert tiny[policy]["held_bytes"] <= 200 << 10 < tiny[policy]["next_held_bytes"]
    # Recomputing H holds fewer bytes a token, so more tokens fit.
    assert tiny["recompute"]["tokens"] > tiny["keep"]["tokens"] > 0
    monkeypatch.delenv("MOE_MLIR_PREBUILT", raising=False)
    assert (
        LC.main(
            [
                "--run",
                str(folder),
                "--device",
                "cpu",
                "--iters",
                "1",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 1
    )  # the default layers are not in the plan
    assert (
        LC.main(
            [
                "--run",
                str(folder),
                "--only",
                "tiny",
                "--device",
                "cpu",
                "--iters",
                "1",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "out" / "long_context.json").read_text())
    keep = report["layers"]["tiny"]["keep"]
    assert keep["tokens"] == tiny["keep"]["tokens"] and keep["median_ms"] > 0
    assert torch is not None
