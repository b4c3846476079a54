#!/usr/bin/env python3
"""Generates GPUContract.h.inc from python/moe_mlir/gpu_contract.json.

    python3 lib/Conversion/MoEToGPU/gen_gpu_contract.py python/moe_mlir/gpu_contract.json \
        -o build/include/moe/Conversion/MoEToGPU/GPUContract.h.inc

The build runs it (lib/Conversion/MoEToGPU/CMakeLists.txt); the output is included by
include/moe/Conversion/MoEToGPU/GPUContract.h, which declares the structs it fills. The JSON
is the one declaration of the sm_90a path's limits and host functions (docs/gpu-path.md
section 1): the conversion, moe-compile and moe_mlir.layer all read it. Anything the JSON
holds that this script does not expect is an error, so the header cannot silently drop it.
"""

import argparse
import json
import os
import re
import sys

TOP_KEYS = {"description", "chip", "limits", "host_functions"}
LIMIT_KEYS = {"value", "applies_to", "reason"}
FUNCTION_KEYS = {"name", "op", "summary", "params", "results"}
HOST_PREFIX = "__moe_gpu_"


class ContractError(Exception):
    pass


def unique_keys(pairs):
    data = dict(pairs)
    if len(data) != len(pairs):
        keys = [key for key, _ in pairs]
        raise ContractError(
            f"an object lists {sorted({k for k in keys if keys.count(k) > 1})} twice"
        )
    return data


def literal(text, where):
    """A C++ string literal of `text`: printable ASCII only, so only \\ and " need escapes."""
    if not isinstance(text, str):
        raise ContractError(f"{where} must be a string, got {text!r}")
    if any(not (" " <= c <= "~") for c in text):
        raise ContractError(f"{where} must be printable ASCII on one line, got {text!r}")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def camel(name):
    """max_expert_groups -> MaxExpertGroups."""
    if not re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)*", name):
        raise ContractError(f"limit name {name!r} must be snake_case")
    return "".join(part.capitalize() for part in name.split("_"))


def strings(values, where):
    if not isinstance(values, list) or not values:
        raise ContractError(f"{where} must be a non-empty list of strings, got {values!r}")
    return "{" + ", ".join(literal(v, where) for v in values) + "}"


def check_keys(data, allowed, required, where):
    if not isinstance(data, dict):
        raise ContractError(f"{where} must be an object, got {data!r}")
    unknown = set(data) - allowed
    if unknown:
        raise ContractError(f"{where} has unknown keys {sorted(unknown)}")
    missing = required - set(data)
    if missing:
        raise ContractError(f"{where} lacks {sorted(missing)}")


def limit_lines(name, limit):
    """The constants of one limit (value, applies_to, reason) and its row of kLimits."""
    where = f"limits.{name}"
    check_keys(limit, LIMIT_KEYS, {"value", "reason"}, where)
    ident = "k" + camel(name)
    value = limit["value"]
    # A row of kLimits: name, kind, integer, string, boolean, strings, appliesTo, reason.
    if isinstance(value, bool):
        decl = f"bool {ident} = {'true' if value else 'false'}"
        row = f'GPULimit::Kind::Boolean, 0, "", {ident}, {{}}'
    elif isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise ContractError(f"{where}.value {value} does not fit int64_t")
        decl = f"int64_t {ident} = {value}"
        row = f'GPULimit::Kind::Integer, {ident}, "", false, {{}}'
    elif isinstance(value, str):
        decl = f"llvm::StringLiteral {ident} = {literal(value, where + '.value')}"
        row = f"GPULimit::Kind::String, 0, {ident}, false, {{}}"
    elif isinstance(value, list):
        decl = f"llvm::StringLiteral {ident}[] = {strings(value, where + '.value')}"
        row = f'GPULimit::Kind::StringList, 0, "", false, {ident}'
    else:
        raise ContractError(
            f"{where}.value must be an integer, a string, a bool or a list of strings, "
            f"got {value!r}"
        )
    lines = [f"inline constexpr {decl};"]
    applies = "{}"
    if "applies_to" in limit:
        applies = f"{ident}AppliesTo"
        lines.append(
            f"inline constexpr llvm::StringLiteral {applies}[] = "
            f"{strings(limit['applies_to'], where + '.applies_to')};"
        )
    lines.append(
        f"inline constexpr llvm::StringLiteral {ident}Reason = "
        f"{literal(limit['reason'], where + '.reason')};"
    )
    return lines, f"    {{{literal(name, where)}, {row}, {applies}, {ident}Reason}},"


def function_lines(index, function):
    where = f"host_functions[{index}]"
    check_keys(function, FUNCTION_KEYS, FUNCTION_KEYS, where)
    name = function["name"]
    literal(name, where + ".name")
    if not re.fullmatch(HOST_PREFIX + r"[a-z0-9_]+", name) or "__" in name[len(HOST_PREFIX) :]:
        raise ContractError(f"{where}.name {name!r} is not a library host function name")
    params = function["params"]
    if not isinstance(params, list) or not params:
        raise ContractError(f"{where}.params must be a non-empty list")
    ident = "kHost" + camel(name[len(HOST_PREFIX) :])
    rows = []
    seen = set()
    for i, param in enumerate(params):
        pwhere = f"{where}.params[{i}]"
        check_keys(param, {"name", "type"}, {"name", "type"}, pwhere)
        if param["name"] in seen:
            raise ContractError(f"{where} names the parameter {param['name']!r} twice")
        seen.add(param["name"])
        rows.append(
            f"    {{{literal(param['name'], pwhere + '.name')}, "
            f"{literal(param['type'], pwhere + '.type')}}},"
        )
    lines = [f"inline constexpr HostFunctionParam {ident}Params[] = {{", *rows, "};"]
    lines.append(
        f"inline constexpr llvm::StringLiteral {ident}Results[] = "
        + strings(function["results"], where + ".results")
        + ";"
    )
    entry = (
        f"    {{{literal(name, where + '.name')}, {literal(function['op'], where + '.op')},\n"
        f"     {literal(function['summary'], where + '.summary')},\n"
        f"     {ident}Params, {ident}Results}},"
    )
    return name, lines, entry


def generate(data, source):
    check_keys(data, TOP_KEYS, {"chip", "limits", "host_functions"}, "the contract")
    out = [
        f"// Generated by gen_gpu_contract.py from {source}: do not edit.",
        "// Included by moe/Conversion/MoEToGPU/GPUContract.h.",
        "",
        "namespace mlir::moe::gpu_contract {",
        "",
        f"inline constexpr llvm::StringLiteral kChip = {literal(data['chip'], 'chip')};",
        "",
    ]
    limits = data["limits"]
    if not isinstance(limits, dict) or not limits:
        raise ContractError("limits must be a non-empty object")
    entries = []
    for name, limit in limits.items():
        lines, entry = limit_lines(name, limit)
        out += lines + [""]
        entries.append(entry)
    out += ["inline constexpr GPULimit kLimits[] = {", *entries, "};", ""]

    functions = data["host_functions"]
    if not isinstance(functions, list) or not functions:
        raise ContractError("host_functions must be a non-empty list")
    names = set()
    entries = []
    for i, function in enumerate(functions):
        name, lines, entry = function_lines(i, function)
        if name in names:
            raise ContractError(f"host_functions lists {name!r} twice")
        names.add(name)
        out += lines + [""]
        entries.append(entry)
    out += ["inline constexpr HostFunctionContract kHostFunctions[] = {", *entries, "};", ""]
    out += ["} // namespace mlir::moe::gpu_contract", ""]
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("contract", help="gpu_contract.json")
    parser.add_argument("-o", "--output", required=True, help="the .h.inc to write")
    args = parser.parse_args()
    try:
        with open(args.contract, encoding="utf-8") as f:
            data = json.load(f, object_pairs_hook=unique_keys)
        text = generate(data, os.path.basename(args.contract))
    except (OSError, ValueError, ContractError) as e:
        print(f"gen_gpu_contract.py: {args.contract}: {e}", file=sys.stderr)
        return 1
    # Written aside and renamed: a build never includes a half-written header.
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    tmp = args.output + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
