// moe-reduce checks what upstream mlir-reduce leaves to the user.
// A test that never finds the input interesting: said, not a silent exit 1.
// RUN: not moe-reduce %S/reduce.mlir --reduction-tree='traversal-mode=0 test=/bin/sh test-arg=%S/Inputs/never-interesting.sh' 2>&1 | FileCheck %s --check-prefix=NEVER
// NEVER: moe-reduce: error: the test does not find the input interesting, so there is nothing to reduce: /bin/sh {{.*}}never-interesting.sh {{.*}}reduce.mlir exited with 0; it must exit 1 for an interesting input within --test-timeout=60 s

// A test that hangs on some candidates: each run gets --test-timeout
// seconds, and a run out of time is not interesting. The reduction ends,
// keeping @router, with no process left behind.
// RUN: moe-reduce %S/reduce.mlir --test-timeout=1 --reduction-tree='traversal-mode=0 test=/bin/sh test-arg=%S/Inputs/hangs-without-router.sh' | FileCheck %s --check-prefix=HANG
// HANG: func.func @router
// HANG-NOT: func.func @scale

// The time limit must be whole seconds.
// RUN: not moe-reduce %S/reduce.mlir --test-timeout=soon 2>&1 | FileCheck %s --check-prefix=BAD
// BAD: moe-reduce: error: --test-timeout takes whole seconds (0: no limit), got 'soon'
