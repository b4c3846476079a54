"""Command line: run one function of an MLIR module on the CPU with .npy files.

    python -m moe_mlir run layer.mlir --function f_forward \\
        --pre-passes=--moe-decompose,--moe-generate-backward \\
        --inputs x.npy w_router.npy ... --out results/

Writes results/<function>_<i>.npy for every result. Input count, shapes and dtypes are checked
against the function's signature before anything runs; errors go to stderr with exit code 2
(bad input) or 1 (a tool failed).
"""

import argparse
import sys
from pathlib import Path

import numpy as np

from . import cpu


def _run(args: argparse.Namespace) -> int:
    text = Path(args.module).read_text()
    pre_passes = [p for p in args.pre_passes.split(",") if p] if args.pre_passes else []
    if pre_passes:
        text = cpu.run_opt(text, pre_passes)
    inputs = [np.load(path, allow_pickle=False) for path in args.inputs]
    function = cpu.compile_function(text, args.function)
    results = function(*inputs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = args.function or "result"
    for index, result in enumerate(results):
        np.save(out / f"{name}_{index}.npy", result)
        print(f"{out / f'{name}_{index}.npy'}: {result.dtype} {list(result.shape)}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe_mlir")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a function of a tensor-level module on the CPU")
    run.add_argument("module", help="tensor-level .mlir file")
    run.add_argument("--function", help="function to run (default: the only public one)")
    run.add_argument(
        "--pre-passes",
        default="",
        help="comma-separated moe-opt flags to apply first, e.g. "
        "--moe-decompose,--moe-generate-backward",
    )
    run.add_argument("--inputs", nargs="*", default=[], help=".npy inputs, in argument order")
    run.add_argument("--out", required=True, help="folder for the .npy results")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except (ValueError, KeyError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except cpu.ToolError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
