// A kernel in a gpu.module of its own (moe-gpu-split-kernel-modules, as a layer
// carries it) lowers to the PTX it had in the library's one module: every
// entry the same text but for its basic-block labels' numbers, so ptxas makes
// the same code of it.
// RUN: rm -rf %t && mkdir -p %t/whole %t/split
// RUN: echo 'module {}' | moe-opt --moe-gpu-emit-library -o %t/library.mlir
// RUN: moe-opt %t/library.mlir --moe-lower-to-nvvm-pipeline="format=isa bare-pointers=false" -o %t/whole.mlir
// RUN: moe-opt %t/library.mlir --moe-gpu-split-kernel-modules --moe-lower-to-nvvm-pipeline="format=isa bare-pointers=false" -o %t/split.mlir
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t/whole.mlir %t/whole/k
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t/split.mlir %t/split/k
// RUN: ls %t/whole | count 1
// RUN: ls %t/split | count 55
// RUN: %PYTHON %S/Inputs/compare_entries.py '%t/whole/*.ptx' '%t/split/*.ptx' | FileCheck %s

// CHECK: 55 entries compared
