// Input nested deeper than 512 levels of brackets is refused before it is
// parsed: MLIR's recursive-descent parser overflowed its stack (exit 139) on
// 10,000 nested `[` or 5,000 nested regions. 510 levels still parse.

// RUN: %PYTHON -c "print('func.func @f() attributes {a = ' + '[' * 10000 + ']' * 10000 + '} { return }')" > %t.attrs.mlir
// RUN: not moe-opt %t.attrs.mlir 2>&1 | FileCheck %s --check-prefix=ATTRS
// RUN: not moe-opt < %t.attrs.mlir 2>&1 | FileCheck %s --check-prefix=STDIN
// RUN: %PYTHON -c "print('func.func @f() {\n' + 'scf.execute_region {\n' * 5000 + '}\n' * 5000 + 'return\n}')" > %t.regions.mlir
// RUN: not moe-opt %t.regions.mlir 2>&1 | FileCheck %s --check-prefix=REGIONS
// RUN: not moe-compile %t.regions.mlir -o %t.out 2>&1 | FileCheck %s --check-prefix=COMPILE
// RUN: %PYTHON -c "print('func.func @f() attributes {a = ' + '[' * 510 + ']' * 510 + '} { return }')" | moe-opt | FileCheck %s --check-prefix=SHALLOW

// ATTRS: deep-nesting.mlir.tmp.attrs.mlir:1:543: error: the input nests brackets more than 512 levels deep, which the tools refuse (the parser would overflow its stack)
// STDIN: <stdin>:1:543: error: the input nests brackets more than 512 levels deep
// REGIONS: :513:20: error: the input nests brackets more than 512 levels deep
// COMPILE: :513:20: error: the input nests brackets more than 512 levels deep
// COMPILE: moe-compile: error: cannot parse
// SHALLOW: func.func @f() attributes {a = {{\[+}}
