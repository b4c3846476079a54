"""Compile and run CPU-lowered MLIR from Python (docs/cpu-path.md §3).

Two levels:

- `CpuModule(llvm_mlir_text)`: a module in the LLVM dialect (what `moe-opt
  --moe-lower-to-cpu-pipeline` prints) is translated with `mlir-translate --mlir-to-llvmir`,
  compiled with `clang -shared -fPIC -O1`, loaded with ctypes; `.call(name, inputs, outputs)`
  calls `_mlir_ciface_<name>` with one ranked memref descriptor per argument (inputs first,
  then caller-allocated outputs) and returns the outputs.
- `compile_mlir(tensor_mlir, passes)`: tensor-level MLIR; the `func.func` signatures are parsed,
  `moe-opt` (or another opt tool) lowers it with `passes`, and each public function becomes a
  `CompiledFunction` that checks its numpy inputs (count, shape, dtype) against the signature
  before calling. `CompiledLayer` builds, differentiates and compiles one `moe.layer`.

Tools: `MOE_OPT` (default `$MOE_BUILD_DIR/bin/moe-opt` when set, `build/bin/moe-opt` under the
repository, then PATH), `MLIR_TRANSLATE` (default
/usr/lib/llvm-22/bin/mlir-translate), `CLANG` (default clang-22). Failures raise `ToolError`
(`MoeOptError` for the opt tool) carrying the tool's diagnostics.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = [
    "ToolError",
    "MoeOptError",
    "CompileError",
    "UnsupportedTypeError",
    "find_moe_opt",
    "find_mlir_opt",
    "find_mlir_translate",
    "find_clang",
    "run_opt",
    "moe_opt_has_passes",
    "TensorSpec",
    "FunctionSignature",
    "parse_functions",
    "numpy_dtype",
    "CpuModule",
    "CompiledFunction",
    "CompiledModule",
    "compile_mlir",
    "compile_function",
    "CompiledLayer",
    "CPU_PIPELINE",
    "UPSTREAM_CPU_PIPELINE",
    "LAYER_PRE_PASSES",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
LLVM_BIN = Path("/usr/lib/llvm-22/bin")
LLVM_LIB = Path("/usr/lib/llvm-22/lib")

CPU_PIPELINE = ("--moe-lower-to-cpu-pipeline",)
# The same calling convention with upstream passes only, for modules without moe ops (run it
# with upstream mlir-opt, `find_mlir_opt()`): elementwise ops to linalg, one-shot bufferization
# with identity layouts at function boundaries, results to out-params (public functions too),
# deallocation, loops, and the LLVM conversions with C wrappers.
UPSTREAM_CPU_PIPELINE = (
    "--pass-pipeline=builtin.module("
    "func.func(convert-elementwise-to-linalg),"
    "one-shot-bufferize{bufferize-function-boundaries "
    "function-boundary-type-conversion=identity-layout-map},"
    "buffer-results-to-out-params{modify-public-functions},"
    "ownership-based-buffer-deallocation,canonicalize,buffer-deallocation-simplification,"
    "bufferization-lower-deallocations,"
    "convert-linalg-to-loops,convert-scf-to-cf,expand-strided-metadata,lower-affine,"
    "func.func(llvm-request-c-wrappers),convert-to-llvm,reconcile-unrealized-casts)",
)
LAYER_PRE_PASSES = ("--moe-decompose", "--moe-generate-backward")


# =========================================================================== errors


class ToolError(RuntimeError):
    """A tool (moe-opt, mlir-translate, clang) failed; `.diagnostics` holds its stderr."""

    def __init__(self, tool: str, args: Sequence[str], returncode: Optional[int], diagnostics: str):
        self.tool = tool
        self.args_list = list(args)
        self.returncode = returncode
        self.diagnostics = diagnostics
        status = f"exit status {returncode}" if returncode is not None else "did not run"
        super().__init__(
            f"{tool} failed ({status}): {' '.join(map(str, args))}\n{diagnostics.rstrip()}"
        )


class MoeOptError(ToolError):
    """moe-opt (or the opt tool in use) rejected the module or a pass failed."""


class CompileError(ToolError):
    """mlir-translate or clang failed on a lowered module."""


class UnsupportedTypeError(ValueError):
    """A type the runner cannot pass (bf16 for now, non-tensor arguments, dynamic results)."""


# =========================================================================== tools


def _which(candidates: Sequence[Union[str, Path]]) -> Optional[str]:
    for c in candidates:
        c = str(c)
        if os.sep in c:
            if os.path.isfile(c) and os.access(c, os.X_OK):
                return c
        else:
            found = shutil.which(c)
            if found:
                return found
    return None


def _tool(env: str, candidates: Sequence[Union[str, Path]], what: str) -> str:
    value = os.environ.get(env)
    if value:
        return value
    found = _which(candidates)
    if found is None:
        raise ToolError(
            what, [], None, f"{what} not found (tried {', '.join(map(str, candidates))}); set {env}"
        )
    return found


def find_moe_opt() -> str:
    candidates: List[Union[str, Path]] = [REPO_ROOT / "build" / "bin" / "moe-opt"]
    if os.environ.get("MOE_BUILD_DIR"):
        candidates.insert(0, Path(os.environ["MOE_BUILD_DIR"]) / "bin" / "moe-opt")
    candidates.append("moe-opt")
    return _tool("MOE_OPT", candidates, "moe-opt")


def find_mlir_opt() -> str:
    """Upstream mlir-opt (`MLIR_OPT`, default /usr/lib/llvm-22/bin/mlir-opt)."""
    return _tool("MLIR_OPT", [LLVM_BIN / "mlir-opt", "mlir-opt-22", "mlir-opt"], "mlir-opt")


def find_mlir_translate() -> str:
    return _tool(
        "MLIR_TRANSLATE",
        [LLVM_BIN / "mlir-translate", "mlir-translate-22", "mlir-translate"],
        "mlir-translate",
    )


def find_clang() -> str:
    return _tool("CLANG", ["clang-22", LLVM_BIN / "clang", "clang"], "clang")


def _run(
    tool: str, args: Sequence[str], stdin: Optional[str], error_cls, what: str, retries: int = 3
) -> str:
    """Runs tool; retries when it cannot start or dies from a signal (a binary being rebuilt)."""
    cmd = [tool, *args]
    last: Optional[Exception] = None
    for attempt in range(retries):
        try:
            proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
        except OSError as exc:  # ETXTBSY, ENOENT while the binary is replaced
            last = exc
            if exc.errno not in (errno.ETXTBSY, errno.ENOENT) or attempt + 1 == retries:
                raise error_cls(what, cmd, None, f"cannot run {tool}: {exc}") from exc
            time.sleep(0.5)
            continue
        if proc.returncode < 0 and attempt + 1 < retries:  # killed by a signal
            time.sleep(0.5)
            continue
        if proc.returncode != 0:
            raise error_cls(what, cmd, proc.returncode, proc.stderr or proc.stdout)
        return proc.stdout
    raise error_cls(what, cmd, None, str(last))  # pragma: no cover


def run_opt(text: str, passes: Sequence[str], tool: Optional[str] = None) -> str:
    """Runs `moe-opt` (or `tool`, e.g. upstream mlir-opt) on text with the given command-line
    arguments; returns the printed module. Raises MoeOptError with the diagnostics."""
    tool = tool or find_moe_opt()
    return _run(tool, [*passes, "-"], text, MoeOptError, os.path.basename(tool))


_HELP_CACHE: Dict[str, str] = {}


def moe_opt_has_passes(*names: str, tool: Optional[str] = None) -> Tuple[bool, List[str]]:
    """(all present, missing names): whether `moe-opt --help` lists each `--<name>`."""
    try:
        tool = tool or find_moe_opt()
    except ToolError:
        return False, list(names)
    if tool not in _HELP_CACHE:
        try:
            _HELP_CACHE[tool] = _run(tool, ["--help"], None, MoeOptError, "moe-opt")
        except ToolError:
            return False, list(names)
    text = _HELP_CACHE[tool]
    missing = [n for n in names if not re.search(r"--" + re.escape(n) + r"(?![\w-])", text)]
    return not missing, missing


# =========================================================================== types

_NUMPY_DTYPES = {
    "f64": np.float64,
    "f32": np.float32,
    "f16": np.float16,
    "i64": np.int64,
    "i32": np.int32,
    "i16": np.int16,
    "i8": np.int8,
    "i1": np.bool_,
    "ui8": np.uint8,
    "ui32": np.uint32,
    "ui64": np.uint64,
}


def numpy_dtype(element: str) -> np.dtype:
    """numpy dtype of an MLIR element type; bf16 and others raise UnsupportedTypeError."""
    if element == "bf16":
        raise UnsupportedTypeError(
            "bf16 tensors are not supported by the CPU runner yet (numpy has no bfloat16); use f32"
        )
    try:
        return np.dtype(_NUMPY_DTYPES[element])
    except KeyError:
        raise UnsupportedTypeError(
            f"element type {element!r} is not supported by the CPU runner"
        ) from None


_TENSOR_RE = re.compile(r"^tensor<\s*((?:(?:\d+|\?)x)*)([A-Za-z_][\w.]*)\s*>$")


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A ranked tensor type: shape (None = dynamic) and element type; `text` is the MLIR type
    as written. Non-tensor types have `element` None."""

    text: str
    shape: Optional[Tuple[Optional[int], ...]] = None
    element: Optional[str] = None

    @staticmethod
    def parse(text: str) -> "TensorSpec":
        text = " ".join(text.split())
        m = _TENSOR_RE.match(text)
        if not m:
            return TensorSpec(text)
        dims = tuple(None if d == "?" else int(d) for d in m.group(1).split("x")[:-1])
        return TensorSpec(text, dims, m.group(2))

    @property
    def is_tensor(self) -> bool:
        return self.element is not None

    @property
    def rank(self) -> int:
        return len(self.shape or ())

    @property
    def is_static(self) -> bool:
        return self.is_tensor and all(d is not None for d in self.shape)

    @property
    def dtype(self) -> np.dtype:
        if not self.is_tensor:
            raise UnsupportedTypeError(f"only ranked tensors can be passed, not {self.text}")
        return numpy_dtype(self.element)

    def __str__(self) -> str:
        return self.text


@dataclasses.dataclass
class FunctionSignature:
    name: str
    inputs: List[TensorSpec]
    results: List[TensorSpec]
    attributes: str = ""  # the text inside `attributes {...}`
    visibility: str = "public"
    is_declaration: bool = False

    def attr(self, key: str) -> Optional[str]:
        """The raw text of attribute `key` (e.g. `array<i64: 0, 1>`, `3 : i64`), or None."""
        for entry in _split_top(self.attributes, ","):
            k, sep, v = entry.partition("=")
            if k.strip().strip('"') == key:
                return v.strip() if sep else "unit"
        return None

    def attr_int(self, key: str) -> Optional[int]:
        v = self.attr(key)
        if v is None:
            return None
        m = re.match(r"^(-?\d+)\s*(?::\s*\w+)?$", v)
        if not m:
            raise ValueError(f"@{self.name}: attribute {key} = {v} is not an integer")
        return int(m.group(1))

    def attr_int_array(self, key: str) -> Optional[List[int]]:
        v = self.attr(key)
        if v is None:
            return None
        m = re.match(r"^array<\s*i\d+\s*(?::\s*(.*))?>$", v, re.S)
        if m:
            body = m.group(1) or ""
        else:
            m = re.match(r"^\[(.*)\]$", v, re.S)  # [0 : i64, 1 : i64]
            if not m:
                raise ValueError(f"@{self.name}: attribute {key} = {v} is not an integer array")
            body = m.group(1)
        items = [s.split(":")[0].strip() for s in body.split(",") if s.strip()]
        return [int(s) for s in items]


_OPEN = {"(": ")", "<": ">", "[": "]", "{": "}"}
_CLOSE = {v: k for k, v in _OPEN.items()}


def _matching(text: str, start: int) -> int:
    """Index just past the bracket that closes text[start]; strings are skipped."""
    stack = []
    i = start
    while i < len(text):
        ch = text[i]
        if ch == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch == "-" and text.startswith("->", i):
            i += 1  # not a closing angle bracket
        elif ch in _OPEN:
            stack.append(_OPEN[ch])
        elif ch in _CLOSE:
            if not stack or stack[-1] != ch:
                raise ValueError(f"unbalanced {ch!r} at offset {i}")
            stack.pop()
            if not stack:
                return i + 1
        i += 1
    raise ValueError("unbalanced brackets in function signature")


def _split_top(text: str, sep: str) -> List[str]:
    parts, depth, cur, i = [], 0, [], 0
    while i < len(text):
        ch = text[i]
        if ch == '"':
            j = i + 1
            while j < len(text) and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            cur.append(text[i : j + 1])
            i = j + 1
            continue
        if ch == "-" and text.startswith("->", i):
            cur.append("->")
            i += 2
            continue
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    tail = "".join(cur)
    if tail.strip() or parts:
        parts.append(tail)
    return [p.strip() for p in parts if p.strip()]


def _strip_attr_dict(entry: str) -> str:
    """`tensor<4xf32> {a.b = 1}` -> `tensor<4xf32>`."""
    entry = entry.strip()
    if entry.endswith("}"):
        depth = 0
        for i in range(len(entry) - 1, -1, -1):
            if entry[i] == "}":
                depth += 1
            elif entry[i] == "{":
                depth -= 1
                if depth == 0:
                    return entry[:i].strip()
    return entry


_FUNC_RE = re.compile(r"\bfunc\.func\s+(?:(private|public|nested)\s+)?@(\"[^\"]+\"|[\w$.]+)\s*\(")


def strip_comments(text: str) -> str:
    """Removes `//` comments (outside string literals)."""
    out, i, n = [], 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i : j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def parse_functions(text: str) -> Dict[str, FunctionSignature]:
    """Signatures of every `func.func` in tensor-level MLIR text, by name."""
    text = strip_comments(text)
    sigs: Dict[str, FunctionSignature] = {}
    for m in _FUNC_RE.finditer(text):
        name = m.group(2).strip('"')
        open_paren = m.end() - 1
        close = _matching(text, open_paren)
        inputs = []
        for entry in _split_top(text[open_paren + 1 : close - 1], ","):
            entry = _strip_attr_dict(entry)
            if entry.startswith("%"):
                entry = entry.split(":", 1)[1]
            inputs.append(TensorSpec.parse(entry))
        i = close
        rest = text[i:]
        results: List[TensorSpec] = []
        stripped = rest.lstrip()
        i += len(rest) - len(stripped)
        if stripped.startswith("->"):
            i += 2
            while text[i].isspace():
                i += 1
            if text[i] == "(":
                end = _matching(text, i)
                results = [
                    TensorSpec.parse(_strip_attr_dict(e))
                    for e in _split_top(text[i + 1 : end - 1], ",")
                ]
            else:
                j = i
                while j < len(text) and not text[j].isspace() and text[j] not in "{":
                    if text[j] == "<":
                        j = _matching(text, j)
                    else:
                        j += 1
                end = j
                results = [TensorSpec.parse(text[i:end])]
            i = end
        while i < len(text) and text[i].isspace():
            i += 1
        attributes = ""
        if text.startswith("attributes", i):
            i += len("attributes")
            while text[i].isspace():
                i += 1
            end = _matching(text, i)
            attributes = text[i + 1 : end - 1].strip()
            i = end
        while i < len(text) and text[i].isspace():
            i += 1
        is_decl = not text.startswith("{", i)
        sigs[name] = FunctionSignature(
            name, inputs, results, attributes, m.group(1) or "public", is_decl
        )
    return sigs


# =========================================================================== ctypes

_DESCRIPTORS: Dict[int, type] = {}


def descriptor_type(rank: int) -> type:
    """ctypes struct of a ranked memref descriptor:
    {T *allocated, T *aligned, int64 offset, int64 sizes[rank], int64 strides[rank]};
    rank 0 has only the first three fields."""
    if rank not in _DESCRIPTORS:
        fields = [
            ("allocated", ctypes.c_void_p),
            ("aligned", ctypes.c_void_p),
            ("offset", ctypes.c_int64),
        ]
        if rank:
            fields += [("sizes", ctypes.c_int64 * rank), ("strides", ctypes.c_int64 * rank)]
        _DESCRIPTORS[rank] = type(
            f"MemRefDescriptor{rank}D", (ctypes.Structure,), {"_fields_": fields}
        )
    return _DESCRIPTORS[rank]


def _descriptor(array: np.ndarray):
    assert array.flags.c_contiguous
    rank = array.ndim
    desc = descriptor_type(rank)()
    ptr = array.ctypes.data
    desc.allocated = ptr
    desc.aligned = ptr
    desc.offset = 0
    if rank:
        stride = 1
        strides = [0] * rank
        for i in range(rank - 1, -1, -1):
            strides[i] = stride
            stride *= max(int(array.shape[i]), 1)
        for i in range(rank):
            desc.sizes[i] = int(array.shape[i])
            desc.strides[i] = strides[i]
    return desc


_CIFACE_RE = re.compile(r"llvm\.func\s+@_mlir_ciface_([\w$.]+)\s*\(")
_LOAD_RE = re.compile(
    r"llvm\.load\s+%arg(\d+)\s*:\s*!llvm\.ptr\s*->\s*"
    r"!llvm\.struct<\(ptr, ptr, i64(?:, array<(\d+) x i64>, "
    r"array<\d+ x i64>)?\)>"
)
_STORE_RE = re.compile(r"llvm\.store\s+%[\w.#]+\s*,\s*%arg\d+\s*:")


def _ciface_ranks(llvm_text: str) -> Dict[str, Optional[List[Optional[int]]]]:
    """For each `_mlir_ciface_<name>`: the memref rank of each argument where the body's
    descriptor loads show it (None where unknown)."""
    out: Dict[str, Optional[List[Optional[int]]]] = {}
    for m in _CIFACE_RE.finditer(llvm_text):
        name = m.group(1)
        close = _matching(llvm_text, m.end() - 1)
        args = [_strip_attr_dict(a) for a in _split_top(llvm_text[m.end() : close - 1], ",")]
        returns_value = llvm_text[close : close + 80].lstrip().startswith("->")
        if returns_value or not all(a.endswith("!llvm.ptr") for a in args):
            out[name] = None  # not the memref-only, void convention
            continue
        ranks: List[Optional[int]] = [None] * len(args)
        # the ciface body: up to the next llvm.func
        nxt = re.compile(r"\bllvm\.func\b").search(llvm_text, close)
        body = llvm_text[close : nxt.start() if nxt else len(llvm_text)]
        if _STORE_RE.search(body):
            out[name] = None  # results returned through a struct pointer
            continue
        for lm in _LOAD_RE.finditer(body):
            idx = int(lm.group(1))
            if idx < len(ranks) and ranks[idx] is None:
                ranks[idx] = int(lm.group(2)) if lm.group(2) else 0
        out[name] = ranks
    return out


def _runner_utils_flags() -> List[str]:
    libs = [
        lib
        for lib in ("mlir_c_runner_utils", "mlir_runner_utils")
        if (LLVM_LIB / f"lib{lib}.so").exists()
    ]
    if not libs:
        return []
    return [
        f"-L{LLVM_LIB}",
        f"-Wl,-rpath,{LLVM_LIB}",
        "-Wl,--as-needed",
        *[f"-l{lib}" for lib in libs],
    ]


class CpuModule:
    """A lowered (LLVM dialect) module compiled to a shared library and loaded with ctypes.

    `call(name, inputs, outputs)`: `inputs` are numpy arrays (copied to C-contiguous buffers, so
    the caller's arrays are never written), `outputs` a list of (shape, dtype); returns the
    output arrays. Arguments are checked against what the C interface shows (count, rank)."""

    def __init__(
        self, llvm_mlir_text: str, *, opt_level: str = "-O1", keep_dir: Optional[str] = None
    ):
        self.llvm_mlir_text = llvm_mlir_text
        self.ranks = _ciface_ranks(llvm_mlir_text)
        translate, clang = find_mlir_translate(), find_clang()
        workdir = keep_dir or tempfile.mkdtemp(prefix="moe_mlir_cpu_")
        os.makedirs(workdir, exist_ok=True)
        try:
            src = os.path.join(workdir, "module.mlir")
            ll = os.path.join(workdir, "module.ll")
            so = os.path.join(workdir, "module.so")
            with open(src, "w") as fh:
                fh.write(llvm_mlir_text)
            _run(
                translate,
                ["--mlir-to-llvmir", src, "-o", ll],
                None,
                CompileError,
                "mlir-translate",
                retries=1,
            )
            _run(
                clang,
                [
                    "-shared",
                    "-fPIC",
                    opt_level,
                    "-Wno-override-module",
                    ll,
                    "-o",
                    so,
                    "-Wl,--no-undefined",
                    *_runner_utils_flags(),
                    "-lm",
                ],
                None,
                CompileError,
                "clang",
                retries=1,
            )
            try:
                self.lib = ctypes.CDLL(so)
            except OSError as exc:
                raise CompileError("ctypes", [so], None, str(exc)) from exc
        finally:
            if keep_dir is None:
                shutil.rmtree(workdir, ignore_errors=True)
        self.workdir = keep_dir
        self._lock = threading.Lock()

    @classmethod
    def load(cls, so_path: str, llvm_mlir_text: str) -> "CpuModule":
        """A module compiled before (its `module.so`, kept with `keep_dir`, and the LLVM-dialect
        text it was built from): loaded with ctypes, nothing compiled. The compile cache of
        `moe_mlir.compile_cache` uses it."""
        self = cls.__new__(cls)
        self.llvm_mlir_text = llvm_mlir_text
        self.ranks = _ciface_ranks(llvm_mlir_text)
        try:
            self.lib = ctypes.CDLL(os.path.abspath(so_path))
        except OSError as exc:
            raise CompileError("ctypes", [so_path], None, str(exc)) from exc
        self.workdir = os.path.dirname(os.path.abspath(so_path))
        self._lock = threading.Lock()
        return self

    @property
    def functions(self) -> List[str]:
        return sorted(self.ranks)

    def call(
        self,
        name: str,
        inputs: Sequence[np.ndarray],
        outputs: Sequence[Tuple[Sequence[int], object]],
    ) -> List[np.ndarray]:
        if name not in self.ranks:
            raise ValueError(
                f"no function _mlir_ciface_{name} in the module (C interfaces: "
                f"{', '.join(self.functions) or 'none'})"
            )
        try:
            fn = getattr(self.lib, f"_mlir_ciface_{name}")
        except AttributeError:
            raise ValueError(
                f"_mlir_ciface_{name} is not exported by the compiled module"
            ) from None
        arrays = []
        for i, a in enumerate(inputs):
            if not isinstance(a, np.ndarray):
                raise ValueError(
                    f"input {i} of @{name} is a {type(a).__name__}, expected a numpy array"
                )
            arrays.append(np.array(a, order="C", copy=True))
        outs = []
        for i, spec in enumerate(outputs):
            try:
                shape, dtype = spec
                shape = tuple(int(s) for s in shape)
                dtype = np.dtype(dtype)
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"output {i} of @{name}: expected (shape, dtype), got {spec!r}"
                ) from exc
            if any(s < 0 for s in shape):
                raise ValueError(f"output {i} of @{name}: negative size in {shape}")
            outs.append(np.zeros(shape, dtype=dtype))
        ranks = self.ranks[name]
        every = arrays + outs
        if ranks is None:
            raise ValueError(
                f"_mlir_ciface_{name} does not follow the calling convention "
                f"(void, one memref descriptor pointer per argument): scalar "
                f"arguments, or results not turned into out-params"
            )
        if len(ranks) != len(every):
            raise ValueError(
                f"@{name} takes {len(ranks)} memref arguments (inputs, then "
                f"outputs), got {len(arrays)} inputs and {len(outs)} outputs"
            )
        for i, (r, a) in enumerate(zip(ranks, every)):
            if r is not None and r != a.ndim:
                what = f"input {i}" if i < len(arrays) else f"output {i - len(arrays)}"
                raise ValueError(
                    f"@{name}: {what} has rank {a.ndim}, the function expects rank {r}"
                )
        descs = [_descriptor(a) for a in every]
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p] * len(descs)
        with self._lock:
            fn(*[ctypes.cast(ctypes.pointer(d), ctypes.c_void_p) for d in descs])
        return outs


# =========================================================================== tensor level


def check_signature_supported(sig: FunctionSignature) -> None:
    """Raises UnsupportedTypeError unless every input and result is a ranked tensor of a
    supported element type. A result of dynamic shape needs its shape from the caller
    (`result_shapes`)."""
    for kind, types in (("input", sig.inputs), ("result", sig.results)):
        for i, t in enumerate(types):
            try:
                _ = t.dtype
            except UnsupportedTypeError as exc:
                raise UnsupportedTypeError(f"@{sig.name} {kind} {i} ({t}): {exc}") from None


# =========================================================================== index inputs

# The integer operands of each moe op whose values the CPU kernels use as indices, by operand
# position: the kind of index and the operand (position, dimension) that bounds it. Most
# kernels read the queues without a bounds check (a token id or an offset out of range reads
# or writes out of bounds), so a function's inputs that reach them are checked before a call.
_INDEX_OPERANDS = {
    "dispatch": [("experts", 0, None)],
    "expert_ffn": [("token_ids", 1, (0, 0)), ("offsets", 2, (3, 0))],
    "expert_ffn_grad": [("token_ids", 1, (0, 0)), ("offsets", 2, (3, 0))],
    "expert_combine_grad": [("token_ids", 1, (0, 0)), ("offsets", 2, (5, 0)), ("rows", 3, (1, 0))],
    "combine": [("rows", 2, (0, 0))],
    "combine_grad": [("rows", 2, (3, 0))],
    "router_grad": [("experts", 3, (2, 1))],
    "aux_loss": [("experts", 1, (0, 1))],
    "aux_loss_grad": [("experts", 1, (0, 1))],
}
_GENERIC_OP_RE = re.compile(r'"moe\.(\w+)"\(([^)]*)\)')


@dataclasses.dataclass
class IndexCheck:
    """One function input that an op reads as indices, and what bounds its values."""

    arg: int  # the function's input
    kind: str  # token_ids, offsets, rows or experts
    op: str
    bound: Optional[tuple]  # ("arg", input, dim) or ("size", n); None: unknown
    queue: Optional[tuple] = None  # offsets: what bounds them, the token ids' count (_bound)
    num_experts: Optional[int] = None
    # token ids: the input holding the op's offsets, whose last entry ends the rows read (the
    # entries past it are unused: -1 after moe.ep_queues); None when the offsets are made inside
    ends: Optional[int] = None


def _bound(ref, operands: List[str], types: List[str], args: Dict[str, int]):
    """What bounds an index operand: ("arg", input, dim) when operand ref[0] is a function
    input, ("size", n) when its type's dimension ref[1] is static, else None."""
    if ref is None:
        return None
    pos, dim = ref
    if operands[pos] in args:
        return ("arg", args[operands[pos]], dim)
    shape = TensorSpec.parse(types[pos]).shape
    size = shape[dim] if dim < len(shape) else None
    return ("size", size) if size is not None else None


def index_checks(generic_text: str) -> Dict[str, List[IndexCheck]]:
    """For each function of generic-form MLIR (`--mlir-print-op-generic`), its inputs that a moe
    op reads as indices, with what bounds their values (_bound)."""
    text = strip_comments(generic_text)
    checks: Dict[str, List[IndexCheck]] = {}
    for m in re.finditer(r'"func\.func"\(\) <\{', text):
        props_end = _matching(text, m.end() - 2)
        name = re.search(r'sym_name = "([^"]+)"', text[m.end() : props_end])
        region = text.find("({", props_end, props_end + 4)
        if not name or region < 0:
            continue
        body = text[region : _matching(text, region)]
        header = re.match(r"\(\{\s*\^bb0\(([^)]*)\)", body)
        args = {}
        if header:
            for i, entry in enumerate(_split_top(header.group(1), ",")):
                args[entry.split(":")[0].strip()] = i
        # The arguments of a checkpoint's region are its operands.
        for c in re.finditer(r'"moe\.checkpoint"\(([^)]*)\)[^(]*\(\{\s*\^bb0\(([^)]*)\)', body):
            outer = [o.strip() for o in c.group(1).split(",") if o.strip()]
            inner = [e.split(":")[0].strip() for e in _split_top(c.group(2), ",")]
            for a, b in zip(outer, inner):
                if a in args:
                    args[b] = args[a]
        found = []
        for op in _GENERIC_OP_RE.finditer(body):
            kind_list = _INDEX_OPERANDS.get(op.group(1))
            if not kind_list:
                continue
            operands = [o.strip() for o in op.group(2).split(",")]
            sig = body.find(" : (", op.end())
            types = _split_top(body[sig + 3 : _matching(body, sig + 3)][1:-1], ",")
            props = body[op.end() : sig]
            experts = re.search(r"num_experts = (\d+)", props)

            queue = _bound((1, 0), operands, types, args) if op.group(1) != "dispatch" else None
            for kind, pos, ref in kind_list:
                if operands[pos] not in args:
                    continue
                ends = None
                if kind == "token_ids" and len(operands) > 2 and operands[2] in args:
                    ends = args[operands[2]]
                found.append(
                    IndexCheck(
                        args[operands[pos]],
                        kind,
                        op.group(1),
                        _bound(ref, operands, types, args),
                        queue if kind == "offsets" else None,
                        int(experts.group(1)) if experts else None,
                        ends,
                    )
                )
        checks[name.group(1)] = found
    return checks


def check_index_inputs(name: str, checks: Sequence[IndexCheck], arrays: Sequence[np.ndarray]):
    """Raises ValueError when an input a moe op reads as indices holds a value out of range."""

    def size(bound):
        return arrays[bound[1]].shape[bound[2]] if bound[0] == "arg" else bound[1]

    def fail(check, detail):
        raise ValueError(f"@{name} input {check.arg} ({check.kind} of 'moe.{check.op}') {detail}")

    for check in checks:
        a = np.asarray(arrays[check.arg]).astype(np.int64).reshape(-1)
        bound = size(check.bound) if check.bound else None
        if check.kind == "offsets":
            if bound is not None and a.size != bound + 1:
                fail(check, f"has {a.size} entries for {bound} experts (expected {bound + 1})")
            if a.size == 0 or a[0] != 0:
                fail(check, "must start at 0")
            if (np.diff(a) < 0).any():
                fail(check, "must not decrease")
            rows = size(check.queue) if check.queue else None
            if rows is not None and a[-1] > rows:
                fail(check, f"ends at {a[-1]}, past the {rows} token ids")
        elif check.kind == "token_ids":
            # The rows the offsets hold are read; those past them may be -1 (unused).
            used = a
            if check.ends is not None:
                offsets = np.asarray(arrays[check.ends]).reshape(-1)
                end = int(np.clip(offsets[-1], 0, a.size)) if offsets.size else a.size
                used, unused = a[:end], a[end:]
                if (
                    bound is not None
                    and unused.size
                    and (unused.min() < -1 or unused.max() >= bound)
                ):
                    bad = unused[(unused < -1) | (unused >= bound)][0]
                    fail(check, f"holds token id {bad} in an unused row, neither -1 nor a token")
            if bound is not None and used.size and (used.min() < 0 or used.max() >= bound):
                bad = used[(used < 0) | (used >= bound)][0]
                fail(check, f"holds token id {bad}, outside [0, {bound}) tokens")
        elif check.kind == "rows":
            if bound is not None and a.size and (a.min() < -1 or a.max() >= bound):
                bad = a[(a < -1) | (a >= bound)][0]
                fail(check, f"holds row {bad}, neither -1 (dropped) nor in [0, {bound})")
        elif check.kind == "experts":
            experts = check.num_experts if check.bound is None else bound
            if experts is not None and a.size and (a.min() < 0 or a.max() >= experts):
                bad = a[(a < 0) | (a >= experts)][0]
                fail(check, f"holds expert {bad}, outside [0, {experts})")


class CompiledFunction:
    """A public function of a compiled module, typed by its tensor-level signature."""

    def __init__(self, module: CpuModule, signature: FunctionSignature):
        check_signature_supported(signature)
        self.module = module
        self.signature = signature
        self.name = signature.name
        self.index_checks: List[IndexCheck] = []

    def check_inputs(self, inputs: Sequence) -> List[np.ndarray]:
        sig = self.signature
        if len(inputs) != len(sig.inputs):
            raise ValueError(f"@{sig.name} takes {len(sig.inputs)} inputs, got {len(inputs)}")
        arrays = []
        for i, (a, t) in enumerate(zip(inputs, sig.inputs)):
            a = np.asarray(a)
            if a.dtype != t.dtype:
                raise ValueError(
                    f"@{sig.name} input {i} ({t}) has dtype {a.dtype}, expected {t.dtype}"
                )
            if a.ndim != t.rank or any(s is not None and s != n for s, n in zip(t.shape, a.shape)):
                raise ValueError(
                    f"@{sig.name} input {i} ({t}) has shape {tuple(a.shape)}, "
                    f"expected {tuple('?' if s is None else s for s in t.shape)}"
                )
            arrays.append(a)
        return arrays

    def __call__(self, *inputs, result_shapes=None) -> Tuple[np.ndarray, ...]:
        """Runs the function. The caller allocates the results: `result_shapes` gives one
        shape a result where any is dynamic (the static sizes must match)."""
        arrays = self.check_inputs(inputs)
        check_index_inputs(self.name, self.index_checks, arrays)
        results = self.signature.results
        if result_shapes is None:
            dynamic = [i for i, t in enumerate(results) if not t.is_static]
            if dynamic:
                raise ValueError(
                    f"@{self.name} result {dynamic[0]} ({results[dynamic[0]]}) has a dynamic "
                    f"shape: pass result_shapes"
                )
            result_shapes = [t.shape for t in results]
        if len(result_shapes) != len(results):
            raise ValueError(
                f"@{self.name} has {len(results)} results, got {len(result_shapes)} shapes"
            )
        for i, (t, shape) in enumerate(zip(results, result_shapes)):
            if len(shape) != t.rank or any(
                s is not None and s != n for s, n in zip(t.shape, shape)
            ):
                raise ValueError(f"@{self.name} result {i} ({t}) cannot have shape {tuple(shape)}")
        outs = [(tuple(shape), t.dtype) for t, shape in zip(results, result_shapes)]
        return tuple(self.module.call(self.name, arrays, outs))


class CompiledModule:
    """Tensor-level MLIR lowered and compiled. `module[name]` is a CompiledFunction."""

    def __init__(
        self,
        tensor_ir: str,
        lowered_ir: str,
        cpu_module: CpuModule,
        checks: Optional[Dict[str, List[IndexCheck]]] = None,
    ):
        self.tensor_ir = tensor_ir
        self.lowered_ir = lowered_ir
        self.cpu = cpu_module
        self.signatures = parse_functions(tensor_ir)
        self.checks = checks or {}
        self._functions: Dict[str, CompiledFunction] = {}

    def __getitem__(self, name: str) -> CompiledFunction:
        if name not in self._functions:
            sig = self.signatures.get(name)
            if sig is None or sig.visibility != "public" or sig.is_declaration:
                public = [
                    n
                    for n, s in self.signatures.items()
                    if s.visibility == "public" and not s.is_declaration
                ]
                raise KeyError(f"no public function @{name} (have: {', '.join(public)})")
            function = CompiledFunction(self.cpu, sig)
            function.index_checks = self.checks.get(name, [])
            self._functions[name] = function
        return self._functions[name]

    def __contains__(self, name: str) -> bool:
        return name in self.signatures


def compile_mlir(
    text: str,
    passes: Optional[Sequence[str]] = None,
    *,
    pre_passes: Sequence[str] = (),
    opt_tool: Optional[str] = None,
    keep_dir: Optional[str] = None,
) -> CompiledModule:
    """Lowers tensor-level MLIR with `opt_tool` (default moe-opt) and compiles it.

    `pre_passes` (if any) run first and their output is the tensor-level IR whose signatures
    are read (e.g. `--moe-decompose --moe-generate-backward`); `passes` (default
    `--moe-lower-to-cpu-pipeline`) then lower it to the LLVM dialect."""
    passes = CPU_PIPELINE if passes is None else passes
    if pre_passes:
        text = run_opt(text, pre_passes, opt_tool)
    lowered = run_opt(text, passes, opt_tool)
    checks = {}
    if "moe." in text:  # which inputs moe ops read as indices, from the generic form
        checks = index_checks(run_opt(text, ["--mlir-print-op-generic"], opt_tool))
    return CompiledModule(text, lowered, CpuModule(lowered, keep_dir=keep_dir), checks)


def compile_function(
    text: str,
    name: Optional[str] = None,
    passes: Optional[Sequence[str]] = None,
    *,
    opt_tool: Optional[str] = None,
    keep_dir: Optional[str] = None,
) -> CompiledFunction:
    """One function of tensor-level MLIR as a numpy callable. With `name` None the module must
    hold exactly one public function. Its types are checked before any tool runs."""
    sigs = {
        n: s
        for n, s in parse_functions(text).items()
        if s.visibility == "public" and not s.is_declaration
    }
    if name is None:
        if len(sigs) != 1:
            raise ValueError(
                f"expected one public function, found {len(sigs)}: {', '.join(sigs)}; pass name="
            )
        name = next(iter(sigs))
    if name not in sigs:
        raise KeyError(f"no public function @{name} (have: {', '.join(sigs)})")
    check_signature_supported(sigs[name])  # before running any tool
    return compile_mlir(text, passes, opt_tool=opt_tool, keep_dir=keep_dir)[name]


# =========================================================================== a layer


def token_rows(
    config,
    name: str,
    signatures: Dict[str, "FunctionSignature"],
    pre_passes: Sequence[str] = LAYER_PRE_PASSES,
    opt_tool: Optional[str] = None,
) -> Dict[str, List[Optional[int]]]:
    """For each function of `signatures` (a layer of dynamic token count through
    `pre_passes`), the rows a token of each result's dynamic leading size (None for a static
    result): the sizes of the same layer at T = 1 through the same passes (moe-opt only)."""
    from .mlir_text import layer_mlir

    probe = dataclasses.replace(config, tokens=1)
    sigs = parse_functions(run_opt(layer_mlir(probe, name), pre_passes, opt_tool))
    return {
        fname: [
            None if t.is_static else sigs[fname].results[i].shape[0]
            for i, t in enumerate(sig.results)
        ]
        for fname, sig in signatures.items()
        if fname in sigs
    }


def tokens_within(x, max_tokens: int) -> int:
    """T of a call with x (numpy or torch, T its leading size); a ValueError outside
    [1, max_tokens], the bound the layer was compiled for."""
    tokens = int(np.shape(x)[0]) if np.ndim(x) >= 1 else 0
    if not 1 <= tokens <= max_tokens:
        raise ValueError(
            f"the token count T = {tokens} is outside [1, {max_tokens}], the bound "
            f"the layer was compiled for"
        )
    return tokens


class CompiledLayer:
    """One `moe.layer` (from a LayerConfig) through `moe-decompose`, `moe-generate-backward`
    and the CPU pipeline.

    - `layer(*args)` runs `@<name>`: returns (out, logits);
    - `forward(*args)` runs `@<name>_forward`: returns (out, logits, saved);
    - `backward(saved, d_out, d_logits)` runs `@<name>_backward`: returns {arg name: gradient}
      for the arguments `moe.gradient_args` lists.

    Arguments are in the order of `config.arg_names()` (or a dict by those names). The
    `@<name>_forward`/`@<name>_backward` contract (moe.num_saved, moe.gradient_args, the types)
    is checked when the module is built."""

    def __init__(
        self,
        config,
        name: str = "moe_layer",
        *,
        pre_passes: Sequence[str] = LAYER_PRE_PASSES,
        passes: Sequence[str] = CPU_PIPELINE,
        opt_tool: Optional[str] = None,
        source: Optional[str] = None,
        module: Optional["CompiledModule"] = None,
        max_tokens: Optional[int] = None,
        result_rows: Optional[Dict[str, List[Optional[int]]]] = None,
    ):
        from .mlir_text import layer_mlir

        self.config = config
        self.name = name
        # With `max_tokens` one module serves every T in [1, max_tokens] (config.tokens unused).
        self.max_tokens = max_tokens
        # `source` replaces the generated layer text (tests of the plumbing use it).
        self.source = layer_mlir(config, name, max_tokens) if source is None else source
        # `module`: the layer compiled before (the compile cache passes it); nothing runs then.
        self.module = (
            module
            if module is not None
            else compile_mlir(self.source, passes, pre_passes=pre_passes, opt_tool=opt_tool)
        )
        self.arg_names = config.arg_names()
        self.has_backward = f"{name}_backward" in self.module.signatures
        if self.has_backward:
            self._check_backward_contract()
        # Each function's results as rows a token of T where the leading size is dynamic.
        self._rows: Dict[str, List[Optional[int]]] = {}
        if max_tokens is not None:
            self._rows = (
                result_rows
                if result_rows is not None
                else token_rows(config, name, self.module.signatures, pre_passes, opt_tool)
            )

    def _tokens(self, x: np.ndarray) -> int:
        return tokens_within(x, self.max_tokens)

    def _run(self, fname: str, args: Sequence[np.ndarray], tokens: Optional[int]):
        function = self.module[fname]
        if self.max_tokens is None:
            return function(*args)
        shapes = [
            t.shape if rows is None else (rows * tokens, *t.shape[1:])
            for t, rows in zip(function.signature.results, self._rows[fname])
        ]
        return function(*args, result_shapes=shapes)

    def _check_backward_contract(self) -> None:
        sigs = self.module.signatures
        f, fwd, bwd = sigs[self.name], sigs[f"{self.name}_forward"], sigs[f"{self.name}_backward"]
        num_saved = fwd.attr_int("moe.num_saved")
        grad_args = bwd.attr_int_array("moe.gradient_args")
        if num_saved is None:
            raise ValueError(f"@{fwd.name} has no moe.num_saved attribute")
        if grad_args is None:
            raise ValueError(f"@{bwd.name} has no moe.gradient_args attribute")
        problems = []
        if [t.text for t in fwd.inputs] != [t.text for t in f.inputs]:
            problems.append(f"@{fwd.name} inputs differ from @{f.name}'s")
        if len(fwd.results) != len(f.results) + num_saved:
            problems.append(
                f"@{fwd.name} has {len(fwd.results)} results, expected "
                f"{len(f.results)} + moe.num_saved = {num_saved}"
            )
        saved = fwd.results[len(f.results) :]
        expected_in = [t.text for t in saved] + [t.text for t in f.results]
        if [t.text for t in bwd.inputs] != expected_in:
            problems.append(
                f"@{bwd.name} inputs ({', '.join(map(str, bwd.inputs))}) are not "
                f"saved + d_out, d_logits ({', '.join(expected_in)})"
            )
        if len(bwd.results) != len(grad_args):
            problems.append(
                f"@{bwd.name} returns {len(bwd.results)} gradients but "
                f"moe.gradient_args lists {len(grad_args)}"
            )
        for idx, t in zip(grad_args, bwd.results):
            if not 0 <= idx < len(f.inputs):
                problems.append(f"moe.gradient_args index {idx} out of range")
            elif t.text != f.inputs[idx].text:
                problems.append(
                    f"gradient of argument {idx} has type {t}, expected {f.inputs[idx]}"
                )
        if problems:
            raise ValueError("backward contract violated: " + "; ".join(problems))
        self.num_saved = num_saved
        self.gradient_args = grad_args
        self.gradient_names = [self.arg_names[i] for i in grad_args]

    def _args(self, args) -> List[np.ndarray]:
        if len(args) == 1 and isinstance(args[0], Mapping):
            given = args[0]
            unknown = set(given) - set(self.arg_names)
            if unknown:
                raise ValueError(
                    f"unknown layer arguments {sorted(unknown)}; expected {self.arg_names}"
                )
            missing = [n for n in self.arg_names if given.get(n) is None]
            if missing:
                raise ValueError(f"missing layer arguments {missing}")
            return [given[n] for n in self.arg_names]
        return list(args)

    def __call__(self, *args):
        args = self._args(args)
        tokens = self._tokens(args[0]) if self.max_tokens is not None else None
        return self._run(self.name, args, tokens)

    def forward(self, *args):
        if not self.has_backward:
            raise ValueError(
                f"the module has no @{self.name}_forward (run --moe-generate-backward)"
            )
        args = self._args(args)
        tokens = self._tokens(args[0]) if self.max_tokens is not None else None
        res = self._run(f"{self.name}_forward", args, tokens)
        return res[0], res[1], tuple(res[2:])

    def backward(
        self, saved: Sequence[np.ndarray], d_out: np.ndarray, d_logits: np.ndarray
    ) -> Dict[str, np.ndarray]:
        if not self.has_backward:
            raise ValueError(f"the module has no @{self.name}_backward")
        tokens = self._tokens(d_out) if self.max_tokens is not None else None
        grads = self._run(f"{self.name}_backward", [*saved, d_out, d_logits], tokens)
        return dict(zip(self.gradient_names, grads))
