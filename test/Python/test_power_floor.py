"""bench/power_floor.py without a GPU: the step's work, the power model and its floor, the
concurrent run's window, and the layers against their floors, on made-up measurements."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

import power_floor as pf  # noqa: E402

# idle 100 W; the matmul 650 TFLOP/s at 700 W; the DRAM copy 4000 GB/s at 400 W (b = 0.075
# J/GB), the L2 copy 8000 GB/s at 260 W (c = 0.02 J/GB): DRAM itself d = 0.055 J/GB, so the
# cap's 600 W above idle buy 600 / 0.055 GB/s of DRAM (600 / 0.075 = 8000 at the copy's cost)
MATMUL = {"tflops": 650.0, "watts": 700.0, "joules_per_tflop": 700.0 / 650.0, "sm_mhz": 1500}
DRAM = {"gbps": 4000.0, "watts": 400.0, "joules_per_gb": 0.1, "sm_mhz": 1700}
L2 = {"gbps": 8000.0, "watts": 260.0, "joules_per_gb": 260.0 / 8000.0, "sm_mhz": 1900}


def test_step_work_counts_the_useful_flops_and_the_unavoidable_bytes():
    # bench.py's useful FLOPs for mixtral-8x7b and deepseek-v3: the "useful_flops" and
    # "useful_flops_routed" of their entries in the bench.json of any `python3 bench/bench.py` run
    # (18·T·k·d·n + 18·T·d·m + 6·T·d·E, with and without the shared expert's m)
    assert pf.step_work(*pf.CONFIGS["mixtral-8x7b"])["tflop"] * 1e12 == pytest.approx(
        34637837500416.0
    )
    assert pf.step_work(*pf.CONFIGS["deepseek-v3"])["tflop"] * 1e12 == pytest.approx(
        19572165967872.0
    )
    assert pf.step_work(*pf.CONFIGS["deepseek-v3-routed"])["tflop"] * 1e12 == pytest.approx(
        17407502450688.0
    )
    # T=2, d=3, n=5, E=7, k=1, m=11: |W| = 6 E d n + 6 d m bytes, 3 |W| + 8 T k n + 8 T d
    w = pf.step_work(2, 3, 5, 7, 1, 11)
    assert w["weights_gb"] * 1e9 == pytest.approx(6 * 7 * 3 * 5 + 6 * 3 * 11)
    assert w["gb"] * 1e9 == pytest.approx(3 * (630 + 198) + 8 * 2 * 5 + 8 * 2 * 3)
    # deepseek-v3's weights dominate: 3 x 22.5 GB
    assert pf.step_work(*pf.CONFIGS["deepseek-v3-routed"])["weights_gb"] == pytest.approx(
        22.55, abs=0.01
    )


def test_the_floor_pays_the_bytes_energy_in_matmul_time():
    model = pf.calibrate(100.0, MATMUL, DRAM, L2)
    assert model["j_per_tflop"] == pytest.approx(600.0 / 650.0)
    assert model["j_per_gb_copy"] == pytest.approx(0.075)
    assert model["j_per_gb_l2"] == pytest.approx(0.02)
    assert model["j_per_gb_dram"] == pytest.approx(0.055)
    assert model["b_eff_gbps"] == pytest.approx(600.0 / 0.055)
    assert model["b_eff_copy_gbps"] == pytest.approx(8000.0)
    fl = pf.floor_ms({"tflop": 65.0, "gb": 80.0}, model)
    assert fl["compute_ms"] == pytest.approx(100.0)
    assert fl["dram_ms"] == pytest.approx(80.0 * 0.055 / 600.0 * 1e3)
    assert fl["floor_ms"] == pytest.approx(100.0 + 80.0 * 0.055 / 600.0 * 1e3)
    assert fl["floor_copy_ms"] == pytest.approx(110.0)
    # the roofline takes the larger of the two at the copy's full rate: 100 against 20 ms
    assert fl["roofline_ms"] == pytest.approx(100.0)
    # a concurrent run on the model's line: half the matmul's rate and half of B_eff
    assert pf.model_check({"tflops": 325.0, "gbps": 4000.0}, model) == pytest.approx(1.0)
    assert pf.model_check({"tflops": 650.0, "gbps": 800.0}, model) == pytest.approx(1.1)


@pytest.mark.parametrize("idle", [700.0, 400.0, 260.0, 900.0])
def test_calibration_needs_work_above_idle(idle):
    with pytest.raises(ValueError, match="more than idle"):
        pf.calibrate(idle, MATMUL, DRAM, L2)


def test_calibration_needs_dram_to_cost_more_than_l2():
    with pytest.raises(ValueError, match="must cost more than one within L2"):
        pf.calibrate(100.0, MATMUL, DRAM, {"gbps": 2000.0, "watts": 400.0})


def test_window_rates_count_what_finished_while_both_ran():
    # stream 0: an op of 2 units every 10 ms until 100 ms; stream 1: 1 unit every 4 ms until 60
    s0 = [10.0 * i for i in range(1, 11)]
    s1 = [4.0 * i for i in range(1, 16)]
    w = pf.window_rates([s0, s1], [2.0, 1.0])
    assert w["window_ms"] == 60.0
    assert w["rates"][0] == pytest.approx(6 * 2.0 / 0.060)
    assert w["rates"][1] == pytest.approx(15 * 1.0 / 0.060)
    with pytest.raises(ValueError):
        pf.window_rates([s0, []], [1.0, 1.0])


def bench_json():
    return {
        "configs": [
            {
                "name": "mixtral-8x7b",
                "ours": {"median_ms": 60.0},
                "hf": {"median_ms": 72.0},
                "liger": {"median_ms": 100.0},
            },
            {
                "name": "deepseek-v3",
                "ours": {"median_ms": 43.0},
                "hf": {"median_ms": 40.0},
                "hf_full": {"median_ms": 62.0},
            },
            {
                "name": "olmoe-1b-7b",
                "ours": {"median_ms": 9.0},
                "hf": {"median_ms": 23.0},
                "liger": {"median_ms": 17.0},
            },
            {"name": "not-a-config", "ours": {"median_ms": 1.0}},
            {"name": "qwen3-30b-a3b", "hf": {"median_ms": 20.0}},  # ours did not run
        ]
    }


def test_layers_against_their_floors():
    model = pf.calibrate(100.0, MATMUL, DRAM, L2)
    rows = {r["name"]: r for r in pf.against_floor(bench_json(), model)}
    assert sorted(rows) == ["deepseek-v3", "mixtral-8x7b", "olmoe-1b-7b"]
    mix = rows["mixtral-8x7b"]
    compute = 34.637837500416 / 650.0 * 1e3
    floor = compute + 12.75068416 * 0.055 / 600.0 * 1e3
    assert mix["floor_ms"] == pytest.approx(floor)
    assert mix["ours_of_floor"] == pytest.approx(floor / 60.0)
    assert mix["ours_of_compute_floor"] == pytest.approx(compute / 60.0)
    assert mix["best_peer_ms"] == 72.0 and mix["ratio"] == pytest.approx(1.2)
    assert mix["ratio_max"] == pytest.approx(72.0 / floor)
    # 1.3x over 72 ms is 55.4 ms, 0.98 of the floor's 54.5
    assert mix["target_1_3x_of_floor"] == pytest.approx(floor / (72.0 / 1.3))
    # deepseek-v3's peer is DeepseekV3MoE (hf_full), not the Mixtral block without the
    # shared expert; olmoe's best peer is Liger
    assert rows["deepseek-v3"]["best_peer_ms"] == 62.0
    assert rows["olmoe-1b-7b"]["best_peer_ms"] == 17.0


def test_report_prints_floor_lines_for_every_configuration():
    meas = {
        "idle_w": 100.0,
        "matmul": MATMUL,
        "dram": DRAM,
        "l2": L2,
        "both": {
            "tflops": 325.0,
            "gbps": 4000.0,
            "window_ms": 2900.0,
            "watts": 690.0,
            "sm_mhz": 1600,
        },
    }
    lines = []
    result = pf.report(meas, bench_json(), lines.append)
    assert all(line.startswith("FLOOR ") for line in lines)
    assert result["model_check"] == pytest.approx(1.0)
    assert sorted(result["floors"]) == sorted(pf.CONFIGS)
    assert any("model check 1.00" in line for line in lines)
    assert any(line.startswith("FLOOR mixtral-8x7b: ours 60.00 ms") for line in lines)
    assert len(result["against"]) == 3


def test_report_from_an_earlier_measurement(tmp_path, capsys):
    meas = {
        "idle_w": 100.0,
        "matmul": MATMUL,
        "dram": DRAM,
        "l2": L2,
        "both": {
            "tflops": 325.0,
            "gbps": 4000.0,
            "window_ms": 2900.0,
            "watts": 690.0,
            "sm_mhz": 1600,
        },
    }
    path = tmp_path / "floor.json"
    path.write_text(__import__("json").dumps({"measured": meas}))
    out = tmp_path / "again.json"
    assert pf.main(["--measured", str(path), "--json", str(out)]) == 0
    assert "FLOOR deepseek-v3-routed: 17.4 TFLOP, 69.2 GB" in capsys.readouterr().out
    assert __import__("json").loads(out.read_text())["measured"] == meas


@pytest.mark.parametrize("arg", ["0", "-1", "nan", "inf"])
def test_bad_seconds_are_refused(arg, capsys):
    with pytest.raises(SystemExit):
        pf.main(["--seconds", arg])
    assert "--seconds must be a positive number" in capsys.readouterr().err


def test_no_gpu_is_a_clear_error(monkeypatch, capsys):
    def missing(seconds):
        raise pf.MeasureError("no CUDA GPU here (--measured reports on an earlier run's JSON)")

    monkeypatch.setattr(pf, "measure_gpu", missing)
    assert pf.main(["--seconds", "1"]) == 2
    assert "power_floor.py: no CUDA GPU here" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "cannot read --measured"),
        ("{not json", "cannot read --measured"),
        ('{"measured": {"idle_w": 1}}', "no measurements of"),
    ],
)
def test_bad_earlier_measurements_are_refused(tmp_path, capsys, text, message):
    path = tmp_path / "floor.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit):
        pf.main(["--measured", str(path)])
    assert message in capsys.readouterr().err
