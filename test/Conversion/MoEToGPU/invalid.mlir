// What convert-moe-to-gpu cannot run on the GPU yet: an error at the op,
// and the pass fails.
// RUN: moe-opt %s --split-input-file --convert-moe-to-gpu --verify-diagnostics

func.func @f32_data(%x: tensor<37x64xf32>, %wr: tensor<64x4xf32>)
    -> (tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>) {
  // expected-error @+1 {{the GPU path runs bf16 data only, got 'tensor<37x64xf32>'}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x64xf32>, tensor<64x4xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>
  return %w, %e, %l : tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>
}

// -----

// The auxiliary losses count the selections in a shared-memory table of
// max_experts entries.
func.func @aux_loss(%l: tensor<37x2048xf32>, %e: tensor<37x2xi32>) -> (tensor<f32>, tensor<f32>) {
  // expected-error @+1 {{the GPU path runs at most 1024 experts, got 2048}}
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<softmax>}
      : tensor<37x2048xf32>, tensor<37x2xi32> -> tensor<f32>, tensor<f32>
  return %lb, %z : tensor<f32>, tensor<f32>
}

// -----

func.func @aux_loss_grad(%l: tensor<?x4xf32>, %e: tensor<?x2xi32>, %dlb: tensor<f32>,
                         %dz: tensor<f32>) -> tensor<?x4xf32> {
  // expected-error @+1 {{the GPU path needs static shapes (or a dynamic token count with its bound, moe.layer's max_tokens), got 'tensor<?x4xf32>'}}
  %dl = moe.aux_loss_grad %l, %e, %dlb, %dz {scoring = #moe.scoring<softmax>}
      : tensor<?x4xf32>, tensor<?x2xi32>, tensor<f32>, tensor<f32> -> tensor<?x4xf32>
  return %dl : tensor<?x4xf32>
}

// -----

func.func @combine_grad(%dout: tensor<37x48xbf16>, %w: tensor<37x2xf32>, %rows: tensor<37x2xi32>,
                        %y: tensor<74x48xbf16>) -> (tensor<74x48xbf16>, tensor<37x2xf32>) {
  // expected-error @+1 {{the GPU kernels need d to be a multiple of 64, got 48}}
  %dy, %dw = moe.combine_grad %dout, %w, %rows, %y
      : tensor<37x48xbf16>, tensor<37x2xf32>, tensor<37x2xi32>, tensor<74x48xbf16>
      -> tensor<74x48xbf16>, tensor<37x2xf32>
  return %dy, %dw : tensor<74x48xbf16>, tensor<37x2xf32>
}

// -----

func.func @expert_ffn_grad(%x: tensor<37x64xf32>, %ids: tensor<74xi32>, %offsets: tensor<5xi32>,
                           %wgu: tensor<4x64x128xf32>, %wd: tensor<4x64x64xf32>,
                           %h: tensor<74x128xf32>, %dy: tensor<74x64xf32>)
    -> (tensor<37x64xf32>, tensor<4x64x128xf32>, tensor<4x64x64xf32>) {
  // expected-error @+1 {{the GPU path runs bf16 data only, got 'tensor<37x64xf32>'}}
  %dx, %dwgu, %dwd = moe.expert_ffn_grad %x, %ids, %offsets, %wgu, %wd, %h, %dy
      {activation = #moe.activation<swiglu>}
      : tensor<37x64xf32>, tensor<74xi32>, tensor<5xi32>, tensor<4x64x128xf32>,
        tensor<4x64x64xf32>, tensor<74x128xf32>, tensor<74x64xf32>
      -> tensor<37x64xf32>, tensor<4x64x128xf32>, tensor<4x64x64xf32>
  return %dx, %dwgu, %dwd : tensor<37x64xf32>, tensor<4x64x128xf32>, tensor<4x64x64xf32>
}

// -----

// Offload and prefetch only between a training forward and its backward
// (what moe-offload makes): not within one function.
func.func @offload(%h: tensor<74x128xbf16>) -> tensor<74x128xbf16> {
  // expected-error @+1 {{the GPU path offloads a tensor only into a saved result of a training forward (moe-offload), returned and used nowhere else}}
  %host = moe.offload %h : tensor<74x128xbf16> -> !moe.host_tensor<74x128xbf16>
  // expected-error @+1 {{the GPU path prefetches only a saved argument of a training backward (moe-offload)}}
  %back = moe.prefetch %host : !moe.host_tensor<74x128xbf16> -> tensor<74x128xbf16>
  return %back : tensor<74x128xbf16>
}

// -----

// A saved result that is offloaded, but read on the host again.
func.func @twice_forward(%h: tensor<74x128xbf16>)
    -> (tensor<74x128xbf16>, !moe.host_tensor<74x128xbf16>, !moe.host_tensor<74x128xbf16>)
    attributes {moe.num_saved = 2 : i64} {
  // expected-error @+1 {{the GPU path offloads a tensor only into a saved result of a training forward (moe-offload), returned and used nowhere else}}
  %host = moe.offload %h : tensor<74x128xbf16> -> !moe.host_tensor<74x128xbf16>
  return %h, %host, %host : tensor<74x128xbf16>, !moe.host_tensor<74x128xbf16>, !moe.host_tensor<74x128xbf16>
}

// -----

// A prefetch of an argument that is not a saved tensor.
func.func @g_backward(%host: !moe.host_tensor<74x128xbf16>) -> tensor<74x128xbf16>
    attributes {moe.gradient_args = array<i64: 0>} {
  // expected-error @+1 {{the GPU path prefetches only a saved argument of a training backward (moe-offload)}}
  %h = moe.prefetch %host : !moe.host_tensor<74x128xbf16> -> tensor<74x128xbf16>
  return %h : tensor<74x128xbf16>
}

// -----

// A host tensor that is not a saved tensor of a training pair.
// expected-error @+1 {{only the saved tensors of a training forward and backward pair can be host tensors, got '!moe.host_tensor<74x128xbf16>'}}
func.func @plain(%host: !moe.host_tensor<74x128xbf16>, %x: tensor<4xbf16>) -> tensor<4xbf16> {
  %y = arith.addf %x, %x : tensor<4xbf16>
  return %y : tensor<4xbf16>
}

// -----

func.func @layer(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>,
                 %wgu: tensor<4x64x128xbf16>, %wd: tensor<4x64x64xbf16>)
    -> tensor<37x64xbf16> {
  // expected-error @+1 {{moe.layer must be decomposed (moe-decompose) before convert-moe-to-gpu}}
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x128xbf16>,
        tensor<4x64x64xbf16> -> tensor<37x64xbf16>, tensor<37x4xf32>
  return %out : tensor<37x64xbf16>
}

// -----

func.func @other_op(%a: tensor<4x64xbf16>, %b: tensor<4x64xbf16>) -> tensor<4x64xbf16> {
  // expected-error @+1 {{'arith.mulf' on tensors is not supported on the GPU path}}
  %0 = arith.mulf %a, %b : tensor<4x64xbf16>
  return %0 : tensor<4x64xbf16>
}

// -----

func.func @add_f32(%a: tensor<4x64xf32>, %b: tensor<4x64xf32>) -> tensor<4x64xf32> {
  // expected-error @+1 {{the GPU path runs bf16 data only, got 'tensor<4x64xf32>'}}
  %0 = arith.addf %a, %b : tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}

// -----

func.func @d_not_tiled(%x: tensor<37x48xbf16>, %wr: tensor<48x4xbf16>)
    -> (tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>) {
  // expected-error @+1 {{the GPU kernels need d to be a multiple of 64, got 48}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xbf16>, tensor<48x4xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>
  return %w, %e, %l : tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>
}

// -----

func.func @n_not_tiled(%x: tensor<37x64xbf16>, %ids: tensor<74xi32>, %offsets: tensor<5xi32>,
                       %wgu: tensor<4x64x80xbf16>, %wd: tensor<4x40x64xbf16>)
    -> (tensor<74x64xbf16>, tensor<74x80xbf16>) {
  // expected-error @+1 {{the GPU kernels need n to be a multiple of 64, got 40}}
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<4x64x80xbf16>,
        tensor<4x40x64xbf16> -> tensor<74x64xbf16>, tensor<74x80xbf16>
  return %y, %h : tensor<74x64xbf16>, tensor<74x80xbf16>
}

// -----

func.func @m_not_tiled(%x: tensor<37x64xbf16>, %wgu: tensor<64x192xbf16>, %wd: tensor<96x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<37x192xbf16>) {
  // expected-error @+1 {{the GPU kernels need m to be a multiple of 64, got 96}}
  %y, %h = moe.shared_expert %x, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x64xbf16>, tensor<64x192xbf16>, tensor<96x64xbf16>
      -> tensor<37x64xbf16>, tensor<37x192xbf16>
  return %y, %h : tensor<37x64xbf16>, tensor<37x192xbf16>
}

// -----

func.func @dynamic(%e: tensor<?x2xi32>) -> (tensor<?xi32>, tensor<5xi32>, tensor<?x2xi32>) {
  // expected-error @+1 {{the GPU path needs static shapes (or a dynamic token count with its bound, moe.layer's max_tokens), got 'tensor<?x2xi32>'}}
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 4 : i64}
      : tensor<?x2xi32> -> tensor<?xi32>, tensor<5xi32>, tensor<?x2xi32>
  return %ids, %offsets, %rows : tensor<?xi32>, tensor<5xi32>, tensor<?x2xi32>
}

// -----

func.func @too_many_experts(%e: tensor<8x2xi32>) -> (tensor<16xi32>, tensor<1026xi32>, tensor<8x2xi32>) {
  // expected-error @+1 {{the GPU path runs at most 1024 experts, got 1025}}
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 1025 : i64}
      : tensor<8x2xi32> -> tensor<16xi32>, tensor<1026xi32>, tensor<8x2xi32>
  return %ids, %offsets, %rows : tensor<16xi32>, tensor<1026xi32>, tensor<8x2xi32>
}

// -----

func.func @router_too_many_experts(%x: tensor<4x64xbf16>, %wr: tensor<64x1088xbf16>)
    -> (tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x1088xf32>) {
  // expected-error @+1 {{the GPU path runs at most 1024 experts, got 1088}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<4x64xbf16>, tensor<64x1088xbf16> -> tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x1088xf32>
  return %w, %e, %l : tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x1088xf32>
}

// -----

func.func @router_too_many_groups(%x: tensor<4x64xbf16>, %wr: tensor<64x128xbf16>)
    -> (tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x128xf32>) {
  // expected-error @+1 {{the GPU path routes among at most 64 expert groups, got 128}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = sigmoid, top_k = 2, num_groups = 128, topk_groups = 2>}
      : tensor<4x64xbf16>, tensor<64x128xbf16> -> tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x128xf32>
  return %w, %e, %l : tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x128xf32>
}

// -----

// expected-error @+1 {{the GPU path needs functions on statically shaped tensors (or a dynamic token count with its bound, moe.max_tokens), got 'i32'}}
func.func @scalar_argument(%a: tensor<4x64xbf16>, %n: i32) -> tensor<4x64xbf16> {
  %0 = arith.addf %a, %a : tensor<4x64xbf16>
  return %0 : tensor<4x64xbf16>
}

// -----

func.func @wrong_library_type(%a: tensor<4x64xbf16>) -> tensor<4x64xbf16> {
  %0 = arith.addf %a, %a : tensor<4x64xbf16>
  return %0 : tensor<4x64xbf16>
}
// expected-error @+1 {{@__moe_gpu_add exists, but the GPU path calls it as a function of type '(!gpu.async.token, memref<?xbf16>, memref<?xbf16>, memref<?xbf16>) -> !gpu.async.token'}}
func.func private @__moe_gpu_add(%a: memref<?xbf16>)

// -----

// No tokens: the kernels need every tensor non-empty (a zero-size layer
// crashed the conversion).
func.func @no_tokens(%x: tensor<0x64xbf16>, %wr: tensor<64x4xbf16>)
    -> (tensor<0x2xf32>, tensor<0x2xi32>, tensor<0x4xf32>) {
  // expected-error @+1 {{the GPU path needs non-empty tensors, got 'tensor<0x64xbf16>'}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<0x64xbf16>, tensor<64x4xbf16> -> tensor<0x2xf32>, tensor<0x2xi32>, tensor<0x4xf32>
  return %w, %e, %l : tensor<0x2xf32>, tensor<0x2xi32>, tensor<0x4xf32>
}

// -----

// n past the kernels' bound (with n = 2^42 the workspace size wrapped).
func.func @n_too_wide(%x: tensor<37x64xbf16>, %ids: tensor<74xi32>, %offsets: tensor<5xi32>,
                      %wgu: tensor<4x64x262144xbf16>, %wd: tensor<4x131072x64xbf16>)
    -> (tensor<74x64xbf16>, tensor<74x262144xbf16>) {
  // expected-error @+1 {{the GPU kernels take n up to 65536, got 131072}}
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<4x64x262144xbf16>,
        tensor<4x131072x64xbf16> -> tensor<74x64xbf16>, tensor<74x262144xbf16>
  return %y, %h : tensor<74x64xbf16>, tensor<74x262144xbf16>
}

// -----

func.func @d_too_wide(%x: tensor<37x131072xbf16>, %wr: tensor<131072x4xbf16>)
    -> (tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>) {
  // expected-error @+1 {{the GPU kernels take d up to 65536, got 131072}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x131072xbf16>, tensor<131072x4xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>
  return %w, %e, %l : tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>
}

// -----

// 2^62 tokens: the tensors' bytes do not fit in 63 bits (the element count
// itself wrapped before).
// expected-error @+1 {{the GPU path takes tensors of at most 2^63 - 1 bytes, got 'tensor<4611686018427387904x64xbf16>'}}
func.func @bytes_wrap(%x: tensor<4611686018427387904x64xbf16>, %wr: tensor<64x4xbf16>)
    -> tensor<4611686018427387904x4xf32> {
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<4611686018427387904x64xbf16>, tensor<64x4xbf16>
      -> tensor<4611686018427387904x2xf32>, tensor<4611686018427387904x2xi32>,
         tensor<4611686018427387904x4xf32>
  return %l : tensor<4611686018427387904x4xf32>
}

// -----

// A collective over several ranks runs as the stages moe-ep-stages splits
// the function into; only of one rank is it its local half.
func.func @ep_dispatch_collective(%x: tensor<32x64xbf16>, %offs: tensor<9xi32>)
    -> (tensor<64x64xbf16>, tensor<2x4xi32>, tensor<2xi32>) {
  // expected-error @+1 {{'moe.ep_dispatch' op is a collective over 2 ranks: split the function with moe-ep-stages before lowering it to the GPU}}
  %r, %c, %d = moe.ep_dispatch %x, %offs {capacity = 32 : i64, ep_size = 2 : i64}
      : tensor<32x64xbf16>, tensor<9xi32> -> tensor<64x64xbf16>, tensor<2x4xi32>, tensor<2xi32>
  return %r, %c, %d : tensor<64x64xbf16>, tensor<2x4xi32>, tensor<2xi32>
}

// -----

func.func @ep_combine_collective(%rows: tensor<64x64xbf16>, %offs: tensor<9xi32>,
                                 %rows_of: tensor<16x2xi32>) -> tensor<16x64xbf16> {
  // expected-error @+1 {{'moe.ep_combine' op is a collective over 4 ranks: split the function with moe-ep-stages before lowering it to the GPU}}
  %y = moe.ep_combine %rows, %offs reduce(%rows_of : tensor<16x2xi32>)
      {capacity = 16 : i64, ep_size = 4 : i64}
      : tensor<64x64xbf16>, tensor<9xi32> -> tensor<16x64xbf16>
  return %y : tensor<16x64xbf16>
}

// -----

func.func @ep_pack_f32(%x: tensor<64x64xf32>, %offs: tensor<9xi32>)
    -> (tensor<48x64xf32>, tensor<2x4xi32>, tensor<2xi32>) {
  // expected-error @+1 {{the GPU path runs bf16 data only, got 'tensor<64x64xf32>'}}
  %s, %c, %d = moe.ep_pack %x, %offs {capacity = 24 : i64, ep_size = 2 : i64}
      : tensor<64x64xf32>, tensor<9xi32> -> tensor<48x64xf32>, tensor<2x4xi32>, tensor<2xi32>
  return %s, %c, %d : tensor<48x64xf32>, tensor<2x4xi32>, tensor<2xi32>
}

// -----

func.func @gather_rows_width(%src: tensor<48x40xbf16>, %ids: tensor<48xi32>) -> tensor<48x40xbf16> {
  // expected-error @+1 {{the GPU kernels need d to be a multiple of 64, got 40}}
  %g = moe.gather_rows %src, %ids : tensor<48x40xbf16>, tensor<48xi32> -> tensor<48x40xbf16>
  return %g : tensor<48x40xbf16>
}

// -----

func.func @ep_queues_experts(%counts: tensor<2x1024xi32>) -> (tensor<64xi32>, tensor<1025xi32>) {
  // expected-error @+1 {{the GPU path runs at most 1024 experts, got 2048}}
  %ids, %offs = moe.ep_queues %counts {capacity = 32 : i64}
      : tensor<2x1024xi32> -> tensor<64xi32>, tensor<1025xi32>
  return %ids, %offs : tensor<64xi32>, tensor<1025xi32>
}

// -----

// Without rows_of or a dispatch nothing says how many rows a token the
// unpacked rows are.
func.func @ep_unpack_rows_unknown(%ret: tensor<96x64xbf16>, %offs: tensor<9xi32>)
    -> tensor<?x64xbf16> attributes {moe.max_tokens = 256 : i64} {
  // expected-error @+1 {{the GPU path needs static shapes but for the token count, got 'tensor<?x64xbf16>'}}
  %y = moe.ep_unpack %ret, %offs {capacity = 48 : i64, ep_size = 2 : i64}
      : tensor<96x64xbf16>, tensor<9xi32> -> tensor<?x64xbf16>
  return %y : tensor<?x64xbf16>
}
