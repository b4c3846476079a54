// Expert FFN and auxiliary losses on the CPU: exact pre-activations, zero
// unused rows, exactly representable losses and gradients (docs/cpu-path.md
// section 2).
// RUN: moe-opt %s --moe-lower-to-cpu-pipeline | \
// RUN:   mlir-runner -e main -entry-point-result=void \
// RUN:     -shared-libs=%mlir_runner_utils,%mlir_c_runner_utils | FileCheck %s

func.func private @printMemrefI32(tensor<*xi32>)
func.func private @printMemrefF32(tensor<*xf32>)

func.func @experts(%x: tensor<3x2xf32>, %experts: tensor<3x1xi32>,
                   %wgu: tensor<2x2x2xf32>, %wd: tensor<2x2x2xf32>)
    -> (tensor<3xi32>, tensor<3x2xf32>, tensor<3x2xf32>) {
  // capacity = ceil(0.5 * 3 * 1 / 2) = 1: token 2 is dropped by expert 0.
  %ids, %offs, %rows = moe.dispatch %experts
      {num_experts = 2 : i64, capacity_factor = 0.5}
      : tensor<3x1xi32> -> tensor<3xi32>, tensor<3xi32>, tensor<3x1xi32>
  %y, %h = moe.expert_ffn %x, %ids, %offs, %wgu, %wd
      {activation = #moe.activation<silu>}
      : tensor<3x2xf32>, tensor<3xi32>, tensor<3xi32>, tensor<2x2x2xf32>,
        tensor<2x2x2xf32> -> tensor<3x2xf32>, tensor<3x2xf32>
  return %ids, %y, %h : tensor<3xi32>, tensor<3x2xf32>, tensor<3x2xf32>
}

func.func @aux(%l: tensor<4x4xf32>, %e: tensor<4x2xi32>)
    -> (tensor<f32>, tensor<f32>, tensor<f32>) {
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<softmax>}
      : tensor<4x4xf32>, tensor<4x2xi32> -> tensor<f32>, tensor<f32>
  %lb2, %z2 = moe.aux_loss %l, %e {scoring = #moe.scoring<sigmoid>}
      : tensor<4x4xf32>, tensor<4x2xi32> -> tensor<f32>, tensor<f32>
  return %lb, %z, %lb2 : tensor<f32>, tensor<f32>, tensor<f32>
}

func.func @aux_grad(%l: tensor<4x4xf32>, %e: tensor<4x2xi32>,
                    %dlb: tensor<f32>, %dz: tensor<f32>) -> tensor<4x4xf32> {
  %dl = moe.aux_loss_grad %l, %e, %dlb, %dz {scoring = #moe.scoring<softmax>}
      : tensor<4x4xf32>, tensor<4x2xi32>, tensor<f32>, tensor<f32>
      -> tensor<4x4xf32>
  return %dl : tensor<4x4xf32>
}

// No tokens: both losses are 0.
func.func @aux_empty(%l: tensor<0x4xf32>, %e: tensor<0x2xi32>)
    -> (tensor<f32>, tensor<f32>) {
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<softmax>}
      : tensor<0x4xf32>, tensor<0x2xi32> -> tensor<f32>, tensor<f32>
  return %lb, %z : tensor<f32>, tensor<f32>
}

func.func @main() {
  %x = arith.constant dense<[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]>
      : tensor<3x2xf32>
  %experts = arith.constant dense<[[0], [1], [0]]> : tensor<3x1xi32>
  %wgu = arith.constant dense<[[[1.0, 0.0], [0.0, 1.0]],
                               [[2.0, 0.0], [0.0, -1.0]]]> : tensor<2x2x2xf32>
  %wd = arith.constant dense<[[[1.0, 0.0], [0.0, 1.0]],
                              [[1.0, 1.0], [2.0, 0.0]]]> : tensor<2x2x2xf32>
  %ids, %y, %h = call @experts(%x, %experts, %wgu, %wd)
      : (tensor<3x2xf32>, tensor<3x1xi32>, tensor<2x2x2xf32>,
         tensor<2x2x2xf32>) -> (tensor<3xi32>, tensor<3x2xf32>, tensor<3x2xf32>)
  // CHECK: [0,  1,  0]
  %u0 = tensor.cast %ids : tensor<3xi32> to tensor<*xi32>
  call @printMemrefI32(%u0) : (tensor<*xi32>) -> ()
  // h = x[token] . wgu[e]; row 2 is unused and 0.
  // CHECK:      [1,   0],
  // CHECK-NEXT: [0,   -1],
  // CHECK-NEXT: [0,   0]]
  %u1 = tensor.cast %h : tensor<3x2xf32> to tensor<*xf32>
  call @printMemrefF32(%u1) : (tensor<*xf32>) -> ()
  // round(1000 y): silu(1) = 0.731059, 2 silu(-1) = -0.537883.
  // CHECK:      [731,   0],
  // CHECK-NEXT: [-538,   0],
  // CHECK-NEXT: [0,   0]]
  %thousand = arith.constant dense<1000.0> : tensor<3x2xf32>
  %ys = arith.mulf %y, %thousand : tensor<3x2xf32>
  %yr = math.round %ys : tensor<3x2xf32>
  %yi = arith.fptosi %yr : tensor<3x2xf32> to tensor<3x2xi32>
  %u2 = tensor.cast %yi : tensor<3x2xi32> to tensor<*xi32>
  call @printMemrefI32(%u2) : (tensor<*xi32>) -> ()

  // Equal logits: p = 1/4 for softmax and for normalised sigmoid. 7 of the
  // 8 selections are valid (-1 is not): load_balance = sum_e f_e = 7/8.
  %l = arith.constant dense<0.0> : tensor<4x4xf32>
  %e = arith.constant dense<[[0, 1], [2, 3], [0, -1], [1, 1]]>
      : tensor<4x2xi32>
  %lb, %z, %lb2 = call @aux(%l, %e)
      : (tensor<4x4xf32>, tensor<4x2xi32>) -> (tensor<f32>, tensor<f32>, tensor<f32>)
  // CHECK: [0.875]
  // CHECK: [0.875]
  %u3 = tensor.cast %lb : tensor<f32> to tensor<*xf32>
  call @printMemrefF32(%u3) : (tensor<*xf32>) -> ()
  %u4 = tensor.cast %lb2 : tensor<f32> to tensor<*xf32>
  call @printMemrefF32(%u4) : (tensor<*xf32>) -> ()
  // z_loss = log(4)^2 = 1.921812
  // CHECK: [1922]
  %thousand_s = arith.constant 1000.0 : f32
  %zt = tensor.extract %z[] : tensor<f32>
  %zs = arith.mulf %zt, %thousand_s : f32
  %zr = math.round %zs : f32
  %zi = arith.fptosi %zr : f32 to i32
  %zv = tensor.from_elements %zi : tensor<1xi32>
  %u5 = tensor.cast %zv : tensor<1xi32> to tensor<*xi32>
  call @printMemrefI32(%u5) : (tensor<*xi32>) -> ()

  // g_e = f_e = (2, 3, 1, 1) / 8, <g, p> = 7/32, dlogits = (g - 7/32) / 4;
  // the z-loss term is 0 with d_z = 0.
  // CHECK:      [0.0078125,   0.0390625,   -0.0234375,   -0.0234375],
  // CHECK-NEXT: [0.0078125,   0.0390625,   -0.0234375,   -0.0234375],
  // CHECK-NEXT: [0.0078125,   0.0390625,   -0.0234375,   -0.0234375],
  // CHECK-NEXT: [0.0078125,   0.0390625,   -0.0234375,   -0.0234375]]
  %one = arith.constant dense<1.0> : tensor<f32>
  %zero = arith.constant dense<0.0> : tensor<f32>
  %dl = call @aux_grad(%l, %e, %one, %zero)
      : (tensor<4x4xf32>, tensor<4x2xi32>, tensor<f32>, tensor<f32>)
      -> tensor<4x4xf32>
  %u6 = tensor.cast %dl : tensor<4x4xf32> to tensor<*xf32>
  call @printMemrefF32(%u6) : (tensor<*xf32>) -> ()

  // CHECK: [0,  0]
  %l0 = arith.constant dense<0.0> : tensor<0x4xf32>
  %e0 = arith.constant dense<0> : tensor<0x2xi32>
  %lb0, %z0 = call @aux_empty(%l0, %e0)
      : (tensor<0x4xf32>, tensor<0x2xi32>) -> (tensor<f32>, tensor<f32>)
  %lb0s = tensor.extract %lb0[] : tensor<f32>
  %z0s = tensor.extract %z0[] : tensor<f32>
  %both = tensor.from_elements %lb0s, %z0s : tensor<2xf32>
  %u7 = tensor.cast %both : tensor<2xf32> to tensor<*xf32>
  call @printMemrefF32(%u7) : (tensor<*xf32>) -> ()
  return
}
