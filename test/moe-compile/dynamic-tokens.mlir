// moe-compile of a layer of dynamic token count (max_tokens = 4096): the entry
// points take T after the stream, refuse one outside [1, 4096] before
// anything else, and pass the host function descriptors whose leading sizes
// are T (or T * k) rows; the workspace function takes T; the header and the
// manifest say the bound and which sizes follow T.
// RUN: rm -rf %t && mkdir -p %t
// RUN: moe-compile %s -o %t/dyn --format=isa --emit=llvm,header,manifest
// RUN: FileCheck %s --check-prefix=HEADER < %t/dyn.h
// RUN: FileCheck %s --check-prefix=MANIFEST < %t/dyn.json
// RUN: FileCheck %s --check-prefix=LLVM < %t/dyn.ll
// H recomputed in backward (its token ids a saved argument read by the
// recomputation alone), and H offloaded to pinned host memory:
// RUN: moe-compile %s -o %t/rec --format=isa --emit=header --policy=recompute 2>/dev/null
// RUN: FileCheck %s --check-prefix=RECOMPUTE < %t/rec.h
// RUN: moe-compile %s -o %t/off --format=isa --emit=header --policy=offload 2>/dev/null
// RUN: FileCheck %s --check-prefix=OFFLOAD < %t/off.h

func.func @dyn(%x: tensor<?x64xbf16>, %wr: tensor<64x8xbf16>,
               %wgu: tensor<8x64x256xbf16>, %wd: tensor<8x128x64xbf16>)
    -> (tensor<?x64xbf16>, tensor<?x8xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, max_tokens = 4096,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x64xbf16>, tensor<64x8xbf16>, tensor<8x64x256xbf16>,
        tensor<8x128x64xbf16> -> tensor<?x64xbf16>, tensor<?x8xf32>
  return %out, %logits : tensor<?x64xbf16>, tensor<?x8xf32>
}

// HEADER: T = 1 .. 4096 tokens, d = 64, n = 128, E = 8 experts, top k = 2
// HEADER: The token count T is dynamic: each call takes it after the stream, any T
// HEADER-NEXT: in [1, 4096] (the bound it was compiled for; another is refused
// HEADER: #include <stdint.h>
// HEADER: int dyn_forward(void *stream, int64_t T,
// HEADER-NEXT: void *arg0 /* input, bf16 [T, 64] */,
// HEADER: void *moe_dispatch_token_ids /* saved, i32 [T * 2] */,
// HEADER: void *moe_expert_ffn_h /* saved, bf16 [T * 2, 256] */);
// HEADER: int64_t dyn_forward_workspace_bytes(int64_t T);
// HEADER: int dyn_backward(void *stream, int64_t T,
// HEADER: int64_t dyn_backward_workspace_bytes(int64_t T);

// MANIFEST: "T": 4096,
// MANIFEST: "max_tokens": 4096,
// MANIFEST: "forward": {
// MANIFEST: "workspace_bytes": 1048576,
// MANIFEST-NEXT: "max_tokens": 4096,
// MANIFEST: "name": "arg0",
// MANIFEST: "shape": [
// MANIFEST-NEXT: -1,
// MANIFEST-NEXT: 64
// MANIFEST-NEXT: ],
// MANIFEST-NEXT: "rows_per_token": 1
// MANIFEST: "name": "moe.dispatch.token_ids",
// MANIFEST: "shape": [
// MANIFEST-NEXT: -1
// MANIFEST-NEXT: ],
// MANIFEST-NEXT: "rows_per_token": 2

// LLVM: c"dyn_forward: the token count T is outside [1, 4096], the bound it was compiled for\00"
// LLVM-LABEL: define i32 @dyn_forward(ptr %0, i64 %1,
// LLVM-NEXT: call void @moeClearLastError()
// LLVM-NEXT: icmp slt i64 %1, 1
// LLVM-NEXT: icmp sgt i64 %1, 4096
// LLVM: call void @__moe_host_dyn_forward(
// LLVM-LABEL: define i64 @dyn_forward_workspace_bytes(i64 %0)
// LLVM: select i1 %{{.*}}, i64 -1, i64 1048576

// RECOMPUTE: int dyn_backward(void *stream, int64_t T,
// RECOMPUTE: void *moe_dispatch_token_ids /* saved, i32 [T * 2] */,
// RECOMPUTE-NOT: moe_expert_ffn_h
// OFFLOAD: void *moe_expert_ffn_h /* saved, bf16 [T * 2, 256] in pinned host memory */);
