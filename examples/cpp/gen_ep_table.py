#!/usr/bin/env python3
"""Writes ep_table.h for ep_example.cpp from an expert-parallel layer's manifest (NAME.json).

An expert-parallel layer compiled by moe-compile has one entry point a stage
(NAME_forward_stage0, ..., NAME_backward_stageN) whose manifest entry carries an `ep` object
(docs/distributed.md): what each parameter is (argJ, carryJ, receivedC, received_countsC,
returnedC in; sendC, send_countsC, droppedC, carryJ, resultK out), the collective between each
stage and the next, and where each result of the function comes from. The table lists, for the
forward and the backward, every stage with its parameters (name, kind, index, element type,
shape, rows a token) and a function that calls the entry point with an array of pointers, then
the collectives and the results' sources, so the example needs no change when the stages do.

    python3 gen_ep_table.py NAME.json NAME.h > ep_table.h
"""

import json
import re
import sys

DTYPES = {"bf16": "BF16", "f16": "F16", "f32": "F32", "i32": "I32"}
# Longest prefix first: "send_counts0" is not "send".
KINDS = [
    ("received_counts", "ReceivedCounts"),
    ("received", "Received"),
    ("returned", "Returned"),
    ("send_counts", "SendCounts"),
    ("send", "Send"),
    ("dropped", "Dropped"),
    ("carry", "Carry"),
    ("result", "Result"),
    ("arg", "Arg"),
]
COLLECTIVES = {"dispatch": "Dispatch", "combine": "Combine"}
OVERFLOWS = {"none": "OverflowNone", "error": "OverflowError", "drop": "OverflowDrop"}


def fail(message):
    raise SystemExit(f"gen_ep_table.py: {message}")


def kind_of(name):
    for prefix, kind in KINDS:
        match = re.fullmatch(re.escape(prefix) + r"(\d+)", name)
        if match:
            return kind, int(match.group(1))
    fail(f"unknown stage parameter {name!r} (docs/distributed.md lists the kinds)")


def value(name, p):
    """One parameter of a stage: its ep name with the entry point's type."""
    shape = list(p["shape"])
    if len(shape) > 4:
        fail(f"{name}: rank {len(shape)} > 4")
    if p["dtype"] not in DTYPES:
        fail(f"{name}: unknown dtype {p['dtype']}")
    kind, index = kind_of(name)
    # a leading size that follows a dynamic token count: 0 here, rowsPerToken * T at a call
    rows = int(p.get("rows_per_token", 0))
    dims = ", ".join(str(max(0, int(s))) for s in shape + [1] * (4 - len(shape)))
    return (
        f'    {{"{name}", {kind}, {index}, {DTYPES[p["dtype"]]}, {len(shape)}, '
        f"{{{dims}}}, {rows}}},"
    )


def stage_entries(entries, half):
    kinds = []
    while f"{half}_stage{len(kinds)}" in entries:
        kinds.append(f"{half}_stage{len(kinds)}")
    if not kinds:
        fail(f"no {half}_stage0: not an expert-parallel layer")
    return kinds


def split_params(kind, entry):
    """The entry point's parameters as the ep object's inputs and outputs, in order."""
    ep = entry.get("ep") or fail(f"{kind}: no ep object")
    params = entry["params"]
    ins = [p for p in params if p["role"] == "input"]
    outs = [p for p in params if p["role"] == "output"]
    if len(ins) + len(outs) != len(params):
        fail(f"{kind}: a parameter neither input nor output")
    # the pointer array is in manifest order: inputs, then outputs
    if params != ins + outs:
        fail(f"{kind}: inputs and outputs interleaved")
    if len(ins) != len(ep["inputs"]) or len(outs) != len(ep["outputs"]):
        fail(
            f"{kind}: ep names {len(ep['inputs'])} inputs and {len(ep['outputs'])} outputs, "
            f"the entry point has {len(ins)} and {len(outs)}"
        )
    return list(zip(ep["inputs"], ins)), list(zip(ep["outputs"], outs))


def call(name, entry):
    count = len(entry["params"])
    dynamic = bool(entry.get("max_tokens"))
    args = ", ".join(["stream"] + (["T"] if dynamic else []) + [f"p[{i}]" for i in range(count)])
    unused = "" if dynamic else "(void)T; "
    ws = entry.get("workspace_symbol")
    if not ws:
        body = "(void)T; return 0"
    elif dynamic:
        body = f"return {ws}(T)"
    else:
        body = f"(void)T; return int64_t({ws}())"
    return [
        f"inline int {name}(void *stream, int64_t T, void *const *p) {{ {unused}"
        f"return {entry['symbol']}({args}); }}",
        f"inline int64_t {name}Workspace(int64_t T) {{ {body}; }}",
    ]


def half_table(entries, half):
    kinds = stage_entries(entries, half)
    first = entries[kinds[0]]["ep"]
    collectives, overflows = first["collectives"], first["overflows"]
    if len(collectives) != len(kinds) - 1 or len(overflows) != len(collectives):
        fail(f"{half}: {len(kinds)} stages but {len(collectives)} collectives")
    cap = half.capitalize()
    out, stages, num_args = [], [], 0
    for i, kind in enumerate(kinds):
        entry = entries[kind]
        ins, outs = split_params(kind, entry)
        fn, table = f"{half}Stage{i}", f"k{cap}Stage{i}"
        # an empty array is ill-formed: one placeholder that the count leaves out
        empty = '    {"", Arg, 0, BF16, 0, {1, 1, 1, 1}, 0},'
        for suffix, pairs in (("In", ins), ("Out", outs)):
            out.append(f"inline constexpr Value {table}{suffix}[] = {{")
            out += [value(n, p) for n, p in pairs] or [empty]
            out.append("};")
        for n, _ in ins:
            k, index = kind_of(n)
            if k == "Arg":
                num_args = max(num_args, index + 1)
        out += call(fn, entry)
        stages.append(
            f'    {{"{entry["symbol"]}", {fn}, {fn}Workspace, {table}In, {len(ins)}, '
            f"{table}Out, {len(outs)}}},"
        )
    sources = []
    for source in first["results"]:
        if source.startswith("arg"):
            sources.append(f"{{-1, {int(source[3:])}}}")
            num_args = max(num_args, int(source[3:]) + 1)
        elif source.startswith("stage"):
            sources.append(f"{{{int(source[5:])}, -1}}")
        else:
            fail(f"{half}: unknown result source {source!r}")
    kinds_of = ", ".join(COLLECTIVES[c] for c in collectives) or "Dispatch"
    overflow_of = ", ".join(OVERFLOWS[o] for o in overflows) or "OverflowNone"
    out += [
        f"inline constexpr Stage k{cap}Stages[] = {{",
        *stages,
        "};",
        f"inline constexpr Collective k{cap}Collectives[] = {{{kinds_of}}};",
        f"inline constexpr Overflow k{cap}Overflows[] = {{{overflow_of}}};",
        f"inline constexpr Source k{cap}Results[] = {{{', '.join(sources)}}};",
    ]
    out.append(
        f"inline constexpr Half k{cap} = {{k{cap}Stages, {len(kinds)}, k{cap}Collectives, "
        f"k{cap}Overflows, {len(collectives)}, k{cap}Results, {len(sources)}, {num_args}}};"
    )
    return out, first


HEAD = """\
namespace moe_ep {

enum DType { BF16, F16, F32, I32 };
/// What a stage's parameter is (docs/distributed.md): inputs argJ (the
/// function's argument J), carryJ (made by an earlier stage), receivedC and
/// received_countsC (what collective C's all-to-all brought), returnedC;
/// outputs sendC, send_countsC (for collective C), droppedC (the rows past the
/// capacity, one a destination rank), carryJ, resultK (the function's result K).
enum Kind {
  Arg,
  Carry,
  Received,
  ReceivedCounts,
  Returned,
  Send,
  SendCounts,
  Dropped,
  Result
};
struct Value {
  const char *name;
  Kind kind;
  int index;
  DType dtype;
  int rank;
  int64_t shape[4];
  // > 0: shape[0] is this many rows a token of the call's T (T or T * k)
  int64_t rowsPerToken;
};
/// A stage's entry point, called with T (ignored for a static one) and its
/// pointers: inputs, then outputs.
using EntryPoint = int (*)(void *stream, int64_t T, void *const *p);
using WorkspaceBytes = int64_t (*)(int64_t T);
struct Stage {
  const char *symbol;
  EntryPoint call;
  WorkspaceBytes workspaceBytes;
  const Value *inputs;
  int numInputs;
  const Value *outputs;
  int numOutputs;
};
/// Collective C runs between stage C and stage C + 1.
enum Collective { Dispatch, Combine };
enum Overflow { OverflowNone, OverflowError, OverflowDrop };
/// Where the function's result K comes from: stage `stage`'s output resultK,
/// or (stage -1) its argument `arg`.
struct Source {
  int stage, arg;
};
struct Half {
  const Stage *stages;
  int numStages;
  const Collective *collectives;
  const Overflow *overflows;
  int numCollectives;
  const Source *results;
  int numResults;
  int numArgs;
};
"""


def main():
    if len(sys.argv) != 3:
        raise SystemExit("usage: gen_ep_table.py NAME.json NAME.h")
    with open(sys.argv[1], encoding="utf-8") as f:
        m = json.load(f)
    entries = m["entry_points"]
    fwd, first = half_table(entries, "forward")
    bwd, bfirst = half_table(entries, "backward")
    grads = [int(i) for i in bfirst.get("gradient_args", [])]
    max_tokens = int(entries["forward_stage0"].get("max_tokens", 0))
    out = [
        f"// Generated by examples/cpp/gen_ep_table.py from {sys.argv[1]}: do not edit.",
        "#pragma once",
        "#include <cstdint>",
        'extern "C" {',
        f'#include "{sys.argv[2]}"',
        "}",
        "",
        HEAD,
        f'inline constexpr const char *kName = "{m["name"]}";',
        "// S ranks, C rows from one rank to one rank a collective.",
        f"inline constexpr int kSize = {int(first['size'])};",
        f"inline constexpr int64_t kCapacity = {int(first['capacity'])};",
        "// A dynamic token count's bound (0: static T).",
        f"inline constexpr int64_t kMaxTokens = {max_tokens};",
        "// The forward's results past the function's own are the saved tensors,",
        "// the backward's first arguments; its results are the gradients of the",
        "// arguments kGradientArgs names.",
        f"inline constexpr int kNumSaved = {int(first.get('num_saved', 0))};",
        "inline constexpr int kGradientArgs[] = {" + (", ".join(map(str, grads)) or "-1") + "};",
        f"inline constexpr int kNumGradients = {len(grads)};",
        "",
        *fwd,
        "",
        *bwd,
        "",
        "} // namespace moe_ep",
        "",
    ]
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main()
