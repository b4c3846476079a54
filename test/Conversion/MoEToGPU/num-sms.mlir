// The persistent GEMMs launch at most a CTA an SM: as many as the module's
// moe_gpu.num_sms (moe-gpu-select-kernels sets it from the chip, or num-sms),
// in the library's host functions and in a variant's alike.
// RUN: moe-opt %s --moe-gpu-select-kernels --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=H200
// RUN: moe-opt %s --moe-gpu-select-kernels=num-sms=114 --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=PCIE
// RUN: moe-opt %s --moe-gpu-select-kernels="num-sms=114 configs=down:stages=2" --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=VARIANT

// H200-LABEL: func.func private @__moe_gpu_expert_ffn(
// H200-DAG: %[[SMS:.*]] = arith.constant 132 : index
// H200-DAG: arith.minui %{{.*}}, %[[SMS]] : index
// H200: return
// PCIE-LABEL: func.func private @__moe_gpu_expert_ffn(
// PCIE-DAG: %[[SMS:.*]] = arith.constant 114 : index
// PCIE-DAG: arith.minui %{{.*}}, %[[SMS]] : index
// PCIE-NOT: arith.constant 132 : index
// PCIE: return
// VARIANT-LABEL: func.func private @__moe_gpu_expert_ffn__moe_gemm_rows_mn_bf16_s2(
// VARIANT-DAG: %[[SMS:.*]] = arith.constant 114 : index
// VARIANT-DAG: arith.minui %{{.*}}, %[[SMS]] : index
// VARIANT: return

func.func @layer(%x: tensor<37x128xbf16>, %ids: tensor<74xi32>, %offsets: tensor<5xi32>,
                 %wgu: tensor<4x128x256xbf16>, %wd: tensor<4x128x128xbf16>)
    -> (tensor<74x128xbf16>, tensor<74x256xbf16>) {
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x128xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<4x128x256xbf16>,
        tensor<4x128x128xbf16> -> tensor<74x128xbf16>, tensor<74x256xbf16>
  return %y, %h : tensor<74x128xbf16>, tensor<74x256xbf16>
}
