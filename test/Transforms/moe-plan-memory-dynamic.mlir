// moe-plan-memory with a dynamic token count: every buffer is placed at its
// size at the bound (moe.max_tokens), which is the plan of the static layer
// of T = bound, and the report gives the bytes a token of each buffer that
// follows T and of the peak. Without the bound it is an error.
// RUN: moe-opt %s --split-input-file --moe-decompose --moe-generate-backward --moe-fold-adds --moe-plan-memory=memory-report=- -o /dev/null | FileCheck %s
// RUN: moe-opt %s --split-input-file --moe-decompose --moe-generate-backward --moe-fold-adds --moe-plan-memory | FileCheck %s --check-prefix=ATTRS

// CHECK: moe-plan-memory: forward @dynamic_forward ops [0, 4], backward @dynamic_backward ops [5, 7], alignment 256 B, at the bound T = 4096
// CHECK: buffer 3 moe.dispatch.token_ids: 32768 B returned, live [1, 5], saved, 8 B a token
// CHECK-NEXT: buffer 4 moe.dispatch.offsets: 36 B returned, live [1, 5], saved{{$}}
// CHECK: buffer 6 moe.expert_ffn.y: 1048576 B at offset 0 in @dynamic_forward, live [2, 3], 256 B a token
// CHECK-NEXT: buffer 7 moe.expert_ffn.h: 4194304 B returned, live [2, 5], saved, 1024 B a token
// CHECK: buffer 11 moe.expert_combine_grad.d_w_gate_up: 262144 B returned, live [5, 7]{{$}}
// CHECK: peak: 6029348 B (0.00562 GiB) at op 3, 1472 B a token
// CHECK-NEXT: arena @dynamic_forward: 1048576 B
// CHECK-NEXT: arena @dynamic_backward: 32768 B
// CHECK-NEXT: saved for backward: 4456484 B (0.00415 GiB) in 7 buffers, and 918528 B (0.000855 GiB) of saved arguments
// The static layer of T = 4096: the same plan.
// CHECK: moe-plan-memory: forward @fixed_forward ops [0, 4], backward @fixed_backward ops [5, 7], alignment 256 B{{$}}
// CHECK: buffer 6 moe.expert_ffn.y: 1048576 B at offset 0 in @fixed_forward, live [2, 3]{{$}}
// CHECK: peak: 6029348 B (0.00562 GiB) at op 3{{$}}
// CHECK-NEXT: arena @fixed_forward: 1048576 B
// CHECK-NEXT: arena @fixed_backward: 32768 B
// CHECK-NEXT: saved for backward: 4456484 B (0.00415 GiB) in 7 buffers, and 918528 B (0.000855 GiB) of saved arguments

// ATTRS-LABEL: func.func @dynamic_forward(
// ATTRS-SAME: moe.arena_size = 1048576 : i64
// ATTRS: moe.expert_ffn {{.*}}moe.arena_offsets = array<i64: 0, -1>

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
