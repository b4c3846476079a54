"""bench/ep_chunks.py --quick: a step in chunks against the unchunked step on 2 and 4 gloo
ranks (CPU), and what the plan of a chunk holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quick_run(tmp_path):
    out = tmp_path / "ep_chunks.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "ep_chunks.py"), "--quick", "--out", out],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    for size in (2, 4):
        one, four = (
            next(r for r in rows if r["ranks"] == size and r["chunks"] == c) for c in (1, 4)
        )
        for row in (one, four):
            assert row["bitwise"] and row["grad_rel"] <= 1e-5, row
        # A chunk's blocks: S * C rows of a quarter of the step's capacity.
        assert four["capacity"] * 4 == one["capacity"]
        assert (
            four["send_block_bytes"] * 4
            == one["send_block_bytes"]
            == size * one["capacity"] * 16 * 4
        )
        assert four["stage_peak_bytes"] < one["stage_peak_bytes"]
    assert "PASS" in proc.stdout
