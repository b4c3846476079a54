#!/usr/bin/env python3
"""Reads `ptxas -v` output on stdin and fails on what costs speed silently
(CODEGEN.md P13): spills, a local-memory stack, and the serialisation and
register warnings C7515, C7520 and C7508. Echoes the input so FileCheck can
read the register counts after it."""
import re
import sys

text = sys.stdin.read()
sys.stdout.write(text)
problems = []
for code in ("C7515", "C7520", "C7508"):
    if code in text:
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
