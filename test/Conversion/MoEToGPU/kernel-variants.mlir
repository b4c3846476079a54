// A variant that convert-moe-to-gpu builds for an op's own config: the down
// projection with `schedule = dynamic` (moe_gemm_rows_mn_bf16_dyn) and the
// variant of @__moe_gpu_expert_ffn that launches it with its tile counter.
// Their texts, stripped of the variant's suffixes, are pinned by digest.
// RUN: rm -rf %t && split-file %s %t
// RUN: moe-opt %t/layer.mlir --moe-gpu-select-kernels --moe-plan-memory --convert-moe-to-gpu -o %t/converted.mlir
// RUN: sed -n '/gpu.func @moe_gemm_rows_mn_bf16_dyn(/,/^    }$/p' %t/converted.mlir | sed 's/@moe_gemm_rows_mn_bf16_dyn(/@moe_gemm_rows_mn_bf16(/' > %t/built-kernel.mlir
// RUN: FileCheck %s --check-prefix=KERNEL < %t/built-kernel.mlir
// RUN: sed -n '/func.func private @__moe_gpu_expert_ffn__moe_gemm_rows_mn_bf16_dyn(/,/^  }$/p' %t/converted.mlir | sed 's/@__moe_gpu_expert_ffn__moe_gemm_rows_mn_bf16_dyn(/@__moe_gpu_expert_ffn(/; s/@moe_kernels::@moe_gemm_rows_mn_bf16_dyn /@moe_kernels::@moe_gemm_rows_mn_bf16 /' > %t/built-host.mlir
// RUN: FileCheck %s --check-prefix=HOST < %t/built-host.mlir
// RUN: %PYTHON -c "import hashlib, sys; print(*(hashlib.sha256(open(f, 'rb').read()).hexdigest() for f in sys.argv[1:]))" %t/built-kernel.mlir %t/built-host.mlir | FileCheck %s --check-prefix=DIGEST

// The producer claims tiles from the launch's counter and hands them to the
// consumers through named barrier 2; the consumers read them by redux.sync.
// KERNEL: gpu.func @moe_gemm_rows_mn_bf16(
// KERNEL: llvm.atomicrmw add
// KERNEL: nvvm.barrier id = %c2_i32 number_of_threads = %c128_i32
// KERNEL: nvvm.redux.sync
// KERNEL: gpu.return
// HOST: func.func private @__moe_gpu_expert_ffn(
// HOST: gpu.memset
// HOST: gpu.launch_func async {{.*}} @moe_kernels::@moe_gemm_rows_mn_bf16 blocks {{.*}} dynamic_shared_memory_size %c220320_i32
// HOST: gpu.dealloc
// Both texts, names aside, pinned: a change of either changes its digest.
// DIGEST: {{^}}8fe811c4e7c58ba6db78c1007ad7d1132d672b7bdda9556bfb4f9982b96e1904 ac9037b637bbd395a8a8c4bb81dd285a9e7902eb4fbb4984c2e1921e2aee3bbb{{$}}

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
