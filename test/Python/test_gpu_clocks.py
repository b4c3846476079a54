"""scripts/dev/gpu-clocks.sh without a GPU: a stand-in nvidia-smi prints samples, and the
summary gives each stretch between the command's output lines its clock, power and
power-cap share; the command's exit status comes through."""

import os
import stat
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FAKE_SMI = """#!/usr/bin/env bash
# the field probe (no --loop-ms) succeeds; the loop prints a sample every 10 ms: SM 1485 MHz,
# 690.5 W, held down by the software power cap (0x4), 55 C
case "$*" in *loop-ms*) ;; *) exit 0 ;; esac
while true; do
  echo "$(date '+%Y/%m/%d %H:%M:%S.%3N'), 1485, 690.50, 0x0000000000000004, 55"
  sleep 0.01
done
"""


def run_clocks(tmp_path, command):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    env = dict(
        os.environ,
        PATH=f"{bin_dir}:{os.environ['PATH']}",
        OUT=str(tmp_path / "out"),
        MOE_CLOCKS_MS="10",
    )
    return subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "dev", "gpu-clocks.sh"), "bash", "-c", command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_stretches_between_output_lines(tmp_path):
    proc = run_clocks(tmp_path, "echo warm-up; sleep 0.4; echo '  ours: 58 ms'; sleep 0.4; exit 3")
    assert proc.returncode == 3, proc.stderr
    summary = (tmp_path / "out" / "clocks.txt").read_text()
    assert summary == proc.stdout
    lines = summary.splitlines()
    labels = [line.split(" | ", 1)[1] for line in lines[1:]]
    assert labels == ["(before the command)", "warm-up", "  ours: 58 ms"], summary
    for line in lines[1:]:
        samples = int(line.split()[0])
        assert samples >= 5, line
        assert (
            "SM  1485 MHz (1485-1485),  690 W mean,  690 max, power cap 100%, thermal 0%, 55 C"
            in line
        ), line
    # the command's output is kept, each line after its time
    logged = (tmp_path / "out" / "cmd.log").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in logged] == ["warm-up", "  ours: 58 ms"]


def test_no_command_is_refused(tmp_path):
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "scripts", "dev", "gpu-clocks.sh")],
        capture_output=True,
        text=True,
        timeout=30,
        env=dict(os.environ, OUT=str(tmp_path / "out")),
    )
    assert proc.returncode == 2 and "no command" in proc.stderr
