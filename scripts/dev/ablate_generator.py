#!/usr/bin/env python3
"""Writes a timing-only copy of gen_gpu_library.py with one part of the weight-gradient
kernels (the varlen-K GEMMs: dW_gate_up, dW_down; the router's wgrad_rows too, except for
the box-store ablations) or of the dSwiGLU GEMMs (dact-*) taken out, to learn what that
part costs by timing the copy beside the real library in one GPU run:

    python3 scripts/dev/ablate_generator.py KIND /tmp/gen_KIND.py
    bash scripts/inputs/build-ops-harness.sh gpu-inputs/ops-KIND /tmp/gen_KIND.py
    MOE_COMPARE_ROUNDS=2 bash scripts/gpu/session.sh ops     # on the GPU machine

KIND (docs/gpu-kernels.md has what each cost on the H200):
  nostore  C staged as usual, the TMA box stores left out
  nostm    no conversion or stmatrix of C (the stores write the staging as it is)
  nowait   the wait for the last tile's stores to have read the staging, and the
           barrier after it, left out (racy)
  noepi    no epilogue at all
  nomma    no wgmma (loads, waits and the epilogue of a zero accumulator)
  dact-noepi  the dSwiGLU GEMMs (dact_gather, dact_rows) without their epilogue (the
           fp32 staging of dA and dSwiGLU): what their k-loop, fill and set-up take
  dact-nomma  the dSwiGLU GEMMs without wgmma: their loads, block barriers and epilogue

The libraries these build compute wrong gradients: gpu/ops-compare.sh's checks of
such a variant fail, and only its timings mean anything. Where the accumulator would be
left unused, ptxas would drop the wgmma with it, so the epilogue stays behind a test that
is never true on real data (the first value equal to 12345.0). Each ablation is a textual
edit of the generator; when the generator no longer has the text, this exits saying which.
"""

import pathlib
import sys

GENERATOR = (
    pathlib.Path(__file__).resolve().parents[2] / "lib/Conversion/MoEToGPU/gen_gpu_library.py"
)


# the never-true test that keeps the accumulator live
def _odd(indent):
    return (
        """a0 = e.op(f"llvm.extractvalue {acc}[0] : {ACC}", "a0")\n"""
        + indent
        + """odd = e.op(f"arith.cmpf oeq, {a0}, {e.const(12345.0, 'f32')} : f32", "odd")"""
    )


ABLATIONS = {
    "nostore": [
        (
            """                    (tma_store_boxes if by_boxes else bulk_store_rows)(S, stage_ptr)""",
            """                    if not (g.sched == "varlen_k" and by_boxes):
                        (tma_store_boxes if by_boxes else bulk_store_rows)(S, stage_ptr)""",
        )
    ],
    "nostm": [
        (
            """                    (stage_boxes_stmatrix if by_boxes else stage_rows_stmatrix)(stage_ptr, acc)""",
            """                    if g.sched == "varlen_k" and by_boxes:
                        """
            + _odd(" " * 24)
            + """
                        if_begin(odd)
                        stage_boxes_stmatrix(stage_ptr, acc)
                        if_end()
                    else:
                        (stage_boxes_stmatrix if by_boxes else stage_rows_stmatrix)(stage_ptr, acc)""",
        )
    ],
    "nowait": [
        (
            """            if g.bulk_store:
                # this thread's copy of the last tile has read its staging row
                e.emit("nvvm.cp.async.bulk.wait_group 0 {read}")
            consumer_barrier()  # the last tile's stores have read the staging buffer""",
            """            if g.sched != "varlen_k":
                if g.bulk_store:
                    e.emit("nvvm.cp.async.bulk.wait_group 0 {read}")
                consumer_barrier()""",
        )
    ],
    "noepi": [
        (
            """            acc, nsl, nph = mainloop_ws(S, sl, ph)
            if_begin(S["valid"])""",
            """            acc, nsl, nph = mainloop_ws(S, sl, ph)
            if g.sched == "varlen_k":
                """
            + _odd(" " * 16)
            + """
                if_begin(e.op(f"arith.andi {odd}, {S['valid']} : i1"))
            else:
                if_begin(S["valid"])""",
        )
    ],
    "nomma": [
        (
            """        e.emit("nvvm.wgmma.fence.aligned")
        for kk in range(count):""",
            """        if g.sched == "varlen_k":
            return acc
        e.emit("nvvm.wgmma.fence.aligned")
        for kk in range(count):""",
        )
    ],
    "dact-noepi": [
        (
            """        acc, _ = mainloop(S, c(0, I32))
        if_begin(S["valid"])
        ring_epilogue(""",
            """        acc, _ = mainloop(S, c(0, I32))
        if g.epi == "dswiglu":
            """
            + _odd(" " * 12)
            + """
            if_begin(e.op(f"arith.andi {odd}, {S['valid']} : i1"))
        else:
            if_begin(S["valid"])
        ring_epilogue(""",
        )
    ],
    "dact-nomma": [
        (
            """        e.emit("nvvm.wgmma.fence.aligned")
        for kk in range(count):""",
            """        if g.epi == "dswiglu":
            return acc
        e.emit("nvvm.wgmma.fence.aligned")
        for kk in range(count):""",
        )
    ],
}


def ablate(source, kind):
    """The generator's text with ablation `kind` applied; SystemExit if it does not apply."""
    if kind not in ABLATIONS:
        raise SystemExit(
            f"ablate_generator.py: unknown ablation {kind!r}: expected one of "
            f"{', '.join(ABLATIONS)}"
        )
    for old, new in ABLATIONS[kind]:
        if source.count(old) != 1:
            first = old.strip().splitlines()[0]
            raise SystemExit(
                f"ablate_generator.py: {kind}: the generator has "
                f"{source.count(old)} copies of the text it edits (expected 1), "
                f"starting: {first}"
            )
        source = source.replace(old, new)
    return source


def main(argv):
    if len(argv) != 3:
        raise SystemExit(f"usage: ablate_generator.py KIND OUT.py  (KIND: {', '.join(ABLATIONS)})")
    kind, out = argv[1], pathlib.Path(argv[2])
    out.write_text(ablate(GENERATOR.read_text(), kind))


if __name__ == "__main__":
    main(sys.argv)
