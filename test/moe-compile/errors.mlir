// moe-compile refuses bad input with a message and a non-zero exit, never a
// crash (`not` fails on a crash), and writes nothing.
// RUN: rm -rf %t && split-file %s %t
// RUN: not moe-compile %t/missing.mlir -o %t/out/missing 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not moe-compile %t/invalid.mlir -o %t/out/invalid 2>&1 | FileCheck %s --check-prefix=INVALID
// RUN: not moe-compile %t/f32.mlir -o %t/out/f32 --format=isa 2>&1 | FileCheck %s --check-prefix=F32
// RUN: not moe-compile %t/nolayer.mlir -o %t/out/nolayer --format=isa 2>&1 | FileCheck %s --check-prefix=NOLAYER
// RUN: not moe-compile %t/two.mlir -o %t/out/two --format=isa 2>&1 | FileCheck %s --check-prefix=TWO
// RUN: not moe-compile %t/f32.mlir -o %t/out/x --emit=obj,pdf 2>&1 | FileCheck %s --check-prefix=EMIT
// RUN: not moe-compile %t/f32.mlir -o %t/out/x --format=offload 2>&1 | FileCheck %s --check-prefix=FORMAT
// RUN: not moe-compile %t/f32.mlir -o %t/out/x --opt-level=7 2>&1 | FileCheck %s --check-prefix=OPT
// RUN: not moe-compile %S/compile.mlir -o %t/out/x --format=isa --policy=frugal 2>&1 | FileCheck %s --check-prefix=POLICY
// RUN: not moe-compile %S/compile.mlir -o %t/out/x --format=isa --memory-budget=4GiX 2>&1 | FileCheck %s --check-prefix=UNIT
// RUN: not moe-compile %S/compile.mlir -o %t/out/x --format=isa --memory-budget=1KiB 2>&1 | FileCheck %s --check-prefix=BUDGET
// RUN: not moe-compile %S/compile.mlir -o %t/out/x --format=isa --policy="keep memory-report=%t/report" 2>&1 | FileCheck %s --check-prefix=INJECT-POLICY
// RUN: not moe-compile %S/compile.mlir -o %t/out/x --format=isa --memory-budget="1GiB policy=keep" 2>&1 | FileCheck %s --check-prefix=INJECT-BUDGET
// RUN: not moe-compile %S/compile.mlir -o %t/out/ --format=isa 2>&1 | FileCheck %s --check-prefix=PREFIX
// RUN: not moe-compile %S/compile.mlir -o %t/out/.x --format=isa 2>&1 | FileCheck %s --check-prefix=HIDDEN
// RUN: not moe-compile %S/compile.mlir -o %t/out/x --format=isa --gpu-library=%t/nolibrary.mlir 2>&1 | FileCheck %s --check-prefix=NOLIB
// RUN: not moe-compile %S/compile.mlir -o %t/out/x --format=isa --gpu-library=%t/invalid.mlir 2>&1 | FileCheck %s --check-prefix=BADLIB
// RUN: not moe-compile %S/compile.mlir -o %t/out/x --format=isa --kernel-config=gate:stages=2 2>&1 | FileCheck %s --check-prefix=ROLECONFIG
// RUN: not moe-compile %S/compile.mlir -o %t/out/x --format=isa --kernel-config=up:unroll=8 2>&1 | FileCheck %s --check-prefix=KEYCONFIG
// RUN: not moe-compile %S/compile.mlir -o %t/out/x --format=isa --num-sms=2000 2>&1 | FileCheck %s --check-prefix=SMS
// RUN: not test -e %t/report
// RUN: not test -e %t/out

// MISSING: moe-compile: error: cannot read '{{.*}}missing.mlir': {{.*}}
// INVALID: invalid.mlir:2:8: error: custom op 'moe.frobnicate' is unknown
// INVALID: moe-compile: error: cannot parse '{{.*}}invalid.mlir'
// F32: f32.mlir:{{[0-9]+}}:{{[0-9]+}}: error: the GPU path runs bf16 data only, got 'tensor<37x64xf32>'
// F32: moe-compile: error: compiling '{{.*}}f32.mlir' failed
// NOLAYER: nolayer.mlir:0:0: error: moe-gpu-build-entry-points: no moe layer function to compile (a func.func of moe ops on tensors)
// NOLAYER-NOT: note
// NOLAYER: moe-compile: error: compiling '{{.*}}nolayer.mlir' failed
// TWO: two.mlir:0:0: error: moe-gpu-build-entry-points: more than one layer (@a, @b); a module compiles one
// TWO: moe-compile: error: compiling '{{.*}}two.mlir' failed
// EMIT: moe-compile: error: unknown --emit kind 'pdf' (expected obj, header, manifest, llvm or mlir)
// FORMAT: moe-compile: error: unknown --format 'offload' (expected bin, isa or fatbin)
// OPT: moe-compile: error: --opt-level must be 0 to 3, got 7
// POLICY: moe-compile: error: unknown --policy 'frugal' (expected auto, keep, recompute or offload)
// UNIT: moe-compile: error: bad --memory-budget '4GiX': unknown unit 'GiX' in memory size '4GiX'
// A value that would carry another pipeline option along is refused.
// INJECT-POLICY: moe-compile: error: unknown --policy 'keep memory-report={{.*}}report'
// INJECT-BUDGET: moe-compile: error: bad --memory-budget '1GiB policy=keep': {{.*}}
// ROLECONFIG: error: kernel config 'gate:stages=2': 'gate' is no GEMM role
// ROLECONFIG: moe-compile: error: compiling '{{.*}}compile.mlir' failed
// KEYCONFIG: compile.mlir:{{[0-9]+}}:{{[0-9]+}}: error: kernel config 'up' gives #moe_gpu.gemm<{{.*}}unroll = 8>: unknown #moe_gpu.gemm parameter 'unroll'
// SMS: moe-compile: error: --num-sms must be 1 to 1024 (0: the chip's), got 2000
// PREFIX: moe-compile: error: -o needs DIR/NAME, a name that does not start with '.', got '{{.*}}out/'
// HIDDEN: moe-compile: error: -o needs DIR/NAME, a name that does not start with '.', got '{{.*}}out/.x'
// NOLIB: moe-compile: error: cannot read the GPU library '{{.*}}nolibrary.mlir': not a file
// BADLIB: invalid.mlir:2:8: error: custom op 'moe.frobnicate' is unknown
// BADLIB: moe-compile: error: compiling '{{.*}}compile.mlir' failed
// BUDGET: compile.mlir:{{[0-9]+}}:{{[0-9]+}}: error: memory-budget 1024 B {{.*}} cannot be met with policy=auto: the smallest budget it can meet is 6532 B
// BUDGET: moe-compile: error: compiling '{{.*}}compile.mlir' failed

//--- invalid.mlir
func.func @f(%x: tensor<4x64xbf16>) -> tensor<4x64xbf16> {
  %0 = moe.frobnicate %x : tensor<4x64xbf16>
  return %0 : tensor<4x64xbf16>
}

//--- f32.mlir
func.func @f32(%x: tensor<37x64xf32>, %wr: tensor<64x4xf32>,
               %wgu: tensor<4x64x64xf32>, %wd: tensor<4x64x64xf32>)
    -> tensor<37x64xf32> {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<gelu>,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x64xf32>, tensor<64x4xf32>, tensor<4x64x64xf32>,
        tensor<4x64x64xf32> -> tensor<37x64xf32>, tensor<37x4xf32>
  return %out : tensor<37x64xf32>
}

//--- nolayer.mlir
func.func @f(%a: i32) -> i32 {
  return %a : i32
}

//--- two.mlir
func.func @a(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>,
             %wgu: tensor<4x64x128xbf16>, %wd: tensor<4x64x64xbf16>)
    -> tensor<37x64xbf16> {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x128xbf16>,
        tensor<4x64x64xbf16> -> tensor<37x64xbf16>, tensor<37x4xf32>
  return %out : tensor<37x64xbf16>
}
func.func @b(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>,
             %wgu: tensor<4x64x128xbf16>, %wd: tensor<4x64x64xbf16>)
    -> tensor<37x64xbf16> {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x128xbf16>,
        tensor<4x64x64xbf16> -> tensor<37x64xbf16>, tensor<37x4xf32>
  return %out : tensor<37x64xbf16>
}
