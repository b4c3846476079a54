#!/usr/bin/env python3
"""Writes the PTX (or cubin) held by each gpu.binary of an MLIR file.

    extract_ptx.py lowered.mlir out_prefix   ->  out_prefix.<module>.ptx (or .cubin)

gpu-module-to-binary stores the object as an MLIR string attribute
(`assembly = "..."` for format=isa, `bin = "..."` for format=bin) with \\XX hex
escapes; this undoes them.
"""

import re
import sys


def unescape(text: str) -> bytes:
    out = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            nxt = text[i + 1]
            if nxt in '\\"':
                out.append(ord(nxt))
                i += 2
                continue
            if nxt == "n":
                out.append(10)
                i += 2
                continue
            if nxt == "t":
                out.append(9)
                i += 2
                continue
            out.append(int(text[i + 1 : i + 3], 16))
            i += 3
            continue
        out.extend(ch.encode())
        i += 1
    return bytes(out)


def main() -> int:
    source, prefix = sys.argv[1], sys.argv[2]
    text = open(source).read()
    found = 0
    for binary in re.finditer(r"gpu\.binary @(\w+)", text):
        tail = text[binary.end() :]
        match = re.search(r'\b(assembly|bin) = "((?:[^"\\]|\\.)*)"', tail)
        if not match:
            continue
        suffix = "ptx" if match.group(1) == "assembly" else "cubin"
        with open(f"{prefix}.{binary.group(1)}.{suffix}", "wb") as out:
            out.write(unescape(match.group(2)))
        found += 1
    if not found:
        print(f"extract_ptx.py: no gpu.binary with an object in {source}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
