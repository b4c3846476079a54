#!/usr/bin/env python3
"""Puts a ptxas for sm_90a where the tests find it, on machines without a CUDA toolkit.

    python3 scripts/fetch-ptxas.py [--dir DIR]    # prints the path of ptxas

CI has no GPU and no CUDA, but the ptxas gate (test/Target/NVPTX/*-ptxas.mlir: no spills,
no stack, no wgmma serialisation warnings on every kernel) must run there. NVIDIA ships
ptxas in the pip wheel nvidia-cuda-nvcc-cu12; this downloads that one pinned wheel with the
standard library (no pip needed), checks its SHA-256 and extracts bin/ptxas into DIR
(default ~/.cache/moe-mlir/ptxas-VERSION). Nothing happens when DIR already has it.
"""

import argparse
import hashlib
import io
import json
import os
import stat
import sys
import urllib.parse
import urllib.request
import zipfile

PACKAGE = "nvidia-cuda-nvcc-cu12"
VERSION = "12.9.86"
SHA256 = "5d6a0d32fdc7ea39917c20065614ae93add6f577d840233237ff08e9a38f58f0"
INDEX = "https://pypi.org/pypi/{package}/{version}/json"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.path.expanduser(f"~/.cache/moe-mlir/ptxas-{VERSION}"))
    args = ap.parse_args()
    target = os.path.join(args.dir, "ptxas")
    if os.access(target, os.X_OK):
        print(target)
        return 0
    index = INDEX.format(package=PACKAGE, version=VERSION)
    try:
        with urllib.request.urlopen(index, timeout=60) as response:
            release = json.load(response)
    except Exception:
        # some mirrors only serve the package-level document
        index = f"https://pypi.org/pypi/{PACKAGE}/json"
        with urllib.request.urlopen(index, timeout=60) as response:
            release = json.load(response)
        release["urls"] = release.get("releases", {}).get(VERSION, release["urls"])
    wheel = next(
        (
            f
            for f in release["urls"]
            if f["filename"].endswith(".whl")
            and "manylinux" in f["filename"]
            and "x86_64" in f["filename"]
        ),
        None,
    )
    if wheel is None:
        print(f"fetch-ptxas: no x86-64 wheel of {PACKAGE} {VERSION} on the index", file=sys.stderr)
        return 1
    url = urllib.parse.urljoin(index, wheel["url"])
    print(
        f"fetch-ptxas: downloading {wheel['filename']} ({wheel['size'] >> 20} MiB)", file=sys.stderr
    )
    with urllib.request.urlopen(url, timeout=600) as response:
        data = response.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256:
        print(f"fetch-ptxas: SHA-256 mismatch for {wheel['filename']}: {digest}", file=sys.stderr)
        return 1
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        member = next(n for n in archive.namelist() if n.endswith("/bin/ptxas"))
        os.makedirs(args.dir, exist_ok=True)
        tmp = target + ".tmp"
        with open(tmp, "wb") as out:
            out.write(archive.read(member))
    os.chmod(tmp, os.stat(tmp).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.replace(tmp, target)
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
