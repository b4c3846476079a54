#!/usr/bin/env python3
"""How much of the varlen-M GEMMs' rows is padding under the bench's routing.

Replays test/GPU/ops_check.py's bench recipe for one benchmark configuration on the CPU
(x ~ N(0, 1) and W_r ~ N(0, 0.02) in bf16, bias ~ U(0, 0.1) with sigmoid scoring, the
group-limited top-k of the reference), so the draws are the CPU generator's, not the
GPU's, and counts the rows that 128-row M-tiles hold, and 128-row tiles with a 64-row
last tile where at most 64 rows are left (docs/gpu-kernels.md).

    python3 bench/routing_padding.py [deepseek-v3|qwen3-30b-a3b|olmoe-1b-7b|mixtral-8x7b]
"""

import sys

import torch

CONFIGS = {  # T, d, E, k, sigmoid, groups, topk_groups (docs/benchmarks.md)
    "mixtral-8x7b": (16384, 4096, 8, 2, False, 1, 1),
    "olmoe-1b-7b": (16384, 2048, 64, 8, False, 1, 1),
    "qwen3-30b-a3b": (16384, 2048, 128, 8, False, 1, 1),
    "deepseek-v3": (8192, 7168, 256, 8, True, 8, 4),
}


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "deepseek-v3"
    if name not in CONFIGS:
        sys.exit(f"routing_padding.py: unknown configuration {name!r}; one of {', '.join(CONFIGS)}")
    T, d, E, k, sigmoid, G, TG = CONFIGS[name]
    torch.manual_seed(0)
    x = torch.randn(T, d).bfloat16().float()
    wr = (torch.randn(d, E) * 0.02).bfloat16().float()
    logits = x @ wr
    c = torch.sigmoid(logits) + torch.rand(E) * 0.1 if sigmoid else torch.softmax(logits, -1)
    if G > 1:
        size = E // G
        scores = c.view(T, G, size).topk(min(2, size), dim=-1).values.sum(-1)
        keep = torch.zeros(T, G, dtype=torch.bool)
        keep.scatter_(1, scores.topk(TG, dim=-1).indices, True)
        c = c.masked_fill(~keep.repeat_interleave(size, 1), float("-inf"))
    counts = torch.bincount(c.topk(k, dim=-1).indices.flatten(), minlength=E)
    tokens = T * k
    full = int(((counts + 127) // 128 * 128).sum())
    rem = counts % 128
    tails = int(
        (counts // 128 * 128 + torch.where(rem == 0, 0, torch.where(rem <= 64, 64, 128))).sum()
    )
    print(f"{name}: {tokens} rows, {int(counts.min())}-{int(counts.max())} an expert")
    print(f"  128-row tiles: {full} rows, {100 * (full - tokens) / full:.1f}% padding")
    print(f"  64-row last tiles: {tails} rows, {100 * (tails - tokens) / tails:.1f}% padding")


if __name__ == "__main__":
    main()
