// ptxas accepts every kernel of the GPU library for sm_90a with no spill, no local
// stack and none of the warnings that serialise wgmma (C7515, C7520, C7508) or say
// that ptxas fenced them (C7519, C7517); check_ptxas.py fails the test on any of them.
// REQUIRES: ptxas
// RUN: rm -f %t.*.ptx
// RUN: echo 'module {}' | moe-opt --moe-gpu-emit-library --moe-lower-to-nvvm-pipeline="format=isa bare-pointers=false" > %t.mlir
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t.mlir %t
// RUN: %ptxas -arch=sm_90a -v %t.moe_kernels.ptx -o %t.cubin 2>&1 | %PYTHON %S/Inputs/check_ptxas.py > %t.txt
// RUN: FileCheck %s < %t.txt
// RUN: FileCheck %s --check-prefix=COUNT < %t.txt

// CHECK-DAG: Compiling entry function 'moe_gemm_up_gather' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_gemm_up_rows' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_gemm_up_gather_h' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_gemm_up_rows_h' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_gemm_rows_mn_bf16' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_gemm_rows_mn_f32' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_gemm_rows_k_bf16' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_gemm_dact_gather' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_gemm_dact_rows' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_gemm_wgrad_gather' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_gemm_wgrad_gather_a' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_gemm_wgrad_rows' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_gemm_rows_k_bf16_acc' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_router_scores' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_router_select' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_dispatch_rank' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_dispatch_scan' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_dispatch_place' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_dispatch_scan_capacity' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_dispatch_place_capacity' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_gather_sum' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_gather_sum_acc' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_scatter_weights' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_single_offsets' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_split_offsets' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_sum_splits_bf16' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_dweights' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_router_grad_logits' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_repack_bf16' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_repack_f32' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_add' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_selection_bias_count' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_selection_bias_update' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_gather_rows' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_invert_rows' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_ep_pack_rows' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_ep_unpack_rows' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_ep_unpack_sum' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_ep_queue_plan' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_ep_queue_fill' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_scale_rows' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_row_dots' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_link_rows' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_token_sum' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_aux_counts' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_aux_partials' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_aux_columns' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_aux_finish' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_aux_loss_grad' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_router_scores_aux' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_router_select_counts' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_router_grad_logits_aux' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_segment_colsum' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_sum_splits_f32' for 'sm_90a'
// CHECK-DAG: Compiling entry function 'moe_bias_dweights' for 'sm_90a'
// COUNT-COUNT-55: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// COUNT-NOT: bytes stack frame
