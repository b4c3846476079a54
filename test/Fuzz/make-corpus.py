#!/usr/bin/env python3
"""Writes the seed corpus of moe-parser-fuzzer into a folder (scripts/fuzz.sh makes it anew
for each run, so no generated seed is checked in).

Every lit test of the dialect, the passes, the conversion and the pipelines,
and every example, is split at its `// -----` markers; comment lines (RUN,
CHECK, expected-*) are dropped, and each case becomes one seed. The seeds end
in .mlir.txt, not .mlir, so that lit and test/lint_tests.py do not take them
for tests.

    python3 test/Fuzz/make-corpus.py --out DIR
"""

import argparse
import hashlib
import pathlib
import re

root = pathlib.Path(__file__).resolve().parents[2]
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--out", required=True, type=pathlib.Path, help="the corpus folder")
out = parser.parse_args().out.resolve()
sources = sorted(
    list((root / "test" / "Dialect" / "MoE").glob("*.mlir"))
    + list((root / "test" / "Dialect" / "MoEGPU").glob("*.mlir"))
    + list((root / "test" / "Transforms").glob("*.mlir"))
    + list((root / "test" / "Conversion" / "MoEToLinalg").glob("*.mlir"))
    + list((root / "test" / "Pipelines").glob("*.mlir"))
    + list((root / "test" / "Fuzz").glob("*.mlir"))
    + list((root / "examples").glob("*.mlir"))
)
MAX_BYTES = 8192  # scripts/fuzz.sh runs with -max_len=8192
SPLIT_BYTES = 4096  # larger cases are split into their top-level functions


def pieces(text):
    """The case itself, or its top-level functions when it is large."""
    if len(text) <= SPLIT_BYTES:
        return [text]
    parts = re.split(r"^(?=func\.func )", text, flags=re.M)
    return [part.strip() + "\n" for part in parts if part.strip()]


for old in out.glob("*.mlir.txt"):
    old.unlink()
out.mkdir(parents=True, exist_ok=True)
seen = set()
count = 0
for source in sources:
    stem = source.stem if source.parent.name != "examples" else "example-" + source.stem
    prefix = (
        source.parent.name.lower() + "-" + stem
        if source.parent.name not in ("MoE", "examples")
        else stem
    )
    cases = re.split(r"^// -----.*$", source.read_text(), flags=re.M)
    for index, case in enumerate(cases):
        lines = [line.rstrip() for line in case.splitlines() if not line.lstrip().startswith("//")]
        text = "\n".join(lines).strip() + "\n"
        if text == "\n":
            continue
        parts = pieces(text)
        for part_index, part in enumerate(parts):
            if len(part) > MAX_BYTES:
                continue
            digest = hashlib.sha1(part.encode()).hexdigest()
            if digest in seen:
                continue
            seen.add(digest)
            name = prefix
            if len(cases) > 1:
                name += f"-{index:03d}"
            if len(parts) > 1:
                name += f"-{part_index:02d}"
            (out / (name + ".mlir.txt")).write_text(part)
            count += 1
print(f"make-corpus: {count} seeds in {out}")
