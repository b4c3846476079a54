#!/usr/bin/env python3
"""Reads `ptxas -v` output on stdin and fails on what costs speed silently
(docs/gpu-kernels.md section 6.6): spills, a local-memory stack, the serialisation and
register warnings C7515, C7520 and C7508, and C7519 / C7517 (a warpgroup.arrive
or wait that ptxas injected around a wgmma, as it did for wgmma under a branch
inside a k-loop: each one then waited for the one before; `--allow CODE` for a
kernel that has them and is not timed). Echoes the input so FileCheck can read
the register counts after it."""

import re
import sys

allowed = {sys.argv[i + 1] for i, arg in enumerate(sys.argv[:-1]) if arg == "--allow"}
text = sys.stdin.read()
sys.stdout.write(text)
problems = []
for code in ("C7515", "C7520", "C7508", "C7519", "C7517"):
    if code in text and code not in allowed:
        problems.append(f"ptxas warning {code}")
for match in re.finditer(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text):
    if match.group(1) != "0" or match.group(2) != "0":
        problems.append(f"spills: {match.group(0)}")
for match in re.finditer(r"(\d+) bytes stack frame", text):
    if match.group(1) != "0":
        problems.append(f"local stack: {match.group(0)}")
if "Used" not in text:
    problems.append("no 'Used N registers' line: was ptxas run with -v?")
for problem in problems:
    print(f"check_ptxas.py: {problem}", file=sys.stderr)
sys.exit(1 if problems else 0)
