"""The on-disk compile cache of `moe_mlir.layer`: one compiled layer per (config, target).

An entry lives in `ROOT/<target>/<config key>/<compiler key>/`:

- `config key`: sha256 of the `LayerConfig` (token count included: layers are compiled for a
  static T), the target (`cpu` or `sm_90a`), the build options (activation-memory budget and
  policy), `GENERATOR_VERSION` and the layer's MLIR text;
- `compiler key`: sha256 of the compiler binary that built it (`moe-opt` for `cpu`,
  `moe-compile` for `sm_90a`);
- `meta.json`: the config, the compiler path and key, when, and how long the build took.

Lookup: with the compiler present here, the entry of its exact key (else it is built); without it
(the GPU machine has no LLVM) the newest entry of the config key, from any root. Roots, searched
in order: `$MOE_MLIR_PREBUILT` (folders separated by `:`, read-only: e.g. the `gpu-inputs/torch-cache`
that scripts/inputs/build-torch-cache.sh fills on the LLVM machine), then `$MOE_MLIR_CACHE` (default
`~/.cache/moe_mlir`), the only one written. Builds go to a temporary folder renamed into place, so
two processes building the same entry do not see half of it.

An expert-parallel layer (`BuildOptions.ep`, a `distributed.EPSpec`) is keyed by its EPSpec
too (its layer text holds ep_size, ep_capacity, ...): its `sm_90a` entry is the stages of one
rank, run by `distributed.GPUEPLayer` (`load_gpu_ep_layer`).

CPU entries hold `layer.mlir`, `tensor.mlir` (after the pre-passes), `module.mlir` (LLVM dialect)
and `module.so`. `sm_90a` entries hold `moe-compile`'s NAME.o, NAME.h, NAME.json; NAME.o is linked
with libmoe_runtime into NAME.so on the machine that runs it (`link_gpu_layer`, into the writable
root, so a read-only prebuilt folder works), with `$MOE_RUNTIME_LIB` (libmoe_runtime.so or its
folder) and `$CXX` (default g++).

Compiles that take more than about a second print progress on stderr (`MOE_MLIR_QUIET=1`
silences it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .config import LayerConfig
from .mlir_text import layer_mlir

__all__ = [
    "GENERATOR_VERSION",
    "TARGETS",
    "BuildOptions",
    "CacheEntry",
    "cache_root",
    "prebuilt_roots",
    "config_key",
    "tool_key",
    "find_moe_compile",
    "layer_name",
    "get_cpu_layer",
    "build_gpu_entry",
    "find_gpu_entry",
    "link_gpu_layer",
    "load_gpu_ep_layer",
    "moe_compile_command",
    "NoCompilerError",
    "Progress",
]

# Bump when what is compiled for a config changes outside the compiler (mlir_text, the passes
# asked for, the entry layout).
GENERATOR_VERSION = "1"
TARGETS = ("cpu", "sm_90a")


class NoCompilerError(RuntimeError):
    """No compiler here and no prebuilt entry for the layer."""


POLICIES = ("auto", "keep", "recompute", "offload")
# What moe-plan-activations' memory-budget takes (lib/Support/MemorySize.cpp), without spaces.
_MEMORY_SIZE = re.compile(r"(\d+(\.\d*)?|\.\d+)(B|kB|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?")
# One moe-compile --kernel-config: moe-compile checks the names and values.
_KERNEL_CONFIG = re.compile(r"([a-z_]+\.)?[a-z_]+(:[a-z_]+=[A-Za-z0-9_\[\], ]+)+")


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """What, besides the config, changes the compiled layer."""

    memory_budget: Optional[str] = None  # moe-plan-activations memory-budget ("1GiB", ...)
    policy: str = "auto"  # moe-plan-activations policy: auto, keep, recompute, offload
    # The GPU's SMs (moe-compile --num-sms; 0: the chip's, 132 for sm_90a).
    num_sms: int = 0
    # GEMM kernel parameters (moe-compile --kernel-config), "[OP.]ROLE:KEY=VALUE[:...]".
    kernel_configs: Tuple[str, ...] = ()
    # A dynamic token count up to this bound (moe.layer's max_tokens): one layer for every
    # T in [1, max_tokens]; config.tokens is then unused. None: the static config.tokens.
    max_tokens: Optional[int] = None
    # Expert parallelism (a moe_mlir.distributed.EPSpec): the layer of one rank, its stages
    # entry points of their own (sm_90a only; the CPU path's is distributed.EPLayer).
    ep: Optional[Any] = None

    def __post_init__(self):
        # Both go into a pass option string: a value with a space or an '=' would carry
        # other options along (a report file, another budget).
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {self.policy!r}")
        if self.memory_budget is not None and not (
            isinstance(self.memory_budget, str) and _MEMORY_SIZE.fullmatch(self.memory_budget)
        ):
            raise ValueError(
                f"memory_budget must be a byte count such as '2GiB', '512MiB' or "
                f"'1000000', not {self.memory_budget!r}"
            )
        if (
            isinstance(self.num_sms, bool)
            or not isinstance(self.num_sms, int)
            or not 0 <= self.num_sms <= 1024
        ):
            raise ValueError(f"num_sms must be 0 (the chip's) or 1 to 1024, not {self.num_sms!r}")
        if isinstance(self.kernel_configs, str) or not all(
            isinstance(c, str) and _KERNEL_CONFIG.fullmatch(c) for c in self.kernel_configs
        ):
            raise ValueError(
                "kernel_configs must be a sequence of '[OP.]ROLE:KEY=VALUE[:KEY=VALUE...]' "
                f"strings such as 'expert_ffn.down:stages=2', not {self.kernel_configs!r}"
            )
        object.__setattr__(self, "kernel_configs", tuple(self.kernel_configs))
        if self.max_tokens is not None and (
            isinstance(self.max_tokens, bool)
            or not isinstance(self.max_tokens, int)
            or self.max_tokens < 1
        ):
            raise ValueError(f"max_tokens must be a positive integer, not {self.max_tokens!r}")
        if self.ep is not None:
            from .distributed import EPSpec  # noqa: PLC0415

            if not isinstance(self.ep, EPSpec):
                raise TypeError(
                    f"ep must be a moe_mlir.distributed.EPSpec, not {type(self.ep).__name__}"
                )
            self.ep.validate()

    def as_dict(self) -> Dict[str, Any]:
        # Options at their defaults are left out, so that adding one keeps the keys of the
        # layers compiled before.
        data = dataclasses.asdict(self)
        if not self.num_sms:
            del data["num_sms"]
        if not self.kernel_configs:
            del data["kernel_configs"]
        else:
            data["kernel_configs"] = list(self.kernel_configs)
        if self.max_tokens is None:
            del data["max_tokens"]
        if self.ep is None:
            del data["ep"]
        else:  # unset fields left out, so that a field added later keeps the keys
            data["ep"] = {
                f.name: getattr(self.ep, f.name)
                for f in dataclasses.fields(self.ep)
                if getattr(self.ep, f.name) is not None
            }
        return data


def default_bound(tokens: int) -> int:
    """The bound MoELayer compiles a layer of dynamic token count at when it first sees
    `tokens` tokens and was given no max_tokens: `tokens` rounded up to a power of two."""
    return 1 << max(0, int(tokens) - 1).bit_length()


# --------------------------------------------------------------------------- roots and keys


def cache_root() -> Path:
    value = os.environ.get("MOE_MLIR_CACHE")
    return Path(value) if value else Path.home() / ".cache" / "moe_mlir"


def prebuilt_roots() -> List[Path]:
    value = os.environ.get("MOE_MLIR_PREBUILT", "")
    return [Path(p) for p in value.split(os.pathsep) if p]


def layer_name(config: LayerConfig) -> str:
    """The layer's function name (a C identifier): moe_<short config key>."""
    return "moe_" + _config_digest(config, "any", BuildOptions())[:12]


def _keyed(config: LayerConfig, options: BuildOptions) -> LayerConfig:
    """`config` as its keys see it: with a dynamic token count its tokens do not matter, and
    are the bound."""
    if options.max_tokens is None:
        return config
    return dataclasses.replace(config, tokens=options.max_tokens)


def _config_digest(config: LayerConfig, target: str, options: BuildOptions) -> str:
    config = _keyed(config, options)
    data = {
        "config": dataclasses.asdict(config),
        "target": target,
        "options": options.as_dict(),
        "generator": GENERATOR_VERSION,
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def config_key(config: LayerConfig, target: str, options: BuildOptions) -> str:
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    config = _keyed(config, options)
    text = layer_mlir(config, layer_name(config), options.max_tokens, ep=options.ep)
    h = hashlib.sha256(_config_digest(config, target, options).encode())
    h.update(text.encode())
    return h.hexdigest()[:24]


_TOOL_KEYS: Dict[Tuple[str, int, int], str] = {}


def tool_key(path: str) -> str:
    """sha256 (24 hex digits) of a compiler binary, memoised by path, size and mtime."""
    st = os.stat(path)
    memo = (os.path.abspath(path), st.st_size, int(st.st_mtime_ns))
    if memo not in _TOOL_KEYS:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _TOOL_KEYS[memo] = h.hexdigest()[:24]
    return _TOOL_KEYS[memo]


def find_moe_compile() -> Optional[str]:
    """`MOE_COMPILE`, `$MOE_BUILD_DIR/bin/moe-compile`, build/bin of this repository, PATH;
    None when there is none (the GPU machine)."""
    from .cpu import REPO_ROOT, _which  # noqa: PLC0415

    if os.environ.get("MOE_COMPILE"):  # "none" (not a file): no compiler, prebuilt entries only
        return _which([os.environ["MOE_COMPILE"]])
    candidates: List[Any] = [REPO_ROOT / "build" / "bin" / "moe-compile", "moe-compile"]
    if os.environ.get("MOE_BUILD_DIR"):
        candidates.insert(0, Path(os.environ["MOE_BUILD_DIR"]) / "bin" / "moe-compile")
    return _which(candidates)


def _find_moe_opt() -> Optional[str]:
    from .cpu import ToolError, find_moe_opt  # noqa: PLC0415

    try:
        path = find_moe_opt()
    except ToolError:
        return None
    return path if os.path.isfile(path) else shutil.which(path)


# --------------------------------------------------------------------------- progress


class Progress:
    """Prints `moe_mlir: compiling WHAT ...` on stderr once a build has taken `after` seconds,
    then every `every` seconds, and the total at the end (only if it printed before)."""

    def __init__(self, what: str, after: float = 1.0, every: float = 15.0, stream=None):
        self.what = what
        self.after = after
        self.every = every
        self.stream = stream
        self.step = ""
        self.printed = False
        self.quiet = os.environ.get("MOE_MLIR_QUIET", "") not in ("", "0")
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.start = 0.0

    def _print(self, text: str) -> None:
        if self.quiet:
            return
        stream = self.stream or sys.stderr
        print(f"moe_mlir: {text}", file=stream, flush=True)
        self.printed = True

    def _run(self) -> None:
        if self._stop.wait(self.after):
            return
        self._print(f"compiling {self.what}{self._step()} ...")
        while not self._stop.wait(self.every):
            self._print(
                f"  still compiling {self.what}{self._step()} "
                f"({time.monotonic() - self.start:.0f} s)"
            )

    def _step(self) -> str:
        return f" [{self.step}]" if self.step else ""

    def __enter__(self) -> "Progress":
        self.start = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.elapsed = time.monotonic() - self.start
        if self.printed:
            state = "failed after" if exc_type else "compiled in"
            self._print(f"{self.what}: {state} {self.elapsed:.1f} s")


# --------------------------------------------------------------------------- entries


@dataclasses.dataclass
class CacheEntry:
    path: Path
    meta: Dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.meta["name"])


def _load_entry(path: Path) -> Optional[CacheEntry]:
    try:
        with open(path / "meta.json", encoding="utf-8") as f:
            return CacheEntry(path, json.load(f))
    except (OSError, ValueError):
        return None


def _lookup(target: str, ckey: str, tkey: Optional[str]) -> Optional[CacheEntry]:
    """The entry of (config key, compiler key); with tkey None the newest of the config key."""
    roots = [*prebuilt_roots(), cache_root()]
    if tkey is not None:
        for root in roots:
            entry = _load_entry(root / target / ckey / tkey)
            if entry is not None:
                return entry
        return None
    found: List[CacheEntry] = []
    for root in roots:
        folder = root / target / ckey
        if folder.is_dir():
            for sub in sorted(folder.iterdir()):
                entry = _load_entry(sub)
                if entry is not None:
                    found.append(entry)
    if not found:
        return None
    return max(found, key=lambda e: float(e.meta.get("created", 0)))


def _build(
    target: str,
    ckey: str,
    tkey: str,
    config: LayerConfig,
    options: BuildOptions,
    tool: str,
    builder,
    name: Optional[str] = None,
) -> CacheEntry:
    """Builds an entry with `builder(folder, name, progress)` into a temporary folder, then
    renames it into place (another process that finished first wins). `name`: the layer's
    function name, default layer_name's."""
    final = cache_root() / target / ckey / tkey
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{tkey}.", dir=final.parent))
    name = name or layer_name(_keyed(config, options))
    what = (
        f"{name} (T={config.tokens} d={config.hidden} n={config.ffn} E={config.experts} "
        f"k={config.top_k}, {config.dtype}) for {target}"
    )
    if options.ep is not None:
        what += f", expert-parallel ({options.ep})"
    try:
        with Progress(what) as progress:
            builder(tmp, name, progress)
        meta = {
            "name": name,
            "target": target,
            "config": dataclasses.asdict(config),
            "options": options.as_dict(),
            "generator": GENERATOR_VERSION,
            "compiler": os.path.abspath(tool),
            "compiler_key": tkey,
            "created": time.time(),
            "seconds": round(progress.elapsed, 3),
        }
        with open(tmp / "meta.json", "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
        try:
            os.rename(tmp, final)
        except OSError:  # another process finished the same entry first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    entry = _load_entry(final)
    assert entry is not None
    return entry


# --------------------------------------------------------------------------- CPU


def _cpu_pre_passes(options: BuildOptions) -> Tuple[str, ...]:
    if options.memory_budget is None and options.policy == "auto":
        return ("--moe-decompose", "--moe-generate-backward")
    plan = [f"policy={options.policy}", "report=false"]
    if options.memory_budget is not None:
        plan.insert(0, f"memory-budget={options.memory_budget}")
    return (
        "--moe-decompose",
        f"--moe-plan-activations={' '.join(plan)}",
        "--moe-generate-backward",
    )


def get_cpu_layer(config: LayerConfig, options: BuildOptions = BuildOptions()):
    """A `cpu.CompiledLayer` for `config` (f32), from the cache or built with moe-opt,
    mlir-translate and clang. Raises NoCompilerError when neither is possible."""
    from . import cpu  # noqa: PLC0415

    if options.ep is not None:
        raise ValueError(
            "the CPU path's expert-parallel layer is moe_mlir.distributed.EPLayer "
            "(ep_layer_for), not a compile-cache entry"
        )
    ckey = config_key(config, "cpu", options)
    tool = _find_moe_opt()
    entry = _lookup("cpu", ckey, tool_key(tool) if tool else None)
    if entry is None:
        if tool is None:
            raise NoCompilerError(
                f"no moe-opt here (set MOE_OPT or MOE_BUILD_DIR) and no cached CPU build of "
                f"this layer (config key {ckey}) under {', '.join(map(str, _roots()))}"
            )

        def build(folder: Path, name: str, progress: Progress) -> None:
            text = layer_mlir(config, name, options.max_tokens)
            (folder / "layer.mlir").write_text(text)
            progress.step = "moe-opt"
            pre = cpu.run_opt(text, _cpu_pre_passes(options), tool)
            (folder / "tensor.mlir").write_text(pre)
            lowered = cpu.run_opt(pre, cpu.CPU_PIPELINE, tool)
            progress.step = "mlir-translate + clang"
            cpu.CpuModule(lowered, keep_dir=str(folder))  # writes module.mlir, module.ll, module.so
            (folder / "module.ll").unlink(missing_ok=True)
            if options.max_tokens is not None:  # the results' rows a token, for the calls
                rows = cpu.token_rows(
                    config, name, cpu.parse_functions(pre), _cpu_pre_passes(options), tool
                )
                (folder / "rows.json").write_text(json.dumps(rows))

        entry = _build("cpu", ckey, tool_key(tool), config, options, tool, build)
    name = entry.name
    tensor_ir = (entry.path / "tensor.mlir").read_text()
    lowered = (entry.path / "module.mlir").read_text()
    module = cpu.CompiledModule(
        tensor_ir, lowered, cpu.CpuModule.load(str(entry.path / "module.so"), lowered)
    )
    rows_file = entry.path / "rows.json"
    return cpu.CompiledLayer(
        config,
        name,
        module=module,
        source=(entry.path / "layer.mlir").read_text(),
        max_tokens=options.max_tokens,
        result_rows=json.loads(rows_file.read_text()) if rows_file.exists() else None,
    )


def _roots() -> List[Path]:
    return [*prebuilt_roots(), cache_root()]


# --------------------------------------------------------------------------- sm_90a


def build_gpu_entry(
    config: LayerConfig,
    options: BuildOptions = BuildOptions(),
    *,
    moe_compile: Optional[str] = None,
) -> CacheEntry:
    """The sm_90a entry of `config` (NAME.o, NAME.h, NAME.json), built with moe-compile when
    the cache has none for this compiler. Needs moe-compile (and ptxas): the LLVM machine.
    `options.policy` and `options.memory_budget` go to moe-compile (--policy,
    --memory-budget); a budget no plan meets, or policy=offload (not on sm_90a yet), raises
    CompileError with moe-compile's diagnostic."""
    tool = moe_compile or find_moe_compile()
    ckey = config_key(config, "sm_90a", options)
    if tool is None:
        raise NoCompilerError("moe-compile not found (set MOE_COMPILE or MOE_BUILD_DIR)")
    tkey = tool_key(tool)
    entry = _lookup("sm_90a", ckey, tkey)
    if entry is not None:
        return entry

    def build(folder: Path, name: str, progress: Progress) -> None:
        src = folder / "layer.mlir"
        src.write_text(layer_mlir(config, name, options.max_tokens, ep=options.ep))
        progress.step = "moe-compile"
        cmd = moe_compile_command(tool, str(src), str(folder / name), options)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            from .cpu import CompileError  # noqa: PLC0415

            raise CompileError("moe-compile", cmd, proc.returncode, proc.stderr or proc.stdout)

    return _build("sm_90a", ckey, tkey, config, options, tool, build)


def gpu_function_entry(
    config: LayerConfig, options: BuildOptions, source, what: str, hint: str
) -> CacheEntry:
    """The sm_90a entry of a function that is not a layer (an op alone: the auxiliary losses,
    the selection-bias update), keyed by `config`, a stand-in whose fields name the function,
    and `options`: built with moe-compile from `source(name)` (the function's MLIR) when this
    machine has moe-compile, else the newest prebuilt. Without either, NoCompilerError naming
    `what` and saying how to build it (`hint`)."""
    ckey = config_key(config, "sm_90a", options)
    tool = find_moe_compile()
    if tool is None:
        entry = _lookup("sm_90a", ckey, None)
        if entry is None:
            raise NoCompilerError(
                f"no moe-compile on this machine and no prebuilt sm_90a {what}; config key "
                f"{ckey}): build it on the LLVM machine ({hint}) and point MOE_MLIR_PREBUILT "
                f"at the cache"
            )
        return entry
    tkey = tool_key(tool)
    entry = _lookup("sm_90a", ckey, tkey)
    if entry is not None:
        return entry

    def build(folder: Path, name: str, progress: Progress) -> None:
        src = folder / "function.mlir"
        src.write_text(source(name))
        progress.step = "moe-compile"
        cmd = [tool, str(src), "-o", str(folder / name)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            from .cpu import CompileError  # noqa: PLC0415

            raise CompileError("moe-compile", cmd, proc.returncode, proc.stderr or proc.stdout)

    return _build("sm_90a", ckey, tkey, config, options, tool, build)


def moe_compile_command(tool: str, source: str, out: str, options: BuildOptions) -> List[str]:
    """The moe-compile command line of an sm_90a entry: the layer's source (an expert-parallel
    one's holds ep_size, ep_capacity, ...) and the options moe-compile takes as flags."""
    cmd = [tool, source, "-o", out]
    if options.policy != "auto":
        cmd.append(f"--policy={options.policy}")
    if options.memory_budget is not None:
        cmd.append(f"--memory-budget={options.memory_budget}")
    if options.num_sms:
        cmd.append(f"--num-sms={options.num_sms}")
    cmd += [f"--kernel-config={c}" for c in options.kernel_configs]
    return cmd


def find_gpu_entry(config: LayerConfig, options: BuildOptions = BuildOptions()) -> CacheEntry:
    """The sm_90a entry to run: built here when moe-compile exists, else the newest prebuilt."""
    if find_moe_compile() is not None:
        return build_gpu_entry(config, options)
    ckey = config_key(config, "sm_90a", options)
    entry = _lookup("sm_90a", ckey, None)
    if entry is None:
        raise NoCompilerError(
            f"no moe-compile on this machine and no prebuilt sm_90a build of this layer "
            f"({config}; config key {ckey}) under {', '.join(map(str, _roots()))}. Build it "
            f"on the LLVM machine (scripts/inputs/build-torch-cache.sh, or "
            f"moe_mlir.compile_cache.build_gpu_entry) and point MOE_MLIR_PREBUILT at the folder"
        )
    return entry


def runtime_library() -> str:
    value = os.environ.get("MOE_RUNTIME_LIB")
    if not value:
        raise NoCompilerError(
            "MOE_RUNTIME_LIB is not set: it names libmoe_runtime.so (or its folder), which "
            "compiled layers are linked with (scripts/common.sh gpu_build_runtime builds it)"
        )
    path = Path(value)
    if path.is_dir():
        path = path / "libmoe_runtime.so"
    if not path.is_file():
        raise NoCompilerError(f"MOE_RUNTIME_LIB={value}: {path} does not exist")
    return str(path)


def link_gpu_layer(entry: CacheEntry) -> Tuple[str, str]:
    """NAME.so (NAME.o linked with libmoe_runtime, cached in the writable root) and NAME.json."""
    name = entry.name
    obj = entry.path / f"{name}.o"
    manifest = entry.path / f"{name}.json"
    runtime = runtime_library()
    rkey = hashlib.sha256(
        f"{obj.resolve()}:{os.stat(obj).st_mtime_ns}:{runtime}:"
        f"{os.stat(runtime).st_mtime_ns}".encode()
    ).hexdigest()[:16]
    folder = cache_root() / "linked" / f"{name}-{rkey}"
    so = folder / f"{name}.so"
    if not so.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{name}.{os.getpid()}.so"
        cxx = os.environ.get("CXX", "g++")
        libdir = os.path.dirname(runtime)
        cmd = [
            cxx,
            "-shared",
            "-o",
            str(tmp),
            str(obj),
            f"-L{libdir}",
            "-lmoe_runtime",
            f"-Wl,-rpath,{libdir}",
            "-Wl,-z,defs",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            from .cpu import CompileError  # noqa: PLC0415

            raise CompileError("link", cmd, proc.returncode, proc.stderr or proc.stdout)
        os.replace(tmp, so)
    return str(so), str(manifest)


def load_gpu_ep_layer(entry: CacheEntry):
    """The `distributed.GPUEPLayer` of an expert-parallel sm_90a entry (NAME.o linked here as
    link_gpu_layer does). Needs a CUDA driver."""
    from .distributed import GPUEPLayer  # noqa: PLC0415

    so, manifest = link_gpu_layer(entry)
    return GPUEPLayer(so, manifest)
