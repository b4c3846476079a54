// Combine and its gradient on the CPU with exactly representable numbers,
// in f32 and in bf16 (docs/cpu-path.md section 2, "Combine").
// RUN: moe-opt %s --moe-lower-to-cpu-pipeline | \
// RUN:   mlir-runner -e main -entry-point-result=void \
// RUN:     -shared-libs=%mlir_runner_utils,%mlir_c_runner_utils | FileCheck %s

func.func private @printMemrefF32(tensor<*xf32>)

func.func @combine(%y: tensor<6x2xf32>, %w: tensor<3x2xf32>,
                   %rows: tensor<3x2xi32>) -> tensor<3x2xf32> {
  %out = moe.combine %y, %w, %rows
      : tensor<6x2xf32>, tensor<3x2xf32>, tensor<3x2xi32> -> tensor<3x2xf32>
  return %out : tensor<3x2xf32>
}

func.func @combine_bf16(%y: tensor<6x2xbf16>, %w: tensor<3x2xf32>,
                        %rows: tensor<3x2xi32>) -> tensor<3x2xbf16> {
  %out = moe.combine %y, %w, %rows
      : tensor<6x2xbf16>, tensor<3x2xf32>, tensor<3x2xi32> -> tensor<3x2xbf16>
  return %out : tensor<3x2xbf16>
}

func.func @combine_grad(%dout: tensor<3x2xf32>, %w: tensor<3x2xf32>,
                        %rows: tensor<3x2xi32>, %y: tensor<6x2xf32>)
    -> (tensor<6x2xf32>, tensor<3x2xf32>) {
  %dy, %dw = moe.combine_grad %dout, %w, %rows, %y
      : tensor<3x2xf32>, tensor<3x2xf32>, tensor<3x2xi32>, tensor<6x2xf32>
      -> tensor<6x2xf32>, tensor<3x2xf32>
  return %dy, %dw : tensor<6x2xf32>, tensor<3x2xf32>
}

func.func @main() {
  %y = arith.constant dense<[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0],
                             [7.0, 8.0], [9.0, 10.0], [100.0, 100.0]]>
      : tensor<6x2xf32>
  %w = arith.constant dense<[[0.5, 0.25], [0.75, 0.125], [1.0, 2.0]]>
      : tensor<3x2xf32>
  // Token 2 lost its first slot (-1); row 5 belongs to nobody.
  %rows = arith.constant dense<[[0, 3], [2, 1], [-1, 4]]> : tensor<3x2xi32>

  // out[0] = 0.5 y0 + 0.25 y3, out[1] = 0.75 y2 + 0.125 y1, out[2] = 2 y4
  // CHECK:      [2.25,   3],
  // CHECK-NEXT: [4.125,   5],
  // CHECK-NEXT: [18,   20]]
  %out = call @combine(%y, %w, %rows)
      : (tensor<6x2xf32>, tensor<3x2xf32>, tensor<3x2xi32>) -> tensor<3x2xf32>
  %u0 = tensor.cast %out : tensor<3x2xf32> to tensor<*xf32>
  call @printMemrefF32(%u0) : (tensor<*xf32>) -> ()

  // The same in bf16 (every value is exact in bf16).
  // CHECK:      [2.25,   3],
  // CHECK-NEXT: [4.125,   5],
  // CHECK-NEXT: [18,   20]]
  %yb = arith.truncf %y : tensor<6x2xf32> to tensor<6x2xbf16>
  %outb = call @combine_bf16(%yb, %w, %rows)
      : (tensor<6x2xbf16>, tensor<3x2xf32>, tensor<3x2xi32>) -> tensor<3x2xbf16>
  %outf = arith.extf %outb : tensor<3x2xbf16> to tensor<3x2xf32>
  %u1 = tensor.cast %outf : tensor<3x2xf32> to tensor<*xf32>
  call @printMemrefF32(%u1) : (tensor<*xf32>) -> ()

  // dy[rows[t, j]] = w[t, j] dout[t]; unused row 5 is 0.
  // d_weights[t, j] = <dout[t], y[rows[t, j]]>; 0 for the dropped slot.
  %dout = arith.constant dense<[[1.0, -1.0], [2.0, 0.5], [4.0, 1.0]]>
      : tensor<3x2xf32>
  %dy, %dw = call @combine_grad(%dout, %w, %rows, %y)
      : (tensor<3x2xf32>, tensor<3x2xf32>, tensor<3x2xi32>, tensor<6x2xf32>)
      -> (tensor<6x2xf32>, tensor<3x2xf32>)
  // CHECK:      [0.5,   -0.5],
  // CHECK-NEXT: [0.25,   0.0625],
  // CHECK-NEXT: [1.5,   0.375],
  // CHECK-NEXT: [0.25,   -0.25],
  // CHECK-NEXT: [8,   2],
  // CHECK-NEXT: [0,   0]]
  %u2 = tensor.cast %dy : tensor<6x2xf32> to tensor<*xf32>
  call @printMemrefF32(%u2) : (tensor<*xf32>) -> ()
  // CHECK:      [-1,   -1],
  // CHECK-NEXT: [13,   8],
  // CHECK-NEXT: [0,   46]]
  %u3 = tensor.cast %dw : tensor<3x2xf32> to tensor<*xf32>
  call @printMemrefF32(%u3) : (tensor<*xf32>) -> ()
  return
}
