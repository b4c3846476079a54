// moe-compile of an expert-parallel layer (ep_size = 2): moe-training-pipeline
// splits its forward and backward at their collectives, and each stage is an
// entry point whose manifest entry says what its parameters are (ep); the
// plain function's stages are no entry points; the manifest's layer is the
// whole layer's, merged from the forward's stages.
// RUN: rm -rf %t && mkdir -p %t
// RUN: moe-compile %s -o %t/ep --format=isa --emit=header,manifest,llvm
// RUN: FileCheck %s --check-prefix=HEADER < %t/ep.h
// RUN: FileCheck %s --check-prefix=MANIFEST < %t/ep.json
// RUN: FileCheck %s --check-prefix=LLVM < %t/ep.ll

func.func @ep(%x: tensor<?x64xbf16>, %wr: tensor<64x8xbf16>,
              %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>)
    -> (tensor<?x64xbf16>, tensor<?x8xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, max_tokens = 256, ep_size = 2,
       ep_capacity = 512, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x64xbf16>, tensor<64x8xbf16>, tensor<4x64x256xbf16>,
        tensor<4x128x64xbf16> -> tensor<?x64xbf16>, tensor<?x8xf32>
  return %out, %logits : tensor<?x64xbf16>, tensor<?x8xf32>
}

// HEADER: /* forward_stage0: a stage of the expert-parallel forward (stage 0 of 3, docs/distributed.md): it takes arg0, arg1; it gives send0, send_counts0, dropped0,
// HEADER: int ep_forward_stage0(void *stream, int64_t T,
// HEADER: void *arg0 /* input, bf16 [T, 64] */,
// HEADER: void *result0 /* output, bf16 [1024, 64] */,
// HEADER: void *result1 /* output, i32 [2, 4] */,
// HEADER: void *result2 /* output, i32 [2] */,
// HEADER: /* forward_stage1: a stage of the expert-parallel forward (stage 1 of 3, docs/distributed.md): it takes received0, received_counts0, arg2, arg3; it gives send1,
// HEADER: int ep_forward_stage1(void *stream, int64_t T,
// HEADER: void *arg2 /* input, bf16 [4, 64, 256] */,
// HEADER: int ep_forward_stage2(
// HEADER: int ep_backward_stage0(
// HEADER: int ep_backward_stage1(
// HEADER: int ep_backward_stage2(
// HEADER-NOT: int ep_stage
// HEADER-NOT: int ep_forward(

// MANIFEST: "layer": {
// MANIFEST: "n": 128,
// MANIFEST: "E": 8,
// MANIFEST: "activation": "swiglu",
// MANIFEST: "inputs": {
// MANIFEST-NEXT: "x": "arg0",
// MANIFEST-NEXT: "w_router": "arg1",
// MANIFEST-NEXT: "w_gate_up": "arg2",
// MANIFEST-NEXT: "w_down": "arg3"
// MANIFEST: "forward_stage0": {
// MANIFEST: "symbol": "ep_forward_stage0",
// MANIFEST: "ep": {
// MANIFEST-NEXT: "capacity": 512,
// MANIFEST-NEXT: "collectives": [
// MANIFEST-NEXT: "dispatch",
// MANIFEST-NEXT: "combine"
// MANIFEST: "num_saved": 14,
// MANIFEST: "overflows": [
// MANIFEST-NEXT: "error",
// MANIFEST-NEXT: "none"
// MANIFEST: "size": 2,
// MANIFEST-NEXT: "stage": 0,
// MANIFEST-NEXT: "stage_of": "ep_forward",
// MANIFEST-NEXT: "stages": 3
// MANIFEST: "forward_stage1": {
// MANIFEST: "forward_stage2": {
// MANIFEST: "backward_stage0": {
// MANIFEST: "gradient_args": [
// MANIFEST: "backward_stage2": {

// The stages of @ep itself are not compiled beside @ep_forward's.
// LLVM-NOT: define {{.*}} @ep_stage0(
// LLVM: define i32 @ep_forward_stage0(
// LLVM-NOT: define {{.*}} @ep_stage0(
