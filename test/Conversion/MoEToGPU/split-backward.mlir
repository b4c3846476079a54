// convert-moe-to-gpu on the unfused backward of the combine and the routed
// experts (the expert-parallel layer's, whose combine runs on another rank
// than its experts): moe.combine_grad and moe.expert_ffn_grad become calls of
// their host functions. combine_grad finds the slot that owns each row of dy
// (moe_invert_rows), scales dout into it (moe_scale_rows) and takes each
// slot's dot a warp (moe_row_dots); expert_ffn_grad runs the fused
// function's GEMMs with dy read by rows (dact_rows, no routing weight, no dS)
// and x gathered by the token ids (wgrad_gather_a), then sums each token's
// rows of dX_e in row order from per-token lists (moe_link_rows,
// moe_token_sum).
// RUN: moe-opt %s --split-input-file --moe-plan-memory --convert-moe-to-gpu | FileCheck %s

// CHECK-LABEL: func.func @combine_grad(
// CHECK-SAME: %[[DOUT:[a-z0-9]+]]: memref<37x64xbf16>, %[[W:[a-z0-9]+]]: memref<37x2xf32>, %[[ROWS:[a-z0-9]+]]: memref<37x2xi32>, %[[Y:[a-z0-9]+]]: memref<74x64xbf16>, %[[DY:[a-z0-9]+]]: memref<74x64xbf16>, %[[DW:[a-z0-9]+]]: memref<37x2xf32>)
// CHECK: %[[T0:.*]] = gpu.wait async
// CHECK-DAG: %[[DOUTD:.*]] = memref.cast %[[DOUT]] : memref<37x64xbf16> to memref<?x?xbf16>
// CHECK-DAG: %[[WD:.*]] = memref.cast %[[W]] : memref<37x2xf32> to memref<?x?xf32>
// CHECK-DAG: %[[ROWSD:.*]] = memref.cast %[[ROWS]] : memref<37x2xi32> to memref<?x?xi32>
// CHECK-DAG: %[[YD:.*]] = memref.cast %[[Y]] : memref<74x64xbf16> to memref<?x?xbf16>
// CHECK-DAG: %[[DYD:.*]] = memref.cast %[[DY]] : memref<74x64xbf16> to memref<?x?xbf16>
// CHECK-DAG: %[[DWD:.*]] = memref.cast %[[DW]] : memref<37x2xf32> to memref<?x?xf32>
// CHECK: %[[T1:.*]] = call @__moe_gpu_combine_grad(%[[T0]], %[[DOUTD]], %[[WD]], %[[ROWSD]], %[[YD]], %[[DYD]], %[[DWD]]) : (!gpu.async.token, memref<?x?xbf16>, memref<?x?xf32>, memref<?x?xi32>, memref<?x?xbf16>, memref<?x?xbf16>, memref<?x?xf32>) -> !gpu.async.token
// CHECK: gpu.wait [%[[T1]]]
// CHECK: gpu.func @moe_invert_rows(
// CHECK: gpu.func @moe_scale_rows(
// CHECK: gpu.func @moe_row_dots(
// Row owners start at -1 (a zero row of dy).
// CHECK-LABEL: func.func private @__moe_gpu_combine_grad(
// CHECK: %[[NONE:.*]] = arith.constant -1 : i32
// CHECK: %[[SRC:.*]], %{{.*}} = gpu.alloc async
// CHECK: gpu.memset async [%{{.*}}] %[[SRC]], %[[NONE]] : memref<?xi32>, i32
// CHECK: @moe_kernels::@moe_invert_rows
// CHECK: @moe_kernels::@moe_scale_rows
// CHECK: @moe_kernels::@moe_row_dots
// CHECK: gpu.dealloc async [%{{.*}}] %[[SRC]]
func.func @combine_grad(%dout: tensor<37x64xbf16>, %w: tensor<37x2xf32>, %rows: tensor<37x2xi32>,
                        %y: tensor<74x64xbf16>) -> (tensor<74x64xbf16>, tensor<37x2xf32>) {
  %dy, %dw = moe.combine_grad %dout, %w, %rows, %y
      : tensor<37x64xbf16>, tensor<37x2xf32>, tensor<37x2xi32>, tensor<74x64xbf16>
      -> tensor<74x64xbf16>, tensor<37x2xf32>
  return %dy, %dw : tensor<74x64xbf16>, tensor<37x2xf32>
}

// -----

// CHECK-LABEL: func.func @expert_ffn_grad(
// CHECK-SAME: %[[X:[a-z0-9]+]]: memref<37x64xbf16>, %[[IDS:[a-z0-9]+]]: memref<74xi32>, %[[OFFS:[a-z0-9]+]]: memref<5xi32>, %[[WGU:[a-z0-9]+]]: memref<4x64x128xbf16>, %[[WD:[a-z0-9]+]]: memref<4x64x64xbf16>, %[[H:[a-z0-9]+]]: memref<74x128xbf16>, %[[DY:[a-z0-9]+]]: memref<74x64xbf16>, %[[DX:[a-z0-9]+]]: memref<37x64xbf16>, %[[DWGU:[a-z0-9]+]]: memref<4x64x128xbf16>, %[[DWD:[a-z0-9]+]]: memref<4x64x64xbf16>)
// CHECK-DAG: %[[XD:.*]] = memref.cast %[[X]] : memref<37x64xbf16> to memref<?x?xbf16>
// CHECK-DAG: %[[IDSD:.*]] = memref.cast %[[IDS]] : memref<74xi32> to memref<?xi32>
// CHECK-DAG: %[[OFFSD:.*]] = memref.cast %[[OFFS]] : memref<5xi32> to memref<?xi32>
// CHECK-DAG: %[[HD:.*]] = memref.cast %[[H]] : memref<74x128xbf16> to memref<?x?xbf16>
// CHECK-DAG: %[[DYD:.*]] = memref.cast %[[DY]] : memref<74x64xbf16> to memref<?x?xbf16>
// CHECK-DAG: %[[ACT:.*]] = arith.constant 0 : i32
// CHECK-DAG: %[[DXD:.*]] = memref.cast %[[DX]] : memref<37x64xbf16> to memref<?x?xbf16>
// CHECK: call @__moe_gpu_expert_ffn_grad(%{{.*}}, %[[XD]], %[[IDSD]], %[[OFFSD]], %{{.*}}, %{{.*}}, %[[HD]], %[[DYD]], %[[ACT]], %[[DXD]], %{{.*}}, %{{.*}}) : (!gpu.async.token, memref<?x?xbf16>, memref<?xi32>, memref<?xi32>, memref<?x?x?xbf16>, memref<?x?x?xbf16>, memref<?x?xbf16>, memref<?x?xbf16>, i32, memref<?x?xbf16>, memref<?x?x?xbf16>, memref<?x?x?xbf16>) -> !gpu.async.token
// CHECK-LABEL: func.func private @__moe_gpu_expert_ffn_grad(
// CHECK-SAME: %[[HX:[a-z0-9]+]]: memref<?x?xbf16>, %[[HIDS:[a-z0-9]+]]: memref<?xi32>, %[[HOFFS:[a-z0-9]+]]: memref<?xi32>
// CHECK: @moe_kernels::@moe_gemm_dact_rows
// CHECK: @moe_kernels::@moe_gemm_rows_k_bf16
// CHECK: @moe_kernels::@moe_gemm_wgrad_rows
// CHECK: @moe_kernels::@moe_gemm_wgrad_gather_a {{.*}} args(%[[HOFFS]] : memref<?xi32>, %{{.*}} : index, %[[HIDS]] : memref<?xi32>,
// CHECK: %[[HEAD:.*]], %{{.*}} = gpu.alloc async
// CHECK: gpu.memset async [%{{.*}}] %[[HEAD]], %c-1_i32
// CHECK: %[[COUNT:.*]], %{{.*}} = gpu.alloc async
// CHECK: gpu.memset async [%{{.*}}] %[[COUNT]], %c0_i32
// CHECK: @moe_kernels::@moe_link_rows {{.*}} args(%[[HIDS]] : memref<?xi32>, %[[HOFFS]] : memref<?xi32>,
// CHECK: @moe_kernels::@moe_token_sum
func.func @expert_ffn_grad(%x: tensor<37x64xbf16>, %ids: tensor<74xi32>, %offsets: tensor<5xi32>,
                           %wgu: tensor<4x64x128xbf16>, %wd: tensor<4x64x64xbf16>,
                           %h: tensor<74x128xbf16>, %dy: tensor<74x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<4x64x128xbf16>, tensor<4x64x64xbf16>) {
  %dx, %dwgu, %dwd = moe.expert_ffn_grad %x, %ids, %offsets, %wgu, %wd, %h, %dy
      {activation = #moe.activation<swiglu>}
      : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<4x64x128xbf16>,
        tensor<4x64x64xbf16>, tensor<74x128xbf16>, tensor<74x64xbf16>
      -> tensor<37x64xbf16>, tensor<4x64x128xbf16>, tensor<4x64x64xbf16>
  return %dx, %dwgu, %dwd : tensor<37x64xbf16>, tensor<4x64x128xbf16>, tensor<4x64x64xbf16>
}

// -----

// A dynamic token count: dy, T * 2 rows of the arena, goes from the
// combine's gradient to the experts'.
// CHECK-LABEL: func.func @chain(
// CHECK-SAME: %[[DOUT:[a-z0-9]+]]: memref<?x64xbf16>, %{{[a-z0-9]+}}: memref<?x2xf32>, %{{[a-z0-9]+}}: memref<?x2xi32>, %{{[a-z0-9]+}}: memref<?x64xbf16>, %[[X:[a-z0-9]+]]: memref<?x64xbf16>
// CHECK-SAME: moe.gpu.max_tokens = 256 : i64
// CHECK: %[[DIM:.*]] = memref.dim %[[DOUT]], %c0 : memref<?x64xbf16>
// CHECK: %[[T:.*]] = arith.divui %[[DIM]], %c1 : index
// CHECK: %[[ARENA:.*]], %{{.*}} = gpu.alloc async
// CHECK: %[[R:.*]] = arith.muli %[[T]], %c2 : index
// CHECK-NEXT: %[[DY:.*]] = memref.view %[[ARENA]][%{{.*}}][%[[R]]] : memref<?xi8> to memref<?x64xbf16>
// CHECK: %[[DYD:.*]] = memref.cast %[[DY]] : memref<?x64xbf16> to memref<?x?xbf16>
// CHECK: %[[T1:.*]] = call @__moe_gpu_combine_grad(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[DYD]], %{{.*}})
// CHECK: %[[XD:.*]] = memref.cast %[[X]] : memref<?x64xbf16> to memref<?x?xbf16>
// CHECK: %[[DYQ:.*]] = memref.cast %[[DY]] : memref<?x64xbf16> to memref<?x?xbf16>
// CHECK: call @__moe_gpu_expert_ffn_grad(%[[T1]], %[[XD]], %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[DYQ]],
// CHECK: gpu.dealloc async [%{{.*}}] %[[ARENA]]
func.func @chain(%dout: tensor<?x64xbf16>, %w: tensor<?x2xf32>, %rows: tensor<?x2xi32>,
                 %y: tensor<?x64xbf16>, %x: tensor<?x64xbf16>, %ids: tensor<?xi32>,
                 %offsets: tensor<5xi32>, %wgu: tensor<4x64x128xbf16>,
                 %wd: tensor<4x64x64xbf16>, %h: tensor<?x128xbf16>)
    -> (tensor<?x64xbf16>, tensor<?x2xf32>, tensor<4x64x128xbf16>, tensor<4x64x64xbf16>)
    attributes {moe.max_tokens = 256 : i64} {
  %dy, %dw = moe.combine_grad %dout, %w, %rows, %y
      : tensor<?x64xbf16>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<?x64xbf16>
      -> tensor<?x64xbf16>, tensor<?x2xf32>
  %dx, %dwgu, %dwd = moe.expert_ffn_grad %x, %ids, %offsets, %wgu, %wd, %h, %dy
      {activation = #moe.activation<swiglu>}
      : tensor<?x64xbf16>, tensor<?xi32>, tensor<5xi32>, tensor<4x64x128xbf16>,
        tensor<4x64x64xbf16>, tensor<?x128xbf16>, tensor<?x64xbf16>
      -> tensor<?x64xbf16>, tensor<4x64x128xbf16>, tensor<4x64x64xbf16>
  return %dx, %dw, %dwgu, %dwd : tensor<?x64xbf16>, tensor<?x2xf32>, tensor<4x64x128xbf16>, tensor<4x64x64xbf16>
}
