"""Load-aware placement of experts on the ranks of an expert-parallel layer
(docs/distributed.md, Capacity and load).

Rank r of S owns experts `[r * E / S, (r + 1) * E / S)` of whatever numbering the layer's
weights have. Renumbering the experts, i.e. permuting the router's columns (and the selection
bias) together with the experts' weights, leaves the layer's function unchanged (each token
chooses the same experts under other numbers) but changes which rank each expert lives on. A
`Placement` is such a renumbering, chosen from measured expert counts so that the busiest
rank receives as few rows as it can:

    counts = expert_counts(experts, E)              # [E], or [S, E]: one row a source rank
    placement = balanced_placement(counts, S)
    placement.max_rows(counts)                      # rows the busiest rank would receive
    placed = placement.permute(whole_args)          # then shard_experts(placed, S, rank)
    logits = placement.restore_logits(placed_logits)

It is a static re-layout (the weights move once, for the next steps), balanced for the counts it
was given: it helps while routing stays as skewed as when it was measured, and cannot split one
expert's rows over several ranks (that needs replicas, which the layer does not have).
Group-limited routing (`num_groups > 1`) chooses among contiguous blocks of experts, which a
permutation would break: it is refused.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Mapping, Optional

import numpy as np

__all__ = ["Placement", "balanced_placement", "expert_counts", "identity_placement"]


def _counts(counts, experts: Optional[int] = None) -> np.ndarray:
    """`counts` as an int64 [sources, E] array (a vector is one source)."""
    a = np.asarray(counts)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2 or a.shape[1] == 0:
        raise ValueError(f"counts must be [E] or [sources, E], got shape {np.shape(counts)}")
    if not np.issubdtype(a.dtype, np.integer):
        if not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
            raise ValueError("counts must be whole numbers of rows")
    if np.any(a < 0):
        raise ValueError("counts must not be negative")
    if experts is not None and a.shape[1] != experts:
        raise ValueError(f"counts has {a.shape[1]} experts, the placement {experts}")
    return a.astype(np.int64)


def _take(a, index: np.ndarray, axis: int):
    """`a` (numpy array or torch tensor) with `index` taken along `axis`."""
    if isinstance(a, np.ndarray):
        return np.take(a, index, axis=axis)
    import torch  # noqa: PLC0415

    if isinstance(a, torch.Tensor):
        return a.index_select(axis, torch.as_tensor(index, device=a.device))
    return np.take(np.asarray(a), index, axis=axis)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Experts renumbered for `size` ranks: the placed layer's expert j is the original
    expert `order[j]`, so rank r holds the original experts `order[r * E / S : (r + 1) * E / S]`."""

    order: np.ndarray
    size: int

    def __post_init__(self):
        order = np.asarray(self.order)
        experts = order.shape[0] if order.ndim == 1 else 0
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"size must be a positive integer, got {self.size!r}")
        if experts == 0 or experts % self.size != 0:
            raise ValueError(
                f"a placement needs a number of experts that {self.size} ranks divide, "
                f"got order of shape {order.shape}"
            )
        if not np.issubdtype(order.dtype, np.integer) or not np.array_equal(
            np.sort(order), np.arange(experts)
        ):
            raise ValueError("order must be a permutation of 0 .. E - 1")
        object.__setattr__(self, "order", order.astype(np.int64))

    @property
    def experts(self) -> int:
        return int(self.order.shape[0])

    @property
    def inverse(self) -> np.ndarray:
        """`inverse[e]`: the placed number of the original expert e."""
        inv = np.empty_like(self.order)
        inv[self.order] = np.arange(self.experts)
        return inv

    def rank_of(self) -> np.ndarray:
        """[E]: the rank that holds each original expert."""
        return self.inverse // (self.experts // self.size)

    def pair_rows(self, counts) -> np.ndarray:
        """[sources, S]: rows each source sends each rank, from the original experts' counts
        ([E] or [sources, E])."""
        c = _counts(counts, self.experts)
        out = np.zeros((c.shape[0], self.size), np.int64)
        np.add.at(out.T, self.rank_of(), c.T)
        return out

    def loads(self, counts) -> np.ndarray:
        """[S]: rows each rank receives (summed over the sources)."""
        return self.pair_rows(counts).sum(0)

    def max_rows(self, counts) -> int:
        """The rows the busiest rank receives."""
        return int(self.loads(counts).max())

    def max_pair_rows(self, counts) -> int:
        """The most rows one source sends one rank: the smallest per-source capacity that
        drops nothing."""
        return int(self.pair_rows(counts).max())

    def permute(self, args: Mapping[str, object]) -> Dict[str, object]:
        """The whole layer's arguments (by name) in the placed numbering: the router's columns,
        the selection bias and the experts' weights permuted, the rest as given. Numpy arrays
        or torch tensors; cut each rank's experts after (`shard_experts`)."""
        return self._apply(args, self.order)

    def restore(self, values: Mapping[str, object]) -> Dict[str, object]:
        """Whole-layer values in the placed numbering (gradients of w_router, router_bias,
        w_gate_up, w_down; or weights) back in the original numbering."""
        return self._apply(values, self.inverse)

    def restore_logits(self, logits):
        """The placed layer's router logits [T, E] in the original expert order."""
        return _take(logits, self.inverse, -1)

    def restore_experts(self, experts):
        """The placed layer's chosen experts in the original numbering."""
        return self.order[np.asarray(experts)]

    def _apply(self, args: Mapping[str, object], index: np.ndarray) -> Dict[str, object]:
        out = dict(args)
        for name, axis in (("w_router", 1), ("router_bias", 0), ("w_gate_up", 0), ("w_down", 0)):
            value = out.get(name)
            if value is None:
                continue
            if np.shape(value)[axis] != self.experts:
                raise ValueError(
                    f"{name} has {np.shape(value)[axis]} experts on axis {axis}, "
                    f"the placement {self.experts} (pass the whole layer's, not a rank's)"
                )
            out[name] = _take(value, index, axis)
        return out


def identity_placement(experts: int, size: int) -> Placement:
    """The layer's own placement: rank r holds experts [r * E / S, (r + 1) * E / S)."""
    return Placement(np.arange(experts), size)


def expert_counts(experts, num_experts: int) -> np.ndarray:
    """[E]: the (token, slot) pairs that chose each expert; `experts` [T, k] (any shape)."""
    e = np.asarray(experts).reshape(-1)
    if e.size and (e.min() < 0 or e.max() >= num_experts):
        raise ValueError(f"experts holds values outside [0, {num_experts})")
    return np.bincount(e.astype(np.int64), minlength=num_experts)


def _key(pair: np.ndarray):
    load = pair.sum(0)
    return (int(load.max()), int(pair.max()), int((load * load).sum()))


def balanced_placement(counts, size: int, *, num_groups: int = 1) -> Placement:
    """A placement of E experts on `size` ranks (E / size each) that makes the busiest rank's
    received rows small for `counts` ([E], or [sources, E]: the rows each source rank sent
    each expert). Largest experts first, each to the least loaded rank with room; then swaps
    of two experts between the busiest rank and another while they lower (the busiest rank's
    rows, the most rows of one source to one rank, the sum of squared loads). Never worse than
    the layer's own placement on that order: that one is the answer when it is best."""
    if num_groups != 1:
        raise ValueError(
            f"group-limited routing (num_groups = {num_groups}) chooses among contiguous blocks "
            "of experts; a placement would change which experts share a group"
        )
    c = _counts(counts)
    experts = c.shape[1]
    if isinstance(size, bool) or not isinstance(size, int) or size < 1 or experts % size:
        raise ValueError(f"size must be a positive integer dividing {experts}, got {size!r}")
    local = experts // size
    total = c.sum(0)
    rank = np.full(experts, -1, np.int64)
    load = np.zeros(size, np.int64)
    room = np.full(size, local, np.int64)
    for e in sorted(range(experts), key=lambda e: (-int(total[e]), e)):
        free = np.flatnonzero(room > 0)
        r = int(free[np.argmin(load[free])])
        rank[e] = r
        load[r] += total[e]
        room[r] -= 1

    def pairs(rank_of):
        out = np.zeros((c.shape[0], size), np.int64)
        np.add.at(out.T, rank_of, c.T)
        return out

    best = _key(pairs(rank))
    for _ in range(4 * experts * experts):
        loads = pairs(rank).sum(0)
        busiest = int(np.argmax(loads))
        improved = False
        for a in np.flatnonzero(rank == busiest):
            for b in np.flatnonzero(rank != busiest):
                trial = rank.copy()
                trial[a], trial[b] = trial[b], trial[a]
                key = _key(pairs(trial))
                if key < best:
                    rank, best, improved = trial, key, True
                    break
            if improved:
                break
        if not improved:
            break
    identity = np.arange(experts) // local
    if _key(pairs(identity)) <= best:
        rank = identity
    # Placed numbering: rank by rank, each rank's experts in their original order.
    order = np.lexsort((np.arange(experts), rank))
    return Placement(order, size)
