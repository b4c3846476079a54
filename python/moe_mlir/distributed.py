"""Expert parallelism: one layer's experts over the ranks of a torch.distributed group
(docs/distributed.md).

An expert-parallel layer (`moe.layer` with `ep_size`, from `layer_mlir(..., ep=EPSpec(...))`)
is compiled once, then split at its collectives into stages by `moe-ep-stages`; each rank runs
the stages and an `Exchange` moves the rows between ranks in between: `TorchExchange` with
`torch.distributed.all_to_all_single` (gloo on the CPU, NCCL on CUDA), `LocalExchange` for a
group of one.

- `EPSpec(size, capacity, overflow)`: S ranks, each owning `experts / S` consecutive experts
  (rank r: experts `[r * E / S, (r + 1) * E / S)`), at most `capacity` rows sent from one rank
  to one rank a step; past it, `overflow="error"` (the default) raises on every rank and
  `"drop"` drops the rows past the capacity (their results are zero rows).
- `EPLayer(config, ep)` (the CPU path): `forward(args, exchange)`, `backward(saved, d_out,
  d_logits, exchange)` and `layer(args, exchange)` on this rank's tokens and expert weights
  (`shard_experts` cuts them from the whole layer's).
- `GPUEPLayer(NAME.so)`: the stages moe-compile built, on torch's CUDA stream, NCCL between.
- PyTorch: `ep_layer_apply` (autograd over an `EPLayer`, which `MoELayer(ep_group=...)` uses),
  `gather_experts`, `load_balancing_loss` over the group.

Synchronisation: the rows and counts travel as fixed-size blocks (C rows and E / S counts a
rank), so no split size is read on the host. With `overflow="error"` each dispatch adds one
all-reduce of the rows past the capacity (a host read of one integer) so that every rank
raises together; `"drop"` adds nothing.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .config import LayerConfig
from .cpu import (
    CPU_PIPELINE,
    CompiledModule,
    CpuModule,
    FunctionSignature,
    compile_mlir,
    parse_functions,
    run_opt,
    tokens_within,
)

__all__ = [
    "EPSpec",
    "GPUEPLayer",
    "ep_layer_for",
    "ep_layer_apply",
    "gather_experts",
    "load_balancing_loss",
    "EP_PRE_PASSES",
    "Exchange",
    "LocalExchange",
    "TorchExchange",
    "CapacityError",
    "StagedFunction",
    "EPLayer",
    "shard_experts",
]

OVERFLOWS = ("error", "drop")
EP_PRE_PASSES = ("--moe-decompose", "--moe-generate-backward", "--moe-ep-stages")


class CapacityError(RuntimeError):
    """A dispatch with `overflow="error"` had rows past its capacity (raised on every rank)."""


@dataclasses.dataclass(frozen=True)
class EPSpec:
    """The expert-parallel shape of a layer: `size` ranks, `capacity` rows from one rank to
    one rank a step, and what happens past it (`overflow`: "error" or "drop")."""

    size: int
    capacity: int
    overflow: str = "error"

    def validate(self, config: Optional[LayerConfig] = None) -> "EPSpec":
        for name, hi in (("size", 65536), ("capacity", 2**31 - 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
                raise ValueError(f"EPSpec.{name} must be an integer in [1, {hi}], got {value!r}")
        if self.overflow not in OVERFLOWS:
            raise ValueError(f"EPSpec.overflow must be one of {OVERFLOWS}, got {self.overflow!r}")
        if self.size * self.capacity > 2**31 - 1:
            raise ValueError(
                f"size * capacity ({self.size} * {self.capacity}) exceeds the i32 row index range"
            )
        if config is not None and config.experts % self.size != 0:
            raise ValueError(
                f"EPSpec.size ({self.size}) must divide the number of experts ({config.experts})"
            )
        return self


def shard_experts(args: Mapping[str, np.ndarray], size: int, rank: int) -> Dict[str, np.ndarray]:
    """The arguments of rank `rank` of `size` from the whole layer's (by name): w_gate_up and
    w_down cut to its experts, everything else as it is."""
    out = dict(args)
    for name in ("w_gate_up", "w_down"):
        whole = np.asarray(args[name])
        if whole.shape[0] % size != 0:
            raise ValueError(f"{name} has {whole.shape[0]} experts, not a multiple of {size}")
        local = whole.shape[0] // size
        out[name] = np.ascontiguousarray(whole[rank * local : (rank + 1) * local])
    return out


# =========================================================================== exchanges


class Exchange:
    """How the stages' rows move between the ranks of a group."""

    size: int = 1
    rank: int = 0

    def all_to_all(self, blocks: np.ndarray) -> np.ndarray:
        """`blocks` (leading size a multiple of `size`): block s goes to rank s; returns the
        blocks received, block s from rank s."""
        raise NotImplementedError

    def max(self, value: int) -> int:
        """The largest `value` of the group's ranks."""
        raise NotImplementedError


class LocalExchange(Exchange):
    """A group of one: the all-to-all is the identity."""

    def all_to_all(self, blocks: np.ndarray) -> np.ndarray:
        return blocks

    def max(self, value: int) -> int:
        return int(value)


class TorchExchange(Exchange):
    """torch.distributed's collectives on `group` (None: the default group): gloo on the
    CPU. The blocks travel as bytes, so every dtype (bf16 included) goes through gloo."""

    def __init__(self, group=None):
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "TorchExchange needs torch.distributed initialised "
                "(torch.distributed.init_process_group, or torchrun)"
            )
        self._dist = dist
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def all_to_all(self, blocks: np.ndarray) -> np.ndarray:
        import torch

        blocks = np.ascontiguousarray(blocks)
        if blocks.shape[0] % self.size != 0:
            raise ValueError(f"all_to_all: {blocks.shape[0]} rows are not {self.size} equal blocks")
        raw = torch.from_numpy(blocks.reshape(-1).view(np.uint8).copy())
        received = torch.empty_like(raw)
        self._dist.all_to_all_single(received, raw, group=self.group)
        return received.numpy().view(blocks.dtype).reshape(blocks.shape)

    def max(self, value: int) -> int:
        import torch

        t = torch.tensor([int(value)], dtype=torch.int64)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.group)
        return int(t.item())


# =========================================================================== stages


def _string_list(sig: FunctionSignature, key: str) -> List[str]:
    raw = sig.attr(key)
    if raw is None:
        raise ValueError(f"@{sig.name} has no {key} attribute (run --moe-ep-stages)")
    return re.findall(r'"([^"]*)"', raw)


@dataclasses.dataclass
class _Stage:
    name: str
    inputs: List[str]
    outputs: List[str]
    rows: List[Optional[int]]  # rows a token of each result with a dynamic leading size


class StagedFunction:
    """Function `@name` of a module split by `moe-ep-stages`: its stages run in order on this
    rank, an `Exchange` moving the rows in between."""

    def __init__(
        self,
        module: CompiledModule,
        name: str,
        rows: Optional[Dict[str, List[Optional[int]]]] = None,
    ):
        sigs = {
            n: s for n, s in module.signatures.items() if s.attr("moe.ep_stage_of") == f'"{name}"'
        }
        if not sigs:
            raise KeyError(f"no stages of @{name} in the module (run --moe-ep-stages)")
        first = next(iter(sigs.values()))
        count = first.attr_int("moe.ep_stages")
        self.name = name
        self.module = module
        self.kinds = _string_list(first, "moe.ep_collectives")
        self.overflows = _string_list(first, "moe.ep_overflows")
        self.results = _string_list(first, "moe.ep_results")
        self.ep_size = first.attr_int("moe.ep_size")
        self.capacity = first.attr_int("moe.ep_capacity")
        self.stages: List[_Stage] = []
        for i in range(count):
            sname = f"{name}_stage{i}"
            if sname not in sigs:
                raise ValueError(f"@{sname} is missing ({count} stages of @{name})")
            sig = sigs[sname]
            self.stages.append(
                _Stage(
                    sname,
                    _string_list(sig, "moe.ep_inputs"),
                    _string_list(sig, "moe.ep_outputs"),
                    (rows or {}).get(sname, [None] * len(sig.results)),
                )
            )
        self.num_saved = first.attr_int("moe.ep_num_saved")
        self.gradient_args = first.attr_int_array("moe.ep_gradient_args")

    def __call__(
        self, args: Sequence[np.ndarray], exchange: Exchange, tokens: Optional[int] = None
    ) -> Tuple[Tuple[np.ndarray, ...], np.ndarray]:
        """Runs the stages on `args`; returns the function's results and, for each dispatch,
        the rows this rank sent past the capacity of each rank (`[dispatches, S]`)."""
        if exchange.size != self.ep_size:
            raise ValueError(
                f"@{self.name} is compiled for {self.ep_size} ranks but the exchange has "
                f"{exchange.size}"
            )
        values: Dict[str, np.ndarray] = {f"arg{i}": np.asarray(a) for i, a in enumerate(args)}
        results: Dict[int, np.ndarray] = {}
        dropped: List[np.ndarray] = []
        for index, stage in enumerate(self.stages):
            function = self.module[stage.name]
            try:
                inputs = [values[n] for n in stage.inputs]
            except KeyError as e:
                raise ValueError(f"@{stage.name} takes {e.args[0]}, which nothing made") from None
            shapes = None
            if any(r is not None for r in stage.rows):
                if tokens is None:
                    raise ValueError(f"@{stage.name} has results that follow T: pass tokens")
                shapes = [
                    t.shape if r is None else (r * tokens, *t.shape[1:])
                    for t, r in zip(function.signature.results, stage.rows)
                ]
            outputs = function(*inputs, result_shapes=shapes)
            for oname, value in zip(stage.outputs, outputs):
                if oname.startswith("result"):
                    results[int(oname[len("result") :])] = value
                else:
                    values[oname] = value
            if index == len(self.stages) - 1:
                break
            c = index  # the collective that ends this stage
            if self.kinds[c] == "dispatch":
                over = values[f"dropped{c}"]
                dropped.append(over)
                if self.overflows[c] == "error":
                    worst = exchange.max(int(over.max()) if over.size else 0)
                    if worst > 0:
                        raise CapacityError(
                            f"@{self.name}: expert-parallel dispatch {c} needs more than its "
                            f"capacity of {self.capacity} rows from one rank to one rank "
                            f"(rank {exchange.rank} has {over.tolist()} rows past it for "
                            f"ranks 0..{self.ep_size - 1}; the worst rank {worst}): raise "
                            f"ep_capacity or compile with overflow='drop'"
                        )
                values[f"received{c}"] = exchange.all_to_all(values[f"send{c}"])
                values[f"received_counts{c}"] = exchange.all_to_all(values[f"send_counts{c}"])
            else:
                values[f"returned{c}"] = exchange.all_to_all(values[f"send{c}"])
        out = []
        for k, source in enumerate(self.results):
            if source.startswith("arg"):
                out.append(values[source])
            else:
                out.append(results[k])
        drops = np.stack(dropped) if dropped else np.zeros((0, self.ep_size), np.int32)
        return tuple(out), drops


def _stage_rows(
    text_at_one: str, pre_passes: Sequence[str], opt_tool: Optional[str]
) -> Dict[str, List[Optional[int]]]:
    """Rows a token of each stage result whose leading size follows T: its size in the same
    layer at T = 1 through the same passes."""
    sigs = parse_functions(run_opt(text_at_one, pre_passes, opt_tool))
    return {name: [t.shape[0] if t.rank else None for t in s.results] for name, s in sigs.items()}


class EPLayer:
    """One expert-parallel `moe.layer` on the CPU path, compiled once, run on each rank.

    - `layer(args, exchange)` runs `@<name>`: (out, logits);
    - `forward(args, exchange)` runs `@<name>_forward`: (out, logits, saved);
    - `backward(saved, d_out, d_logits, exchange)`: {argument name: gradient} of this rank's
      tokens; the expert weights' gradients are this rank's experts', summed over the tokens
      of every rank; the router's (and shared expert's) are this rank's tokens' alone.

    `args` by name or in `config.arg_names()` order, with this rank's expert weights
    (`shard_experts`). `dropped` holds, after each call, the rows this rank's dispatches
    sent past the capacity of each rank (`overflow="drop"`)."""

    def __init__(
        self,
        config: LayerConfig,
        ep: EPSpec,
        name: str = "moe_layer",
        *,
        max_tokens: Optional[int] = None,
        opt_tool: Optional[str] = None,
        keep_dir: Optional[str] = None,
        _compiled: Optional[dict] = None,
    ):
        from .mlir_text import layer_mlir

        ep.validate(config)
        self.config, self.ep, self.name, self.max_tokens = config, ep, name, max_tokens
        self.arg_names = config.arg_names()
        if _compiled is None:
            self.keep_dir = keep_dir or tempfile.mkdtemp(prefix="moe_mlir_ep_")
            source = layer_mlir(config, name, max_tokens, ep=ep)
            module = compile_mlir(
                source,
                CPU_PIPELINE,
                pre_passes=EP_PRE_PASSES,
                opt_tool=opt_tool,
                keep_dir=self.keep_dir,
            )
            rows = {}
            if max_tokens is not None:
                probe = dataclasses.replace(config, tokens=1)
                rows = _stage_rows(layer_mlir(probe, name, ep=ep), EP_PRE_PASSES, opt_tool)
                dynamic = {
                    n: [r if not t.is_static else None for r, t in zip(rows[n], s.results)]
                    for n, s in module.signatures.items()
                    if n in rows
                }
                rows = dynamic
            self._compiled = {
                "tensor_ir": module.tensor_ir,
                "lowered_ir": module.lowered_ir,
                "so": f"{self.keep_dir}/module.so",
                "checks": module.checks,
                "rows": rows,
            }
            self.module = module
        else:
            self._compiled = _compiled
            self.module = CompiledModule(
                _compiled["tensor_ir"],
                _compiled["lowered_ir"],
                CpuModule.load(_compiled["so"], _compiled["lowered_ir"]),
                _compiled["checks"],
            )
        rows = self._compiled["rows"]
        self.functions = {
            kind: StagedFunction(self.module, fname, rows)
            for kind, fname in (
                ("layer", name),
                ("forward", f"{name}_forward"),
                ("backward", f"{name}_backward"),
            )
        }
        backward = self.functions["backward"]
        self.num_saved = self.functions["forward"].num_saved
        self.gradient_names = [self.arg_names[i] for i in backward.gradient_args]
        self.dropped = np.zeros((0, ep.size), np.int32)

    def state(self) -> dict:
        """What another process needs to load this layer without compiling (its `.so` stays
        in `keep_dir`): `EPLayer.load(config, ep, state)`."""
        return dict(self._compiled, name=self.name, max_tokens=self.max_tokens)

    @classmethod
    def load(cls, config: LayerConfig, ep: EPSpec, state: dict) -> "EPLayer":
        return cls(config, ep, state["name"], max_tokens=state["max_tokens"], _compiled=state)

    def _args(self, args) -> List[np.ndarray]:
        if isinstance(args, Mapping):
            missing = [n for n in self.arg_names if args.get(n) is None]
            if missing:
                raise ValueError(f"missing layer arguments {missing}")
            return [args[n] for n in self.arg_names]
        return list(args)

    def _tokens(self, x: np.ndarray) -> Optional[int]:
        return None if self.max_tokens is None else tokens_within(x, self.max_tokens)

    def _run(self, kind: str, args, exchange: Exchange, tokens: Optional[int]):
        results, self.dropped = self.functions[kind](args, exchange, tokens)
        return results

    def layer(self, args, exchange: Exchange):
        args = self._args(args)
        return self._run("layer", args, exchange, self._tokens(args[0]))

    def forward(self, args, exchange: Exchange):
        args = self._args(args)
        res = self._run("forward", args, exchange, self._tokens(args[0]))
        return res[0], res[1], tuple(res[2:])

    def backward(
        self,
        saved: Sequence[np.ndarray],
        d_out: np.ndarray,
        d_logits: np.ndarray,
        exchange: Exchange,
    ) -> Dict[str, np.ndarray]:
        if len(saved) != self.num_saved:
            raise ValueError(
                f"backward takes the {self.num_saved} saved tensors forward returned, "
                f"got {len(saved)}"
            )
        grads = self._run("backward", [*saved, d_out, d_logits], exchange, self._tokens(d_out))
        return dict(zip(self.gradient_names, grads))


# =========================================================================== PyTorch

_EP_LAYERS: Dict[tuple, EPLayer] = {}


def ep_layer_for(config: LayerConfig, ep: EPSpec, bound: int) -> EPLayer:
    """The compiled expert-parallel layer of `config` and `ep` for every T up to `bound`,
    compiled once a process."""
    key = (dataclasses.astuple(dataclasses.replace(config, tokens=0, dtype="f32")), ep, bound)
    layer = _EP_LAYERS.get(key)
    if layer is None:
        layer = EPLayer(
            dataclasses.replace(config, tokens=bound, dtype="f32"), ep, max_tokens=bound
        )
        _EP_LAYERS[key] = layer
    return layer


def _torch_function():
    import torch

    class EPLayerFunction(torch.autograd.Function):
        """Forward and backward of an `EPLayer` on CPU tensors (f32), the exchange between
        the stages inside: out, logits from x and this rank's weights."""

        @staticmethod
        def forward(ctx, layer, exchange, names, x, *weights):
            args = {"x": x.detach().numpy()}
            for name, w in zip(names, weights):
                args[name] = w.detach().numpy()
            out, logits, saved = layer.forward(args, exchange)
            ctx.layer, ctx.exchange, ctx.names, ctx.saved = layer, exchange, names, saved
            ctx.tokens = x.shape[0]
            return torch.from_numpy(np.array(out)), torch.from_numpy(np.array(logits))

        @staticmethod
        def backward(ctx, d_out, d_logits):
            config = ctx.layer.config

            def array(grad, width):
                if grad is None:  # a result nothing read: a zero cotangent
                    return np.zeros((ctx.tokens, width), np.float32)
                return np.ascontiguousarray(grad.detach().float().numpy())

            grads = ctx.layer.backward(
                ctx.saved,
                array(d_out, config.hidden),
                array(d_logits, config.experts),
                ctx.exchange,
            )
            result = [None, None, None, _tensor(grads.get("x"))]
            result += [_tensor(grads.get(n)) for n in ctx.names]
            return tuple(result)

    return EPLayerFunction


def _tensor(value):
    import torch

    return None if value is None else torch.from_numpy(np.array(value))


_FUNCTION = None


def ep_layer_apply(layer: EPLayer, exchange: Exchange, x, weights: Mapping[str, object]):
    """out, logits of `layer` on torch CPU tensors, differentiable in x and every weight given
    (this rank's experts' for w_gate_up and w_down)."""
    global _FUNCTION
    if _FUNCTION is None:
        _FUNCTION = _torch_function()
    names = tuple(n for n in layer.arg_names if n != "x" and weights.get(n) is not None)
    return _FUNCTION.apply(layer, exchange, names, x, *[weights[n] for n in names])


def load_balancing_loss(logits, experts, num_experts: int, group=None, scoring: str = "softmax"):
    """The load-balancing loss of the whole group's tokens, `E * sum_e f_e * P_e`, where
    f_e is the fraction of the (token, slot) pairs of every rank that chose expert e and P_e the
    mean score of e over every rank's tokens; differentiable in this rank's `logits` (the
    counts all-reduced, the score sums through a differentiable all-reduce). Every rank gets
    the same value. `experts` [T, k]: the chosen experts (`return_router_logits` and the
    layer's routing give them)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.nn.functional import all_reduce

    probs = (
        torch.softmax(logits.float(), -1) if scoring == "softmax" else torch.sigmoid(logits.float())
    )
    counts = torch.bincount(experts.reshape(-1).long(), minlength=num_experts).float()
    totals = torch.tensor([float(logits.shape[0])])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(counts, group=group)
        dist.all_reduce(totals, group=group)
        score_sums = all_reduce(probs.sum(0), group=group)
    else:
        score_sums = probs.sum(0)
    tokens = totals[0]
    f = counts / (tokens * experts.shape[-1])
    return num_experts * torch.sum(f * score_sums / tokens)


def gather_experts(layer, group=None) -> Dict[str, object]:
    """The whole layer's state of an expert-parallel `MoELayer` (its state_dict holds this
    rank's experts): w_gate_up and w_down gathered from every rank of `group` (the layer's own
    group when None) in rank order, the rest as this rank holds it. Every rank calls it."""
    import torch
    import torch.distributed as dist

    group = layer.ep_group if group is None else group
    state = {k: v.detach().clone() for k, v in layer.state_dict().items()}
    for name in ("w_gate_up", "w_down"):
        local = state[name].contiguous()
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, local, group=group)
        state[name] = torch.cat(parts, 0)
    return state


# =========================================================================== the GPU path


class GPUEPLayer:
    """An expert-parallel layer compiled by moe-compile (NAME.so linked with libmoe_runtime,
    and NAME.json): its forward and backward are stages (entry points `NAME_forward_stage0`,
    ...), run here on torch's current CUDA stream with the rows moved between them by
    `torch.distributed.all_to_all_single` (NCCL) on the same stream.

    - `forward(inputs, group)`: `inputs` the forward's arguments by name ("arg0", ... or the
      layer's "x", "w_router", ...), this rank's expert weights; returns every result of the
      training forward by name ("result0" out, "result1" logits, then the saved tensors as
      "saved0", ...);
    - `backward(saved, cotangents, group)`: `saved` what forward returned, `cotangents`
      {"d_result0": d_out, "d_result1": d_logits}; returns the gradients by the backward's
      results ("d_arg0", ...).

    Synchronisation: none but the capacity check of `overflow="error"` (one integer read a
    dispatch, after an all-reduce); `"drop"` reads nothing."""

    def __init__(self, so_path: str, manifest_path: Optional[str] = None):
        import ctypes
        import json
        import os

        from . import gpu

        manifest_path = manifest_path or os.path.splitext(so_path)[0] + ".json"
        with open(manifest_path, encoding="utf-8") as f:
            data = json.load(f)
        entries = data.get("entry_points", {})
        if "forward_stage0" not in entries:
            raise ValueError(f"{manifest_path}: not an expert-parallel layer (no forward_stage0)")
        self.name = data.get("name", "")
        self.layer = data.get("layer", {})
        self.entries: Dict[str, "gpu.EntryPoint"] = {}
        self.ep: Dict[str, dict] = {}
        # Each stage's workspace at the bound (the manifest's), by entry point.
        self.workspace_bytes: Dict[str, int] = {}
        lib = ctypes.CDLL(os.path.abspath(so_path))
        self._fns = {}
        for kind, raw in entries.items():
            entry = gpu._parse_entry(kind, raw)
            self.entries[kind] = entry
            self.ep[kind] = dict(raw.get("ep", {}))
            self.workspace_bytes[kind] = int(raw.get("workspace_bytes", 0))
            fn = getattr(lib, entry.symbol)
            fn.restype = ctypes.c_int
            tokens = [ctypes.c_int64] if entry.max_tokens else []
            fn.argtypes = [ctypes.c_void_p, *tokens] + [ctypes.c_void_p] * len(entry.params)
            self._fns[kind] = fn
        for sym, res, args in (
            ("moeGetLastErrorMessage", ctypes.c_char_p, []),
            ("moeStatusString", ctypes.c_char_p, [ctypes.c_int]),
        ):
            f = getattr(lib, sym, None)
            if f is not None:
                f.restype, f.argtypes = res, args
                self._fns[sym] = f
        first = self.ep["forward_stage0"]
        self.ep_size = int(first["size"])
        self.capacity = int(first["capacity"])
        self.max_tokens = self.entries["forward_stage0"].max_tokens
        self.dropped = None

    def _stages(self, half: str) -> List[str]:
        count = int(self.ep[f"{half}_stage0"]["stages"])
        return [f"{half}_stage{i}" for i in range(count)]

    def _call(self, kind: str, inputs: List, tokens: Optional[int]):
        import ctypes

        import torch

        from . import gpu

        entry = self.entries[kind]
        if entry.max_tokens:
            entry = entry.at(tokens)
        specs_in = entry.by_role("input")
        outputs = [
            torch.empty(p.shape, dtype=gpu.torch_dtype(p.dtype), device="cuda")
            for p in entry.by_role("output")
        ]
        for value, spec in zip(inputs, specs_in):
            gpu.check_tensor(value, spec, entry.symbol, require_cuda=True)
        stream = torch.cuda.current_stream().cuda_stream or gpu.CU_STREAM_LEGACY
        ptrs = [ctypes.c_void_p(t.data_ptr() or None) for t in [*inputs, *outputs]]
        extra = [ctypes.c_int64(tokens)] if self.entries[kind].max_tokens else []
        status = self._fns[kind](ctypes.c_void_p(stream), *extra, *ptrs)
        if status != 0:
            message = self._fns["moeGetLastErrorMessage"]()
            raise RuntimeError(
                f"{entry.symbol} failed: status {status}: "
                f"{message.decode('utf-8', 'replace') if message else ''}"
            )
        return outputs

    def _run(self, half: str, args: List, group, tokens: Optional[int]) -> Tuple[List, List]:
        import torch
        import torch.distributed as dist

        kinds = self._stages(half)
        info = self.ep[kinds[0]]
        collectives, overflows = info["collectives"], info["overflows"]
        values = {f"arg{i}": a for i, a in enumerate(args)}
        results: Dict[int, object] = {}
        dropped = []

        def exchange(t):
            out = torch.empty_like(t)
            dist.all_to_all_single(
                out.view(-1).view(torch.uint8),
                t.contiguous().view(-1).view(torch.uint8),
                group=group,
            )
            return out

        for index, kind in enumerate(kinds):
            stage = self.ep[kind]
            outputs = self._call(kind, [values[n] for n in stage["inputs"]], tokens)
            for name, value in zip(stage["outputs"], outputs):
                if name.startswith("result"):
                    results[int(name[len("result") :])] = value
                else:
                    values[name] = value
            if index == len(kinds) - 1:
                break
            c = index
            if collectives[c] == "dispatch":
                over = values[f"dropped{c}"]
                dropped.append(over)
                if overflows[c] == "error":
                    worst = over.max().to(torch.int64).reshape(1)
                    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
                    if int(worst.item()) > 0:
                        raise CapacityError(
                            f"{self.name}: expert-parallel dispatch {c} needs more than its "
                            f"capacity of {self.capacity} rows from one rank to one rank "
                            f"(this rank: {over.tolist()} past it): raise ep_capacity or "
                            f"compile with overflow='drop'"
                        )
                values[f"received{c}"] = exchange(values[f"send{c}"])
                values[f"received_counts{c}"] = exchange(values[f"send_counts{c}"])
            else:
                values[f"returned{c}"] = exchange(values[f"send{c}"])
        out = [
            values[source] if source.startswith("arg") else results[k]
            for k, source in enumerate(info["results"])
        ]
        return out, dropped

    def _tokens(self, x) -> Optional[int]:
        return tokens_within(x, self.max_tokens) if self.max_tokens else None

    def forward(self, args: Sequence, group=None) -> List:
        """The training forward's results in order (out, logits, then the saved tensors)."""
        out, self.dropped = self._run("forward", list(args), group, self._tokens(args[0]))
        return out

    def backward(self, saved: Sequence, d_out, d_logits, group=None) -> List:
        """The gradients of the arguments `gradient_args` names, in that order."""
        out, _ = self._run("backward", [*saved, d_out, d_logits], group, self._tokens(d_out))
        return out

    @property
    def num_saved(self) -> int:
        return int(self.ep["forward_stage0"]["num_saved"])

    @property
    def gradient_args(self) -> List[int]:
        return [int(i) for i in self.ep["backward_stage0"]["gradient_args"]]
