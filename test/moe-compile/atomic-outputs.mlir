// moe-compile writes NAME.h, NAME.json and NAME.o together or not at all:
// each goes to a temporary file beside it, renamed when all are written.
// A NAME.o it cannot write used to leave a new header beside an old object.

// A directory where the object goes: nothing is written, no temporary stays.
// RUN: rm -rf %t && mkdir -p %t/out/layer.o
// RUN: not moe-compile %S/compile.mlir -o %t/out/layer --format=isa 2>&1 | FileCheck %s --check-prefix=BLOCKED
// RUN: ls %t/out | count 1
// BLOCKED: moe-compile: error: cannot write '{{.*}}layer.o': it is a directory

// A compile that works replaces the three files; one that fails after
// parsing leaves them as they were.
// RUN: rm -rf %t/out/layer.o
// RUN: moe-compile %S/compile.mlir -o %t/out/layer --format=isa
// RUN: ls %t/out | FileCheck %s --check-prefix=FILES
// RUN: cp %t/out/layer.h %t/before.h
// RUN: not moe-compile %S/compile.mlir -o %t/out/layer --format=isa --memory-budget=1KiB 2>/dev/null
// RUN: cmp %t/out/layer.h %t/before.h
// RUN: ls %t/out | count 3
// FILES: layer.h
// FILES-NEXT: layer.json
// FILES-NEXT: layer.o
