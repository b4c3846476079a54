#!/usr/bin/env python3
"""Compiles, for sm_90 and without a GPU, the Triton kernels that MegaBlocks' dMoE runs (its
gather/scatter copies; stk's block-sparse matmuls, mlp_impl 'sparse'), with the Triton at hand,
and counts the int16 multiplies left in stk's kernels: Triton >= 3.2 keeps int16 * int in
int16, so a block index times the block size overflows past 32767 rows (why megablocks 0.10.0
refuses 'sparse' with Triton >= 3.2; scripts/dev/build-megablocks.sh casts those loads to int32,
after which there are none). Run with the built SITE on PYTHONPATH:

    PYTHONPATH=SITE python3 scripts/dev/megablocks_triton_check.py

Last line "N passed, M failed"; exit 1 on a failure.
"""

import re
import sys
import time


def main() -> int:
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import stk.backend.triton_kernels as S
    from megablocks.backend import kernels as K

    target = GPUTarget("cuda", 90, 32)
    results = {"passed": 0, "failed": 0}

    def ptr(t):
        return f"*{t}"

    def compile_one(fn, sig, consts, name, no_i16=False):
        fn = getattr(fn, "fn", fn)  # the autotuner's kernel
        t0 = time.time()
        try:
            k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=target)
        except Exception as e:  # noqa: BLE001 - each kernel says its own
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[:400]}")
            results["failed"] += 1
            return
        i16 = len(re.findall(r"arith.muli[^\n]*: (?:tensor<[0-9x]*)?i16\b", k.asm["ttir"]))
        if no_i16 and i16:
            print(f"FAIL {name}: {i16} int16 multiplies (offsets overflow past 32767)")
            results["failed"] += 1
            return
        print(f"PASS {name} ({time.time() - t0:.1f} s, {len(k.asm['cubin'])} B, {i16} i16 muls)")
        results["passed"] += 1

    copy = {
        "indices": ptr("i32"),
        "bin_ids": ptr("i32"),
        "bins": ptr("i32"),
        "padded_bins": ptr("i32"),
        "NUM_COLUMNS": "constexpr",
        "TOP_K": "constexpr",
        "BLOCK_X": "constexpr",
    }
    for a_to_b in (True, False):
        for scale in (True, False):
            compile_one(
                K._padded_copy,
                {
                    "a": ptr("bf16"),
                    "b": ptr("bf16"),
                    **copy,
                    "weights": ptr("bf16"),
                    "A_TO_B": "constexpr",
                    "SCALE": "constexpr",
                },
                {"NUM_COLUMNS": 2048, "TOP_K": 2, "BLOCK_X": 128, "A_TO_B": a_to_b, "SCALE": scale},
                f"megablocks _padded_copy A_TO_B={a_to_b} SCALE={scale}",
            )
    compile_one(
        K._padded_copy_wgrad,
        {"x": ptr("bf16"), "grad": ptr("bf16"), "wgrad": ptr("bf16"), **copy},
        {"NUM_COLUMNS": 2048, "TOP_K": 2, "BLOCK_X": 128},
        "megablocks _padded_copy_wgrad",
    )
    blk = {
        "BLOCK_M": 128,
        "BLOCK_N": 128,
        "BLOCK_K": 32,
        "BLOCK_SIZE": 128,
        "GROUP_M": 8,
        "ACC_TYPE": tl.float32,
    }
    mm = {n: ptr("bf16") for n in ("A", "B", "C")}
    mm.update({n: "i32" for n in ("M", "N", "K")})
    mm.update({f"stride_{s}": "i32" for s in ("am", "ak", "bk", "bn", "cm", "cn")})
    mm.update({"row_indices": ptr("i16"), "column_indices": ptr("i16")})
    blocks = {"offsets": ptr("i32"), "block_offsets_t": ptr("i32")}
    trans = {"trans_A": "constexpr", "trans_B": "constexpr"}
    cs = {k: "constexpr" for k in blk}
    compile_one(S._sdd_kernel, {**mm, **cs}, blk, "stk _sdd_kernel", no_i16=True)
    for t in (False, True):
        compile_one(
            S._dsd_kernel,
            {**mm, **blocks, **trans, **cs},
            {**blk, "trans_A": t, "trans_B": False},
            f"stk _dsd_kernel trans_A={t}",
            no_i16=True,
        )
        compile_one(
            S._dds_kernel,
            {**mm, **blocks, **trans, **cs},
            {**blk, "trans_A": False, "trans_B": t},
            f"stk _dds_kernel trans_B={t}",
            no_i16=True,
        )
    print(f"triton {triton.__version__}")
    print(f"{results['passed']} passed, {results['failed']} failed")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
