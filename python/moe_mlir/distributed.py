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
import os
import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .config import LayerConfig
from .cpu import (
    CPU_PIPELINE,
    CompiledModule,
    CpuModule,
    FunctionSignature,
    IndexCheck,
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
    "ChunkedSaved",
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
    one rank a step (a chunk, when chunked), and what happens past it (`overflow`: "error" or
    "drop"). `chunk_tokens`: run a step of up to max_tokens tokens as chunks of at most this
    many, each with its own dispatch and combine, one chunk's rows moving while another's
    experts compute (None: one dispatch a step)."""

    size: int
    capacity: int
    overflow: str = "error"
    chunk_tokens: Optional[int] = None

    def validate(self, config: Optional[LayerConfig] = None) -> "EPSpec":
        for name, hi in (("size", 65536), ("capacity", 2**31 - 2)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= hi:
                raise ValueError(f"EPSpec.{name} must be an integer in [1, {hi}], got {value!r}")
        chunk = self.chunk_tokens
        if chunk is not None and (
            isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1
        ):
            raise ValueError(f"EPSpec.chunk_tokens must be a positive integer, got {chunk!r}")
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

    def all_to_all_start(self, blocks: np.ndarray):
        """Starts `all_to_all(blocks)`; `all_to_all_finish` of what it returns gives the
        blocks received. Here synchronous; an exchange that can overlaps it with the
        caller's work."""
        return self.all_to_all(blocks)

    def all_to_all_finish(self, handle) -> np.ndarray:
        return handle


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
        return self.all_to_all_finish(self.all_to_all_start(blocks))

    def all_to_all_start(self, blocks: np.ndarray):
        import torch

        blocks = np.ascontiguousarray(blocks)
        if blocks.shape[0] % self.size != 0:
            raise ValueError(f"all_to_all: {blocks.shape[0]} rows are not {self.size} equal blocks")
        raw = torch.from_numpy(blocks.reshape(-1).view(np.uint8).copy())
        received = torch.empty_like(raw)
        work = self._dist.all_to_all_single(received, raw, group=self.group, async_op=True)
        # The send buffer stays referenced until the work is done.
        return work, raw, received, blocks.dtype, blocks.shape

    def all_to_all_finish(self, handle) -> np.ndarray:
        work, _, received, dtype, shape = handle
        work.wait()
        return received.numpy().view(dtype).reshape(shape)

    def max(self, value: int) -> int:
        import torch

        t = torch.tensor([int(value)], dtype=torch.int64)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX, group=self.group)
        return int(t.item())


# =========================================================================== stages


@dataclasses.dataclass
class _Stage:
    name: str
    inputs: List[str]
    outputs: List[str]
    rows: List[Optional[int]]  # rows a token of each result with a dynamic leading size


@dataclasses.dataclass
class _StagePlan:
    """What the stage attributes of one split function say (the same on both paths)."""

    name: str
    stages: List[_Stage]
    kinds: List[str]  # the collective that ends each stage but the last
    overflows: List[str]
    results: List[str]  # where each result of the function comes from
    ep_size: int
    capacity: int
    chunk_tokens: int  # the bound of one call (a chunk's; the step's when unchunked)
    step_tokens: int  # the bound of a step; 0: a static token count

    def expert_side(self, index: int) -> bool:
        """Whether stage `index` runs on the rows other ranks sent (after a dispatch), rather
        than on this rank's tokens."""
        return index > 0 and self.kinds[index - 1] == "dispatch"

    @property
    def chunks(self) -> int:
        """Chunks a step runs as: the same on every rank, whatever its T, so that every rank
        makes the same collectives."""
        if not self.step_tokens:
            return 1
        return -(-self.step_tokens // self.chunk_tokens)

    def split(self, tokens: int) -> List[Tuple[int, int]]:
        """(start, T) of each chunk of a step of `tokens` tokens: `chunks` near-equal parts,
        empty ones (T = 0) when a step has fewer tokens than chunks."""
        n = self.chunks
        base, extra = divmod(tokens, n)
        spans, start = [], 0
        for i in range(n):
            size = base + (1 if i < extra else 0)
            spans.append((start, size))
            start += size
        return spans


class _Backend:
    """How one path calls stages and moves their rows: the CPU (numpy, an Exchange) or the
    GPU (torch on the current CUDA stream, torch.distributed)."""

    def call(self, index: int, inputs: List, tokens: int) -> List:
        raise NotImplementedError

    def skipped(self, index: int) -> List:
        """The outputs of local stage `index` for a chunk without tokens: zero blocks for a
        collective, zero rows for a result that follows T, None for the rest."""
        raise NotImplementedError

    def follows_tokens(self, index: int, output: int) -> bool:
        raise NotImplementedError

    def start(self, blocks):
        """Starts the all-to-all of `blocks`; returns what `finish` takes."""
        raise NotImplementedError

    def finish(self, handle):
        raise NotImplementedError

    def group_max(self, dropped) -> int:
        raise NotImplementedError

    def add(self, total, value):
        raise NotImplementedError


def _run_stages(
    plan: _StagePlan, backend: _Backend, chunks: Sequence[Tuple[List, int]], sum_static: bool
) -> Tuple[List[List], Dict[int, object], List]:
    """Runs the stages of `plan` on each chunk (its arguments and T), software-pipelined:
    the collectives start asynchronously, and a chunk's local stages run while an earlier
    chunk's rows travel, so one chunk's all-to-all overlaps another's compute. Every rank
    makes the same collectives in the same order, whatever its T (a chunk without tokens
    sends zero counts). Returns each chunk's results (in the function's order; None where an
    empty chunk made none), the static results summed over the chunks when `sum_static`
    (gradients of weights; then absent from the per-chunk lists), and each dispatch's rows
    past the capacity summed over the chunks."""
    n, last = len(chunks), len(plan.stages) - 1
    values = [{f"arg{i}": a for i, a in enumerate(args)} for args, _ in chunks]
    produced: List[Dict[int, object]] = [{} for _ in range(n)]
    static: Dict[int, bool] = {}
    pending: Dict[Tuple[int, int], List] = {}
    dropped: Dict[int, object] = {}
    # What a chunk still needs after each stage: the later stages' inputs and the arguments
    # returned as results. The rest is dropped, so that only the chunks in flight hold their
    # buffers (a started collective keeps its own reference to what it sends).
    returned_args = {source for source in plan.results if source.startswith("arg")}
    needed_after = [
        returned_args.union(*(stage.inputs for stage in plan.stages[k + 1 :]))
        for k in range(last + 1)
    ]

    def run(i: int, k: int) -> None:
        run_stage(i, k)
        for name in [name for name in values[i] if name not in needed_after[k]]:
            del values[i][name]

    def run_stage(i: int, k: int) -> None:
        """Stage k of chunk i, after the collective before it, then the one after it."""
        tokens = chunks[i][1]
        if k > 0:  # the rows of the collective before this stage
            c = k - 1
            handles = pending.pop((i, c))
            if plan.kinds[c] == "dispatch":
                values[i][f"received{c}"] = backend.finish(handles[0])
                values[i][f"received_counts{c}"] = backend.finish(handles[1])
            else:
                values[i][f"returned{c}"] = backend.finish(handles[0])
        stage = plan.stages[k]
        if tokens == 0 and not plan.expert_side(k):
            outputs = backend.skipped(k)
        else:
            try:
                inputs = [values[i][name] for name in stage.inputs]
            except KeyError as e:
                raise ValueError(f"@{stage.name} takes {e.args[0]}, which nothing made") from None
            if any(v is None for v in inputs):
                raise ValueError(f"@{stage.name} takes a value an empty chunk did not make")
            # An expert-side stage's shapes do not follow T; it runs for a chunk without
            # tokens too, on what the other ranks sent.
            if tokens == 0 and any(backend.follows_tokens(k, j) for j in range(len(stage.outputs))):
                raise ValueError(
                    f"@{stage.name} runs for every chunk but has results that follow T"
                )
            outputs = backend.call(k, inputs, max(tokens, 1))
        for j, (oname, value) in enumerate(zip(stage.outputs, outputs)):
            if oname.startswith("result"):
                index = int(oname[len("result") :])
                static[index] = not backend.follows_tokens(k, j)
                produced[i][index] = value
            else:
                values[i][oname] = value
        if k == last:
            return
        c = k
        if plan.kinds[c] == "dispatch":
            over = values[i][f"dropped{c}"]
            dropped[c] = over if c not in dropped else backend.add(dropped[c], over)
            if plan.overflows[c] == "error":
                worst = backend.group_max(over)
                if worst > 0:
                    where = f" (chunk {i} of {n})" if n > 1 else ""
                    raise CapacityError(
                        f"@{plan.name}: expert-parallel dispatch {c}{where} needs more than "
                        f"its capacity of {plan.capacity} rows from one rank to one rank "
                        f"(this rank has {_as_list(over)} rows past it for ranks "
                        f"0..{plan.ep_size - 1}; the worst rank {worst}): raise ep_capacity "
                        f"or compile with overflow='drop'"
                    )
            pending[(i, c)] = [
                backend.start(values[i][f"send{c}"]),
                backend.start(values[i][f"send_counts{c}"]),
            ]
        else:
            pending[(i, c)] = [backend.start(values[i][f"send{c}"])]

    # Wavefront order: in wave t chunk i runs stage t - i, the later chunk first so that its
    # collective is under way while the earlier chunk computes.
    for t in range(n + last):
        for i in reversed(range(n)):
            if 0 <= t - i <= last:
                run(i, t - i)

    per_chunk: List[List] = []
    sums: Dict[int, object] = {}
    for i in range(n):
        out = []
        for k, source in enumerate(plan.results):
            if source.startswith("arg"):
                out.append(values[i][source])
                continue
            value = produced[i].get(k)
            if sum_static and static.get(k, False):
                if value is not None:
                    sums[k] = value if k not in sums else backend.add(sums[k], value)
                value = None
            out.append(value)
        per_chunk.append(out)
    return per_chunk, sums, [dropped[c] for c in sorted(dropped)]


def _as_list(value) -> list:
    return value.tolist() if hasattr(value, "tolist") else list(value)


def _string_list(sig: FunctionSignature, key: str) -> List[str]:
    raw = sig.attr(key)
    if raw is None:
        raise ValueError(f"@{sig.name} has no {key} attribute (run --moe-ep-stages)")
    return re.findall(r'"([^"]*)"', raw)


class _NumpyBackend(_Backend):
    def __init__(self, function: "StagedFunction", exchange: Exchange):
        self.function, self.exchange = function, exchange

    def _results(self, index: int):
        return self.function.module[self.function.plan.stages[index].name].signature.results

    def call(self, index: int, inputs: List, tokens: int) -> List:
        stage = self.function.plan.stages[index]
        shapes = None
        if any(r is not None for r in stage.rows):
            shapes = [
                t.shape if r is None else (r * tokens, *t.shape[1:])
                for t, r in zip(self._results(index), stage.rows)
            ]
        return list(self.function.module[stage.name](*inputs, result_shapes=shapes))

    def skipped(self, index: int) -> List:
        out = []
        for name, t, r in zip(
            self.function.plan.stages[index].outputs,
            self._results(index),
            self.function.plan.stages[index].rows,
        ):
            if r is not None:
                out.append(np.zeros((0, *t.shape[1:]), t.dtype))
            elif name.startswith(("send", "dropped")):
                out.append(np.zeros(t.shape, t.dtype))
            else:
                out.append(None)
        return out

    def follows_tokens(self, index: int, output: int) -> bool:
        return self.function.plan.stages[index].rows[output] is not None

    def start(self, blocks):
        return self.exchange.all_to_all_start(blocks)

    def finish(self, handle):
        return self.exchange.all_to_all_finish(handle)

    def group_max(self, dropped) -> int:
        return self.exchange.max(int(dropped.max()) if dropped.size else 0)

    def add(self, total, value):
        return total + value


class StagedFunction:
    """Function `@name` of a module split by `moe-ep-stages`: its stages run in order on this
    rank (once a chunk when the layer is chunked), an `Exchange` moving the rows in between."""

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
        stages: List[_Stage] = []
        for i in range(count):
            sname = f"{name}_stage{i}"
            if sname not in sigs:
                raise ValueError(f"@{sname} is missing ({count} stages of @{name})")
            sig = sigs[sname]
            stages.append(
                _Stage(
                    sname,
                    _string_list(sig, "moe.ep_inputs"),
                    _string_list(sig, "moe.ep_outputs"),
                    (rows or {}).get(sname, [None] * len(sig.results)),
                )
            )
        self.plan = _StagePlan(
            name,
            stages,
            _string_list(first, "moe.ep_collectives"),
            _string_list(first, "moe.ep_overflows"),
            _string_list(first, "moe.ep_results"),
            first.attr_int("moe.ep_size"),
            first.attr_int("moe.ep_capacity"),
            first.attr_int("moe.max_tokens") or 0,
            first.attr_int("moe.ep_step_tokens") or 0,
        )
        self.ep_size, self.capacity = self.plan.ep_size, self.plan.capacity
        self.num_saved = first.attr_int("moe.ep_num_saved")
        self.gradient_args = first.attr_int_array("moe.ep_gradient_args")

    def run(
        self,
        chunks: Sequence[Tuple[Sequence[np.ndarray], int]],
        exchange: Exchange,
        sum_static: bool = False,
    ):
        """The stages on each chunk's arguments and T (`_run_stages`)."""
        if exchange.size != self.ep_size:
            raise ValueError(
                f"@{self.name} is compiled for {self.ep_size} ranks but the exchange has "
                f"{exchange.size}"
            )
        chunks = [([np.asarray(a) for a in args], t) for args, t in chunks]
        per_chunk, sums, dropped = _run_stages(
            self.plan, _NumpyBackend(self, exchange), chunks, sum_static
        )
        drops = np.stack(dropped) if dropped else np.zeros((0, self.ep_size), np.int32)
        return per_chunk, sums, drops

    def __call__(
        self, args: Sequence[np.ndarray], exchange: Exchange, tokens: Optional[int] = None
    ) -> Tuple[Tuple[np.ndarray, ...], np.ndarray]:
        """Runs the stages on `args` as one call (an unchunked layer, or one chunk); returns
        the function's results and, for each dispatch, the rows this rank sent past the
        capacity of each rank (`[dispatches, S]`)."""
        if tokens is None:
            if any(r is not None for st in self.plan.stages for r in st.rows):
                raise ValueError(f"@{self.name} has results that follow T: pass tokens")
            tokens = 1
        per_chunk, _, drops = self.run([(args, tokens)], exchange)
        return tuple(per_chunk[0]), drops


def _stage_rows(
    text_at_one: str, pre_passes: Sequence[str], opt_tool: Optional[str]
) -> Dict[str, List[Optional[int]]]:
    """Rows a token of each stage result whose leading size follows T: its size in the same
    layer at T = 1 through the same passes."""
    sigs = parse_functions(run_opt(text_at_one, pre_passes, opt_tool))
    return {name: [t.shape[0] if t.rank else None for t in s.results] for name, s in sigs.items()}


def _cached_ep_state(
    config: LayerConfig,
    ep: EPSpec,
    name: str,
    max_tokens: Optional[int],
    opt_tool: Optional[str],
) -> dict:
    """EPLayer's compiled state (`EPLayer.state()` without name and bound) from the compile
    cache ([python.md](python.md): MOE_MLIR_CACHE, MOE_MLIR_PREBUILT), built there with
    moe-opt, mlir-translate and clang when missing: the CPU target with `ep` and `max_tokens`
    as options, the function name in the key where it is not the cache's own name."""
    import json  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from . import compile_cache as cc  # noqa: PLC0415
    from .mlir_text import layer_mlir  # noqa: PLC0415

    options = cc.BuildOptions(max_tokens=max_tokens, ep=ep)
    ckey = cc.config_key(config, "cpu", options)
    if name != cc.layer_name(cc._keyed(config, options)):
        ckey += "-" + name
    tool = opt_tool or cc._find_moe_opt()
    entry = cc._lookup("cpu", ckey, cc.tool_key(tool) if tool else None)
    if entry is None:
        if tool is None:
            raise cc.NoCompilerError(
                f"no moe-opt here (set MOE_OPT or MOE_BUILD_DIR) and no cached CPU build of "
                f"this expert-parallel layer (config key {ckey}) under "
                f"{', '.join(map(str, cc._roots()))}"
            )

        def build(folder: Path, fname: str, progress) -> None:
            source = layer_mlir(config, fname, max_tokens, ep=ep)
            (folder / "layer.mlir").write_text(source)
            progress.step = "moe-opt, mlir-translate + clang"
            module = compile_mlir(
                source, CPU_PIPELINE, pre_passes=EP_PRE_PASSES, opt_tool=tool, keep_dir=str(folder)
            )
            (folder / "module.ll").unlink(missing_ok=True)
            (folder / "tensor.mlir").write_text(module.tensor_ir)
            (folder / "module.mlir").write_text(module.lowered_ir)
            checks = {n: [dataclasses.asdict(c) for c in cs] for n, cs in module.checks.items()}
            (folder / "checks.json").write_text(json.dumps(checks))
            rows = {}
            if max_tokens is not None:
                progress.step = "the stages' rows a token"
                rows = _dynamic_rows(config, ep, fname, module, tool)
            (folder / "rows.json").write_text(json.dumps(rows))

        entry = cc._build("cpu", ckey, cc.tool_key(tool), config, options, tool, build, name)
    checks = json.loads((entry.path / "checks.json").read_text())
    return {
        "tensor_ir": (entry.path / "tensor.mlir").read_text(),
        "lowered_ir": (entry.path / "module.mlir").read_text(),
        "so": str(entry.path / "module.so"),
        "checks": {n: [_index_check(c) for c in cs] for n, cs in checks.items()},
        "rows": json.loads((entry.path / "rows.json").read_text()),
    }


def _index_check(data: dict) -> IndexCheck:
    """An IndexCheck from its JSON form (tuples come back as lists)."""
    fields = dict(data)
    for key in ("bound", "queue"):
        if fields.get(key) is not None:
            fields[key] = tuple(fields[key])
    return IndexCheck(**fields)


def _dynamic_rows(config, ep, name, module, opt_tool) -> Dict[str, List[Optional[int]]]:
    """The rows a token of each stage result whose leading size follows T, for a layer of
    dynamic T: the probe at T = 1 through the same passes, unchunked (a chunk's stages are a
    step's at a smaller bound); results of static size are left out (None)."""
    from .mlir_text import layer_mlir  # noqa: PLC0415

    probe = dataclasses.replace(config, tokens=1)
    unchunked = dataclasses.replace(ep, chunk_tokens=None)
    rows = _stage_rows(layer_mlir(probe, name, ep=unchunked), EP_PRE_PASSES, opt_tool)
    return {
        n: [r if not t.is_static else None for r, t in zip(rows[n], s.results)]
        for n, s in module.signatures.items()
        if n in rows
    }


class EPLayer:
    """One expert-parallel `moe.layer` on the CPU path, compiled once, run on each rank.

    - `layer(args, exchange)` runs `@<name>`: (out, logits);
    - `forward(args, exchange)` runs `@<name>_forward`: (out, logits, saved);
    - `backward(saved, d_out, d_logits, exchange)`: {argument name: gradient} of this rank's
      tokens; the expert weights' gradients are this rank's experts', summed over the tokens
      of every rank; the router's (and shared expert's) are this rank's tokens' alone.

    `args` by name or in `config.arg_names()` order, with this rank's expert weights
    (`shard_experts`). `dropped` holds, after each call, the rows this rank's dispatches
    sent past the capacity of each rank (`overflow="drop"`).

    The layer compiles into the compile cache (its `.so` stays there for `state()`'s other
    processes), or into `keep_dir` when given."""

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
        if _compiled is None and keep_dir is not None:
            self.keep_dir = keep_dir
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
                rows = _dynamic_rows(config, ep, name, module, opt_tool)
            self._compiled = {
                "tensor_ir": module.tensor_ir,
                "lowered_ir": module.lowered_ir,
                "so": f"{self.keep_dir}/module.so",
                "checks": module.checks,
                "rows": rows,
            }
            self.module = module
        else:
            if _compiled is None:
                _compiled = _cached_ep_state(config, ep, name, max_tokens, opt_tool)
            self.keep_dir = os.path.dirname(_compiled["so"])
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
        in the compile cache, or in `keep_dir`): `EPLayer.load(config, ep, state)`."""
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

    @property
    def chunks(self) -> int:
        """Chunks a step runs as (1 unless compiled with `EPSpec.chunk_tokens`)."""
        return self.functions["forward"].plan.chunks

    def _forward(self, kind: str, args, exchange: Exchange):
        function = self.functions[kind]
        args = self._args(args)
        tokens = self._tokens(args[0])
        if function.plan.chunks == 1:
            res, self.dropped = function(args, exchange, tokens)
            return res[0], res[1], tuple(res[2:])
        spans = function.plan.split(tokens)
        x = np.asarray(args[0])
        chunks = [([x[a : a + t], *args[1:]], t) for a, t in spans]
        per_chunk, _, self.dropped = function.run(chunks, exchange)
        out = np.concatenate([c[0] for c in per_chunk])
        logits = np.concatenate([c[1] for c in per_chunk])
        return out, logits, ChunkedSaved(spans, [tuple(c[2:]) for c in per_chunk])

    def layer(self, args, exchange: Exchange):
        out, logits, _ = self._forward("layer", args, exchange)
        return out, logits

    def forward(self, args, exchange: Exchange):
        """(out, logits, saved); `saved` is a `ChunkedSaved` when the layer is chunked."""
        return self._forward("forward", args, exchange)

    def backward(
        self,
        saved,
        d_out: np.ndarray,
        d_logits: np.ndarray,
        exchange: Exchange,
    ) -> Dict[str, np.ndarray]:
        function = self.functions["backward"]
        chunked = ChunkedSaved.of(saved)
        if chunked is None:
            if len(saved) != self.num_saved:
                raise ValueError(
                    f"backward takes the {self.num_saved} saved tensors forward returned, "
                    f"got {len(saved)}"
                )
            grads, self.dropped = function([*saved, d_out, d_logits], exchange, self._tokens(d_out))
            return dict(zip(self.gradient_names, grads))
        tokens = self._tokens(d_out)
        chunked.check(tokens, self.num_saved)
        chunks = [
            ([*kept, d_out[a : a + t], d_logits[a : a + t]], t)
            for (a, t), kept in zip(chunked.spans, chunked.saved)
        ]
        per_chunk, sums, self.dropped = function.run(chunks, exchange, sum_static=True)
        grads = {}
        for k, name in enumerate(self.gradient_names):
            if k in sums:
                grads[name] = sums[k]
            else:
                grads[name] = np.concatenate([c[k] for c in per_chunk])
        return grads


@dataclasses.dataclass
class ChunkedSaved:
    """What the forward of a chunked layer saves for its backward: each chunk's span of the
    step's tokens (start, T) and its saved tensors (None where a chunk without tokens made
    none). Pass it back to backward as it is."""

    spans: List[Tuple[int, int]]
    saved: List[tuple]

    @staticmethod
    def of(saved) -> Optional["ChunkedSaved"]:
        """`saved` itself, or the one element of a sequence holding it, or None."""
        if isinstance(saved, ChunkedSaved):
            return saved
        if isinstance(saved, (list, tuple)) and len(saved) == 1:
            if isinstance(saved[0], ChunkedSaved):
                return saved[0]
        return None

    def check(self, tokens: int, num_saved: int) -> None:
        total = sum(t for _, t in self.spans)
        if total != tokens:
            raise ValueError(
                f"backward has the cotangents of {tokens} tokens but the forward saved {total}"
            )
        for kept in self.saved:
            if len(kept) != num_saved:
                raise ValueError(
                    f"backward takes the {num_saved} saved tensors a chunk's forward "
                    f"returned, got {len(kept)}"
                )


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


class _TorchBackend(_Backend):
    """The GPU path's stages on torch's current CUDA stream; the all-to-alls through
    torch.distributed (NCCL) asynchronously, each finish making the stream wait for it."""

    def __init__(self, layer: "GPUEPLayer", kinds: List[str], group):
        import torch
        import torch.distributed as dist

        self.layer, self.kinds, self.group = layer, kinds, group
        self.torch, self.dist = torch, dist
        # A group of one: the all-to-all is the identity, and its copy is skipped.
        self.alone = dist.get_world_size(group) == 1

    def _outputs(self, index: int):
        return self.layer.entries[self.kinds[index]].by_role("output")

    def call(self, index: int, inputs: List, tokens: int) -> List:
        return self.layer._call(self.kinds[index], inputs, tokens)

    def skipped(self, index: int) -> List:
        from . import gpu

        out = []
        for name, spec in zip(self.layer.ep[self.kinds[index]]["outputs"], self._outputs(index)):
            dtype = gpu.torch_dtype(spec.dtype)
            if spec.follows_tokens:
                out.append(
                    self.torch.empty((0, *spec.shape[1:]), dtype=dtype, device=self.layer.device)
                )
            elif name.startswith(("send", "dropped")):
                out.append(self.torch.zeros(spec.shape, dtype=dtype, device=self.layer.device))
            else:
                out.append(None)
        return out

    def follows_tokens(self, index: int, output: int) -> bool:
        return self._outputs(index)[output].follows_tokens

    def start(self, blocks):
        if self.alone:
            return None, blocks, blocks
        received = self.torch.empty_like(blocks)
        blocks = blocks.contiguous()
        work = self.dist.all_to_all_single(
            received.view(-1).view(self.torch.uint8),
            blocks.view(-1).view(self.torch.uint8),
            group=self.group,
            async_op=True,
        )
        return work, received, blocks

    def finish(self, handle):
        work, received, _ = handle
        if work is not None:
            work.wait()
        return received

    def group_max(self, dropped) -> int:
        worst = dropped.max().to(self.torch.int64).reshape(1)
        self.dist.all_reduce(worst, op=self.dist.ReduceOp.MAX, group=self.group)
        return int(worst.item())

    def add(self, total, value):
        return total.add_(value)


class GPUEPLayer:
    """An expert-parallel layer compiled by moe-compile (NAME.so linked with libmoe_runtime,
    and NAME.json): its forward and backward are stages (entry points `NAME_forward_stage0`,
    ...), run here on torch's current CUDA stream with the rows moved between them by
    `torch.distributed.all_to_all_single` (NCCL), started asynchronously and waited for by
    the stream before the stage that reads them.

    - `forward(args, group)`: `args` the forward's arguments in order (x, the router weight,
      ..., this rank's expert weights); returns the training forward's results in order: out,
      logits, then the saved tensors (one `ChunkedSaved` when chunked);
    - `backward(saved, d_out, d_logits, group)`: `saved` what forward returned after out and
      logits; returns the gradients of the arguments `gradient_args` names, in that order.

    A chunked layer (`EPSpec.chunk_tokens`; the manifest's `ep.step_tokens`) takes a step of
    up to `step_tokens` tokens and runs it as `chunks` chunks, pipelined: one chunk's
    all-to-all runs on NCCL's stream while another's stages compute. The weights' gradients
    are summed over the chunks, in place.

    Synchronisation: none but the capacity check of `overflow="error"` (one integer read a
    dispatch and chunk, after an all-reduce); `"drop"` reads nothing."""

    device = "cuda"  # where the stages' tensors are

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

    def _plan(self, half: str) -> _StagePlan:
        kinds = self._stages(half)
        info = self.ep[kinds[0]]
        stages = [
            _Stage(
                f"{self.name}_{kind}",
                list(self.ep[kind]["inputs"]),
                list(self.ep[kind]["outputs"]),
                [None] * len(self.ep[kind]["outputs"]),
            )
            for kind in kinds
        ]
        return _StagePlan(
            self.name,
            stages,
            list(info["collectives"]),
            list(info["overflows"]),
            list(info["results"]),
            self.ep_size,
            self.capacity,
            self.max_tokens,
            int(info.get("step_tokens", 0)),
        )

    def _run(self, half: str, chunks, group, sum_static: bool = False):
        plan = self._plan(half)
        return _run_stages(plan, _TorchBackend(self, self._stages(half), group), chunks, sum_static)

    def _tokens(self, x) -> Optional[int]:
        bound = self.step_tokens or self.max_tokens
        return tokens_within(x, bound) if bound else None

    def forward(self, args: Sequence, group=None) -> List:
        """The training forward's results in order (out, logits, then the saved tensors; a
        chunked layer saves one `ChunkedSaved` instead)."""
        args = list(args)
        tokens = self._tokens(args[0])
        if self.chunks == 1:
            per_chunk, _, self.dropped = self._run("forward", [(args, tokens or 1)], group)
            return per_chunk[0]
        import torch

        spans = self._plan("forward").split(tokens)
        chunks = [([args[0][a : a + t], *args[1:]], t) for a, t in spans]
        per_chunk, _, self.dropped = self._run("forward", chunks, group)
        out = torch.cat([c[0] for c in per_chunk])
        logits = torch.cat([c[1] for c in per_chunk])
        return [out, logits, ChunkedSaved(spans, [tuple(c[2:]) for c in per_chunk])]

    def backward(self, saved: Sequence, d_out, d_logits, group=None) -> List:
        """The gradients of the arguments `gradient_args` names, in that order."""
        tokens = self._tokens(d_out)
        chunked = ChunkedSaved.of(saved)
        if chunked is None:
            chunks = [([*saved, d_out, d_logits], tokens or 1)]
            per_chunk, _, _ = self._run("backward", chunks, group)
            return per_chunk[0]
        import torch

        chunked.check(tokens, self.num_saved)
        chunks = [
            ([*kept, d_out[a : a + t], d_logits[a : a + t]], t)
            for (a, t), kept in zip(chunked.spans, chunked.saved)
        ]
        per_chunk, sums, _ = self._run("backward", chunks, group, sum_static=True)
        return [
            sums[k] if k in sums else torch.cat([c[k] for c in per_chunk])
            for k in range(len(per_chunk[0]))
        ]

    @property
    def step_tokens(self) -> int:
        """The bound of a step when chunked, else 0."""
        return int(self.ep["forward_stage0"].get("step_tokens", 0))

    @property
    def chunks(self) -> int:
        return self._plan("forward").chunks

    @property
    def num_saved(self) -> int:
        return int(self.ep["forward_stage0"]["num_saved"])

    @property
    def gradient_args(self) -> List[int]:
        return [int(i) for i in self.ep["backward_stage0"]["gradient_args"]]
