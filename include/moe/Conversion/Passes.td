//===- Passes.td - moe-mlir conversion passes ---------------*- tablegen -*-===//

#ifndef MOE_CONVERSION_PASSES_TD
#define MOE_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

def ConvertMoEToLinalg : Pass<"convert-moe-to-linalg", "::mlir::ModuleOp"> {
  let summary = "lower every moe op to linalg, tensor, scf, arith and math (CPU path)";
  let description = [{
    The reference lowering that CI runs on the CPU (docs/cpu-path.md). Every
    moe op becomes a `func.call` of a kernel written once in MLIR (linalg,
    tensor, scf, arith, math) in `lib/Conversion/MoEToLinalg/MoECPULibrary.mlir`,
    which is embedded in the compiler; the kernels the module calls, and the
    helpers they call, are copied into it as private functions (a function
    of the same name that the module already has is kept).

    Kernels take dynamically shaped f32 tensors (i32 for indices) and scalar
    configuration, so each call is wrapped in `arith.extf`/`arith.truncf` for
    bf16/f16 data and `tensor.cast` to and from the op's static shapes.
    Before the conversion, `moe.layer` is decomposed as by `moe-decompose`
    and `moe.checkpoint` regions are inlined. `moe.offload` and
    `moe.prefetch` become tensor copies, and `!moe.host_tensor` becomes the
    tensor type it mirrors everywhere, function signatures included. A
    missing router bias is a zero tensor; the dispatch capacity is
    `ceil(capacity_factor * T * k / E)` (f64, at run time when T is dynamic),
    or `T * k` without a capacity factor.

    ```mlir
    %out = moe.combine %y, %w, %rows
        : tensor<8x4xbf16>, tensor<4x2xf32>, tensor<4x2xi32> -> tensor<4x4xbf16>
    ```

    becomes

    ```mlir
    %0 = arith.extf %y : tensor<8x4xbf16> to tensor<8x4xf32>
    %1 = tensor.cast %0 : tensor<8x4xf32> to tensor<?x?xf32>
    %2 = tensor.cast %w : tensor<4x2xf32> to tensor<?x?xf32>
    %3 = tensor.cast %rows : tensor<4x2xi32> to tensor<?x?xi32>
    %4 = call @__moe_cpu_combine(%1, %2, %3)
        : (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xi32>) -> tensor<?x?xf32>
    %5 = tensor.cast %4 : tensor<?x?xf32> to tensor<4x4xf32>
    %out = arith.truncf %5 : tensor<4x4xf32> to tensor<4x4xbf16>
    ...
    func.func private @__moe_cpu_combine(%y: tensor<?x?xf32>,
        %weights: tensor<?x?xf32>, %rows: tensor<?x?xi32>) -> tensor<?x?xf32>
    ```

    A layer whose number of experts is not static cannot be decomposed and
    gets an error.
  }];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::func::FuncDialect",
    "::mlir::linalg::LinalgDialect",
    "::mlir::math::MathDialect",
    "::mlir::scf::SCFDialect",
    "::mlir::tensor::TensorDialect"
  ];
}

def ConvertMoEToGPU : Pass<"convert-moe-to-gpu", "::mlir::ModuleOp"> {
  let summary = "lower the training forward and backward to calls of GPU host functions on device memrefs";
  let description = [{
    The sm_90a path (docs/gpu-path.md section 1). Runs after
    `moe-decompose` and `moe-generate-backward`. Every function on tensors
    becomes a host function on device memrefs (identity layout, the same
    static shapes): tensor arguments become memref arguments and results
    become trailing out-parameters. Every moe op becomes a `func.call` of a
    `__moe_gpu_*` host function of the GPU library the kernel builder makes
    (`moe-gpu-emit-library` prints it), or of the file `library` names
    (memrefs cast to dynamic sizes; routing and activation config as
    i32/i1/index/f32 scalars), and
    `arith.addf` on bf16 tensors becomes `__moe_gpu_add` on flattened
    memrefs. One `!gpu.async.token` is threaded through the calls, from a
    `gpu.wait async` at entry to a `gpu.wait` before the return.

    Values that are returned are written straight into their
    out-parameter; a value returned twice, or a returned argument, is
    copied with `gpu.memcpy async`. The other values share one arena, a
    `gpu.alloc async` a call, at static offsets placed from their
    lifetimes (as `moe-plan-memory` places a step), 256-byte aligned. A
    missing router bias or logits gradient is a size-0 view of another f32
    operand of the call. `moe.checkpoint` regions are inlined; a
    `moe.offload` of a saved tensor (from `moe-offload`) copies it to the
    forward's pinned host out-parameter, and `moe.prefetch` copies it back,
    both on the runtime's copy stream with events.

    `@f_forward` (`moe.num_saved`) drops the saved values that are its own
    arguments: backward takes the input again, and `moe.saved` on the
    backward argument names the forward parameter. `@f` itself is dropped
    when `@f_forward` exists (it computes the same results without the
    saved set); a function without a training pair is converted as it is.

    Each converted function records, for moe-compile's C entry points and
    manifest, `moe.gpu.entry` (forward, backward or plain),
    `moe.gpu.layer_name` (`f`), `moe.gpu.params` (name, role, dtype and
    shape of every parameter), `moe.gpu.workspace_bytes` (the peak of the
    bytes its allocations, the arena among them, hold at once; temporaries
    of the library functions are not counted) and, on the forward, `moe.gpu.layer` (the
    layer configuration and which argument is which input).

    The host functions the module calls, the functions they call and the
    library's `gpu.module`s are copied into the module (existing symbols
    are kept), and the module gets `gpu.container_module`.

    ```mlir
    %out = moe.combine %y, %w, %rows
        : tensor<128x64xbf16>, tensor<64x2xf32>, tensor<64x2xi32> -> tensor<64x64xbf16>
    return %out : tensor<64x64xbf16>
    ```

    becomes (inside a function that takes `%out_buf` as its out-parameter)

    ```mlir
    %t0 = gpu.wait async
    %0 = memref.cast %y : memref<128x64xbf16> to memref<?x?xbf16>
    %1 = memref.cast %w : memref<64x2xf32> to memref<?x?xf32>
    %2 = memref.cast %rows : memref<64x2xi32> to memref<?x?xi32>
    %3 = memref.cast %out_buf : memref<64x64xbf16> to memref<?x?xbf16>
    %t1 = call @__moe_gpu_combine(%t0, %0, %1, %2, %3) : (...) -> !gpu.async.token
    gpu.wait [%t1]
    return
    ```

    Where the library (the builder's or given by `library`) has the accumulating
    host functions, as the default one does, an `arith.addf` `sum = X + P`
    is folded where P is the `dx` of a `moe.router_grad` or a
    `moe.expert_combine_grad`, or the output of a `moe.combine`: X is written
    straight into the sum's buffer and P's op, by its `_acc` host function,
    adds P there, so no add runs. Only where the sum has a buffer of its own
    (an out-parameter, or the X of another fold), P and X are used by the add
    alone, X is the result of an op (not an argument or a prefetch) and comes
    before P's op, or P's op can move to right before the add (nothing reads
    its results before, and it does not pass work that waits for a prefetch).

    Rejected with an error at the op, as this version cannot run them:
    data other than bf16, dynamic shapes, activations other than swiglu, a
    dispatch capacity factor, `moe.aux_loss(_grad)`, the unfused
    `moe.combine_grad`/`moe.expert_ffn_grad`, an offload or prefetch other
    than `moe-offload`'s, an undecomposed `moe.layer`, any other op on
    tensors, an empty tensor, `d`, `n` or the shared expert's `m` not a
    multiple of 64 or over 65536, and more than 1024 experts or 64 expert
    groups.
  }];
  let options = [
    Option<"libraryPath", "library", "std::string", /*default=*/"\"\"",
           "A GPU library file to use instead of the one the kernel builder makes, "
           "e.g. moe-gpu-emit-library's output, edited, or another build's; empty: "
           "the builder's library">,
  ];
  let dependentDialects = [
    "::mlir::affine::AffineDialect",
    "::mlir::arith::ArithDialect",
    "::mlir::cf::ControlFlowDialect",
    "::mlir::func::FuncDialect",
    "::mlir::gpu::GPUDialect",
    "::mlir::index::IndexDialect",
    "::mlir::LLVM::LLVMDialect",
    "::mlir::math::MathDialect",
    "::mlir::memref::MemRefDialect",
    "::mlir::nvgpu::NVGPUDialect",
    "::mlir::NVVM::NVVMDialect",
    "::mlir::scf::SCFDialect",
    "::mlir::vector::VectorDialect"
  ];
}

def MoESerializeKernelsCached : Pass<"moe-serialize-kernels-cached", "::mlir::ModuleOp"> {
  let summary = "gpu-module-to-binary with an on-disk cache of the kernel binaries";
  let description = [{
    Serializes every `gpu.module` as `gpu-module-to-binary` does, but first
    looks each one up in `cache-dir` by a SHA-256 of its printed (already
    lowered) form, the format, toolkit and command-line options, the LLVM
    version, and, for `bin` and `fatbin`, the size and time of the
    toolkit's `ptxas`. A hit becomes the `gpu.binary` that was stored; a
    miss is compiled and stored (written to a temporary file and renamed, so
    concurrent compiles never see half a file). Every layer shares the GPU
    library's kernels, so only the first compile on a machine pays for
    NVPTX code generation and ptxas. Without `cache-dir` it is
    `gpu-module-to-binary`. A cache that cannot be read or written is
    skipped with a warning, never an error. `library` directories hold
    binaries stored the same way by the project's build (the kernel
    library, `share/moe_mlir/kernels`): they are searched after `cache-dir`
    and never written. Statistics: `cache-hits` (of them `library-hits`),
    `cache-misses`.
  }];
  let options = [
    Option<"cacheDir", "cache-dir", "std::string", /*default=*/"\"\"",
           "directory of the cached binaries (empty: no cache)">,
    ListOption<"libraryDirs", "library", "std::string",
               "read-only directories of prebuilt binaries, searched after "
               "cache-dir">,
    Option<"toolkitPath", "toolkit", "std::string", /*default=*/"\"\"",
           "CUDA toolkit path (gpu-module-to-binary's toolkit)">,
    Option<"cmdOptions", "opts", "std::string", /*default=*/"\"\"",
           "extra options for the target compiler">,
    Option<"compilationTarget", "format", "std::string", /*default=*/"\"fatbin\"",
           "bin, isa or fatbin">
  ];
  let statistics = [
    Statistic<"numHits", "cache-hits", "kernel modules found in the cache">,
    Statistic<"numLibraryHits", "library-hits",
              "kernel modules found in a library directory">,
    Statistic<"numMisses", "cache-misses", "kernel modules compiled and stored">
  ];
}

def MoEGPUEmitLibrary : Pass<"moe-gpu-emit-library", "::mlir::ModuleOp"> {
  let summary = "append the GPU library the kernel builder makes to the module";
  let description = [{
    Appends the whole GPU library, as `convert-moe-to-gpu` takes it from the
    kernel builder, to the module: `gpu.module @moe_kernels` with every kernel
    and device function, the runtime's tensor-map declaration and the
    `__moe_gpu_*` host functions, and marks the module a
    `gpu.container_module`. For tools that compile the library on its own
    (the op-level GPU checks: `scripts/inputs/build-ops-harness.sh`):

    ```
    echo 'module {}' | moe-opt --moe-gpu-emit-library -o library.mlir
    ```

    A module that already has one of the library's symbols is an error.
    `configs` (as `moe-gpu-select-kernels`' option: `[OP.]ROLE:KEY=VALUE...`)
    builds the host functions of those ops with the roles' kernels so
    configured, under the library's names: a library whose `expert_ffn`
    runs another down projection, timed beside the default by the op checks.
    An accumulating host function whose configured GEMM cannot add to what C
    holds (a `dx` not stored by `tma_boxes`) is left out of the library.
  }];
  let options = [
    ListOption<"configs", "configs", "std::string",
               "Parameters of the host functions' GEMMs: "
               "[OP.]ROLE:KEY=VALUE[:...], e.g. expert_ffn.down:stages=2">,
  ];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::func::FuncDialect",
    "::mlir::gpu::GPUDialect",
    "::mlir::LLVM::LLVMDialect",
    "::mlir::moe_gpu::MoEGPUDialect",
    "::mlir::memref::MemRefDialect",
    "::mlir::NVVM::NVVMDialect",
    "::mlir::scf::SCFDialect",
    "::mlir::vector::VectorDialect"
  ];
}

def MoEGPUBuildEntryPoints
    : Pass<"moe-gpu-build-entry-points", "::mlir::ModuleOp"> {
  let summary = "give a compiled layer's host functions C entry points";
  let description = [{
    Runs on the LLVM dialect a GPU layer lowers to (`moe-training-pipeline`
    with a chip). For the forward and backward host functions
    (`moe.gpu.entry`) of the module's one layer `@L`, builds
    `i32 @<L>_forward(!llvm.ptr stream, !llvm.ptr...)` and `@<L>_backward`:
    each checks its pointers (null: `MOE_ERROR_INVALID_ARGUMENT`, not
    16-byte aligned: `MOE_ERROR_MISALIGNED`, with a message naming the
    parameter), makes the stream the runtime's launch stream, calls the host
    function on memref descriptors of the static shapes and returns the
    runtime's status; and `i64 @<L>_<kind>_workspace_bytes()`. `<L>` is the
    layer's name as a C identifier. The host functions become internal
    `@__moe_host_<L>_<kind>`, and their `moe.gpu.*` attributes move to the
    entry points, from which `moe-compile` writes the header and manifest.

    A module without a layer, with two layers, or with a symbol of an entry
    point's name is an error.
  }];
  let dependentDialects = ["::mlir::LLVM::LLVMDialect"];
}

def MoEGPUSplitKernelModules
    : Pass<"moe-gpu-split-kernel-modules", "::mlir::ModuleOp"> {
  let summary = "give each launched kernel a gpu.module of its own, drop the others";
  let description = [{
    Moves every kernel that a `gpu.launch_func` of the module launches into
    a `gpu.module` named after it, with the device functions it calls (in
    their module's order) and its module's attributes, and points the
    launches there; the modules it took kernels from are erased, with the
    kernels nothing launches. A layer's module then holds only the kernels
    it runs, each once, and a kernel's module is the same text in every
    layer that runs it, so the compiled-kernel cache and the prebuilt kernel
    library (`moe-serialize-kernels-cached`) find it by its config whatever
    else the layer runs.

    ```mlir
    gpu.module @moe_kernels { gpu.func @a() kernel {...}  gpu.func @b() kernel {...} }
    gpu.launch_func @moe_kernels::@a ...
    // becomes
    gpu.module @a { gpu.func @a() kernel {...} }
    gpu.launch_func @a::@a ...
    ```

    A launched kernel that is missing, or a symbol already named after a
    kernel, is an error.
  }];
  let dependentDialects = ["::mlir::gpu::GPUDialect"];
}

def MoEAlignDynamicSharedMemory
    : Pass<"moe-align-dynamic-shared-memory", "::mlir::gpu::GPUModuleOp"> {
  let summary = "make the dynamic shared memory of lowered kernels one external, aligned array";
  let description = [{
    Runs on a `gpu.module` after `convert-gpu-to-nvvm` (docs/gpu-kernels.md, pitfall P6).
    `gpu.dynamic_shared_memory` lowers to an internal zero-size global
    `@__dynamic_shmem__N` in address space 3 aligned to 16, which becomes
    `.shared .align 16 .b8 __dynamic_shmem__0;` in PTX. 128B-swizzled TMA
    and wgmma tiles need 1024-byte alignment, so the global becomes external
    with the given alignment: `.extern .shared .align 1024 .b8
    __dynamic_shmem__0[];`.

    ```mlir
    llvm.mlir.global internal @__dynamic_shmem__0()
        {addr_space = 3 : i32, alignment = 16 : i64} : !llvm.array<0 x i8>
    // becomes
    llvm.mlir.global external @__dynamic_shmem__0()
        {addr_space = 3 : i32, alignment = 1024 : i64} : !llvm.array<0 x i8>
    ```
  }];
  let options = [
    Option<"alignment", "alignment", "uint64_t", /*default=*/"1024",
           "alignment in bytes of the dynamic shared memory">
  ];
  let dependentDialects = ["::mlir::LLVM::LLVMDialect"];
}

#endif // MOE_CONVERSION_PASSES_TD
