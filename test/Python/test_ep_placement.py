"""moe_mlir.ep_placement: balanced placements of experts on ranks, and the layer renumbered by
one computing the same function (the single-process CPU layer, random data)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from moe_mlir import cpu
from moe_mlir.config import LayerConfig
from moe_mlir.distributed import shard_experts
from moe_mlir.ep_placement import (
    Placement,
    balanced_placement,
    expert_counts,
    identity_placement,
)


def _optimum(counts: np.ndarray, size: int) -> int:
    """The smallest busiest-rank load over every split of the experts (small E only)."""
    experts = counts.shape[-1]
    local = experts // size
    total = np.asarray(counts).reshape(-1, experts).sum(0)
    best = None

    def split(left, loads):
        nonlocal best
        if not left:
            worst = max(loads)
            best = worst if best is None else min(best, worst)
            return
        first, rest = left[0], left[1:]
        for others in itertools.combinations(rest, local - 1):
            group = (first, *others)
            remaining = [e for e in rest if e not in others]
            split(remaining, [*loads, int(total[list(group)].sum())])

    split(list(range(experts)), [])
    return best


@pytest.mark.parametrize("size", [2, 4])
def test_balanced_against_optimum(size):
    rng = np.random.default_rng(size)
    for _ in range(20):
        counts = rng.integers(0, 50, (size, 8)) + rng.integers(0, 300, (size, 8)) * (
            rng.random(8) < 0.25
        )
        p = balanced_placement(counts, size)
        own = identity_placement(8, size)
        assert sorted(p.order.tolist()) == list(range(8))
        assert np.bincount(p.rank_of(), minlength=size).tolist() == [8 // size] * size
        assert p.loads(counts).sum() == counts.sum()
        assert p.pair_rows(counts).sum(1).tolist() == counts.sum(1).tolist()
        best = _optimum(counts, size)
        assert best <= p.max_rows(counts) <= own.max_rows(counts)
        assert p.max_rows(counts) <= best + counts.sum(0).max()  # greedy's bound
        assert p.max_rows(counts) <= 1.1 * best


def test_hot_experts_split():
    # Experts 0 and 1 (rank 0's of 4) take most rows: the placement puts them apart.
    counts = np.array([400, 380, 10, 12, 9, 11, 8, 10])
    p = balanced_placement(counts, 4)
    assert p.rank_of()[0] != p.rank_of()[1]
    assert p.max_rows(counts) == 400 + 8
    assert identity_placement(8, 4).max_rows(counts) == 780
    # Balanced counts keep the layer's own placement.
    even = np.full(8, 10)
    assert balanced_placement(even, 4).order.tolist() == list(range(8))


def test_placement_mappings():
    p = Placement(np.array([3, 0, 2, 1]), 2)  # rank 0: experts 3, 0; rank 1: 2, 1
    assert p.inverse.tolist() == [1, 3, 2, 0]
    assert p.rank_of().tolist() == [0, 1, 1, 0]
    counts = np.array([[5, 1, 2, 7], [1, 1, 1, 1]])
    assert p.pair_rows(counts).tolist() == [[12, 3], [2, 2]]
    assert p.max_pair_rows(counts) == 12
    assert p.restore_experts(np.array([[0, 1]])).tolist() == [[3, 0]]
    assert expert_counts(np.array([[0, 3], [3, 1]]), 4).tolist() == [1, 1, 0, 2]


def test_bad_input():
    with pytest.raises(ValueError, match="permutation"):
        Placement(np.array([0, 0, 1, 2]), 2)
    with pytest.raises(ValueError, match="ranks divide"):
        Placement(np.arange(6), 4)
    with pytest.raises(ValueError, match="size must be a positive integer"):
        balanced_placement(np.ones(8), 3)
    with pytest.raises(ValueError, match="negative"):
        balanced_placement(np.array([1, -1]), 2)
    with pytest.raises(ValueError, match="whole numbers"):
        balanced_placement(np.array([1.5, 1.0]), 2)
    with pytest.raises(ValueError, match="group-limited"):
        balanced_placement(np.ones(8), 2, num_groups=2)
    with pytest.raises(ValueError, match="outside"):
        expert_counts(np.array([[0, 8]]), 8)
    p = identity_placement(8, 2)
    with pytest.raises(ValueError, match="has 4 experts"):
        p.pair_rows(np.ones(4))
    with pytest.raises(ValueError, match="not a rank's"):
        p.permute({"w_gate_up": np.zeros((4, 2, 2))})


CONFIG = LayerConfig(
    tokens=24, hidden=16, ffn=12, experts=8, top_k=2, renormalize=True, router_bias=True
)


@pytest.fixture(scope="module")
def layer():
    return cpu.CompiledLayer(CONFIG, "moe_layer")


def test_placed_layer_is_the_layer(layer):
    """The layer with its experts renumbered: out equal within rounding (the softmax sums
    its columns in another order), the logits and every gradient the same once restored."""
    rng = np.random.default_rng(7)
    d, n, e = CONFIG.hidden, CONFIG.ffn, CONFIG.experts
    args = {
        "x": rng.normal(0, 1, (CONFIG.tokens, d)).astype(np.float32),
        "w_router": rng.normal(0, 0.3, (d, e)).astype(np.float32),
        "router_bias": rng.normal(0, 0.1, e).astype(np.float32),
        "w_gate_up": rng.normal(0, 0.3, (e, d, 2 * n)).astype(np.float32),
        "w_down": rng.normal(0, 0.3, (e, n, d)).astype(np.float32),
    }
    d_out = rng.normal(0, 1, (CONFIG.tokens, d)).astype(np.float32)
    d_logits = rng.normal(0, 0.1, (CONFIG.tokens, e)).astype(np.float32)
    out, logits, saved = layer.forward(args)
    grads = layer.backward(saved, d_out, d_logits)

    p = Placement(np.array([5, 2, 7, 0, 1, 6, 3, 4]), 2)
    placed = p.permute(args)
    # Rank 0 of the placed layer holds the original experts 5, 2, 7, 0.
    np.testing.assert_array_equal(
        shard_experts(placed, 2, 0)["w_down"], args["w_down"][[5, 2, 7, 0]]
    )
    p_out, p_logits, p_saved = layer.forward(placed)
    p_grads = p.restore(layer.backward(p_saved, d_out, d_logits[:, p.order]))

    def rel(a, b):
        return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))

    assert rel(p_out, out) <= 1e-6
    np.testing.assert_array_equal(p.restore_logits(p_logits), logits)
    for name, grad in grads.items():
        assert rel(p_grads[name], grad) <= 1e-5, name


def test_torch_tensors():
    torch = pytest.importorskip("torch")
    p = Placement(np.array([1, 0, 3, 2]), 2)
    w = torch.arange(12.0).reshape(3, 4)
    placed = p.permute({"w_router": w})["w_router"]
    assert placed[:, 0].tolist() == w[:, 1].tolist()
    assert torch.equal(p.restore({"w_router": placed})["w_router"], w)
    assert torch.equal(p.restore_logits(placed), w)
