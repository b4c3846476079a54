"""Load a layer compiled for sm_90a (docs/gpu-path.md §2) and run it on torch CUDA tensors.

`moe-compile layer.mlir -o DIR/NAME` writes NAME.o, NAME.h and NAME.json (the manifest);
NAME.o linked with libmoe_runtime into NAME.so is what `CompiledLayer` loads:

    layer = CompiledLayer("build/gpu-inputs/layers/tiny.so")      # manifest: tiny.json beside it
    fwd = layer.forward({"x": x, "w_router": wr, "w_gate_up": wgu, "w_down": wd})
    out, logits = fwd["result0"], fwd["result1"]
    grads = layer.backward(fwd, {"d_result0": d_out, "d_result1": d_logits})
    dx = grads["d_arg0"]                                   # layer.input_name("arg0") == "x"

Every tensor is checked before the call (type, dtype, shape, contiguity, CUDA device,
16-byte alignment); outputs, saved tensors and gradients are allocated here with torch. The
call is enqueued on `torch.cuda.current_stream()` and returns without waiting, as torch
kernels do (torch's default stream is passed as CU_STREAM_LEGACY, so the call stays ordered
with torch's work there). A non-zero status raises RuntimeError with the runtime's message.

Only the manifest parsing and the argument checks need no GPU; torch is imported lazily so
that this module imports without it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import json
import os
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = [
    "ParamSpec",
    "EntryPoint",
    "Manifest",
    "CompiledLayer",
    "DTYPES",
    "ROLES",
    "ALIGNMENT",
    "torch_dtype",
    "element_size",
]

# Manifest element types: (torch dtype attribute name, bytes per element).
DTYPES: Dict[str, Tuple[str, int]] = {
    "bf16": ("bfloat16", 2),
    "f16": ("float16", 2),
    "f32": ("float32", 4),
    "i32": ("int32", 4),
}
ROLES = ("input", "output", "saved", "cotangent", "gradient")
ALIGNMENT = 16  # bytes; docs/gpu-path.md §2
CU_STREAM_LEGACY = 0x1  # cuda.h: the legacy default stream as a stream handle

# moeStatus names, for messages when the library cannot name a status itself.
_STATUS_NAMES = [
    "MOE_SUCCESS",
    "MOE_ERROR_NO_DRIVER",
    "MOE_ERROR_NO_DEVICE",
    "MOE_ERROR_INVALID_ARGUMENT",
    "MOE_ERROR_MISALIGNED",
    "MOE_ERROR_OUT_OF_MEMORY",
    "MOE_ERROR_MODULE_LOAD",
    "MOE_ERROR_NOT_FOUND",
    "MOE_ERROR_SHAPE_MISMATCH",
    "MOE_ERROR_CUDA",
    "MOE_ERROR_KERNEL_FAULT",
]


def _torch():
    try:
        import torch  # noqa: PLC0415 (lazy: the manifest needs no torch)
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ImportError("moe_mlir.gpu needs PyTorch to run a layer (pip install torch)") from e
    return torch


def torch_dtype(dtype: str):
    """The torch dtype of a manifest element type ("bf16" -> torch.bfloat16)."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown element type {dtype!r} (known: {', '.join(DTYPES)})")
    return getattr(_torch(), DTYPES[dtype][0])


def element_size(dtype: str) -> int:
    if dtype not in DTYPES:
        raise ValueError(f"unknown element type {dtype!r} (known: {', '.join(DTYPES)})")
    return DTYPES[dtype][1]


# --------------------------------------------------------------------------- manifest


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """One pointer parameter of an entry point."""

    name: str
    role: str
    dtype: str
    shape: Tuple[int, ...]
    forward_param: Optional[str] = None  # backward saved params: the forward's name
    of: Optional[str] = None  # cotangents: the result; gradients: the input
    memory: str = "device"  # "host": pinned host memory (an offloaded saved tensor)
    # A layer of dynamic token count: shape[0] is -1, this many rows a token (1: T, k: T * k).
    rows_per_token: int = 0

    @property
    def on_host(self) -> bool:
        return self.memory == "host"

    @property
    def follows_tokens(self) -> bool:
        return self.rows_per_token > 0

    def at(self, tokens: int) -> "ParamSpec":
        """This parameter with its shape at `tokens` tokens (itself when static)."""
        if not self.follows_tokens:
            return self
        shape = (self.rows_per_token * tokens, *self.shape[1:])
        return dataclasses.replace(self, shape=shape, rows_per_token=0)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * element_size(self.dtype)

    def describe(self) -> str:
        sizes = [str(s) for s in self.shape]
        if self.follows_tokens:
            sizes[0] = "T" if self.rows_per_token == 1 else f"T * {self.rows_per_token}"
        text = f"{self.dtype}[{', '.join(sizes)}]"
        return text + " in pinned host memory" if self.on_host else text


@dataclasses.dataclass(frozen=True)
class EntryPoint:
    kind: str  # "forward" or "backward"
    symbol: str
    workspace_symbol: Optional[str]
    params: Tuple[ParamSpec, ...]
    # A dynamic token count's bound (0: static): the entry point takes T after the stream.
    max_tokens: int = 0

    def at(self, tokens: int) -> "EntryPoint":
        """The entry point with every shape at `tokens` tokens (itself when static). Kept per
        T: a call takes it twice, and building it costs microseconds a step at small T."""
        if not self.max_tokens:
            return self
        return _entry_at(self, int(tokens))

    def tokens_of(self, tensors: Mapping[str, Any], where: str) -> int:
        """T of a call: the leading size of the first given tensor of T rows; a ValueError
        unless it is in [1, max_tokens]."""
        for p in self.params:
            if p.rows_per_token == 1 and p.name in tensors:
                shape = tuple(tensors[p.name].shape)
                tokens = shape[0] if shape else 0
                break
        else:
            raise ValueError(f"{where}: no tensor of T rows given to tell the token count")
        if not 1 <= tokens <= self.max_tokens:
            raise ValueError(
                f"{where}: the token count T = {tokens} is outside [1, {self.max_tokens}], "
                f"the bound the layer was compiled for (compile one with a larger max_tokens)"
            )
        return tokens

    def by_role(self, *roles: str) -> List[ParamSpec]:
        return [p for p in self.params if p.role in roles]

    def param(self, name: str) -> ParamSpec:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(
            f"{self.symbol} has no parameter {name!r} "
            f"(it has {', '.join(p.name for p in self.params)})"
        )


def _need(obj: Mapping[str, Any], key: str, kind, where: str):
    if not isinstance(obj, Mapping) or key not in obj:
        raise ValueError(f"manifest: {where} has no {key!r}")
    value = obj[key]
    if kind is int and isinstance(value, bool):
        raise ValueError(f"manifest: {where}.{key} must be an integer, got {value!r}")
    if not isinstance(value, kind):
        raise ValueError(
            f"manifest: {where}.{key} must be {getattr(kind, '__name__', kind)}, got {value!r}"
        )
    return value


def _parse_param(raw: Any, where: str) -> ParamSpec:
    if not isinstance(raw, Mapping):
        raise ValueError(f"manifest: {where} must be an object, got {raw!r}")
    name = _need(raw, "name", str, where)
    where = f"{where} ({name})"
    role = _need(raw, "role", str, where)
    if role not in ROLES:
        raise ValueError(f"manifest: {where}.role is {role!r}, expected one of {ROLES}")
    dtype = _need(raw, "dtype", str, where)
    if dtype not in DTYPES:
        raise ValueError(f"manifest: {where}.dtype is {dtype!r}, expected one of {tuple(DTYPES)}")
    shape = _need(raw, "shape", list, where)
    rows = raw.get("rows_per_token", 0)
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
        raise ValueError(
            f"manifest: {where}.rows_per_token must be a positive integer, got {rows!r}"
        )
    for i, s in enumerate(shape):
        dynamic = i == 0 and s == -1 and rows > 0
        if not dynamic and (isinstance(s, bool) or not isinstance(s, int) or s < 0):
            raise ValueError(
                f"manifest: {where}.shape must hold non-negative integers (-1 first with "
                f"rows_per_token), got {shape!r}"
            )
    if rows and (not shape or shape[0] != -1):
        raise ValueError(f"manifest: {where} has rows_per_token but a static shape {shape!r}")
    fp = raw.get("forward_param")
    of = raw.get("of")
    for key, value in (("forward_param", fp), ("of", of)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"manifest: {where}.{key} must be a string, got {value!r}")
    memory = raw.get("memory", "device")
    if memory not in ("device", "host"):
        raise ValueError(f"manifest: {where}.memory is {memory!r}, expected 'device' or 'host'")
    if memory == "host" and role != "saved":
        raise ValueError(
            f"manifest: {where} is in host memory, but only saved tensors can "
            f"be (its role is {role!r})"
        )
    return ParamSpec(
        name=name,
        role=role,
        dtype=dtype,
        shape=tuple(shape),
        forward_param=fp,
        of=of,
        memory=memory,
        rows_per_token=rows,
    )


def _parse_entry(kind: str, raw: Any) -> EntryPoint:
    where = f"entry_points.{kind}"
    symbol = _need(raw, "symbol", str, where)
    ws = raw.get("workspace_symbol")
    if ws is not None and not isinstance(ws, str):
        raise ValueError(f"manifest: {where}.workspace_symbol must be a string, got {ws!r}")
    params_raw = _need(raw, "params", list, where)
    params = tuple(_parse_param(p, f"{where}.params[{i}]") for i, p in enumerate(params_raw))
    seen = set()
    for p in params:
        if p.name in seen:
            raise ValueError(f"manifest: {where} lists the parameter {p.name!r} twice")
        seen.add(p.name)
    if "_stage" in kind:  # a stage of an expert-parallel layer (moe_mlir.distributed)
        allowed = ("input", "output")
    else:
        allowed = {
            "forward": ("input", "output", "saved"),
            "backward": ("saved", "cotangent", "gradient"),
        }[kind]
    for p in params:
        if p.role not in allowed:
            raise ValueError(
                f"manifest: {where}: parameter {p.name!r} has role {p.role!r}, "
                f"which a {kind} entry point cannot have ({allowed})"
            )
    max_tokens = raw.get("max_tokens", 0)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
        raise ValueError(
            f"manifest: {where}.max_tokens must be a positive integer, got {max_tokens!r}"
        )
    if any(p.follows_tokens for p in params) and not max_tokens:
        raise ValueError(f"manifest: {where} has sizes that follow T but no max_tokens")
    return EntryPoint(
        kind=kind, symbol=symbol, workspace_symbol=ws, params=params, max_tokens=max_tokens
    )


@functools.lru_cache(maxsize=256)
def _entry_at(ep: EntryPoint, tokens: int) -> EntryPoint:
    return dataclasses.replace(ep, params=tuple(p.at(tokens) for p in ep.params))


@dataclasses.dataclass
class Manifest:
    """NAME.json as moe-compile writes it."""

    name: str
    chip: str
    compiler: str
    layer: Dict[str, Any]
    forward: EntryPoint
    backward: Optional[EntryPoint]
    path: Optional[str] = None
    # The limits of the compiler's GPU contract (moe_mlir/gpu_contract.json's "limits"), as
    # moe-compile writes them; empty for a manifest without them.
    gpu_limits: Dict[str, Any] = dataclasses.field(default_factory=dict)
    # The SMs the persistent GEMMs were compiled to launch on (moe-compile --num-sms; 0:
    # not said). Another count is correct, only slower.
    num_sms: int = 0

    @classmethod
    def from_dict(cls, data: Any, path: Optional[str] = None) -> "Manifest":
        if not isinstance(data, Mapping):
            raise ValueError("manifest: the top level must be a JSON object")
        name = _need(data, "name", str, "the manifest")
        layer = _need(data, "layer", Mapping, "the manifest")
        entries = _need(data, "entry_points", Mapping, "the manifest")
        if "forward" not in entries:
            if "forward_stage0" in entries:
                raise ValueError(
                    "manifest: an expert-parallel layer (entry points forward_stage0, ...): "
                    "load it with moe_mlir.distributed.GPUEPLayer"
                )
            raise ValueError("manifest: entry_points has no 'forward'")
        forward = _parse_entry("forward", entries["forward"])
        backward = (
            _parse_entry("backward", entries["backward"])
            if entries.get("backward") is not None
            else None
        )
        if backward is not None:
            fwd_names = {p.name for p in forward.params}
            fwd_outputs = {p.name for p in forward.by_role("output")}
            fwd_inputs = {p.name for p in forward.by_role("input")}
            for p in backward.params:
                if p.role == "saved":
                    src = p.forward_param or p.name
                    if src not in fwd_names:
                        raise ValueError(
                            f"manifest: backward saved parameter {p.name!r} names the forward "
                            f"parameter {src!r}, which the forward does not have"
                        )
                    fp = forward.param(src)
                    if (fp.dtype, fp.shape, fp.memory, fp.rows_per_token) != (
                        p.dtype,
                        p.shape,
                        p.memory,
                        p.rows_per_token,
                    ):
                        raise ValueError(
                            f"manifest: backward saved parameter {p.name!r} is "
                            f"{p.describe()} but the forward's {src!r} is {fp.describe()}"
                        )
                elif p.role == "cotangent" and p.of is not None and p.of not in fwd_outputs:
                    raise ValueError(
                        f"manifest: cotangent {p.name!r} is of {p.of!r}, which "
                        f"is not a forward output"
                    )
                elif p.role == "gradient" and p.of is not None and p.of not in fwd_inputs:
                    raise ValueError(
                        f"manifest: gradient {p.name!r} is of {p.of!r}, which "
                        f"is not a forward input"
                    )
        gpu_limits = data.get("gpu_limits", {})
        if not isinstance(gpu_limits, Mapping):
            raise ValueError(f"manifest: gpu_limits must be an object, got {gpu_limits!r}")
        num_sms = data.get("num_sms", 0)
        if isinstance(num_sms, bool) or not isinstance(num_sms, int) or num_sms < 0:
            raise ValueError(f"manifest: num_sms must be a non-negative integer, got {num_sms!r}")
        return cls(
            name=name,
            chip=str(data.get("chip", "")),
            compiler=str(data.get("compiler", "")),
            layer=dict(layer),
            forward=forward,
            backward=backward,
            path=path,
            gpu_limits=dict(gpu_limits),
            num_sms=num_sms,
        )

    @classmethod
    def load(cls, path: str) -> "Manifest":
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"manifest {path} does not exist (moe-compile writes NAME.json beside NAME.o)"
            ) from None
        except json.JSONDecodeError as e:
            raise ValueError(f"manifest {path} is not valid JSON: {e}") from None
        try:
            return cls.from_dict(data, path)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    # ---------------------------------------------------------------- helpers
    def entry(self, kind: str) -> EntryPoint:
        if kind == "forward":
            return self.forward
        if kind == "backward":
            if self.backward is None:
                raise ValueError(f"layer {self.name!r} was compiled without a backward entry point")
            return self.backward
        raise ValueError(f"entry point kind must be 'forward' or 'backward', got {kind!r}")

    @property
    def input_names(self) -> Dict[str, str]:
        """Layer argument name ("x", "w_router", ...) -> forward parameter ("arg0", ...)."""
        raw = self.layer.get("inputs") or {}
        return {str(k): str(v) for k, v in raw.items()}

    def input_name(self, param: str) -> str:
        """The layer's name of a forward input parameter ("arg0" -> "x"); itself if none."""
        for layer_name, p in self.input_names.items():
            if p == param:
                return layer_name
        return param

    @property
    def max_tokens(self) -> int:
        """The bound of a layer of dynamic token count; 0 for a static one."""
        return self.forward.max_tokens

    def saved_bytes(self, tokens: Optional[int] = None) -> int:
        """Bytes of the forward's saved tensors that are not inputs (what it keeps alive for
        backward beyond the layer's arguments); with a dynamic token count at `tokens`
        (default: the bound)."""
        ep = self.forward.at(tokens or self.max_tokens)
        return sum(p.nbytes for p in ep.by_role("saved"))


# --------------------------------------------------------------------------- checks

TensorArgs = Union[Mapping[str, Any], Sequence[Any]]


def check_tensor(
    tensor: Any,
    spec: ParamSpec,
    where: str,
    *,
    require_cuda: bool = True,
    device_index: Optional[int] = None,
) -> None:
    """Raises TypeError/ValueError saying what is wrong with `tensor` for `spec`."""
    torch = _torch()
    expected = f"{spec.describe()} contiguous CUDA tensor"
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"{where}: {spec.name} must be a torch.Tensor ({expected}), got {type(tensor).__name__}"
        )
    want = torch_dtype(spec.dtype)
    if tensor.dtype != want:
        raise TypeError(
            f"{where}: {spec.name} has dtype {tensor.dtype}, expected {want} ({spec.dtype})"
        )
    if tuple(tensor.shape) != spec.shape:
        raise ValueError(
            f"{where}: {spec.name} has shape {tuple(tensor.shape)}, expected {spec.shape}"
        )
    if not tensor.is_contiguous():
        raise ValueError(
            f"{where}: {spec.name} is not contiguous (strides "
            f"{tuple(tensor.stride())}); pass .contiguous()"
        )
    if spec.on_host:
        # an offloaded saved tensor: the copies are asynchronous only from pinned memory
        if tensor.device.type != "cpu":
            raise ValueError(
                f"{where}: {spec.name} is on {tensor.device}, expected pinned "
                f"host memory (a CPU tensor with pin_memory=True)"
            )
        if require_cuda and not tensor.is_pinned():
            raise ValueError(
                f"{where}: {spec.name} is a CPU tensor in pageable memory; the "
                f"offload copies need pinned memory (pin_memory=True)"
            )
    elif require_cuda:
        if tensor.device.type != "cuda":
            raise ValueError(f"{where}: {spec.name} is on {tensor.device}, expected a CUDA device")
        if device_index is not None and tensor.device.index != device_index:
            raise ValueError(
                f"{where}: {spec.name} is on {tensor.device}, but the current "
                f"device is cuda:{device_index}"
            )
    if spec.numel and tensor.data_ptr() % ALIGNMENT:
        raise ValueError(
            f"{where}: {spec.name} at 0x{tensor.data_ptr():x} is not "
            f"{ALIGNMENT}-byte aligned (a view with an offset?); pass a "
            f"fresh tensor or .clone()"
        )


def _as_named(
    args: TensorArgs, specs: Sequence[ParamSpec], where: str, aliases: Mapping[str, str]
) -> Dict[str, Any]:
    """Maps a dict (parameter names or aliases) or a list (in `specs` order) to
    {param name: value}; raises on unknown or duplicate names and on a wrong count."""
    names = [s.name for s in specs]
    if isinstance(args, Mapping):
        out: Dict[str, Any] = {}
        for key, value in args.items():
            name = key if key in names else aliases.get(key)
            if name is None or name not in names:
                known = [f"{a} ({p})" for a, p in aliases.items() if p in names] or names
                raise ValueError(f"{where}: unknown argument {key!r} (expected {', '.join(known)})")
            if name in out and out[name] is not value:
                raise ValueError(f"{where}: {name} given twice (as {key!r} too)")
            out[name] = value
        return out
    if isinstance(args, (list, tuple)):
        if len(args) != len(specs):
            raise ValueError(
                f"{where}: {len(args)} tensors given, expected {len(specs)} ({', '.join(names)})"
            )
        return dict(zip(names, args))
    raise TypeError(f"{where}: pass a dict or a list of tensors, got {type(args).__name__}")


# --------------------------------------------------------------------------- the layer


class CompiledLayer:
    """A compiled layer: NAME.so (NAME.o linked with libmoe_runtime) and NAME.json."""

    def __init__(
        self,
        so_path: Optional[str],
        manifest_path: Optional[str] = None,
        *,
        require_cuda: bool = True,
    ):
        """`so_path` None: the manifest only (argument checks work, calls raise).
        `require_cuda=False` accepts CPU tensors and passes a null stream: for tests of the
        calling convention against a stand-in library, never for a real layer."""
        if manifest_path is None:
            if so_path is None:
                raise ValueError("CompiledLayer needs a library or a manifest path")
            manifest_path = os.path.splitext(so_path)[0] + ".json"
        self.manifest = Manifest.load(manifest_path)
        self.so_path = so_path
        self.require_cuda = require_cuda
        self._lib: Optional[ctypes.CDLL] = None
        self._fns: Dict[str, Any] = {}
        # Host tensors that offload copies (--policy=offload) may still use: held so torch
        # cannot give their pinned memory to others. Those of forwards since the last backward
        # (no event yet), then per backward: its host tensors and every earlier one, with an
        # event on the caller's stream after it. That stream waited for the backward's
        # prefetches, which the copy stream ran after every earlier offload; so past the
        # event, none of them is in use.
        self._offloads_in_flight: List[Any] = []
        self._offloads_until: List[Tuple[Any, List[Any]]] = []
        self._sm_counts_checked: set = set()
        if so_path is not None:
            self._load(so_path)

    # ---------------------------------------------------------------- loading
    def _load(self, so_path: str) -> None:
        if not os.path.exists(so_path):
            raise FileNotFoundError(
                f"{so_path} does not exist (link NAME.o with "
                f"libmoe_runtime: scripts/gpu/layer-check.sh does)"
            )
        try:
            lib = ctypes.CDLL(os.path.abspath(so_path))
        except OSError as e:
            raise RuntimeError(f"cannot load {so_path}: {e}") from None
        for kind in ("forward", "backward"):
            ep = self.manifest.forward if kind == "forward" else self.manifest.backward
            if ep is None:
                continue
            try:
                fn = getattr(lib, ep.symbol)
            except AttributeError:
                raise RuntimeError(
                    f"{so_path} has no symbol {ep.symbol} (the manifest "
                    f"{self.manifest.path} names it)"
                ) from None
            fn.restype = ctypes.c_int
            # A dynamic token count: T after the stream.
            tokens = [ctypes.c_int64] if ep.max_tokens else []
            fn.argtypes = [ctypes.c_void_p, *tokens] + [ctypes.c_void_p] * len(ep.params)
            self._fns[kind] = fn
            if ep.workspace_symbol:
                ws = getattr(lib, ep.workspace_symbol, None)
                if ws is not None:
                    ws.restype = ctypes.c_int64 if ep.max_tokens else ctypes.c_size_t
                    ws.argtypes = tokens
                    self._fns[kind + "_workspace"] = ws
        for sym, res, args in (
            ("moeGetLastErrorMessage", ctypes.c_char_p, []),
            ("moeStatusString", ctypes.c_char_p, [ctypes.c_int]),
            ("moeSetDevice", ctypes.c_int, [ctypes.c_int]),
            ("moeOffloadSynchronize", ctypes.c_int, []),
            ("moePrefetchSaved", ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]),
        ):
            f = getattr(lib, sym, None)
            if f is not None:
                f.restype = res
                f.argtypes = args
                self._fns[sym] = f
        self._lib = lib

    # ---------------------------------------------------------------- naming
    @property
    def name(self) -> str:
        return self.manifest.name

    @property
    def layer(self) -> Dict[str, Any]:
        return self.manifest.layer

    def input_name(self, param: str) -> str:
        return self.manifest.input_name(param)

    def workspace_bytes(self, kind: str = "forward", tokens: Optional[int] = None) -> Optional[int]:
        """Device bytes the call holds in temporaries; with a dynamic token count at `tokens`
        (default: the bound; -1 for a T outside [1, bound])."""
        fn = self._fns.get(kind + "_workspace")
        if fn is None:
            return None
        if self.manifest.entry(kind).max_tokens:
            return int(fn(tokens or self.manifest.max_tokens))
        return int(fn())

    def gradient_names(self) -> Dict[str, str]:
        """Gradient parameter -> layer argument name ("d_arg0" -> "x")."""
        bwd = self.manifest.entry("backward")
        return {p.name: self.input_name(p.of or p.name) for p in bwd.by_role("gradient")}

    # ---------------------------------------------------------------- calls
    def _device_index(self) -> Optional[int]:
        if not self.require_cuda:
            return None
        torch = _torch()
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available to torch; a compiled layer runs on the GPU")
        device = torch.cuda.current_device()
        if self.manifest.num_sms and device not in self._sm_counts_checked:
            self._sm_counts_checked.add(device)
            sms = torch.cuda.get_device_properties(device).multi_processor_count
            if sms != self.manifest.num_sms:
                warnings.warn(
                    f"{self.manifest.name}: compiled for {self.manifest.num_sms} SMs, GPU "
                    f"{device} has {sms}: correct but slower; recompile with "
                    f"moe-compile --num-sms={sms}",
                    stacklevel=3,
                )
        return device

    def _check_all(
        self, ep: EntryPoint, given: Dict[str, Any], roles: Sequence[str], where: str
    ) -> Optional[int]:
        """Checks every tensor of `roles`, then that they share the current CUDA device;
        returns that device (None without require_cuda)."""
        specs = [spec for spec in ep.params if spec.role in roles]
        for spec in specs:
            if spec.name not in given:
                alias = self.input_name(spec.name)
                label = spec.name if alias == spec.name else f"{alias} ({spec.name})"
                raise ValueError(f"{where}: missing {label}: {spec.role}, {spec.describe()}")
        for spec in specs:
            check_tensor(given[spec.name], spec, where, require_cuda=self.require_cuda)
        device = self._device_index()
        if device is not None:
            for spec in specs:
                if spec.on_host:
                    continue
                index = given[spec.name].device.index
                if index != device:
                    raise ValueError(
                        f"{where}: {spec.name} is on cuda:{index}, but the "
                        f"current device is cuda:{device}"
                    )
        return device

    def _empty(self, spec: ParamSpec, device: Optional[int], zero: bool = False):
        torch = _torch()
        make = torch.zeros if zero else torch.empty
        if spec.on_host:
            return make(
                spec.shape,
                dtype=torch_dtype(spec.dtype),
                device="cpu",
                pin_memory=self.require_cuda,
            )
        dev = torch.device("cuda", device) if self.require_cuda else torch.device("cpu")
        return make(spec.shape, dtype=torch_dtype(spec.dtype), device=dev)

    def _call(
        self,
        kind: str,
        ep: EntryPoint,
        tensors: Dict[str, Any],
        device: Optional[int],
        tokens: Optional[int] = None,
    ) -> None:
        fn = self._fns.get(kind)
        if fn is None:
            raise RuntimeError(
                f"{ep.symbol}: no library loaded (CompiledLayer was made from the manifest only)"
            )
        torch = _torch()
        stream = None
        if self.require_cuda:
            set_device = self._fns.get("moeSetDevice")
            if set_device is not None and device is not None:
                set_device(device)
            # torch's default stream is the legacy one (handle 0). A null stream would make the
            # entry point use a non-blocking stream of the runtime, unordered with torch's work
            # on the legacy stream; CU_STREAM_LEGACY names that stream explicitly.
            stream = torch.cuda.current_stream(device).cuda_stream or CU_STREAM_LEGACY
        ptrs = [ctypes.c_void_p(tensors[p.name].data_ptr() or None) for p in ep.params]
        extra = [ctypes.c_int64(tokens)] if tokens is not None else []
        status = fn(ctypes.c_void_p(stream or None), *extra, *ptrs)
        if status != 0:
            raise RuntimeError(
                f"{ep.symbol} failed: {self._status_name(status)}: {self._last_message()}"
            )

    def _status_name(self, status: int) -> str:
        f = self._fns.get("moeStatusString")
        if f is not None:
            return f(status).decode("utf-8", "replace")
        if 0 <= status < len(_STATUS_NAMES):
            return _STATUS_NAMES[status]
        return f"status {status}"

    def _last_message(self) -> str:
        f = self._fns.get("moeGetLastErrorMessage")
        if f is None:
            return "(the library has no moeGetLastErrorMessage)"
        raw = f()
        return raw.decode("utf-8", "replace") if raw else ""

    def forward(self, inputs: TensorArgs) -> Dict[str, Any]:
        """Runs the forward on `inputs` (a dict keyed by parameter or layer names, or a list
        in the manifest's input order). Returns every forward parameter by name: the inputs
        as given, the outputs (result0 = out [T,d], result1 = router logits [T,E]) and the
        saved tensors, ready to pass to `backward`."""
        ep = self.manifest.forward
        where = ep.symbol
        given = _as_named(inputs, ep.by_role("input"), where, self.manifest.input_names)
        tokens = None
        if ep.max_tokens:  # a dynamic token count: T from x
            tokens = ep.tokens_of(given, where)
            ep = ep.at(tokens)
        device = self._check_all(ep, given, ("input",), where)
        tensors = dict(given)
        for spec in ep.params:
            if spec.role in ("output", "saved"):
                tensors[spec.name] = self._empty(spec, device)
        self._call("forward", ep, tensors, device, tokens)
        self._offloads_in_flight += [tensors[p.name] for p in ep.params if p.on_host]
        return tensors

    def prefetch(self, saved: Mapping[str, Any]) -> None:
        """Starts bringing the offloaded saved tensors of `saved` (what forward returned)
        back to the device now, for the backward that takes them next: called before the
        backward of the layer after this one, the copies overlap that backward."""
        ep = self.manifest.entry("backward")
        if ep.max_tokens:
            named = {
                p.name: saved[p.forward_param or p.name]
                for p in ep.by_role("saved")
                if (p.forward_param or p.name) in saved
            }
            ep = ep.at(ep.tokens_of(named, "prefetch"))
        host = []
        for spec in ep.by_role("saved"):
            if not spec.on_host:
                continue
            src = spec.forward_param or spec.name
            if src not in saved:
                raise ValueError(
                    f"prefetch: saved has no {src!r} ({spec.describe()}); pass "
                    f"the dict that forward returned"
                )
            # the copy reads spec.nbytes from the pointer: the tensor must be what it says
            check_tensor(saved[src], spec, "prefetch", require_cuda=self.require_cuda)
            host.append((saved[src], spec))
        fn = self._fns.get("moePrefetchSaved")
        if fn is None or not self.require_cuda:
            return  # without CUDA there is nothing to copy
        for tensor, spec in host:
            status = fn(ctypes.c_void_p(tensor.data_ptr()), spec.nbytes)
            if status != 0:
                raise RuntimeError(
                    f"moePrefetchSaved failed: {self._status_name(status)}: {self._last_message()}"
                )

    def synchronize_offloads(self) -> None:
        """Waits for the copies of offloaded saved tensors (a layer compiled with
        --policy=offload) in flight on the current device: the host tensors forward returned
        are complete after it."""
        fn = self._fns.get("moeOffloadSynchronize")
        if fn is not None and self.require_cuda:
            status = fn()
            if status != 0:
                raise RuntimeError(
                    f"moeOffloadSynchronize failed: "
                    f"{self._status_name(status)}: {self._last_message()}"
                )
        self._offloads_in_flight.clear()
        self._offloads_until.clear()

    def _release_offloads(self, saved_host: List[Any]) -> None:
        """After a backward: its host tensors and those of earlier forwards wait for an event
        on the current stream; those of earlier backwards whose event passed are let go."""
        self._offloads_until = [(e, held) for e, held in self._offloads_until if not e.query()]
        held = self._offloads_in_flight + saved_host
        self._offloads_in_flight = []
        if self.require_cuda:
            event = _torch().cuda.Event()
            event.record()
            self._offloads_until.append((event, held))

    def backward(
        self, saved: Mapping[str, Any], cotangents: Union[Mapping[str, Any], Sequence[Any]]
    ) -> Dict[str, Any]:
        """Runs the backward. `saved`: what `forward` returned (keyed by forward parameter
        names). `cotangents`: keyed by the cotangent's name ("d_result0") or its result's
        ("result0"), or a list in manifest order; a missing cotangent is zeros. Returns the
        gradients by parameter name ("d_arg0", ...; see `gradient_names`)."""
        ep = self.manifest.entry("backward")
        where = ep.symbol
        if not isinstance(saved, Mapping):
            raise TypeError(
                f"{where}: saved must be the dict that forward returned, got {type(saved).__name__}"
            )
        tensors: Dict[str, Any] = {}
        for spec in ep.by_role("saved"):
            src = spec.forward_param or spec.name
            if src in saved:
                tensors[spec.name] = saved[src]
            elif spec.name in saved:
                tensors[spec.name] = saved[spec.name]
            else:
                raise ValueError(
                    f"{where}: saved has no {src!r} ({spec.describe()}); pass "
                    f"the dict that forward returned"
                )
        tokens = None
        if ep.max_tokens:  # a dynamic token count: T from the saved x
            tokens = ep.tokens_of(tensors, where)
            ep = ep.at(tokens)
        cot_specs = ep.by_role("cotangent")
        aliases = {p.of: p.name for p in cot_specs if p.of}
        if isinstance(cotangents, Mapping):
            for key in cotangents:
                if key not in aliases and key not in {p.name for p in cot_specs}:
                    raise ValueError(
                        f"{where}: unknown cotangent {key!r} (expected "
                        f"{', '.join(p.name for p in cot_specs)})"
                    )
        given = _as_named(cotangents, cot_specs, where, aliases)
        for name, value in given.items():
            check_tensor(value, ep.param(name), where, require_cuda=self.require_cuda)
        tensors.update(given)
        device = self._check_all(ep, tensors, ("saved",), where)
        for name, value in given.items():
            if device is not None and value.device.index != device:
                raise ValueError(
                    f"{where}: {name} is on {value.device}, but the current device is cuda:{device}"
                )
        for spec in cot_specs:  # a missing cotangent is zeros
            if spec.name not in tensors:
                tensors[spec.name] = self._empty(spec, device, zero=True)
        grads = {}
        for spec in ep.by_role("gradient"):
            grads[spec.name] = tensors[spec.name] = self._empty(spec, device)
        self._call("backward", ep, tensors, device, tokens)
        saved_host = [tensors[p.name] for p in ep.params if p.on_host]
        if saved_host or self._offloads_in_flight:
            self._release_offloads(saved_host)
        return grads
