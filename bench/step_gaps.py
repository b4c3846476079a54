"""Where a GPU step's time goes besides its kernels: one run of a step under the PyTorch
profiler (CPU and CUDA activities, so CUDA runtime and driver API calls too), then per named
part of the step

- host: the part's wall time on the CPU (perf_counter around the call);
- the span of its GPU activities (kernels, copies, memsets), their busy time;
- the idle stretches on the GPU longer than `min_idle_ms` from the part's start to its last
  GPU activity, each with the API calls and ranges the CPU was in meanwhile;
- the API calls that took longest on the host.

Used by test/GPU/ops_check.py (MOE_PROFILE=1: the op sequence of a step) and bench/bench.py
(--gaps: the compiled layer's forward and backward). Lines start with GAPS.
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Sequence, Tuple


def _gpu_activity(e) -> bool:
    # kernels, copies and memsets; not the ranges' own annotations on the GPU timeline
    return (
        e.device_type.name == "CUDA"
        and e.time_range.end > e.time_range.start
        and not e.name.startswith("gaps:")
    )


def _api_call(e) -> bool:
    name = e.name
    return e.device_type.name == "CPU" and (name.startswith("cu") or name.startswith("cuda"))


def report(
    torch,
    label: str,
    parts: Sequence[Tuple[str, Callable[[], Any]]],
    min_idle_ms: float = 0.05,
    top: int = 4,
) -> List[str]:
    """Runs `parts` in order once under the profiler (a synchronization before and after
    each, so each part's GPU work is its own) and prints GAPS lines; returns them."""
    from torch.profiler import ProfilerActivity, profile, record_function

    host_ms = []
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for name, fn in parts:
            with record_function(f"gaps:{name}"):
                t0 = time.perf_counter()
                fn()
                host_ms.append((time.perf_counter() - t0) * 1e3)
                torch.cuda.synchronize()
    events = list(prof.events())
    ranges = {
        e.name[5:]: e for e in events if e.device_type.name == "CPU" and e.name.startswith("gaps:")
    }
    gpu = sorted((e for e in events if _gpu_activity(e)), key=lambda e: e.time_range.start)
    api = [e for e in events if _api_call(e)]
    lines = []
    for (name, _), host in zip(parts, host_ms):
        rng = ranges.get(name)
        if rng is None:
            continue
        lo, hi = rng.time_range.start, rng.time_range.end
        mine = [e for e in gpu if lo <= e.time_range.start < hi]
        calls = [e for e in api if lo <= e.time_range.start < hi]
        if not mine:
            lines.append(f"GAPS {label} {name}: host {host:.3f} ms, no GPU activity")
            continue
        first, last = mine[0].time_range.start, max(e.time_range.end for e in mine)
        busy = sum(e.time_range.end - e.time_range.start for e in mine) / 1e3
        lines.append(
            f"GAPS {label} {name}: host {host:.3f} ms; {len(mine)} GPU activities, "
            f"first {(first - lo) / 1e3:.3f} ms after the call began, span "
            f"{(last - first) / 1e3:.3f} ms, busy {busy:.3f} ms; the call returned "
            f"{(lo + host * 1e3 - last) / 1e3:+.3f} ms after the GPU's last activity"
        )
        lines.append(
            f"GAPS {label} {name}:   timeline (ms from the call's start): "
            + ", ".join(
                f"{e.name[:28]} {(e.time_range.start - lo) / 1e3:.3f}+"
                f"{(e.time_range.end - e.time_range.start) / 1e3:.3f}"
                for e in mine[:16]
            )
        )
        # idle stretches: from the call's start to the first activity, then between
        idle = []
        cursor, before = lo, "(call start)"
        for e in mine:
            if e.time_range.start - cursor > min_idle_ms * 1e3:
                idle.append((cursor, e.time_range.start, before, e.name))
            if e.time_range.end > cursor:
                cursor, before = e.time_range.end, e.name
        idle.sort(key=lambda s: s[0] - s[1])
        for a, b, after, nxt in idle[:top]:
            during = sorted(
                (
                    (min(b, c.time_range.end) - max(a, c.time_range.start), c.name)
                    for c in calls
                    if c.time_range.start < b and c.time_range.end > a
                ),
                reverse=True,
            )[:top]
            lines.append(
                f"GAPS {label} {name}:   idle {(b - a) / 1e3:.3f} ms after {after[:40]} "
                f"before {nxt[:40]}; host in: "
                + (", ".join(f"{n} {t / 1e3:.3f} ms" for t, n in during) or "no API call")
            )
        slow = sorted(calls, key=lambda c: c.time_range.start - c.time_range.end)[:top]
        totals = {}
        for c in calls:
            t, n = totals.get(c.name, (0.0, 0))
            totals[c.name] = (t + (c.time_range.end - c.time_range.start) / 1e3, n + 1)
        lines.append(
            f"GAPS {label} {name}:   longest API calls: "
            + ", ".join(
                f"{c.name} {(c.time_range.end - c.time_range.start) / 1e3:.3f} ms" for c in slow
            )
            + "; totals: "
            + ", ".join(
                f"{n} {t:.3f} ms/{k}"
                for n, (t, k) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
            )
        )
    for line in lines:
        print(line, flush=True)
    return lines
