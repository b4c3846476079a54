"""scripts/inputs/stamp.sh: the lines that inputs/build-layers.sh and inputs/build-torch-cache.sh
write to INPUTS.txt, and the "kernel library:" line that gpu/torch-check.sh reads back to
refuse a torch cache built with other kernels than the layers."""

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def stamp(build):
    script = f'. "{ROOT}/scripts/inputs/stamp.sh"; inputs_stamp "{ROOT}" "{build}"'
    return subprocess.run(
        ["bash", "-c", script], check=True, capture_output=True, text=True
    ).stdout.splitlines()


def kernel_library(lines):
    """What gpu/torch-check.sh takes from an INPUTS.txt (sed -n 's/^kernel library: //p')."""
    return [
        line[len("kernel library: ") :] for line in lines if line.startswith("kernel library: ")
    ]


def test_stamp_names_the_build_kernel_library(tmp_path):
    kernels = tmp_path / "share" / "moe_mlir" / "kernels"
    kernels.mkdir(parents=True)
    (kernels / "0123abcd.mlir").write_text("")
    lines = stamp(tmp_path)
    keys = [line.split(":")[0] for line in lines]
    assert keys == [
        "commit",
        "uncommitted in lib/ include/ tools/",
        "kernel library",
        "date",
    ]
    assert kernel_library(lines) == ["0123abcd.mlir "]
    other = tmp_path / "other"
    (other / "share" / "moe_mlir" / "kernels").mkdir(parents=True)
    (other / "share" / "moe_mlir" / "kernels" / "feed.mlir").write_text("")
    assert kernel_library(stamp(other)) != kernel_library(lines)


def test_stamp_of_a_build_without_kernels_is_empty(tmp_path):
    # gpu/torch-check.sh fails on an empty "kernel library:", whatever the other file says
    assert kernel_library(stamp(tmp_path / "missing")) == [""]
