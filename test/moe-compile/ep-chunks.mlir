// moe-compile of a chunked expert-parallel layer: a step of up to 256 tokens
// runs as chunks of at most 64. The entry points serve one chunk (T = 1 ..
// 64, buffers of a chunk's capacity, 128 rows from one rank to one rank), and
// each stage's manifest entry gives the step's bound for the caller that
// splits the step.
// RUN: rm -rf %t && mkdir -p %t
// RUN: moe-compile %s -o %t/ep --format=isa --emit=header,manifest
// RUN: FileCheck %s --check-prefix=HEADER < %t/ep.h
// RUN: FileCheck %s --check-prefix=MANIFEST < %t/ep.json

func.func @ep(%x: tensor<?x64xbf16>, %wr: tensor<64x8xbf16>,
              %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>)
    -> (tensor<?x64xbf16>, tensor<?x8xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, max_tokens = 256, ep_size = 2,
       ep_capacity = 128, ep_chunk_tokens = 64,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x64xbf16>, tensor<64x8xbf16>, tensor<4x64x256xbf16>,
        tensor<4x128x64xbf16> -> tensor<?x64xbf16>, tensor<?x8xf32>
  return %out, %logits : tensor<?x64xbf16>, tensor<?x8xf32>
}

// HEADER: any T
// HEADER-NEXT: in [1, 64]
// HEADER: /* forward_stage0: a stage of the expert-parallel forward (stage 0 of 3, docs/distributed.md): it takes arg0, arg1; it gives send0, send_counts0, dropped0, {{.*}}. Called once a chunk: a step of up to 256 tokens runs as ceil(256 / 64) chunks of at most 64 tokens, each its own dispatch and combine. */
// HEADER: int ep_forward_stage0(void *stream, int64_t T,
// HEADER: void *result0 /* output, bf16 [256, 64] */,
// HEADER: int ep_backward_stage2(

// MANIFEST: "forward_stage0": {
// MANIFEST: "ep": {
// MANIFEST-NEXT: "capacity": 128,
// MANIFEST: "stages": 3,
// MANIFEST-NEXT: "step_tokens": 256
// MANIFEST: "max_tokens": 64
// MANIFEST: "backward_stage2": {
// MANIFEST: "step_tokens": 256
