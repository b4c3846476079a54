#!/usr/bin/env python3
"""Compares the PTX of each kernel (.entry) between two sets of PTX files: the
same entries, each the same text but for the numbers of its basic-block labels
($L__BB<function>_<block>, numbered by the function's place in its module).

    compare_entries.py 'A/*.ptx' 'B/*.ptx'
"""

import glob
import re
import sys


def entries(pattern: str) -> dict:
    out = {}
    for path in sorted(glob.glob(pattern)):
        text = open(path).read()
        for match in re.finditer(r"\.visible \.entry (\w+)\(", text):
            end = text.index("\n}\n", match.start())
            body = re.sub(r"\$L__BB\d+_", "$L__BB_", text[match.start() : end])
            if match.group(1) in out:
                sys.exit(f"compare_entries.py: {match.group(1)} twice in {pattern}")
            out[match.group(1)] = body
    return out


def main() -> int:
    a, b = entries(sys.argv[1]), entries(sys.argv[2])
    problems = [f"only in {sys.argv[1]}: {name}" for name in sorted(set(a) - set(b))]
    problems += [f"only in {sys.argv[2]}: {name}" for name in sorted(set(b) - set(a))]
    problems += [f"differs: {name}" for name in sorted(set(a) & set(b)) if a[name] != b[name]]
    for problem in problems:
        print(f"compare_entries.py: {problem}", file=sys.stderr)
    print(f"{len(set(a) & set(b))} entries compared")
    return 1 if problems or not a else 0


if __name__ == "__main__":
    sys.exit(main())
