#!/usr/bin/env python3
"""Writes ops_harness.mlir: the GPU library plus one C-interface wrapper per host function,
so bench-free op checks (ops_check.py) can call each host function from PyTorch.

    echo 'module {}' | build/bin/moe-opt --moe-gpu-emit-library -o library.mlir
    python3 test/GPU/gen_ops_harness.py library.mlir > ops.mlir

Scalars cross the C interface as i64 (flags, enums) or f32, and are converted inside.
"""

import sys

B2, F2, I2 = "memref<?x?xbf16>", "memref<?x?xf32>", "memref<?x?xi32>"
B3 = "memref<?x?x?xbf16>"
I1, F1, BF1 = "memref<?xi32>", "memref<?xf32>", "memref<?xbf16>"
S0 = "memref<f32>"  # a scalar loss or its gradient

# name: [(arg, type)] in host-function order; "i32"/"i1" scalars become i64 at the boundary.
OPS = {
    "router": [
        ("x", B2),
        ("wr", B2),
        ("bias", F1),
        ("scoring", "i32"),
        ("renormalize", "i1"),
        ("num_groups", "index"),
        ("topk_groups", "index"),
        ("scaling", "f32"),
        ("round_logits", "i1"),
        ("weights", F2),
        ("experts", I2),
        ("logits", F2),
    ],
    "dispatch": [("experts", I2), ("token_ids", I1), ("offsets", I1), ("rows", I2)],
    "expert_ffn": [
        ("x", B2),
        ("token_ids", I1),
        ("offsets", I1),
        ("wgu", B3),
        ("wd", B3),
        ("act", "i32"),
        ("y", B2),
        ("h", B2),
    ],
    "expert_ffn_h": [
        ("x", B2),
        ("token_ids", I1),
        ("offsets", I1),
        ("wgu", B3),
        ("wd", B3),
        ("act", "i32"),
        ("h", B2),
    ],
    "combine": [("y", B2), ("weights", F2), ("rows", I2), ("out", B2)],
    "shared_expert": [("x", B2), ("wgu", B2), ("wd", B2), ("act", "i32"), ("y", B2), ("h", B2)],
    "shared_expert_h": [("x", B2), ("wgu", B2), ("wd", B2), ("act", "i32"), ("h", B2)],
    "expert_combine_grad": [
        ("x", B2),
        ("token_ids", I1),
        ("offsets", I1),
        ("rows", I2),
        ("weights", F2),
        ("wgu", B3),
        ("wd", B3),
        ("h", B2),
        ("dout", B2),
        ("act", "i32"),
        ("dx", B2),
        ("d_weights", F2),
        ("d_wgu", B3),
        ("d_wd", B3),
    ],
    "shared_expert_grad": [
        ("x", B2),
        ("wgu", B2),
        ("wd", B2),
        ("h", B2),
        ("dy", B2),
        ("act", "i32"),
        ("dx", B2),
        ("d_wgu", B2),
        ("d_wd", B2),
    ],
    "router_grad": [
        ("x", B2),
        ("wr", B2),
        ("logits", F2),
        ("experts", I2),
        ("d_weights", F2),
        ("d_logits", F2),
        ("scoring", "i32"),
        ("renormalize", "i1"),
        ("scaling", "f32"),
        ("dx", B2),
        ("d_wr", B2),
    ],
    "add": [("a", BF1), ("b", BF1), ("out", BF1)],
    # moe.update_selection_bias: rule 0 sign, 1 proportional
    "update_selection_bias": [
        ("bias", F1),
        ("experts", I2),
        ("rate", "f32"),
        ("rule", "i32"),
        ("result", F1),
    ],
    # the local expert-parallel ops (moe.ep_pack, ep_unpack, ep_queues, gather_rows,
    # scatter_rows)
    "ep_pack": [
        ("source", B2),
        ("offsets", I1),
        ("ep_size", "index"),
        ("capacity", "index"),
        ("send", B2),
        ("send_counts", I2),
        ("dropped", I1),
    ],
    "ep_pack_gather": [
        ("source", B2),
        ("offsets", I1),
        ("token_ids", I1),
        ("ep_size", "index"),
        ("capacity", "index"),
        ("send", B2),
        ("send_counts", I2),
        ("dropped", I1),
    ],
    "ep_unpack": [
        ("returned", B2),
        ("offsets", I1),
        ("ep_size", "index"),
        ("capacity", "index"),
        ("result", B2),
    ],
    "ep_unpack_reduce": [
        ("returned", B2),
        ("offsets", I1),
        ("rows_of", I2),
        ("ep_size", "index"),
        ("capacity", "index"),
        ("result", B2),
    ],
    "ep_queues": [
        ("received_counts", I2),
        ("capacity", "index"),
        ("token_ids", I1),
        ("offsets", I1),
    ],
    "gather_rows": [("source", B2), ("indices", I1), ("result", B2)],
    "scatter_rows": [("source", B2), ("indices", I1), ("result", B2)],
    # the unfused backward of the combine and the routed experts (the expert-parallel
    # layer's: moe.combine_grad, moe.expert_ffn_grad)
    "combine_grad": [
        ("dout", B2),
        ("weights", F2),
        ("rows", I2),
        ("y", B2),
        ("dy", B2),
        ("d_weights", F2),
    ],
    "expert_ffn_grad": [
        ("x", B2),
        ("token_ids", I1),
        ("offsets", I1),
        ("wgu", B3),
        ("wd", B3),
        ("h", B2),
        ("dy", B2),
        ("act", "i32"),
        ("dx", B2),
        ("d_wgu", B3),
        ("d_wd", B3),
    ],
    # the auxiliary losses (moe.aux_loss, moe.aux_loss_grad)
    "aux_loss": [
        ("logits", F2),
        ("experts", I2),
        ("scoring", "i32"),
        ("load_balance", S0),
        ("z_loss", S0),
    ],
    "aux_loss_grad": [
        ("logits", F2),
        ("experts", I2),
        ("d_load_balance", S0),
        ("d_z_loss", S0),
        ("scoring", "i32"),
        ("d_logits", F2),
    ],
}
# The accumulating host functions: the result added to what its buffer holds.
OPS["combine_acc"] = OPS["combine"]
OPS["expert_combine_grad_acc"] = OPS["expert_combine_grad"]
ROUTER_GRAD_AUX = (
    OPS["router_grad"][:5] + [("d_load_balance", S0), ("d_z_loss", S0)] + OPS["router_grad"][6:]
)
# Host functions of a library built with some configs only: wrapped where it has them.
OPTIONAL_OPS = {
    # not where the router's dX config cannot add to C (a store other than tma_boxes)
    "router_grad_acc": OPS["router_grad"],
    # moe.router with its moe.aux_loss in its kernels (a library older than it has none)
    "router_aux": OPS["router"] + [("load_balance", S0), ("z_loss", S0)],
    # moe.router_grad with its moe.aux_loss_grad's d_logits added in its pass (d_logits'
    # place holds the losses' gradients); `_acc` where router_grad_acc is
    "router_grad_aux": ROUTER_GRAD_AUX,
    "router_grad_aux_acc": ROUTER_GRAD_AUX,
    # moe.dispatch with a capacity factor (a library older than it has none)
    "dispatch_capacity": [
        ("experts", I2),
        ("capacity", "index"),
        ("token_ids", I1),
        ("offsets", I1),
        ("rows", I2),
    ],
}


def with_biases(args, after):
    """`args` with b_gate_up and b_down after input `after` and their gradients at the end
    (the expert-bias backward host functions)."""
    at = [a for a, _ in args].index(after) + 1
    return (
        args[:at]
        + [("b_gate_up", B2), ("b_down", B2)]
        + args[at:]
        + [("d_b_gate_up", B2), ("d_b_down", B2)]
    )


# the backward of experts with biases (a library older than it has none)
OPTIONAL_OPS["expert_combine_grad_bias"] = with_biases(OPS["expert_combine_grad"], "dout")
OPTIONAL_OPS["expert_combine_grad_bias_acc"] = OPTIONAL_OPS["expert_combine_grad_bias"]
OPTIONAL_OPS["expert_ffn_grad_bias"] = with_biases(OPS["expert_ffn_grad"], "dy")

# expert_ffn and expert_ffn_h of a library built with the expert biases (build-ops-harness.sh
# --bias): b_gate_up and b_down after the weights.
BIAS_OPS = {
    name: OPS[name][:5] + [("b_gate_up", B2), ("b_down", B2)] + OPS[name][5:]
    for name in ("expert_ffn", "expert_ffn_h")
}


def arg_types(lib, name):
    """The parameter types of host function `name` in the library's text (None if absent)."""
    head = f"@__moe_gpu_{name}("
    at = lib.find(head)
    if at < 0:
        return None
    params = lib[at + len(head) : lib.index(")", at)]
    return [p.partition(": ")[2] for p in params.split(", %")]


def wrapper(name, args):
    params, conv, call_args, call_types = [], [], [], []
    for a, t in args:
        if t in ("i32", "i1"):
            params.append(f"%{a}_i64: i64")
            if t == "i32":
                conv.append(f"    %{a} = arith.trunci %{a}_i64 : i64 to i32")
            else:
                conv.append(f"    %{a} = arith.cmpi ne, %{a}_i64, %zero : i64")
        else:
            params.append(f"%{a}: {t}")
        call_args.append(f"%{a}")
        call_types.append(t)
    lines = (
        [
            f"  func.func @op_{name}({', '.join(params)}) attributes {{llvm.emit_c_interface}} {{",
            "    %zero = arith.constant 0 : i64",
        ]
        + conv
        + [
            "    %t0 = gpu.wait async",
            f"    %t1 = func.call @__moe_gpu_{name}(%t0, {', '.join(call_args)}) : "
            f"(!gpu.async.token, {', '.join(call_types)}) -> !gpu.async.token",
            "    gpu.wait [%t1]",
            "    return",
            "  }",
        ]
    )
    return "\n".join(lines)


def main():
    lib = open(sys.argv[1]).read().rstrip()
    assert lib.endswith("}")
    body = lib[:-1]
    ops = dict(OPS, **{n: a for n, a in OPTIONAL_OPS.items() if f"@__moe_gpu_{n}(" in lib})
    for name, args in BIAS_OPS.items():
        if arg_types(lib, name) == ["!gpu.async.token"] + [t for _, t in args]:
            ops[name] = args
    wrappers = "\n".join(wrapper(n, a) for n, a in ops.items())
    sys.stdout.write(body + wrappers + "\n}\n")


if __name__ == "__main__":
    main()
