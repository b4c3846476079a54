// moe-compile keeps the kernels' binary in --kernel-cache (default
// $MOE_MLIR_CACHE/kernels): a second compile, of the same layer or of
// another one, finds it, and writes the same object as a compile without
// the cache. --kernel-cache=none compiles the kernels every time.
// RUN: rm -rf %t && mkdir -p %t
// RUN: moe-compile %S/compile.mlir -o %t/first --format=isa --kernel-cache=%t/kc
// RUN: ls %t/kc | count 1
// RUN: moe-compile %S/compile.mlir -o %t/second --format=isa --kernel-cache=%t/kc
// RUN: moe-compile %S/compile.mlir -o %t/uncached --format=isa --kernel-cache=none
// RUN: cmp %t/first.o %t/second.o
// RUN: cmp %t/first.o %t/uncached.o
// Another layer shares the library's kernels, and so the entry.
// RUN: moe-compile %S/shared-expert.mlir -o %t/other --format=isa --kernel-cache=%t/kc
// RUN: ls %t/kc | count 1
// The default folder comes from MOE_MLIR_CACHE.
// RUN: env MOE_MLIR_CACHE=%t/root moe-compile %S/compile.mlir -o %t/default --format=isa
// RUN: ls %t/root/kernels | count 1
// RUN: cmp %t/first.o %t/default.o
