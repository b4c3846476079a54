// moe-plan-activations with a dynamic token count: the plan is made at the
// bound (moe.max_tokens, from moe.layer's max_tokens), where it is the plan of
// the static layer of T = bound, and the saved bytes are reported as a
// function of T.
// RUN: moe-opt %s --split-input-file --moe-decompose --moe-plan-activations="policy=keep" 2>&1 >/dev/null | FileCheck %s --check-prefix=KEEP
// RUN: moe-opt %s --split-input-file --moe-decompose --moe-plan-activations="policy=keep report=false" | FileCheck %s --check-prefix=ATTRS
// RUN: moe-opt %s --split-input-file --moe-decompose --moe-plan-activations="memory-budget=1MiB report=false" | FileCheck %s --check-prefix=BUDGET
// RUN: moe-opt %s --split-input-file --moe-decompose --moe-plan-activations="policy=recompute report=false" --moe-generate-backward | FileCheck %s --check-prefix=SAVED

// T tokens of d = 64, E = 8, n = 128, k = 2 in bf16: x 128 B a token, the
// router's and dispatch's results 8 + 8 + 32 + 8 + 8 B a token (and 36 B of
// offsets), h 2 * 512 B a token: keep saves 1216 B * T + 36 B.
// KEEP: remark: activation plan 'keep' (policy keep): keep saves 4980772 B (0.00464 GiB), recompute saves 786468 B (0.000732 GiB) and adds 2.684e+08 FLOPs
// KEEP-SAME: planned 4980772 B (0.00464 GiB) on the device at the bound T = 4096 (1216 B * T + 36 B)
// The static layer of T = 4096 saves as much.
// KEEP: remark: activation plan 'keep' (policy keep): keep saves 4980772 B (0.00464 GiB), recompute saves 786468 B (0.000732 GiB) and adds 2.684e+08 FLOPs
// KEEP-SAME: planned 4980772 B (0.00464 GiB) on the device, 0 recomputed
// ATTRS-LABEL: func.func @dynamic(
// ATTRS-SAME: moe.activation_plan = "keep", moe.max_tokens = 4096 : i64, moe.saved_bytes = 4980772 : i64, moe.saved_bytes_fixed = 36 : i64, moe.saved_bytes_per_token = 1216 : i64
// ATTRS-LABEL: func.func @fixed(
// ATTRS-SAME: moe.saved_bytes = 4980772 : i64}

// A budget is met at the bound, so at every T below it: 1 MiB holds the
// recomputed plan (192 B * T + 36 B) but not the kept one.
// BUDGET-LABEL: func.func @dynamic(
// BUDGET-SAME: moe.activation_plan = "recompute"
// BUDGET-SAME: moe.saved_bytes = 786468 : i64, moe.saved_bytes_fixed = 36 : i64, moe.saved_bytes_per_token = 192 : i64
// BUDGET: moe.checkpoint
// BUDGET-LABEL: func.func @fixed(
// BUDGET-SAME: moe.activation_plan = "recompute"

// SAVED-LABEL: func.func @dynamic_forward(
// SAVED-SAME: -> (tensor<?x64xbf16>, tensor<?x8xf32>, tensor<?x64xbf16>, tensor<64x8xbf16>, tensor<8x64x256xbf16>, tensor<8x128x64xbf16>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<?x8xf32>, tensor<?xi32>, tensor<9xi32>, tensor<?x2xi32>)
// SAVED-SAME: moe.max_tokens = 4096 : i64
// SAVED-LABEL: func.func @dynamic_backward(
// SAVED-SAME: moe.max_tokens = 4096 : i64

func.func @dynamic(%x: tensor<?x64xbf16>, %wr: tensor<64x8xbf16>,
                   %wgu: tensor<8x64x256xbf16>, %wd: tensor<8x128x64xbf16>)
    -> (tensor<?x64xbf16>, tensor<?x8xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, max_tokens = 4096,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x64xbf16>, tensor<64x8xbf16>, tensor<8x64x256xbf16>,
        tensor<8x128x64xbf16> -> tensor<?x64xbf16>, tensor<?x8xf32>
  return %out, %logits : tensor<?x64xbf16>, tensor<?x8xf32>
}

// -----

func.func @fixed(%x: tensor<4096x64xbf16>, %wr: tensor<64x8xbf16>,
                 %wgu: tensor<8x64x256xbf16>, %wd: tensor<8x128x64xbf16>)
    -> (tensor<4096x64xbf16>, tensor<4096x8xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<4096x64xbf16>, tensor<64x8xbf16>, tensor<8x64x256xbf16>,
        tensor<8x128x64xbf16> -> tensor<4096x64xbf16>, tensor<4096x8xf32>
  return %out, %logits : tensor<4096x64xbf16>, tensor<4096x8xf32>
}
