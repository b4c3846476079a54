#!/usr/bin/env python3
"""Lints the lit tests for mistakes that make a test silently pass.

- `// RUN` without a colon is ignored by lit.
- `expected-error` and friends without `-verify-diagnostics` are ignored by
  moe-opt, which then exits 0.
- A lit test with no RUN line at all never runs.
"""

import pathlib
import re
import sys

root = pathlib.Path(__file__).resolve().parent
problems = []
for path in sorted(root.rglob("*.mlir")):
    if "Inputs" in path.parts:
        continue
    text = path.read_text()
    rel = path.relative_to(root)
    for number, line in enumerate(text.splitlines(), 1):
        if re.search(r"//\s*RUN(?!:)\b", line):
            problems.append(f"{rel}:{number}: 'RUN' without a colon")
        if re.match(r"\s*//\s*CHECK(-[A-Z]+)?\s", line):
            problems.append(f"{rel}:{number}: CHECK directive without a colon")
    if "RUN:" not in text:
        problems.append(f"{rel}: no RUN line")
    if (
        re.search(r"expected-(error|warning|note|remark)", text)
        and "-verify-diagnostics" not in text
    ):
        problems.append(f"{rel}: expected-* diagnostics without -verify-diagnostics")

for problem in problems:
    print(problem)
print(f"lint: {len(problems)} problem(s) in the lit tests")
sys.exit(1 if problems else 0)
