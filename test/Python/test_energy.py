"""bench/energy.py without a GPU: measure() against a stand-in meter and clock whose work
costs a known energy and time a call, and NvmlEnergy's error when NVML is not there."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import energy  # noqa: E402


class FakeGpu:
    """Each call of work() costs `seconds` (10 ms) and 500 W of it once synced; the clock is
    1500 MHz."""

    def __init__(self, seconds=0.010):
        self.cost = seconds
        self.t = 0.0
        self.mj = 1_000_000
        self.pending = 0
        self.syncs = 0

    def work(self):
        self.pending += 1

    def sync(self):
        self.syncs += 1
        self.t += self.cost * self.pending
        self.mj += round(500e3 * self.cost) * self.pending
        self.pending = 0

    def now(self):
        return self.t

    def millijoules(self):
        return self.mj

    def sm_clock_mhz(self):
        return 1500


def test_joules_a_call_and_per_tflop():
    gpu = FakeGpu()
    r = energy.measure(gpu.work, 1.0, gpu, gpu.sync, now=gpu.now, tflop_per_call=0.5)
    # 5 calls between syncs (50 ms / 10 ms), until a second has passed
    assert r["calls"] == 100 and r["seconds"] == pytest.approx(1.0)
    assert r["joules"] == pytest.approx(500.0)
    assert r["joules_per_call"] == pytest.approx(5.0)
    assert r["watts"] == pytest.approx(500.0)
    assert r["ms_per_call"] == pytest.approx(10.0)
    assert r["joules_per_tflop"] == pytest.approx(10.0)
    assert r["sm_mhz"] == 1500
    assert gpu.pending == 0  # the counter was read after the work was done
    line = energy.describe("expert_ffn", r)
    assert line == (
        "expert_ffn: 5000.0 mJ a call, 10.000 ms, 500 W, SM 1500 MHz, "
        "10.00 J/TFLOP (100 calls in 1.00 s)"
    )


def test_slow_work_still_gets_its_minimum_of_calls():
    """A call longer than the sync interval: synced after each one, and min_calls of them
    even when the time asked for is shorter."""
    gpu = FakeGpu(seconds=0.2)
    r = energy.measure(gpu.work, 0.001, gpu, gpu.sync, now=gpu.now, min_calls=3)
    assert r["calls"] == 3 and r["joules_per_call"] == pytest.approx(100.0)
    assert gpu.syncs == 2 + 3 and "joules_per_tflop" not in r


@pytest.mark.parametrize("seconds", [0.0, -1.0, float("nan")])
def test_no_time_is_refused(seconds):
    gpu = FakeGpu()
    with pytest.raises(ValueError, match="seconds must be positive"):
        energy.measure(gpu.work, seconds, gpu, gpu.sync, now=gpu.now)


def test_missing_nvml_is_a_clear_error(tmp_path):
    with pytest.raises(energy.EnergyUnavailable, match="cannot load"):
        energy.NvmlEnergy(library=str(tmp_path / "libnvidia-ml-missing.so"))
