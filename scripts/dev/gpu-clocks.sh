#!/usr/bin/env bash
# The GPU's SM clock, power draw and clock-event reasons (power cap, thermal) sampled every
# MOE_CLOCKS_MS milliseconds (default 20) while a command runs, the command's output lines
# timestamped, and a summary per stretch between two of its output lines: the median SM
# clock, the mean power and the share of samples the power cap or a thermal limit held down.
# It answers whether a timed loop runs at lower clocks than a short one (the GPU's power cap:
# docs/gpu-kernels.md).
#   bash scripts/dev/gpu-clocks.sh CMD [ARGS...]
# Output in $OUT (default /tmp/moe-clocks-out): clocks.csv, cmd.log (each line with its
# time), clocks.txt (the summary, also printed). Exits with CMD's status.
set -u -o pipefail
# shellcheck source=../common.sh
. "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
out=${OUT:-/tmp/moe-clocks-out}
[ $# -gt 0 ] || die "no command"
case "$1" in -h | --help) usage ;; esac
mkdir -p "$out"
fields=timestamp,clocks.sm,power.draw.instant,clocks_event_reasons.active,temperature.gpu
# older drivers know the power field only as power.draw
nvidia-smi --query-gpu="$fields" --format=csv,noheader >/dev/null 2>&1 ||
  fields=timestamp,clocks.sm,power.draw,clocks_event_reasons.active,temperature.gpu
nvidia-smi --query-gpu="$fields" --format=csv,noheader,nounits \
  --loop-ms="${MOE_CLOCKS_MS:-20}" >"$out/clocks.csv" 2>"$out/nvidia-smi.err" &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT
sleep 1 # a second of the idle GPU first, for comparison
"$@" 2>&1 | while IFS= read -r line; do
  printf '%s %s\n' "$(date +%s.%N)" "$line"
done >"$out/cmd.log"
status=${PIPESTATUS[0]}
sleep 1
kill $sampler 2>/dev/null
wait $sampler 2>/dev/null
python3 - "$out/clocks.csv" "$out/cmd.log" <<'EOF' | tee "$out/clocks.txt"
import csv, datetime, statistics, sys

samples = []
for row in csv.reader(open(sys.argv[1])):
    if len(row) < 5:
        continue
    try:
        t = datetime.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
        sm, watts, reasons = float(row[1]), float(row[2]), int(row[3].strip(), 16)
    except ValueError:
        continue
    samples.append((t, sm, watts, reasons, row[4].strip()))
lines = []
for text in open(sys.argv[2], errors="replace"):
    stamp, _, rest = text.rstrip("\n").partition(" ")
    try:
        lines.append((float(stamp), rest))
    except ValueError:
        pass
print(f"{len(samples)} samples, {len(lines)} output lines")
# clocks_event_reasons bits (nvml): 0x1 idle, 0x4 software power cap, 0x8 hardware
# slowdown, 0x20 software thermal, 0x40 hardware thermal, 0x80 power brake
POWER, THERMAL = 0x4 | 0x80, 0x8 | 0x20 | 0x40


def summary(label, chunk):
    if not chunk:
        return
    sm = [s[1] for s in chunk]
    watts = [s[2] for s in chunk]
    busy = [s for s in chunk if not s[3] & 0x1]
    capped = sum(1 for s in busy if s[3] & POWER)
    hot = sum(1 for s in busy if s[3] & THERMAL)
    share = (lambda n: f"{100 * n / len(busy):.0f}%") if busy else (lambda n: "-")
    print(f"{len(chunk):5d} samples, SM {statistics.median(sm):5.0f} MHz "
          f"({min(sm):.0f}-{max(sm):.0f}), {statistics.mean(watts):4.0f} W mean, "
          f"{max(watts):4.0f} max, power cap {share(capped)}, thermal {share(hot)}, "
          f"{chunk[-1][4]} C | {label[:90]}")


start = lines[0][0] if lines else float("inf")
summary("(before the command)", [s for s in samples if s[0] < start])
for (t0, text), (t1, _) in zip(lines, lines[1:] + [(float("inf"), "")]):
    summary(text, [s for s in samples if t0 <= s[0] < t1])
EOF
exit "$status"
