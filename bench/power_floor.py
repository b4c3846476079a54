"""What the H200's power cap leaves a layer step: a floor for its time from energy.

Every long GEMM on the H200 runs at its power cap (docs/results.md, "The power cap"): the dense
matmul itself slows by about a sixth after a few seconds, and a step's time follows its
energy more than its stalls. The time floor of docs/benchmarks.md (the useful FLOPs at the
short-run ceiling) ignores that, and ignores the bytes a step must move through DRAM. This
measures, in one process, each part back to back for SECONDS after as long of warm-up:

  idle    the board's power with nothing running, P0;
  matmul  the 8192^3 bf16 matmul: its sustained rate F_mm (TFLOP/s) and power, P_cap;
  dram    a 1 GiB copy into another buffer: bytes moved (read + write) a second, B_dram,
          and power, P_dram;
  l2      the same with 16 MiB buffers, which stay in L2 (64 copies a CUDA graph, so that
          launch gaps do not dilute the power): B_l2, P_l2;
  both    the matmul and the DRAM copy on two streams at once: each one's rate while both
          run, and the power.

The linear model  P = P0 + a F + c S + d D  (F TFLOP/s, S GB/s through the SMs, D GB/s of
DRAM): a = (P_cap - P0) / F_mm, c = (P_l2 - P0) / B_l2, c + d = b = (P_dram - P0) / B_dram.
A GEMM's operands already pass through the SMs in the matmul's a, so what a step's DRAM
bytes add is d a GB, and a step of F TFLOP and D GB at the cap takes at least

    T_floor = F / F_mm + D / B_eff,   B_eff = (P_cap - P0) / d,

the DRAM bytes' energy paid in matmul time. F / F_mm alone is the strict floor (nothing
does FLOPs more cheaply than the dense matmul); D at the copy's whole cost b, not d, gives
the upper estimate (floor_copy). `both` tests the linear model: at the cap its rates give
F_both / F_mm + B_both b / (P_cap - P0) = 1 (model_check). P0 is the idle power, a lower
bound of a busy GPU's static power, which makes b, d and the floors larger.

The bytes B no implementation of the benchmark step avoids (bf16): the expert weights read in
forward and again in backward and their gradients written (3 |W|, |W| = 6 E d n, plus a
shared expert's 3 * 6 d m), the saved H written and read (2 * 4 T k n), and x, the output,
its gradient and x's gradient once each (4 * 2 T d). L2 (50 MB) holds none of them.

    python3 bench/power_floor.py [--seconds S] [--json PATH] [--bench-json BENCH.JSON]
                                 [--measured FLOOR.JSON]

--bench-json takes bench/bench.py's JSON of the same GPU and prints each layer's time,
and the best peer's, against its floor; --measured reports on the measurements of an
earlier --json instead of measuring (no GPU needed). Lines start with FLOOR.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench import best_peer_ms, useful_flops  # noqa: E402

# The benchmark configurations (docs/benchmarks.md): T, d, n, E, k, and the shared expert's
# width m (deepseek-v3's DeepseekV3MoE; its routed-only layer is "deepseek-v3-routed", bench.py's
# name)
CONFIGS = {
    "mixtral-8x7b": (16384, 4096, 14336, 8, 2, 0),
    "olmoe-1b-7b": (16384, 2048, 1024, 64, 8, 0),
    "qwen3-30b-a3b": (16384, 2048, 768, 128, 8, 0),
    "deepseek-v3": (8192, 7168, 2048, 256, 8, 2048),
    "deepseek-v3-routed": (8192, 7168, 2048, 256, 8, 0),
}
MATMUL_SIZE = 8192
DRAM_BYTES = 1 << 30
L2_BYTES = 16 << 20
L2_REPEAT = 64


def step_work(T: int, d: int, n: int, E: int, k: int, m: int = 0) -> Dict[str, float]:
    """The useful FLOPs of one forward + backward (bench.py's useful_flops) and the DRAM
    bytes no implementation avoids (the module docstring), as TFLOP and GB."""
    flops = useful_flops(T, d, n, E, k, m)
    weights = 6.0 * E * d * n + 6.0 * d * m
    nbytes = 3 * weights + 2 * (4.0 * T * k * n) + 4 * (2.0 * T * d)
    return {"tflop": flops / 1e12, "gb": nbytes / 1e9, "weights_gb": weights / 1e9}


def calibrate(
    idle_w: float, matmul: Dict[str, float], dram: Dict[str, float], l2: Dict[str, float]
) -> Dict[str, float]:
    """The linear power model from the idle power and the matmul's and the two copies' rates
    and powers (tflops, gbps, watts)."""
    p0, p_cap = idle_w, matmul["watts"]
    for name, r in (("matmul", matmul), ("DRAM copy", dram), ("L2 copy", l2)):
        if not r["watts"] > p0:
            raise ValueError(
                f"the {name} ({r['watts']:.0f} W) must draw more than idle ({p0:.0f} W)"
            )
    a = (p_cap - p0) / matmul["tflops"]  # W per TFLOP/s = J per TFLOP
    b = (dram["watts"] - p0) / dram["gbps"]  # J per GB copied through DRAM
    c = (l2["watts"] - p0) / l2["gbps"]  # J per GB copied within L2
    if not b > c:
        raise ValueError(
            f"a GB copied through DRAM ({b * 1e3:.1f} mJ) must cost more than one "
            f"within L2 ({c * 1e3:.1f} mJ)"
        )
    return {
        "p0_w": p0,
        "p_cap_w": p_cap,
        "j_per_tflop": a,
        "j_per_gb_copy": b,
        "j_per_gb_l2": c,
        "j_per_gb_dram": b - c,
        "f_mm_tflops": matmul["tflops"],
        "b_eff_gbps": (p_cap - p0) / (b - c),
        "b_eff_copy_gbps": (p_cap - p0) / b,
        "b_dram_gbps": dram["gbps"],
    }


def floor_ms(work: Dict[str, float], model: Dict[str, float]) -> Dict[str, float]:
    """T_floor of a step's work under the model and its two parts, the upper estimate with
    the DRAM bytes at the copy's whole cost, and the classic roofline floor max(compute,
    DRAM at its full rate)."""
    compute = work["tflop"] / model["f_mm_tflops"] * 1e3
    dram = work["gb"] / model["b_eff_gbps"] * 1e3
    copy = work["gb"] / model["b_eff_copy_gbps"] * 1e3
    roofline = max(compute, work["gb"] / model["b_dram_gbps"] * 1e3)
    return {
        "floor_ms": compute + dram,
        "compute_ms": compute,
        "dram_ms": dram,
        "floor_copy_ms": compute + copy,
        "roofline_ms": roofline,
    }


def model_check(both: Dict[str, float], model: Dict[str, float]) -> float:
    """F_both / F_mm + B_both b / (P_cap - P0): 1 when the concurrent run of the matmul and
    the DRAM copy sits on the model's line."""
    return both["tflops"] / model["f_mm_tflops"] + both["gbps"] / model["b_eff_copy_gbps"]


def window_rates(
    done_ms: Sequence[Sequence[float]], work_per_op: Sequence[float]
) -> Dict[str, Any]:
    """Streams that ran at once: done_ms[s] are stream s's ops' completion times (ms from a
    common start, in order). Within the window until the first stream ran out of work, each
    stream's rate is its completed ops' work over the window (a partial op not counted)."""
    if not done_ms or any(not t for t in done_ms):
        raise ValueError("every stream needs completed ops")
    window = min(t[-1] for t in done_ms)
    rates = [
        sum(1 for x in t if x <= window) * w / (window * 1e-3) for t, w in zip(done_ms, work_per_op)
    ]
    return {"window_ms": window, "rates": rates}


def against_floor(bench: Dict[str, Any], model: Dict[str, float]) -> List[Dict[str, Any]]:
    """Each layer of bench.py's JSON: its floor, ours and the best peer's time (HF, or
    Liger where it ran and was faster) as fractions of it, and the time a 1.3x margin over
    that peer asks for, as a fraction of the floor (above 1: below the floor)."""
    rows = []
    for entry in bench.get("configs", []):
        name = entry.get("name")
        if name not in CONFIGS or "ours" not in entry:
            continue
        work = step_work(*CONFIGS[name])
        fl = floor_ms(work, model)
        ours = entry["ours"]["median_ms"]
        best = best_peer_ms(entry)
        row = {
            "name": name,
            **work,
            **fl,
            "ours_ms": ours,
            "ours_of_floor": fl["floor_ms"] / ours,
            "ours_of_compute_floor": fl["compute_ms"] / ours,
        }
        if best is not None:
            row.update(
                best_peer_ms=best,
                peer_of_floor=fl["floor_ms"] / best,
                ratio=best / ours,
                ratio_max=best / fl["floor_ms"],
                target_1_3x_of_floor=fl["floor_ms"] / (best / 1.3),
            )
        rows.append(row)
    return rows


class MeasureError(RuntimeError):
    """What measure_gpu needs is not there (a GPU, NVML's energy counter)."""


def measure_gpu(seconds: float) -> Dict[str, Any]:
    try:
        import torch
    except ImportError as e:
        raise MeasureError(
            f"no PyTorch here ({e}; --measured reports on an earlier run's JSON)"
        ) from e
    import energy

    if not torch.cuda.is_available():
        raise MeasureError("no CUDA GPU here (--measured reports on an earlier run's JSON)")
    dev = torch.device("cuda")
    try:
        meter = energy.NvmlEnergy(int(os.environ.get("MOE_NVML_INDEX", "0")))
    except energy.EnergyUnavailable as e:
        raise MeasureError(f"no energy counter: {e}") from e
    sync = torch.cuda.synchronize
    out: Dict[str, Any] = {"device": torch.cuda.get_device_name(dev), "seconds": seconds}

    torch.cuda.synchronize()
    time.sleep(1.0)
    e0, t0 = meter.millijoules(), time.perf_counter()
    time.sleep(seconds)
    out["idle_w"] = (meter.millijoules() - e0) / 1e3 / (time.perf_counter() - t0)

    a = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=dev, dtype=torch.bfloat16)
    b = torch.randn(MATMUL_SIZE, MATMUL_SIZE, device=dev, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    mm_tflop = 2.0 * MATMUL_SIZE**3 / 1e12

    def matmul():
        torch.matmul(a, b, out=c)

    def copier(nbytes, repeat=1):
        """a copy of nbytes into another buffer; repeat > 1: that many in one CUDA graph"""
        src = torch.randint(0, 255, (nbytes,), device=dev, dtype=torch.uint8)
        dst = torch.empty_like(src)
        if repeat == 1:
            return lambda: dst.copy_(src)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            dst.copy_(src)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(repeat):
                dst.copy_(src)
        return graph.replay

    dram, l2 = copier(DRAM_BYTES), copier(L2_BYTES, L2_REPEAT)

    def run(fn, gb_per_call=0.0, tflop=None):
        energy.measure(fn, seconds, meter, sync)  # warm-up: to the cap
        r = energy.measure(fn, seconds, meter, sync, tflop_per_call=tflop)
        r["tflops"] = tflop / (r["ms_per_call"] * 1e-3) if tflop else 0.0
        r["gbps"] = gb_per_call / (r["ms_per_call"] * 1e-3)
        if gb_per_call:
            r["joules_per_gb"] = r["joules_per_call"] / gb_per_call
        return r

    out["matmul"] = run(matmul, tflop=mm_tflop)
    out["dram"] = run(dram, gb_per_call=2 * DRAM_BYTES / 1e9)
    out["l2"] = run(l2, gb_per_call=2 * L2_BYTES * L2_REPEAT / 1e9)

    # both at once: two streams fed in turn so each has about as much work queued; events
    # after every op give each stream's progress inside the window where both ran
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    fns, per_op = [matmul, dram], [mm_tflop, 2 * DRAM_BYTES / 1e9]
    solo_ms = [out["matmul"]["ms_per_call"], out["dram"]["ms_per_call"]]
    energy.measure(lambda: (matmul(), dram()), seconds, meter, sync)  # warm-up
    start = torch.cuda.Event(enable_timing=True)
    sync()
    start.record()
    for s in streams:
        s.wait_event(start)
    events: List[List[Any]] = [[], []]
    queued = [0.0, 0.0]
    e0, t0 = meter.millijoules(), time.perf_counter()
    while min(queued) < seconds * 1e3:
        i = 0 if queued[0] <= queued[1] else 1
        with torch.cuda.stream(streams[i]):
            fns[i]()
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
        events[i].append(ev)
        queued[i] += solo_ms[i]
    sync()
    total_s = time.perf_counter() - t0
    joules = (meter.millijoules() - e0) / 1e3
    done = [[start.elapsed_time(ev) for ev in evs] for evs in events]
    win = window_rates(done, per_op)
    out["both"] = {
        "window_ms": win["window_ms"],
        "tflops": win["rates"][0],
        "gbps": win["rates"][1],
        "watts": joules / total_s,
        "seconds": total_s,
        "sm_mhz": meter.sm_clock_mhz(),
    }
    return out


def report(
    meas: Dict[str, Any], bench: Optional[Dict[str, Any]], log: Callable[[str], None]
) -> Dict[str, Any]:
    mm, dr, l2, both = meas["matmul"], meas["dram"], meas["l2"], meas["both"]
    log(f"FLOOR idle: {meas['idle_w']:.0f} W")
    log(
        f"FLOOR matmul {MATMUL_SIZE}^3 bf16: {mm['tflops']:.0f} TFLOP/s, {mm['watts']:.0f} W, "
        f"{mm['joules_per_tflop']:.2f} J/TFLOP, SM {mm['sm_mhz']} MHz"
    )
    for name, r in (("dram copy", dr), ("l2 copy", l2)):
        log(
            f"FLOOR {name}: {r['gbps']:.0f} GB/s moved, {r['watts']:.0f} W, "
            f"{r['joules_per_gb'] * 1e3:.1f} mJ/GB, SM {r['sm_mhz']} MHz"
        )
    model = calibrate(meas["idle_w"], mm, dr, l2)
    check = model_check(both, model)
    log(
        f"FLOOR both: matmul {both['tflops']:.0f} TFLOP/s and copy {both['gbps']:.0f} GB/s at once "
        f"({both['window_ms']:.0f} ms), {both['watts']:.0f} W, SM {both['sm_mhz']} MHz; model check "
        f"{check:.2f} (1: on the line)"
    )
    log(
        f"FLOOR model: above {model['p0_w']:.0f} W, {model['j_per_tflop']:.3f} J/TFLOP, "
        f"{model['j_per_gb_copy'] * 1e3:.1f} mJ a GB copied through DRAM, "
        f"{model['j_per_gb_l2'] * 1e3:.1f} within L2, so {model['j_per_gb_dram'] * 1e3:.1f} for DRAM "
        f"itself: a GB of DRAM costs the cap {1e3 / model['b_eff_gbps']:.3f} ms (B_eff "
        f"{model['b_eff_gbps']:.0f} GB/s; {1e3 / model['b_eff_copy_gbps']:.3f} ms at the copy's cost)"
    )
    result = {"measured": meas, "model": model, "model_check": check, "floors": {}}
    for name, cfg in CONFIGS.items():
        work = step_work(*cfg)
        fl = floor_ms(work, model)
        result["floors"][name] = {**work, **fl}
        log(
            f"FLOOR {name}: {work['tflop']:.1f} TFLOP, {work['gb']:.1f} GB -> floor "
            f"{fl['floor_ms']:.1f} ms (compute {fl['compute_ms']:.1f} + DRAM {fl['dram_ms']:.1f}; "
            f"at the copy's cost {fl['floor_copy_ms']:.1f}; roofline {fl['roofline_ms']:.1f})"
        )
    if bench is not None:
        rows = against_floor(bench, model)
        result["against"] = rows
        for r in rows:
            peer = ""
            if "best_peer_ms" in r:
                peer = (
                    f"; best peer {r['best_peer_ms']:.2f} ms ({r['peer_of_floor']:.2f}), ours "
                    f"{r['ratio']:.2f}x it, at most {r['ratio_max']:.2f}x at the floor; 1.3x asks "
                    f"{r['target_1_3x_of_floor']:.2f} of the floor"
                )
            log(
                f"FLOOR {r['name']}: ours {r['ours_ms']:.2f} ms = {r['ours_of_floor']:.2f} of the "
                f"floor {r['floor_ms']:.2f} ({r['ours_of_compute_floor']:.2f} of compute alone){peer}"
            )
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=3.0, help="each measurement (and its warm-up)")
    p.add_argument("--json", help="write everything here")
    p.add_argument(
        "--bench-json", help="bench/bench.py's JSON of the same GPU: layers against their floors"
    )
    p.add_argument(
        "--measured", help="an earlier --json: report on its measurements, measure nothing"
    )
    opts = p.parse_args(argv)
    if not (opts.seconds > 0 and math.isfinite(opts.seconds)):
        p.error(f"--seconds must be a positive number, not {opts.seconds}")

    def load(path, what):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            p.error(f"cannot read {what} {path}: {e}")

    bench = load(opts.bench_json, "--bench-json") if opts.bench_json else None
    if bench is not None and not isinstance(bench, dict):
        p.error(f"--bench-json {opts.bench_json}: not bench.py's JSON")
    if opts.measured:
        earlier = load(opts.measured, "--measured")
        meas = earlier.get("measured") if isinstance(earlier, dict) else None
        if not isinstance(meas, dict) or not {"idle_w", "matmul", "dram", "l2", "both"} <= set(
            meas
        ):
            p.error(f"--measured {opts.measured}: no measurements of power_floor.py --json there")
    else:
        try:
            meas = measure_gpu(opts.seconds)
        except MeasureError as e:
            print(f"power_floor.py: {e}", file=sys.stderr)
            return 2
    result = report(meas, bench, lambda s: print(s, flush=True))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
