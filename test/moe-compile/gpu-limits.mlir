// The manifest's gpu_limits are the limits of the GPU path's contract,
// python/moe_mlir/gpu_contract.json, which the compiler is built from: the same
// values, sizes and reasons, and no limit more or less.
// RUN: rm -rf %t && mkdir -p %t
// RUN: moe-compile %moe_src_root/examples/small.mlir -o %t/small --format=isa --emit=manifest
// RUN: %PYTHON %S/Inputs/check_gpu_limits.py %t/small.json %moe_src_root/python/moe_mlir/gpu_contract.json | FileCheck %s
// RUN: FileCheck %s --check-prefix=MANIFEST < %t/small.json

// CHECK: gpu_limits: 8 limits, as gpu_contract.json gives them

// The existing keys stay, gpu_limits comes last.
// MANIFEST: "name": "small",
// MANIFEST-NEXT: "chip": "sm_90a",
// MANIFEST-NEXT: "num_sms": 132,
// MANIFEST: "entry_points": {
// MANIFEST: "gpu_limits": {
// MANIFEST-NEXT: "tile_multiple": {
// MANIFEST-NEXT: "value": 64,
// MANIFEST-NEXT: "applies_to": [
// MANIFEST-NEXT: "d",
// MANIFEST-NEXT: "n",
// MANIFEST-NEXT: "m"
// MANIFEST-NEXT: ],
// MANIFEST-NEXT: "reason": "the kernels tile d, n and m {{.*}} by 64"
