"""bench/ep_capacity.py --quick (2 and 4 ranks, gloo): the drops it measures against the
routing's prediction, the error growing as the capacity falls, the memory following S C, and
the balanced placement receiving fewer rows than the layer's own under skewed routing."""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

import pytest

pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import ep_capacity  # noqa: E402


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("ep_capacity") / "ep_capacity.json"
    assert ep_capacity.main(["--quick", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def _series(report):
    series = defaultdict(list)
    for row in report["rows"]:
        series[(row["ranks"], row["routing"], row["placement"])].append(row)
    for rows in series.values():
        rows.sort(key=lambda r: -r["capacity"])
    return series


def test_drops(report):
    config = report["config"]
    tk = config["tokens"] * config["top_k"]
    series = _series(report)
    assert {k[0] for k in series} == {2, 4}
    for key, rows in series.items():
        assert rows[0]["capacity"] == tk
        for row in rows:
            # What the layer dropped is what its routing predicts: each source-rank pair's
            # rows past the capacity.
            assert row["dropped"] == row["dropped_predicted"], (key, row["capacity"])
            if row["capacity"] >= row["max_pair_rows"]:
                assert row["dropped"] == 0, (key, row["capacity"])
                assert row["out_rel_err"] <= 1e-6 and row["dx_rel_err"] <= 1e-6, key
            else:
                assert row["dropped"] > 0, (key, row["capacity"])
                assert row["out_rel_err"] > 1e-3, (key, row["capacity"])
            assert row["max_received_rows"] <= row["ranks"] * row["capacity"]
        # A smaller capacity drops a superset of the rows: more drops, a larger error.
        for hi, lo in zip(rows, rows[1:]):
            assert lo["dropped"] >= hi["dropped"], key
            assert lo["out_rel_err"] >= hi["out_rel_err"] - 1e-6, key
            assert lo["dx_rel_err"] >= hi["dx_rel_err"] - 1e-6, key
        assert rows[-1]["dropped"] > 0, key  # 1/8 of T k is below the busiest pair


def test_memory_follows_capacity(report):
    d = report["config"]["hidden"]
    for row in report["rows"]:
        s, c = row["ranks"], row["capacity"]
        assert row["recv_bytes"] == s * c * d * 4
        assert row["plan"]["send_block_bytes"] == s * c * d * 4  # moe-plan-memory's
    for rows in _series(report).values():
        peaks = [r["plan"]["stage_peak_bytes"] for r in rows]
        assert peaks == sorted(peaks, reverse=True) and peaks[0] > peaks[-1]


def test_balanced_placement(report):
    series = _series(report)
    for (size, routing, placement), rows in series.items():
        if placement != "balanced" or not routing.startswith("skew"):
            continue
        own = series[(size, routing, "own")]
        # The hot experts no longer share a rank: fewer rows at the busiest rank and pair,
        # and no more drops at any capacity.
        assert rows[0]["max_received_rows"] < own[0]["max_received_rows"], size
        assert rows[0]["max_pair_rows"] < own[0]["max_pair_rows"], size
        for b, o in zip(rows, own):
            assert b["capacity"] == o["capacity"]
            assert b["dropped"] <= o["dropped"], (size, b["capacity"])
        assert any(b["dropped"] < o["dropped"] for b, o in zip(rows, own)), size


def test_table(report, capsys):
    text = ep_capacity.table(report["rows"])
    assert text.count("\n") == len(report["rows"]) + 1
    assert "balanced" in text and "skew0.75" in text


def test_bad_sizes():
    with pytest.raises(SystemExit):
        ep_capacity.main(["--quick", "--sizes", "3"])
