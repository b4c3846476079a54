// A variant that convert-moe-to-gpu builds for an op's own config is the
// generator's kernel and host function under the matching setting: the down
// projection with `schedule = dynamic` is gen_gpu_library.py's
// moe_gemm_rows_mn_bf16 under MOE_GEMM_DYNAMIC=rows (the generator keeps the
// default names), and the variant of @__moe_gpu_expert_ffn that launches it
// is the generator's @__moe_gpu_expert_ffn, tile counter included. The names
// are stripped of the variant's suffixes before the bodies are compared.
// RUN: rm -rf %t && split-file %s %t
// RUN: moe-opt %t/layer.mlir --moe-gpu-select-kernels --convert-moe-to-gpu -o %t/converted.mlir
// RUN: env MOE_GEMM_DYNAMIC=rows %PYTHON %moe_src_root/lib/Conversion/MoEToGPU/gen_gpu_library.py | moe-opt -o %t/generated.mlir
// RUN: sed -n '/gpu.func @moe_gemm_rows_mn_bf16_dyn(/,/^    }$/p' %t/converted.mlir | sed 's/@moe_gemm_rows_mn_bf16_dyn(/@moe_gemm_rows_mn_bf16(/' > %t/built-kernel.mlir
// RUN: sed -n '/gpu.func @moe_gemm_rows_mn_bf16(/,/^    }$/p' %t/generated.mlir > %t/generated-kernel.mlir
// RUN: FileCheck %s --check-prefix=KERNEL < %t/built-kernel.mlir
// RUN: diff %t/generated-kernel.mlir %t/built-kernel.mlir
// RUN: sed -n '/func.func private @__moe_gpu_expert_ffn__moe_gemm_rows_mn_bf16_dyn(/,/^  }$/p' %t/converted.mlir | sed 's/@__moe_gpu_expert_ffn__moe_gemm_rows_mn_bf16_dyn(/@__moe_gpu_expert_ffn(/; s/@moe_kernels::@moe_gemm_rows_mn_bf16_dyn /@moe_kernels::@moe_gemm_rows_mn_bf16 /' > %t/built-host.mlir
// RUN: sed -n '/func.func private @__moe_gpu_expert_ffn(/,/^  }$/p' %t/generated.mlir > %t/generated-host.mlir
// RUN: FileCheck %s --check-prefix=HOST < %t/built-host.mlir
// RUN: diff %t/generated-host.mlir %t/built-host.mlir

// KERNEL: gpu.func @moe_gemm_rows_mn_bf16(
// KERNEL: gpu.return
// HOST: func.func private @__moe_gpu_expert_ffn(
// HOST: gpu.memset
// HOST: gpu.launch_func async {{.*}} @moe_kernels::@moe_gemm_rows_mn_bf16 blocks {{.*}} dynamic_shared_memory_size %c220320_i32
// HOST: gpu.dealloc

//--- layer.mlir
func.func @layer(%x: tensor<37x128xbf16>, %ids: tensor<74xi32>, %offsets: tensor<5xi32>,
                 %wgu: tensor<4x128x256xbf16>, %wd: tensor<4x128x128xbf16>)
    -> (tensor<74x128xbf16>, tensor<74x256xbf16>) {
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd {activation = #moe.activation<swiglu>,
      moe_gpu.kernels = {down = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, schedule = dynamic>}}
      : tensor<37x128xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<4x128x256xbf16>,
        tensor<4x128x128xbf16> -> tensor<74x128xbf16>, tensor<74x256xbf16>
  return %y, %h : tensor<74x128xbf16>, tensor<74x256xbf16>
}
