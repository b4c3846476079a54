// convert-moe-to-gpu on the local expert-parallel ops: each becomes a call of
// its host function (ep_size and capacity as index operands), and
// moe.ep_dispatch / moe.ep_combine of one rank the call of their local half.
// The host functions work out each result row's source row, then move the
// rows with moe_gather_rows (or sum them with moe_ep_unpack_sum).
// RUN: moe-opt %s --split-input-file --moe-plan-memory --convert-moe-to-gpu | FileCheck %s

// CHECK-LABEL: func.func @pack(
// CHECK-SAME: %[[X:[a-z0-9]+]]: memref<64x64xbf16>, %[[OFFS:[a-z0-9]+]]: memref<9xi32>, %[[SEND:[a-z0-9]+]]: memref<48x64xbf16>, %[[COUNTS:[a-z0-9]+]]: memref<2x4xi32>, %[[DROPPED:[a-z0-9]+]]: memref<2xi32>)
// CHECK: %[[T0:.*]] = gpu.wait async
// CHECK-DAG: %[[XD:.*]] = memref.cast %[[X]] : memref<64x64xbf16> to memref<?x?xbf16>
// CHECK-DAG: %[[OD:.*]] = memref.cast %[[OFFS]] : memref<9xi32> to memref<?xi32>
// CHECK-DAG: %[[S:.*]] = arith.constant 2 : index
// CHECK-DAG: %[[C:.*]] = arith.constant 24 : index
// CHECK-DAG: %[[SD:.*]] = memref.cast %[[SEND]] : memref<48x64xbf16> to memref<?x?xbf16>
// CHECK-DAG: %[[CD:.*]] = memref.cast %[[COUNTS]] : memref<2x4xi32> to memref<?x?xi32>
// CHECK-DAG: %[[DD:.*]] = memref.cast %[[DROPPED]] : memref<2xi32> to memref<?xi32>
// CHECK: %[[T1:.*]] = call @__moe_gpu_ep_pack(%[[T0]], %[[XD]], %[[OD]], %[[S]], %[[C]], %[[SD]], %[[CD]], %[[DD]]) : (!gpu.async.token, memref<?x?xbf16>, memref<?xi32>, index, index, memref<?x?xbf16>, memref<?x?xi32>, memref<?xi32>) -> !gpu.async.token
// CHECK: gpu.wait [%[[T1]]]
// The library's kernels, then its host function: the row sources of the
// send rows (and the counts and drops), then the gather of the rows.
// CHECK: gpu.func @moe_gather_rows(
// CHECK: gpu.func @moe_ep_pack_rows(
// CHECK-LABEL: func.func private @__moe_gpu_ep_pack(
// CHECK: gpu.alloc async
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@moe_ep_pack_rows
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@moe_gather_rows
// CHECK: gpu.dealloc async
func.func @pack(%x: tensor<64x64xbf16>, %offs: tensor<9xi32>)
    -> (tensor<48x64xbf16>, tensor<2x4xi32>, tensor<2xi32>) {
  %send, %counts, %dropped = moe.ep_pack %x, %offs
      {capacity = 24 : i64, ep_size = 2 : i64, overflow = #moe.ep_overflow<drop>}
      : tensor<64x64xbf16>, tensor<9xi32>
      -> tensor<48x64xbf16>, tensor<2x4xi32>, tensor<2xi32>
  return %send, %counts, %dropped : tensor<48x64xbf16>, tensor<2x4xi32>, tensor<2xi32>
}

// -----

// CHECK-LABEL: func.func @pack_gather(
// CHECK-SAME: %[[X:[a-z0-9]+]]: memref<32x128xbf16>, %[[OFFS:[a-z0-9]+]]: memref<9xi32>, %[[IDS:[a-z0-9]+]]: memref<64xi32>
// CHECK-DAG: %[[XD:.*]] = memref.cast %[[X]] : memref<32x128xbf16> to memref<?x?xbf16>
// CHECK-DAG: %[[OD:.*]] = memref.cast %[[OFFS]] : memref<9xi32> to memref<?xi32>
// CHECK-DAG: %[[ID:.*]] = memref.cast %[[IDS]] : memref<64xi32> to memref<?xi32>
// CHECK-DAG: %[[S:.*]] = arith.constant 4 : index
// CHECK-DAG: %[[C:.*]] = arith.constant 16 : index
// CHECK: call @__moe_gpu_ep_pack_gather(%{{.*}}, %[[XD]], %[[OD]], %[[ID]], %[[S]], %[[C]], %{{.*}}, %{{.*}}, %{{.*}}) : (!gpu.async.token, memref<?x?xbf16>, memref<?xi32>, memref<?xi32>, index, index, memref<?x?xbf16>, memref<?x?xi32>, memref<?xi32>) -> !gpu.async.token
// CHECK-LABEL: func.func private @__moe_gpu_ep_pack_gather(
// CHECK: @moe_kernels::@moe_ep_pack_rows
// CHECK: @moe_kernels::@moe_gather_rows
func.func @pack_gather(%x: tensor<32x128xbf16>, %offs: tensor<9xi32>, %ids: tensor<64xi32>)
    -> (tensor<64x128xbf16>, tensor<4x2xi32>, tensor<4xi32>) {
  %send, %counts, %dropped = moe.ep_pack %x, %offs gather(%ids : tensor<64xi32>)
      {capacity = 16 : i64, ep_size = 4 : i64}
      : tensor<32x128xbf16>, tensor<9xi32>
      -> tensor<64x128xbf16>, tensor<4x2xi32>, tensor<4xi32>
  return %send, %counts, %dropped : tensor<64x128xbf16>, tensor<4x2xi32>, tensor<4xi32>
}

// -----

// A static result has its rows; the reduce sums [T, k] slots into [T, d].
// CHECK-LABEL: func.func @unpack(
// CHECK-SAME: %[[RET:[a-z0-9]+]]: memref<48x64xbf16>, %[[OFFS:[a-z0-9]+]]: memref<9xi32>, %[[ROWS:[a-z0-9]+]]: memref<20x3xi32>, %[[Y:[a-z0-9]+]]: memref<60x64xbf16>, %[[DX:[a-z0-9]+]]: memref<20x64xbf16>)
// CHECK-DAG: %[[RD:.*]] = memref.cast %[[RET]] : memref<48x64xbf16> to memref<?x?xbf16>
// CHECK-DAG: %[[OD:.*]] = memref.cast %[[OFFS]] : memref<9xi32> to memref<?xi32>
// CHECK-DAG: %[[YD:.*]] = memref.cast %[[Y]] : memref<60x64xbf16> to memref<?x?xbf16>
// CHECK: %[[T1:.*]] = call @__moe_gpu_ep_unpack(%{{.*}}, %[[RD]], %[[OD]], %{{.*}}, %{{.*}}, %[[YD]]) : (!gpu.async.token, memref<?x?xbf16>, memref<?xi32>, index, index, memref<?x?xbf16>) -> !gpu.async.token
// CHECK-DAG: %[[WD:.*]] = memref.cast %[[ROWS]] : memref<20x3xi32> to memref<?x?xi32>
// CHECK-DAG: %[[XD:.*]] = memref.cast %[[DX]] : memref<20x64xbf16> to memref<?x?xbf16>
// CHECK: call @__moe_gpu_ep_unpack_reduce(%[[T1]], %{{.*}}, %{{.*}}, %[[WD]], %{{.*}}, %{{.*}}, %[[XD]]) : (!gpu.async.token, memref<?x?xbf16>, memref<?xi32>, memref<?x?xi32>, index, index, memref<?x?xbf16>) -> !gpu.async.token
// Row sources start at -1 (a zero row); the returned rows set theirs.
// CHECK: gpu.func @moe_ep_unpack_rows(
// CHECK: gpu.func @moe_ep_unpack_sum(
// CHECK-LABEL: func.func private @__moe_gpu_ep_unpack_reduce(
// CHECK: %[[NONE:.*]] = arith.constant -1 : i32
// CHECK: %[[SRC:.*]], %{{.*}} = gpu.alloc async
// CHECK: gpu.memset async [%{{.*}}] %[[SRC]], %[[NONE]] : memref<?xi32>, i32
// CHECK: @moe_kernels::@moe_ep_unpack_rows
// CHECK: @moe_kernels::@moe_ep_unpack_sum
// CHECK-LABEL: func.func private @__moe_gpu_ep_unpack(
// CHECK: gpu.memset
// CHECK: @moe_kernels::@moe_ep_unpack_rows
// CHECK: @moe_kernels::@moe_gather_rows
func.func @unpack(%ret: tensor<48x64xbf16>, %offs: tensor<9xi32>, %rows: tensor<20x3xi32>)
    -> (tensor<60x64xbf16>, tensor<20x64xbf16>) {
  %y = moe.ep_unpack %ret, %offs {capacity = 24 : i64, ep_size = 2 : i64}
      : tensor<48x64xbf16>, tensor<9xi32> -> tensor<60x64xbf16>
  %dx = moe.ep_unpack %ret, %offs reduce(%rows : tensor<20x3xi32>)
      {capacity = 24 : i64, ep_size = 2 : i64}
      : tensor<48x64xbf16>, tensor<9xi32> -> tensor<20x64xbf16>
  return %y, %dx : tensor<60x64xbf16>, tensor<20x64xbf16>
}

// -----

// CHECK-LABEL: func.func @queues(
// CHECK-SAME: %[[COUNTS:[a-z0-9]+]]: memref<2x4xi32>, %[[IDS:[a-z0-9]+]]: memref<48xi32>, %[[OFFS:[a-z0-9]+]]: memref<5xi32>)
// CHECK-DAG: %[[CD:.*]] = memref.cast %[[COUNTS]] : memref<2x4xi32> to memref<?x?xi32>
// CHECK-DAG: %[[C:.*]] = arith.constant 24 : index
// CHECK-DAG: %[[ID:.*]] = memref.cast %[[IDS]] : memref<48xi32> to memref<?xi32>
// CHECK-DAG: %[[OD:.*]] = memref.cast %[[OFFS]] : memref<5xi32> to memref<?xi32>
// CHECK: call @__moe_gpu_ep_queues(%{{.*}}, %[[CD]], %[[C]], %[[ID]], %[[OD]]) : (!gpu.async.token, memref<?x?xi32>, index, memref<?xi32>, memref<?xi32>) -> !gpu.async.token
// CHECK: gpu.func @moe_ep_queue_plan(
// CHECK: gpu.func @moe_ep_queue_fill(
// CHECK-LABEL: func.func private @__moe_gpu_ep_queues(
// CHECK: @moe_kernels::@moe_ep_queue_plan blocks in (%{{.*}}, %{{.*}}, %{{.*}}) threads in (%c128, %c1, %c1)
// CHECK: @moe_kernels::@moe_ep_queue_fill
func.func @queues(%counts: tensor<2x4xi32>) -> (tensor<48xi32>, tensor<5xi32>) {
  %ids, %offs = moe.ep_queues %counts {capacity = 24 : i64}
      : tensor<2x4xi32> -> tensor<48xi32>, tensor<5xi32>
  return %ids, %offs : tensor<48xi32>, tensor<5xi32>
}

// -----

// scatter_rows inverts its indices (moe_invert_rows) and gathers by them.
// CHECK-LABEL: func.func @rows(
// CHECK-SAME: %[[SRC:[a-z0-9]+]]: memref<48x64xbf16>, %[[IDS:[a-z0-9]+]]: memref<48xi32>
// CHECK-DAG: %[[SD:.*]] = memref.cast %[[SRC]] : memref<48x64xbf16> to memref<?x?xbf16>
// CHECK-DAG: %[[ID:.*]] = memref.cast %[[IDS]] : memref<48xi32> to memref<?xi32>
// CHECK: %[[T1:.*]] = call @__moe_gpu_gather_rows(%{{.*}}, %[[SD]], %[[ID]], %[[G:.*]]) : (!gpu.async.token, memref<?x?xbf16>, memref<?xi32>, memref<?x?xbf16>) -> !gpu.async.token
// CHECK: call @__moe_gpu_scatter_rows(%[[T1]], %{{.*}}, %{{.*}}, %{{.*}}) : (!gpu.async.token, memref<?x?xbf16>, memref<?xi32>, memref<?x?xbf16>) -> !gpu.async.token
// CHECK: gpu.func @moe_gather_rows(
// CHECK: gpu.func @moe_invert_rows(
// CHECK-LABEL: func.func private @__moe_gpu_scatter_rows(
// CHECK: gpu.memset
// CHECK: @moe_kernels::@moe_invert_rows
// CHECK: @moe_kernels::@moe_gather_rows
// CHECK-LABEL: func.func private @__moe_gpu_gather_rows(
// CHECK-NOT: gpu.memset
// CHECK: @moe_kernels::@moe_gather_rows
// CHECK-NEXT: return
func.func @rows(%src: tensor<48x64xbf16>, %ids: tensor<48xi32>) -> tensor<56x64xbf16> {
  %g = moe.gather_rows %src, %ids : tensor<48x64xbf16>, tensor<48xi32> -> tensor<48x64xbf16>
  %s = moe.scatter_rows %g, %ids : tensor<48x64xbf16>, tensor<48xi32> -> tensor<56x64xbf16>
  return %s : tensor<56x64xbf16>
}

// -----

// Of one rank the collectives are their local halves.
// CHECK-LABEL: func.func @one_rank(
// CHECK: call @__moe_gpu_ep_pack_gather(
// CHECK: call @__moe_gpu_ep_unpack(
// CHECK: call @__moe_gpu_ep_unpack_reduce(
func.func @one_rank(%x: tensor<32x64xbf16>, %offs: tensor<9xi32>, %ids: tensor<64xi32>,
                    %rows: tensor<32x2xi32>)
    -> (tensor<64x64xbf16>, tensor<1x8xi32>, tensor<1xi32>, tensor<64x64xbf16>,
        tensor<32x64xbf16>) {
  %recv, %counts, %dropped = moe.ep_dispatch %x, %offs gather(%ids : tensor<64xi32>)
      {capacity = 64 : i64, ep_size = 1 : i64}
      : tensor<32x64xbf16>, tensor<9xi32> -> tensor<64x64xbf16>, tensor<1x8xi32>, tensor<1xi32>
  %y = moe.ep_combine %recv, %offs {capacity = 64 : i64, ep_size = 1 : i64}
      : tensor<64x64xbf16>, tensor<9xi32> -> tensor<64x64xbf16>
  %dx = moe.ep_combine %recv, %offs reduce(%rows : tensor<32x2xi32>)
      {capacity = 64 : i64, ep_size = 1 : i64}
      : tensor<64x64xbf16>, tensor<9xi32> -> tensor<32x64xbf16>
  return %recv, %counts, %dropped, %y, %dx
      : tensor<64x64xbf16>, tensor<1x8xi32>, tensor<1xi32>, tensor<64x64xbf16>,
        tensor<32x64xbf16>
}

// -----

// A dynamic token count: the dispatch's rows, the one-rank exchange, the
// queues and row moves between, and ep_combine's results, whose rows follow
// T: T * k (its buffer's rows, offsets[E] after the dropless dispatch) and T
// with reduce.
// CHECK-LABEL: func.func @chain(
// CHECK-SAME: %[[E:[a-z0-9]+]]: memref<?x2xi32>, %[[X:[a-z0-9]+]]: memref<?x64xbf16>, %[[Y:[a-z0-9]+]]: memref<?x64xbf16>, %[[DX:[a-z0-9]+]]: memref<?x64xbf16>, %[[DROPPED:[a-z0-9]+]]: memref<1xi32>)
// CHECK-SAME: moe.gpu.max_tokens = 256 : i64
// CHECK-SAME: {dtype = "bf16", name = "result0", role = "output", rows_per_token = 2 : i64, shape = array<i64: -9223372036854775808, 64>}
// CHECK-SAME: {dtype = "bf16", name = "result1", role = "output", rows_per_token = 1 : i64, shape = array<i64: -9223372036854775808, 64>}
// CHECK: %[[DIM:.*]] = memref.dim %[[E]], %c0 : memref<?x2xi32>
// CHECK: %[[T:.*]] = arith.divui %[[DIM]], %c1 : index
// CHECK: %[[ARENA:.*]], %{{.*}} = gpu.alloc async
// The token ids, T * 2 of them, in the arena.
// CHECK: %[[R:.*]] = arith.muli %[[T]], %c2 : index
// CHECK-NEXT: %[[IDS:.*]] = memref.view %[[ARENA]][%{{.*}}][%[[R]]] : memref<?xi8> to memref<?xi32>
// CHECK: call @__moe_gpu_dispatch(
// CHECK-DAG: %[[XD:.*]] = memref.cast %[[X]] : memref<?x64xbf16> to memref<?x?xbf16>
// CHECK-DAG: %[[IDD:.*]] = memref.cast %[[IDS]] : memref<?xi32> to memref<?xi32>
// CHECK: call @__moe_gpu_ep_pack_gather(%{{.*}}, %[[XD]], %{{.*}}, %[[IDD]], %c1{{.*}}, %c96{{.*}}, %{{.*}}, %{{.*}}, %{{.*}})
// CHECK: call @__moe_gpu_ep_queues(
// CHECK: call @__moe_gpu_gather_rows(
// CHECK: call @__moe_gpu_scatter_rows(
// CHECK: %[[YD:.*]] = memref.cast %[[Y]] : memref<?x64xbf16> to memref<?x?xbf16>
// CHECK: call @__moe_gpu_ep_unpack(%{{.*}}, %{{.*}}, %{{.*}}, %c1{{.*}}, %c96{{.*}}, %[[YD]])
// CHECK: %[[XDD:.*]] = memref.cast %[[DX]] : memref<?x64xbf16> to memref<?x?xbf16>
// CHECK: call @__moe_gpu_ep_unpack_reduce(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %c1{{.*}}, %c96{{.*}}, %[[XDD]])
func.func @chain(%e: tensor<?x2xi32>, %x: tensor<?x64xbf16>)
    -> (tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<1xi32>)
    attributes {moe.max_tokens = 256 : i64} {
  %ids, %offs, %rows = moe.dispatch %e {num_experts = 8 : i64}
      : tensor<?x2xi32> -> tensor<?xi32>, tensor<9xi32>, tensor<?x2xi32>
  %recv, %counts, %dropped = moe.ep_dispatch %x, %offs gather(%ids : tensor<?xi32>)
      {capacity = 96 : i64, ep_size = 1 : i64, overflow = #moe.ep_overflow<drop>}
      : tensor<?x64xbf16>, tensor<9xi32>
      -> tensor<96x64xbf16>, tensor<1x8xi32>, tensor<1xi32>
  %qids, %qoffs = moe.ep_queues %counts {capacity = 96 : i64}
      : tensor<1x8xi32> -> tensor<96xi32>, tensor<9xi32>
  %g = moe.gather_rows %recv, %qids : tensor<96x64xbf16>, tensor<96xi32>
      -> tensor<96x64xbf16>
  %s = moe.scatter_rows %g, %qids : tensor<96x64xbf16>, tensor<96xi32>
      -> tensor<96x64xbf16>
  %y = moe.ep_combine %s, %offs {capacity = 96 : i64, ep_size = 1 : i64}
      : tensor<96x64xbf16>, tensor<9xi32> -> tensor<?x64xbf16>
  %dx = moe.ep_combine %s, %offs reduce(%rows : tensor<?x2xi32>)
      {capacity = 96 : i64, ep_size = 1 : i64}
      : tensor<96x64xbf16>, tensor<9xi32> -> tensor<?x64xbf16>
  return %y, %dx, %dropped : tensor<?x64xbf16>, tensor<?x64xbf16>, tensor<1xi32>
}

// -----

// A stage of an expert-parallel layer (moe-ep-stages): offsets and the
// returned rows are arguments, rows_of gives k, so the unpacked rows are
// T * k of the call.
// CHECK-LABEL: func.func @stage(
// CHECK-SAME: %[[Y:[a-z0-9]+]]: memref<?x64xbf16>, %{{.*}}: memref<?x64xbf16>)
// CHECK-SAME: {dtype = "bf16", name = "result0", role = "output", rows_per_token = 2 : i64
// CHECK: %[[YD:.*]] = memref.cast %[[Y]] : memref<?x64xbf16> to memref<?x?xbf16>
// CHECK: call @__moe_gpu_ep_unpack(%{{.*}}, %{{.*}}, %{{.*}}, %c2{{.*}}, %c48{{.*}}, %[[YD]])
// CHECK: call @__moe_gpu_ep_unpack_reduce(
func.func @stage(%ret: tensor<96x64xbf16>, %offs: tensor<9xi32>, %rows: tensor<?x2xi32>)
    -> (tensor<?x64xbf16>, tensor<?x64xbf16>)
    attributes {moe.max_tokens = 256 : i64} {
  %y = moe.ep_unpack %ret, %offs {capacity = 48 : i64, ep_size = 2 : i64}
      : tensor<96x64xbf16>, tensor<9xi32> -> tensor<?x64xbf16>
  %dx = moe.ep_unpack %ret, %offs reduce(%rows : tensor<?x2xi32>)
      {capacity = 48 : i64, ep_size = 2 : i64}
      : tensor<96x64xbf16>, tensor<9xi32> -> tensor<?x64xbf16>
  return %y, %dx : tensor<?x64xbf16>, tensor<?x64xbf16>
}
