"""The energy of a piece of GPU work, from NVML's total-energy counter.

Under the H200's 700 W cap a long run's time follows its energy more than its stalls
(docs/results.md, "The power cap"): the dense matmul itself runs 16% slower after a few seconds.
So joules a call, and joules per TFLOP of useful work, rank what to change better than
milliseconds alone. NVML comes with the driver (libnvidia-ml.so.1), read here through ctypes,
so no Python package is needed on the GPU machine.

    meter = NvmlEnergy()
    result = measure(step, seconds=2.0, meter=meter, sync=torch.cuda.synchronize)
"""

import ctypes
import math
import time
from typing import Any, Callable, Dict, Optional

NVML_CLOCK_SM = 1


class EnergyUnavailable(RuntimeError):
    """NVML or its energy counter is not there (no driver, an old GPU, a fake one)."""


class NvmlEnergy:
    """The GPU's total energy since the driver loaded (mJ) and its SM clock (MHz)."""

    def __init__(self, index: int = 0, library: str = "libnvidia-ml.so.1"):
        try:
            self.nvml = ctypes.CDLL(library)
        except OSError as e:
            raise EnergyUnavailable(f"cannot load {library}: {e}") from e
        self._check(self.nvml.nvmlInit_v2(), "nvmlInit_v2")
        self.handle = ctypes.c_void_p()
        self._check(
            self.nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.handle)),
            f"nvmlDeviceGetHandleByIndex_v2({index})",
        )
        self.millijoules()  # fails here when the GPU has no energy counter

    def _check(self, status: int, call: str) -> None:
        if status != 0:
            self.nvml.nvmlErrorString.restype = ctypes.c_char_p
            text = self.nvml.nvmlErrorString(status)
            raise EnergyUnavailable(
                f"{call}: NVML error {status} ({text.decode() if text else '?'})"
            )

    def millijoules(self) -> int:
        value = ctypes.c_ulonglong()
        self._check(
            self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(value)),
            "nvmlDeviceGetTotalEnergyConsumption",
        )
        return int(value.value)

    def sm_clock_mhz(self) -> int:
        value = ctypes.c_uint()
        self._check(
            self.nvml.nvmlDeviceGetClockInfo(self.handle, NVML_CLOCK_SM, ctypes.byref(value)),
            "nvmlDeviceGetClockInfo",
        )
        return int(value.value)


def measure(
    fn: Callable[[], Any],
    seconds: float,
    meter,
    sync: Callable[[], Any],
    now: Callable[[], float] = time.perf_counter,
    min_calls: int = 3,
    sync_every_s: float = 0.05,
    tflop_per_call: Optional[float] = None,
) -> Dict[str, Any]:
    """Calls `fn` back to back for at least `seconds` (and at least `min_calls` times) and
    returns what that took: calls, seconds, joules, joules_per_call, watts, ms_per_call,
    sm_mhz (the clock at the end), and with `tflop_per_call` joules_per_tflop. `fn` only
    enqueues work; `sync` waits for it, every `sync_every_s` or so, so the host never runs
    far ahead of the GPU and the counter is read when the work is done."""
    if not seconds > 0:
        raise ValueError(f"seconds must be positive, not {seconds}")
    sync()
    t_first = now()
    fn()
    sync()
    one = max(now() - t_first, 1e-9)
    batch = max(1, int(sync_every_s / one))
    e0, t0 = meter.millijoules(), now()
    calls = 0
    while calls < min_calls or now() - t0 < seconds:
        for _ in range(batch):
            fn()
        calls += batch
        sync()
    t1, e1 = now(), meter.millijoules()
    elapsed = t1 - t0
    joules = (e1 - e0) / 1e3
    result = {
        "calls": calls,
        "seconds": elapsed,
        "joules": joules,
        "joules_per_call": joules / calls,
        "watts": joules / elapsed if elapsed > 0 else math.nan,
        "ms_per_call": elapsed * 1e3 / calls,
        "sm_mhz": meter.sm_clock_mhz(),
    }
    if tflop_per_call:
        result["joules_per_tflop"] = result["joules_per_call"] / tflop_per_call
    return result


def describe(name: str, r: Dict[str, Any]) -> str:
    """One line: what measure() found for `name`."""
    per_tflop = f", {r['joules_per_tflop']:.2f} J/TFLOP" if "joules_per_tflop" in r else ""
    return (
        f"{name}: {r['joules_per_call'] * 1e3:.1f} mJ a call, {r['ms_per_call']:.3f} ms, "
        f"{r['watts']:.0f} W, SM {r['sm_mhz']} MHz{per_tflop} ({r['calls']} calls in "
        f"{r['seconds']:.2f} s)"
    )
