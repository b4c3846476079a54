#!/usr/bin/env python3
"""Generates MoEGPULibrary.mlir: the sm_90a kernels and host functions of the GPU path.

    python3 lib/Conversion/MoEToGPU/gen_gpu_library.py -o build/.../MoEGPULibrary.mlir

The build runs it (lib/Conversion/MoEToGPU/CMakeLists.txt) and embeds the output in the
compiler; the output is written to a temporary file and renamed, so a build never embeds a
half-written library.

The GEMM kernels are unrolled (the wgmma accumulators are LLVM structs of 128 f32 and every
k-step and copy is spelled out), which is why they are generated rather than written by hand.
docs/gpu-kernels.md describes the kernels, each MOE_* setting read below with its default
and the measurements that chose it, and the Hopper code-generation rules followed here (its
section 6); the host-function contract is the table in docs/gpu-path.md section 1.
"""

import os
import re
import sys

# ---------------------------------------------------------------------------
# GEMM tiling: two warpgroups (256 threads) compute a 128x256 tile of C, each
# 64 rows with one m64n256k16 wgmma accumulator; A and B stream through a ring
# in shared memory, 128B-swizzled (docs/gpu-kernels.md 6.2-6.3): 4 stages for the
# kernels that stage fp32 C in the ring, P_STAGES for the persistent ones below.
# All 256 threads copy A (and token-row B) by cp.async; weight B comes by TMA
# (Gemm.tma_b). Both warpgroups read all of B.
# ---------------------------------------------------------------------------
BM, BN, BK, STAGES, THREADS = 128, 256, 64, 4, 128
GEMM_THREADS = 256
A_TILE_BYTES = BM * BK * 2  # 16 KiB
B_TILE_BYTES = BK * BN * 2  # 32 KiB
STAGE_BYTES = A_TILE_BYTES + B_TILE_BYTES
# wgmma descriptors (docs/gpu-kernels.md 6.2): 128B swizzle (bit 62), SBO = 1024 B
# (8 rows of 128 B), LBO = 16 KiB for K-major tiles (unused with swizzle, the
# value nvgpu emits) and 8 KiB for MN-major tiles (the distance between two
# 64-column boxes).
DESC_KMAJOR = 0x4000004004000000
DESC_MNMAJOR = 0x4000004002000000


def setting(name, default, allowed):
    """The generator setting `name` from the environment (`default` where unset), one of
    `allowed`; anything else ends the run with a message that lists them."""
    value = os.environ.get(name, default)
    if value not in allowed:
        expected = ", ".join(allowed[:-1]) + " or " + allowed[-1]
        sys.exit(f"gen_gpu_library.py: {name}={value!r}: expected {expected}")
    return value


GROUP_M = int(os.environ.get("MOE_GEMM_GROUP_M", "16"))  # M-tiles per raster group
# Persistent kernels (the bf16 epilogues): NUM_CTAS CTAs, one an SM (a thread holds 255
# registers, so two CTAs never share an SM), P_STAGES ring stages. C is staged in bf16
# (64 KiB) over the last ring slot and past the ring: 3 x 48 + 64 + 1 KiB of alignment.
PERSISTENT_EPILOGUES = ("store_bf16", "store_bf16_w", "swiglu")
P_STAGES = int(os.environ.get("MOE_GEMM_PSTAGES", "3"))
NUM_CTAS = 132  # SMs of an H100 / H200; any count is correct, this one is the fastest
MAX_SMEM = 227 * 1024  # dynamic shared memory a CTA may ask for on sm_90
# Warp specialisation (docs/gpu-kernels.md 6.4): the persistent kernels named by MOE_GEMM_WS
# ("all" of them, the "gather"ed-operand ones, or "none") add a producer warpgroup that
# issues every copy of the ring; the two consumer warpgroups only wait on the ring's
# full[s] mbarriers, run wgmma, release slots on empty[s] and write C out. No block-wide
# barrier is left in the k-loop, and the next tile's loads fill the whole ring while the
# consumers run the epilogue (C has a staging buffer of its own).
WS_KERNELS = setting("MOE_GEMM_WS", "all", ("all", "gather", "none"))
WS_THREADS = GEMM_THREADS + 128
# MOE_GEMM_ROWS_TMA=1 (the default): the warp-specialised weight gradients with a gathered
# operand load the other one, an expert's contiguous rows (w*A of dW_down, dH of
# dW_gate_up), by TMA boxes of a per-call map, and by cp.async only in an expert's last,
# partial k-step (a box would read the next expert's rows there). 0: both by cp.async.
# Measured: mixtral's dW_gate_up 12.2 -> 11.5 ms (docs/gpu-kernels.md, decision L7).
ROWS_TMA = setting("MOE_GEMM_ROWS_TMA", "1", ("0", "1"))
# MOE_GEMM_BULK_STORE=1 (the default): the warp-specialised kernels with a plain bf16 C
# (down, dX, the weight gradients) stage C by stmatrix in rows padded to 528 bytes (no bank
# conflicts) and write it out by one cp.async.bulk a row: the consumers go on to the next
# tile's wgmma while the copy engine stores this one, where they issued 16 loads and 16
# stores each before. The staging buffer is rewritten a tile later, after the copies have
# read it. The default because the op-level step was faster with it in 10 of 12
# same-call comparisons (1.0-5.5%; mixtral tied in the other two; docs/gpu-kernels.md, S1).
# "wgrad": the weight gradients only; 0: 16-byte stores from every consumer thread.
BULK_STORE = setting("MOE_GEMM_BULK_STORE", "1", ("0", "1", "wgrad"))
BULK_EPILOGUES = {"0": (), "1": ("store_bf16", "store_bf16_w"), "wgrad": ("store_bf16_w",)}[
    BULK_STORE
]
# MOE_GEMM_TMA_STORE=1 (with the bulk store; the default): the experts' weight gradients
# (dW_gate_up, dW_down: whole [E, M, N] blocks, which a tensor map clips at M and N) and a
# whole tile of down and dX stage C by stmatrix in four 128B-swizzled 128x64 boxes and one
# thread stores them by four TMA box stores. The row-wise bulk store issued 128 copies a
# tile, which the compiler serialises lane by lane (the copy takes uniform registers): on
# deepseek-v3's 4-k-step tiles that loop and the barrier waiting for it held 10-14% of the
# samples (Nsight Compute; docs/gpu-kernels.md, S2). 0: the row-wise copies everywhere.
TMA_STORE = setting("MOE_GEMM_TMA_STORE", "1", ("0", "1"))
# MOE_GEMM_DYNAMIC=rows: the warp-specialised varlen-M GEMMs with a row-wise bf16 C (down,
# dX) hand out their tiles from a global atomic counter in the order the CTAs reach them,
# where the static schedule gives SM s the tiles s, s + 132, ...: the M-tiles that share a
# weight tile then stay in step however long each takes (with tiles of unequal cost the
# static order let them drift apart and read W from DRAM again, Nsight Compute showed). The
# producer's TMA thread claims the next tile during the current one, passes it to its
# warpgroup through shared memory and a named barrier, and to the consumers through a
# two-entry ring with full/empty mbarriers. The counters are a per-call buffer the host
# zeroes (a word a launch). "all": the up projection too. 0 (the default): the static
# schedule, because "rows" with the skip below measured no faster than it (deepseek-v3's
# down and dX 1.4-3% faster under Nsight Compute's fixed clocks, 0-3% slower in a timed
# step, over 4 rounds) and "all" slower on the up projection (docs/gpu-kernels.md, T12).
DYNAMIC = setting("MOE_GEMM_DYNAMIC", "0", ("0", "rows", "all"))
# MOE_GEMM_IDLE_SKIP=1 (the default, for the kernels MOE_GEMM_DYNAMIC schedules): in a tile
# whose rows end in its first half, the second consumer warpgroup runs no wgmma (it only
# waits for each ring slot and frees it), so the tensor cores serve the first alone: one
# warpgroup keeps the tensor pipe as busy as two (test/GPU/wgmma_warpgroups.cu). Never
# under the static schedule, where it was slower, twice (docs/gpu-kernels.md, T11). 0: both
# warpgroups multiply every tile.
IDLE_SKIP = setting("MOE_GEMM_IDLE_SKIP", "1", ("0", "1"))
# setmaxnreg moves registers between the warpgroups of a CTA, within what the launch gave
# it: 384 threads get 168 registers each (65536 / 384, in steps of 8), so the producer must
# free at least what the consumers take: 128 (168 - P) >= 256 (C - 168); consumers that ask
# for more wait in setmaxnreg.inc forever. P = 40 and 56 spill in the row-wise producers
# (ptxas -v); the consumers need 128 for the accumulator.
WS_LAUNCH_REGS = 65536 // WS_THREADS // 8 * 8
SCHED_BYTES = 48  # MOE_GEMM_DYNAMIC's shared memory (Gemm.sched_offset)
COUNTER_WORDS = 8  # MOE_GEMM_DYNAMIC's tile counters: words a host buffer (Host.tile_counter)


def ws_register_split(text):
    """(producer, consumer) registers from MOE_GEMM_WS_REGS ("P,C"), or exits saying why
    the split cannot work."""
    try:
        producer, consumer = (int(x) for x in text.split(","))
    except ValueError:
        sys.exit(f"gen_gpu_library.py: MOE_GEMM_WS_REGS={text!r}: expected two integers, P,C")
    for n in (producer, consumer):
        if n % 8 or not 24 <= n <= 256:
            sys.exit(
                f"gen_gpu_library.py: MOE_GEMM_WS_REGS={text!r}: setmaxnreg takes multiples "
                "of 8 from 24 to 256"
            )
    if not producer <= WS_LAUNCH_REGS <= consumer:
        sys.exit(
            f"gen_gpu_library.py: MOE_GEMM_WS_REGS={text!r}: the producer gives registers "
            f"away and the consumers take them (P <= {WS_LAUNCH_REGS} <= C)"
        )
    if 128 * (WS_LAUNCH_REGS - producer) < GEMM_THREADS * (consumer - WS_LAUNCH_REGS):
        sys.exit(
            f"gen_gpu_library.py: MOE_GEMM_WS_REGS={text!r}: the consumers would wait for "
            f"registers the producer never frees (128 ({WS_LAUNCH_REGS} - P) must be >= "
            f"256 (C - {WS_LAUNCH_REGS}))"
        )
    return producer, consumer


# The dSwiGLU epilogue walks a warp's 16 rows of a tile MOE_GEMM_DACT_UNROLL (U) at a time,
# H (gate and up) of a batch of U rows loaded while the previous batch computes: the rows
# wait for global memory 16 / U times a tile (1: every row on its own). 4 and 8 ran alike
# (docs/gpu-kernels.md, A1); 16 spills.
DACT_UNROLL_TEXT = setting("MOE_GEMM_DACT_UNROLL", "4", ("1", "2", "4", "8"))
DACT_UNROLL = int(DACT_UNROLL_TEXT)
WS_PRODUCER_REGS, WS_CONSUMER_REGS = ws_register_split(os.environ.get("MOE_GEMM_WS_REGS", "72,216"))
STAGE_C_BYTES = BM * BN * 2
# MOE_GEMM_BULK_STORE's staging: a row of C (512 bytes) and 16 of padding, so the 8 rows
# of an stmatrix fragment start in 8 different 16-byte bank groups
BULK_ROW = BN + 8
BULK_STAGE_C_BYTES = BM * BULK_ROW * 2
# MOE_GEMM_TMA_STORE's staging: four boxes of BM rows by 64 columns (128 bytes)
TMA_BOX_BYTES = BM * 64 * 2
# varlen_m: each CTA sums the experts' M-tiles into a table in shared memory once and
# finds a tile's expert by binary search; past TABLE_EXPERTS experts it scans offsets.
TABLE_EXPERTS = 4 * GEMM_THREADS
CUM_BYTES = 4 * (TABLE_EXPERTS + 1 + 8) + 28

ACC = "!llvm.struct<(" + ", ".join(["f32"] * (BN // 2)) + ")>"
WG = "#gpu.address_space<workgroup>"
SMEM = f"memref<?xi8, {WG}>"
SBF16 = f"memref<?xbf16, {WG}>"
I32, P1, P3 = "i32", "!llvm.ptr<1>", "!llvm.ptr<3>"


class Emitter:
    """Collects lines of MLIR with fresh SSA names and cached constants."""

    def __init__(self, indent="      "):
        self.lines = []
        self.n = 0
        self.indent = indent
        self.consts = {}
        # constants go to the top of the function so every region can use them
        self.const_lines = []

    def fresh(self, hint="v"):
        self.n += 1
        return f"%{hint}{self.n}"

    def emit(self, text):
        self.lines.append(self.indent + text)

    def op(self, text, hint="v"):
        name = self.fresh(hint)
        self.emit(f"{name} = {text}")
        return name

    def const(self, value, ty="index"):
        key = (value, ty)
        if key not in self.consts:
            name = self.fresh("c")
            lit = value
            if ty in ("f32",):
                lit = repr(float(value))
            if ty == "i1":
                lit = "true" if value else "false"
            suffix = "" if ty == "i1" else f" : {ty}"
            self.const_lines.append(f"      {name} = arith.constant {lit}{suffix}")
            self.consts[key] = name
        return self.consts[key]

    # index arithmetic helpers
    def add(self, a, b, ty="index"):
        return self.op(f"arith.addi {a}, {b} : {ty}")

    def sub(self, a, b, ty="index"):
        return self.op(f"arith.subi {a}, {b} : {ty}")

    def mul(self, a, b, ty="index"):
        return self.op(f"arith.muli {a}, {b} : {ty}")

    def div(self, a, b, ty="index"):
        return self.op(f"arith.divui {a}, {b} : {ty}")

    def rem(self, a, b, ty="index"):
        return self.op(f"arith.remui {a}, {b} : {ty}")

    def xor(self, a, b, ty="index"):
        return self.op(f"arith.xori {a}, {b} : {ty}")

    def cmp(self, pred, a, b, ty="index"):
        return self.op(f"arith.cmpi {pred}, {a}, {b} : {ty}")

    def select(self, c, a, b, ty="index"):
        return self.op(f"arith.select {c}, {a}, {b} : {ty}")

    def minu(self, a, b, ty="index"):
        return self.op(f"arith.minui {a}, {b} : {ty}")

    def maxs(self, a, b, ty="index"):
        return self.op(f"arith.maxsi {a}, {b} : {ty}")

    def load_i32_as_index(self, mem, idx):
        v = self.op(f"memref.load {mem}[{idx}] : memref<?xi32>")
        return self.op(f"arith.index_cast {v} : i32 to index")

    def if_begin(self, cond):
        """Opens `scf.if cond {`; if_end closes it."""
        self.emit(f"scf.if {cond} {{")
        self.indent += "  "

    def if_end(self):
        self.indent = self.indent[:-2]
        self.emit("}")

    def if_else(self, cond, then, otherwise):
        """`scf.if cond` with no results, its branches emitted by then() and otherwise()."""
        self.if_begin(cond)
        then()
        self.indent = self.indent[:-2]
        self.emit("} else {")
        self.indent += "  "
        otherwise()
        self.if_end()

    def if_values(self, cond, types, then, otherwise, hint="if"):
        """`scf.if cond -> (types)` whose branches are emitted by then() and otherwise(),
        each returning the list of values it yields; returns the if's results."""
        out = self.fresh(hint)
        n = len(types)
        self.emit(f"{out}{f':{n}' if n > 1 else ''} = scf.if {cond} -> ({', '.join(types)}) {{")
        for branch in (then, otherwise):
            self.indent += "  "
            self.emit(f"scf.yield {', '.join(branch())} : {', '.join(types)}")
            self.indent = self.indent[:-2]
            self.emit("} else {" if branch is then else "}")
        return [f"{out}#{k}" for k in range(n)] if n > 1 else [out]

    def load_smem_index(self, mem, idx):
        v = self.op(f"memref.load {mem}[{idx}] : memref<?xi32, #gpu.address_space<workgroup>>")
        return self.op(f"arith.index_cast {v} : i32 to index")

    def fadd(self, a, b):
        return self.op(f"arith.addf {a}, {b} : f32")

    def fmul(self, a, b):
        return self.op(f"arith.mulf {a}, {b} : f32")

    def fsub(self, a, b):
        return self.op(f"arith.subf {a}, {b} : f32")

    def ffma(self, a, b, c):
        """a * b + c, rounded once. The LLVM intrinsic, not math.fma, which the NVVM
        lowering may turn into a call of libdevice's __nv_fmaf that nothing links."""
        return self.op(f"llvm.intr.fma({a}, {b}, {c}) : (f32, f32, f32) -> f32")

    def bf16x8_to_f32(self, vec):
        """The 8 lanes of a vector<8xbf16> in f32, two bit operations a pair: lane 2i is
        the low half of 32-bit word i (LLVM's extract and extend take three)."""
        words = self.op(f"vector.bitcast {vec} : vector<8xbf16> to vector<4xi32>")
        out = []
        for i in range(4):
            w = self.op(f"vector.extract {words}[{i}] : i32 from vector<4xi32>")
            lo = self.op(f"arith.shli {w}, {self.const(16, 'i32')} : i32")
            hi = self.op(f"arith.andi {w}, {self.const(-65536, 'i32')} : i32")
            out += [self.op(f"arith.bitcast {x} : i32 to f32") for x in (lo, hi)]
        return out


# ---------------------------------------------------------------------------
# GEMM variants
# ---------------------------------------------------------------------------
# A operand (a tile of BM rows x BK):
#   gather:  row r of the tile is row ids[r] of a [*, K] matrix (dispatch queue)
#   rows:    row r is row r of a [*, K] matrix
#   mn:      K-row k of the tile is row ids[off + k] (gather_a) or off + k of a
#            [*, M] matrix, columns m0 + [0, 128) (MN-major smem tile, read
#            transposed by wgmma; varlen K): the weight gradients read x, dH and
#            w*A where forward and backward wrote them, with no transposed copy
# B operand (w_*: the expert weights, by TMA boxes; rows_mn: by cp.async):
#   w_mn:        W[e] is [K, N], N contiguous (MN-major smem tile)
#   w_mn_swiglu: W[e] is [K, 2h]; the tile takes 64 gate columns and the same
#                64 up columns, so SwiGLU completes inside one tile
#   w_k:         W[e] is [N, K], K contiguous (K-major smem tile)
#   rows_mn:     row k of the tile is row ids[off + k] (or off + k) of a [*, N]
#                matrix (varlen K, gathered along K)
# Schedules:
#   varlen_m: x over every expert's 128-row tiles (offsets), y over N tiles
#   varlen_k: x over M tiles, y over N tiles, z over experts; K = expert's rows


class Gemm:
    def __init__(
        self,
        name,
        a,
        b,
        epi,
        sched,
        gather_a=False,
        gather_b=False,
        has_w=False,
        has_ds=False,
        store_a=True,
        reduce_store=False,
    ):
        self.name, self.a, self.b, self.epi, self.sched = name, a, b, epi, sched
        self.gather_a, self.gather_b, self.has_w, self.has_ds = gather_a, gather_b, has_w, has_ds
        # swiglu: A = silu(gate) * up too, for the down projection (not when H is
        # recomputed in backward, which wants H alone)
        self.store_a = store_a
        # bf16 epilogues run persistent: one CTA an SM walks the tiles and prefetches the
        # next tile's first stages while it writes this tile's C through a half-tile
        # staging buffer of its own. The others stage the whole fp32 tile in the ring.
        self.persistent = epi in PERSISTENT_EPILOGUES
        self.ws = self.persistent and (
            WS_KERNELS == "all"
            or (WS_KERNELS == "gather" and (a == "gather" or gather_a or gather_b))
        )
        self.threads = WS_THREADS if self.ws else GEMM_THREADS
        rows_tma = self.ws and ROWS_TMA == "1" and sched == "varlen_k"
        self.tma_rows_a = rows_tma and gather_b and a == "mn"
        self.tma_rows_b = rows_tma and gather_a and b == "rows_mn"
        self.bulk_store = self.ws and epi in BULK_EPILOGUES
        # the experts' weight gradients by TMA box stores (MOE_GEMM_TMA_STORE)
        self.tma_store = (
            self.bulk_store
            and epi == "store_bf16_w"
            and (gather_a or gather_b)
            and TMA_STORE == "1"
        )
        # and the row-wise C of the varlen-M GEMMs (down, dX): a whole tile by TMA boxes
        # of a [rows, N] map, an expert's partial last tile (whose box would run into the
        # next expert's rows) row by row
        self.tma_store_rows = self.bulk_store and epi == "store_bf16" and TMA_STORE == "1"
        # reduce_store (the accumulating dX): C += the tile, every tile by TMA reduce-add
        # boxes of the [rows, N] map. Only for one problem (num_experts = 1): the map's rows
        # end where the problem's do, so it clips a partial last tile (several experts'
        # partial tiles would reach into the next expert's rows).
        self.reduce_store = reduce_store
        assert self.tma_store_rows or not reduce_store, name
        self.stage_c_bytes = (
            BULK_STAGE_C_BYTES if self.bulk_store and not self.tma_store else STAGE_C_BYTES
        )
        self.stages = P_STAGES if self.persistent else STAGES
        ring = self.stages * STAGE_BYTES
        self.ring_bytes = ring
        if self.ws:
            # C's staging buffer follows the ring: the producer may refill every slot
            # while the consumers write C out
            self.cum_offset = ring + self.stage_c_bytes
        elif self.persistent:
            self.cum_offset = max(ring, ring - STAGE_BYTES + STAGE_C_BYTES)
        else:
            self.cum_offset = ring + 1024  # after the dS row sums of the dact epilogue
        # varlen_m kernels keep the experts' cumulative M-tile counts in shared memory
        self.launch_smem = self.cum_offset + 1024 + (CUM_BYTES if sched == "varlen_m" else 0)
        # The weight operand (B of the varlen-M GEMMs) comes by TMA: one thread issues
        # the boxes of a stage, which complete on the stage's mbarrier (full[s]); the
        # gathered or row-wise A operand stays on cp.async, which TMA cannot gather on
        # sm_90a (docs/gpu-kernels.md 6.3).
        self.tma_b = b in ("w_mn", "w_mn_swiglu", "w_k")
        if self.tma_b or self.ws:
            assert sched == "varlen_m" or not self.tma_b, name
            # full[s] at bar_offset + 8 s; with warp specialisation empty[s] follows
            self.bar_offset = self.cum_offset + (
                CUM_BYTES if sched == "varlen_m" else 0
            )  # 8-aligned
            self.launch_smem += 8 * self.stages * (2 if self.ws else 1)
        # MOE_GEMM_DYNAMIC: the tile ids' ring after the barriers: ids[2], the producer
        # warpgroup's next[2], then tile_full[2] and tile_empty[2] (mbarriers)
        self.dynamic = (
            self.ws
            and sched == "varlen_m"
            and (DYNAMIC == "all" or (DYNAMIC == "rows" and epi == "store_bf16"))
        )
        self.idle_skip = self.dynamic and IDLE_SKIP == "1"
        if self.dynamic:
            self.sched_offset = self.bar_offset + 16 * self.stages
            self.launch_smem += SCHED_BYTES
        if self.launch_smem > MAX_SMEM:
            sys.exit(
                f"gen_gpu_library.py: {name} needs {self.launch_smem} bytes of shared memory, "
                f"over the {MAX_SMEM} a CTA gets on sm_90a (MOE_GEMM_PSTAGES={self.stages}?)"
            )


def gemm_signature(g):
    """Kernel arguments: (name, type) pairs."""
    args = []
    if g.sched == "varlen_m":
        args += [("offsets", "memref<?xi32>"), ("num_experts", "index")]
    else:
        args += [("offsets", "memref<?xi32>"), ("num_experts", "index")]
    if g.a == "gather" or g.gather_a:
        args += [("ids", "memref<?xi32>")]
    args += [("amat", "memref<?xbf16>"), ("lda", "index")]
    if g.b == "rows_mn" and g.gather_b:
        args += [("bids", "memref<?xi32>")]
    if g.tma_rows_a:
        # the tensor map of A's rows (Host.rows_map); amat serves partial k-steps
        args += [("amap", "!llvm.ptr")]
    if g.tma_b:
        # the device address of W's tensor map (moeTensorMapDeviceBf16, Host.weight_map)
        args += [("bmap", "!llvm.ptr")]
    else:
        args += [("bmat", "memref<?xbf16>"), ("ldb", "index")]
        if g.tma_rows_b:
            args += [("browmap", "!llvm.ptr")]
    # M, N, K of one problem (varlen dims are read from offsets)
    args += [("dim_m", "index"), ("dim_n", "index"), ("dim_k", "index")]
    if g.epi == "swiglu":
        args += [("hout", "memref<?xbf16>")] + ([("aout", "memref<?xbf16>")] if g.store_a else [])
    elif g.epi == "store_f32":
        args += [("cout", "memref<?xf32>"), ("ldc", "index")]
    elif g.epi in ("store_bf16", "store_bf16_w"):
        args += [("cout", "memref<?xbf16>"), ("ldc", "index")]
        if g.tma_store or g.tma_store_rows:
            # the tensor map of C as [E][M][N] (Host.out_map) or [M][N] (Host.rows_map)
            args += [("cmap", "!llvm.ptr")]
    elif g.epi == "dswiglu":
        args += [("hsaved", "memref<?xbf16>")]
        if g.has_w:
            args += [("wrow", "memref<?xf32>")]
        args += [("dh", "memref<?xbf16>"), ("wa", "memref<?xbf16>")]
        if g.has_ds:
            args += [("dspart", "memref<?xf32>"), ("num_ntiles", "index")]
    if g.dynamic:
        # MOE_GEMM_DYNAMIC: word counter_slot of tile_counter, zero at the launch
        args += [("tile_counter", "memref<?xi32>"), ("counter_slot", "index")]
    return args


def gen_gemm(g):
    # the one-tile kernels index tiles by x alone
    assert g.persistent or g.sched == "varlen_m", g.name
    e = Emitter()
    sig = gemm_signature(g)
    A = {n: f"%{n}" for n, _ in sig}
    c = e.const
    stages = g.stages
    tid = e.op("gpu.thread_id x", "tid")
    bid = e.op("gpu.block_id x", "bid")
    gridx = e.op("gpu.grid_dim x", "gdim")
    warp = e.div(tid, c(32))
    lane = e.rem(tid, c(32))
    wg = e.div(tid, c(128))

    def consumer_barrier():
        """bar.sync 1 over the 256 consumer threads (warp specialisation: the
        producer warpgroup never takes part)."""
        e.emit(f"nvvm.barrier id = {c(1, I32)} number_of_threads = {c(GEMM_THREADS, I32)}")

    bn_eff = BN // 2 if g.b == "w_mn_swiglu" else BN
    ntiles = e.div(e.add(A["dim_n"], c(bn_eff - 1)), c(bn_eff))
    # M-tiles as the host counts them: varlen_m adds one tile an expert for the rounding
    mtiles = e.div(e.add(A["dim_m"], c(BM - 1)), c(BM))
    if g.sched == "varlen_m":
        mtiles = e.add(mtiles, A["num_experts"])
        total = e.mul(mtiles, ntiles)
    else:
        total = e.mul(e.mul(mtiles, ntiles), A["num_experts"])

    # ---- shared memory -----------------------------------------------------
    # The 128B swizzle written by the copies below is relative to the tile base,
    # and wgmma reads it by address: tiles must start 1024-aligned. The launch
    # asks for 1 KiB more than it uses and the ring starts at the first
    # 1024-aligned byte, whatever alignment the dynamic buffer gets (docs/gpu-kernels.md,
    # pitfall P6).
    smem = e.op(f"gpu.dynamic_shared_memory : {SMEM}", "smem")
    raw_idx = e.op(f"memref.extract_aligned_pointer_as_index {smem} : {SMEM} -> index")
    pad = e.rem(e.sub(c(1024), e.rem(raw_idx, c(1024))), c(1024))
    sview = e.op(f"memref.view {smem}[{pad}][{c(g.ring_bytes // 2)}] : {SMEM} to {SBF16}", "sb")
    sbase_idx = e.op(f"memref.extract_aligned_pointer_as_index {sview} : {SBF16} -> index")
    sbase = e.op(f"arith.index_cast {sbase_idx} : index to i64")

    def desc(addr, const):
        mask = c(0x3FFFF, "i64")
        masked = e.op(f"arith.andi {addr}, {mask} : i64")
        field = e.op(f"arith.shrui {masked}, {c(4, 'i64')} : i64")
        return e.op(f"arith.ori {field}, {c(const, 'i64')} : i64")

    # ---- per-thread copy assignments (the same for every tile) --------------
    # The copies are made by all 256 threads, or with warp specialisation by the
    # producer warpgroup's 128 (ctid = tid - 256; the consumers never use these).
    ncopy = 128 if g.ws else GEMM_THREADS
    ctid = e.sub(tid, c(GEMM_THREADS)) if g.ws else tid
    # K-major tile (A: 128 rows, B w_k: 256 rows) x 8 chunks of 16 B; thread t
    # copies chunk t%8 of rows t/8 + RS_K i. The 128B swizzle puts chunk c of row
    # r at c ^ (r % 8); r % 8 = (t/8) % 8 for every i.
    RS_K, RS_A, RS_B = ncopy // 8, ncopy // 16, ncopy // 32
    kchunk = e.rem(ctid, c(8))
    krow = e.div(ctid, c(8))
    kswz = e.xor(kchunk, e.rem(krow, c(8)))
    k_soff = e.add(e.mul(krow, c(64)), e.mul(kswz, c(8)))
    # MN-major tile (B rows_mn): 64 K-rows x 4 boxes of 64 columns x 8 chunks;
    # thread t copies chunk t%32 (box (t%32)/8) of K-rows t/32 + RS_B i. With 128
    # copying threads RS_B = 4, so the swizzle of odd i differs from even i.
    mchunk = e.rem(ctid, c(32))
    mbox = e.div(mchunk, c(8))
    mcc = e.rem(mchunk, c(8))
    mrow = e.div(ctid, c(32))

    def m_soff(first_row):
        row = e.add(mrow, c(first_row))
        swz = e.xor(mcc, e.rem(row, c(8)))
        return e.add(e.add(e.mul(mbox, c(4096)), e.mul(row, c(64))), e.mul(swz, c(8)))

    # MN-major A tile (mn): 64 K-rows x 2 boxes of 64 columns x 8 chunks; thread t
    # copies chunk t%16 (box (t%16)/8) of K-rows t/16 + RS_A i.
    achunk = e.rem(ctid, c(16))
    abox = e.div(achunk, c(8))
    acc8 = e.rem(ctid, c(8))
    arow = e.div(ctid, c(16))
    a_soff_mn = e.add(
        e.add(e.mul(abox, c(4096)), e.mul(arow, c(64))), e.mul(e.xor(acc8, e.rem(arow, c(8))), c(8))
    )

    # The copies go through raw pointers with 32-bit K arithmetic. With two warps a
    # scheduler and 128 accumulator registers a thread, the k-loop is bound by the
    # instructions it issues: index (i64) math, a 64-bit multiply per gathered row and
    # a division for the ring slot made the weight-gradient k-step take twice the
    # wgmma time (Nsight Compute: 380 instructions a warp a k-step, stalls on IMAD).
    def i32(v):
        return e.op(f"arith.index_cast {v} : index to i32")

    def i64(v):
        return e.op(f"arith.index_cast {v} : index to i64")

    def gptr(mem, ty):
        a = e.op(f"memref.extract_aligned_pointer_as_index {mem} : {ty} -> index")
        p = e.op(f"llvm.inttoptr {i64(a)} : i64 to !llvm.ptr")
        return e.op(f"llvm.addrspacecast {p} : !llvm.ptr to {P1}")

    def gep1(p, off):
        return e.op(f"llvm.getelementptr {p}[{off}] : ({P1}, i64) -> {P1}, i8")

    def gep3(p, off):
        return e.op(f"llvm.getelementptr {p}[{off}] : ({P3}, i32) -> {P3}, i8")

    def zext(v):
        return e.op(f"arith.extui {v} : i32 to i64")

    def wide(a, b):
        """u32 x u32 -> u64, one IMAD.WIDE.U32 (LLVM keeps a full 64-bit multiply)."""
        return e.op(
            f'llvm.inline_asm "mul.wide.u32 $0, $1, $2;", "=l,r,r" {a}, {b} : (i32, i32) -> i64'
        )

    def cp_async(dst, src, size):
        e.emit(
            f"nvvm.cp.async.shared.global {dst}, {src}, 16, cache = cg, {size} : {P3}, {P1}, i32"
        )

    def guarded_load_i32(cond, ptr):
        """*ptr if cond else 0, without touching ptr otherwise (the ids may be empty)."""
        out = e.fresh("gl")
        e.emit(f"{out} = scf.if {cond} -> (i32) {{")
        e.emit(f"  {out}v = llvm.load {ptr} : {P1} -> i32")
        e.emit(f"  scf.yield {out}v : i32")
        e.emit("} else {")
        e.emit(f"  scf.yield {c(0, I32)} : i32")
        e.emit("}")
        return out

    aptr = gptr(A["amat"], "memref<?xbf16>")
    if not g.tma_b:
        bptr = gptr(A["bmat"], "memref<?xbf16>")
    if g.a == "gather" or g.gather_a:
        idsptr = gptr(A["ids"], "memref<?xi32>")
    if g.b == "rows_mn" and g.gather_b:
        bidsptr = gptr(A["bids"], "memref<?xi32>")
    sptr = e.op(f"llvm.inttoptr {sbase} : i64 to {P3}")
    lda2 = e.mul(i32(A["lda"]), c(2, I32), I32)
    if not g.tma_b:
        ldb2 = e.mul(i32(A["ldb"]), c(2, I32), I32)
    dimk32 = i32(A["dim_k"])
    kchunk8 = i32(e.mul(kchunk, c(8)))
    mrow32 = i32(mrow)
    # this thread's destinations in ring slot 0
    a_dst0 = gep3(sptr, i32(e.mul(a_soff_mn if g.a == "mn" else k_soff, c(2))))
    if g.a == "mn":
        arow32 = i32(arow)
        a_step = wide(c(RS_A, I32), lda2)  # K-rows RS_A apart
    if g.tma_b:
        # the B tile of ring slot 0; the TMA boxes write the same 128B-swizzled image
        # as the copies: 64-column boxes 8 KiB apart (MN-major), or one box of 256
        # K-major rows
        b_tile0 = gep3(sptr, c(A_TILE_BYTES, I32))
    else:
        # rows_mn: this thread's chunk of K-rows mrow + RS_B i (two swizzles if RS_B = 4)
        b_dst0 = [
            gep3(sptr, e.add(i32(e.mul(m_soff(p * RS_B), c(2))), c(A_TILE_BYTES, I32), I32))
            for p in range(1 if RS_B % 8 == 0 else 8 // RS_B)
        ]
    if g.tma_b or g.ws:
        bars = gep3(sptr, c(g.bar_offset, I32))  # full[s] at bars + 8 s, empty[s] after

        def full_bar(slot32):
            return gep3(bars, e.mul(slot32, c(8, I32), I32))

        def empty_bar(slot32):
            return gep3(bars, e.mul(e.add(slot32, c(stages, I32), I32), c(8, I32), I32))

        if g.dynamic:
            sched = gep3(sptr, c(g.sched_offset, I32))

            def sched_word(base, j):
                """the i32 (base 0: ids, 8: next) or mbarrier (16: full, 32: empty) at
                entry j (an i32) of the tile ring"""
                return gep3(
                    sched, e.add(c(base, I32), e.mul(j, c(8 if base >= 16 else 4, I32), I32), I32)
                )

            def tile_full(j):
                return sched_word(16, j)

            def tile_empty(j):
                return sched_word(32, j)

        # the thread that arms full[s] and issues the TMA boxes
        is_t0 = e.cmp("eq", tid, c(GEMM_THREADS if g.ws else 0))
        e.if_begin(e.cmp("eq", tid, c(0)))
        # full[s]: the TMA thread's arrive.expect_tx, and with warp specialisation one
        # arrival of each producer thread when its cp.async copies land; empty[s]:
        # lane 0 of each consumer warp once its wgmma have read the slot
        row_maps = [A[m] for m, on in (("amap", g.tma_rows_a), ("browmap", g.tma_rows_b)) if on]
        full_count = (ncopy if g.ws else 0) + (1 if g.tma_b or row_maps else 0)
        for st in range(stages):
            bar = e.op(f"llvm.getelementptr {bars}[{8 * st}] : ({P3}) -> {P3}, i8")
            e.emit(f"nvvm.mbarrier.init {bar}, {c(full_count, I32)} : {P3}, i32")
            if g.ws:
                bar = e.op(f"llvm.getelementptr {bars}[{8 * (stages + st)}] : ({P3}) -> {P3}, i8")
                e.emit(f"nvvm.mbarrier.init {bar}, {c(GEMM_THREADS // 32, I32)} : {P3}, i32")
        if g.dynamic:
            # tile_full[j]: the TMA thread's arrival with tile id j; tile_empty[j]: every
            # consumer thread's once it has read it
            for j in range(2):
                e.emit(f"nvvm.mbarrier.init {tile_full(c(j, I32))}, {c(1, I32)} : {P3}, i32")
                e.emit(
                    f"nvvm.mbarrier.init {tile_empty(c(j, I32))}, {c(GEMM_THREADS, I32)} : {P3}, i32"
                )
        # the barriers' initial state, visible to the TMA unit (async proxy)
        e.emit("nvvm.fence.mbarrier.init")
        # (not the row maps: with no rows they are null, and no k-step reads them)
        if g.tma_b:
            e.emit(f"nvvm.prefetch tensormap, {A['bmap']} : !llvm.ptr")
        e.if_end()
        e.emit("gpu.barrier")
    # wgmma descriptors of ring slot 0, k-step 0: a slot or a k-step moves only the
    # start-address field (address / 16; shared addresses stay below 2^18)
    b_desc_const = DESC_KMAJOR if g.b == "w_k" else DESC_MNMAJOR
    wg64 = e.op(f"arith.index_cast {wg} : index to i64")
    # warpgroup wg multiplies rows [64 wg, 64 wg + 64) of the A tile: 64 K-major rows,
    # or MN-major box wg
    a_desc_const = DESC_MNMAJOR if g.a == "mn" else DESC_KMAJOR
    desc_a0 = desc(e.add(sbase, e.mul(wg64, c(64 * 128, "i64"), "i64"), "i64"), a_desc_const)
    desc_b0 = desc(e.add(sbase, c(A_TILE_BYTES, "i64"), "i64"), b_desc_const)

    SI = f"memref<?xi32, {WG}>"
    if g.sched == "varlen_m":
        cumv = e.op(
            f"memref.view {smem}[{e.add(pad, c(g.cum_offset))}][{c(TABLE_EXPERTS + 9)}] : {SMEM} to {SI}",
            "cumv",
        )
        use_table = e.cmp("ule", A["num_experts"], c(TABLE_EXPERTS))
        e.emit(f"scf.if {use_table} {{")
        e.indent += "  "
        if g.ws:
            # the consumer warpgroups build it (a thread sums 4 experts) and
            # synchronise on barrier 1; the gpu.barrier below publishes it to all
            e.if_begin(e.cmp("ult", tid, c(GEMM_THREADS)))
            build_tile_table(e, A, cumv, tid, consumer_barrier)
            e.if_end()
        else:
            build_tile_table(e, A, cumv, tid, lambda: e.emit("gpu.barrier"))
        e.indent = e.indent[:-2]
        e.emit("}")
        if g.ws:
            e.emit("gpu.barrier")

    def setup(t):
        """Tile t of the schedule, as straight-line code: every index is clamped so a
        tile past the end (or an M-tile no expert owns) is valid=false with numk = 0."""
        S = {}
        # The raster in i32: a tile count fits (a layer that fits the GPU's memory has
        # at most a few million tiles), and 64-bit divisions are calls of about 40
        # instructions each, twice a tile.
        t32 = i32(t)
        mt32, nt32 = i32(mtiles), i32(ntiles)
        if g.sched == "varlen_m":
            inner_all = t32
        else:
            # (at least 1: with no tiles at all, the tile before the loop still divides)
            per = e.op(f"arith.maxui {e.mul(mt32, nt32, I32)}, {c(1, I32)} : i32")
            inner_all = e.rem(t32, per, I32)
        # Grouped raster: GROUP_M M-tiles by all N-tiles, the M-tile fastest inside a
        # group, so the CTAs on the GPU at one time cover GROUP_M M-tiles by a few
        # N-tiles and share their A rows and B columns in L2; a plain M-fastest order
        # re-read the activations from DRAM once per N-tile.
        span = e.op(f"arith.maxui {e.mul(nt32, c(GROUP_M, I32), I32)}, {c(GROUP_M, I32)} : i32")
        first_m = e.mul(e.div(inner_all, span, I32), c(GROUP_M, I32), I32)
        gsize = e.op(
            f"arith.maxui {e.minu(c(GROUP_M, I32), e.sub(mt32, first_m, I32), I32)}, {c(1, I32)} : i32"
        )
        inner = e.rem(inner_all, span, I32)
        bx = e.op(
            f"arith.index_castui {e.add(first_m, e.rem(inner, gsize, I32), I32)} : i32 to index"
        )
        by = e.op(f"arith.index_castui {e.div(inner, gsize, I32)} : i32 to index")
        S["by"] = by
        if g.sched == "varlen_m":
            # the expert whose tiles contain M-tile bx (-1 if none) and its first tile
            found_e = e.fresh("fnd")
            e.emit(f"{found_e}:2 = scf.if {use_table} -> (index, index) {{")
            e.indent += "  "
            lo, hi = c(0), A["num_experts"]
            for _ in range(10):  # TABLE_EXPERTS = 2^10
                mid = e.div(e.add(lo, hi), c(2))
                le = e.cmp("ule", e.load_smem_index(cumv, mid), bx)
                lo, hi = e.select(le, mid, lo), e.select(le, hi, mid)
            inside = e.cmp("ult", bx, e.load_smem_index(cumv, A["num_experts"]))
            e.emit(
                f"scf.yield {e.select(inside, lo, c(-1))}, {e.load_smem_index(cumv, lo)} : index, index"
            )
            e.indent = e.indent[:-2]
            e.emit("} else {")
            e.indent += "  "
            res, ex, cum, fe, fcum = (e.fresh(h) for h in ("sched", "ex", "cum", "fe", "fcum"))
            e.emit(
                f"{res}:3 = scf.for {ex} = {c(0)} to {A['num_experts']} step {c(1)} "
                f"iter_args({cum} = {c(0)}, {fe} = {c(-1)}, {fcum} = {c(0)}) -> (index, index, index) {{"
            )
            e.indent += "  "
            lo = e.load_i32_as_index(A["offsets"], ex)
            hi = e.load_i32_as_index(A["offsets"], e.add(ex, c(1)))
            tiles = e.div(e.add(e.sub(hi, lo), c(BM - 1)), c(BM))
            ncum = e.add(cum, tiles)
            hit = e.op(f"arith.andi {e.cmp('uge', bx, cum)}, {e.cmp('ult', bx, ncum)} : i1")
            e.emit(
                f"scf.yield {ncum}, {e.select(hit, ex, fe)}, {e.select(hit, cum, fcum)} : index, index, index"
            )
            e.indent = e.indent[:-2]
            e.emit("}")
            e.emit(f"scf.yield {res}#1, {res}#2 : index, index")
            e.indent = e.indent[:-2]
            e.emit("}")
            valid = e.cmp("sge", f"{found_e}#0", c(0))
            expert = e.select(valid, f"{found_e}#0", c(0))
            elo = e.load_i32_as_index(A["offsets"], expert)
            ehi = e.load_i32_as_index(A["offsets"], e.add(expert, c(1)))
            S["m0"] = e.add(elo, e.mul(e.sub(bx, f"{found_e}#1"), c(BM)))
            S["m_end"] = e.select(valid, ehi, c(0))
            S["n0"] = e.mul(by, c(bn_eff))
            S["numk"] = e.select(valid, e.div(e.add(A["dim_k"], c(BK - 1)), c(BK)), c(0))
        else:
            valid = e.cmp("ult", t, total)
            expert = e.select(
                valid, e.op(f"arith.index_castui {e.div(t32, per, I32)} : i32 to index"), c(0)
            )
            S["m0"] = e.mul(bx, c(BM))
            S["m_end"] = A["dim_m"]
            S["n0"] = e.mul(by, c(BN))
            elo = e.load_i32_as_index(A["offsets"], expert)
            ehi = e.load_i32_as_index(A["offsets"], e.add(expert, c(1)))
            S["kcount"] = e.sub(ehi, elo)
            S["numk"] = e.select(valid, e.div(e.add(S["kcount"], c(BK - 1)), c(BK)), c(0))
        S["valid"], S["expert"], S["elo"] = valid, expert, elo
        m0, m_end = S["m0"], S["m_end"]
        # A rows of this thread: a pointer to its first chunk, and validity
        if g.a == "mn":
            # columns m0 + 64 box + 8 chunk of the expert's K-rows off + t/16 + ...
            S["kcnt"] = i32(e.select(valid, S["kcount"], c(0)))
            acol = e.add(m0, e.add(e.mul(abox, c(64)), e.mul(acc8, c(8))))
            S["acol_ok"] = e.cmp("ult", acol, A["dim_m"])
            acol = e.select(S["acol_ok"], acol, c(0))
            if g.gather_a:
                # the rows come per stage (load_rows)
                S["a_ptr"] = gep1(aptr, e.mul(i64(acol), c(2, "i64"), "i64"))
                S["ids_a"] = gep1(idsptr, e.mul(i64(elo), c(4, "i64"), "i64"))  # the expert's first
            else:
                first = e.add(e.mul(e.add(elo, arow), A["lda"]), acol)
                S["a_ptr"] = gep1(aptr, e.mul(i64(first), c(2, "i64"), "i64"))
        else:
            col_bytes = zext(e.mul(kchunk8, c(2, I32), I32))
            S["a_rows"] = []
            for i in range(BM // RS_K):
                r = e.add(m0, e.add(krow, c(RS_K * i)))
                ok = e.op(f"arith.andi {e.cmp('ult', r, m_end)}, {valid} : i1")
                if g.a == "gather":
                    src = guarded_load_i32(ok, gep1(idsptr, e.mul(i64(r), c(4, "i64"), "i64")))
                else:
                    src = i32(e.select(ok, r, c(0)))
                S["a_rows"].append((gep1(gep1(aptr, wide(src, lda2)), col_bytes), ok))
        n0 = S["n0"]
        if g.tma_b:
            # TMA coordinates of the tile's boxes (innermost first, as the map's dims)
            S["n0_32"], S["e32"] = i32(n0), i32(expert)
        if g.b == "rows_mn":
            bcol = e.add(n0, e.add(e.mul(mbox, c(64)), e.mul(mcc, c(8))))
            S["bcol_ok"] = e.cmp("ult", bcol, A["dim_n"])
            S["bcol"] = e.select(S["bcol_ok"], bcol, c(0))
            # column bcol of the expert's rows; the rows come per stage (load_rows)
            S["b_ptr"] = gep1(bptr, e.mul(i64(S["bcol"]), c(2, "i64"), "i64"))
            S["kcnt"] = i32(e.select(valid, S["kcount"], c(0)))
            if g.gather_b:
                S["ids_b"] = gep1(
                    bidsptr, e.mul(i64(S["elo"]), c(4, "i64"), "i64")
                )  # the expert's first
            else:
                S["brow0"] = e.add(i32(S["elo"]), mrow32, I32)
        return S

    # Warp specialisation: a gathered operand's token ids of a k-step are loaded one a
    # lane (16 lanes a warp) a k-step ahead, carried in a register and spread with
    # shuffles. Loading them in the step that used them left their latency in every
    # k-step (Nsight Compute, mixtral's dW_gate_up: the producer stalled on the id, the
    # consumers waited for full[s] in 30% of the samples).
    if g.ws and g.sched == "varlen_k" and (g.gather_a or g.gather_b):
        pwarp, plane = e.div(ctid, c(32)), lane
        id_lane_ok = e.cmp("ult", plane, c(16))
        if g.gather_a:
            # warp w copies K-rows 2w + lane/16 + RS_A i; lane j loads row 2w + j%2 + 8 (j/2)
            assert RS_A == 8
            id_row_a = i32(
                e.add(
                    e.add(e.mul(pwarp, c(2)), e.rem(plane, c(2))),
                    e.mul(e.div(plane, c(2)), c(RS_A)),
                )
            )
        if g.gather_b:
            # warp w copies K-rows w + RS_B i; lane j loads row w + RS_B j
            assert RS_B == 4
            id_row_b = i32(e.add(pwarp, e.mul(plane, c(RS_B))))

    def lane_ids_at(pick):
        """The ids this lane loads, one a gathered operand (0 where none): pick(name) gives
        (pointer to the expert's first id, ids left there) of the k-step to load."""
        ids = []
        for name in ("a", "b"):
            if not (g.gather_a if name == "a" else g.gather_b):
                continue
            row = id_row_a if name == "a" else id_row_b
            ptr, left = pick(name)
            ok = e.op(f"arith.andi {id_lane_ok}, {e.cmp('sgt', left, row, I32)} : i1")
            ids.append(guarded_load_i32(ok, gep1(ptr, zext(e.mul(row, c(4, I32), I32)))))
        return ids

    def load_rows(S, kt, lane_ids=None):
        """Source rows of the gathered A and B tiles of k-tile kt, as (row, valid) lists:
        the token ids loaded here, a stage early so their latency hides behind the wgmma
        of the current stage, or (warp specialisation) spread by shuffles from the ids the
        lanes loaded a k-step before (`lane_ids`, from lane_ids_at)."""
        rows = {}
        k0 = e.mul(i32(kt), c(BK, I32), I32)
        held = dict(
            zip([n for n, on in (("a", g.gather_a), ("b", g.gather_b)) if on], lane_ids or [])
        )

        def gathered_rows(name, row0, step, kleft, lane_of):
            """(row, valid) of K-rows row0 + step i: each loaded (valid ones only), or taken
            from lane lane_of(i), which loaded it."""
            out = []
            if lane_ids is None:
                stage_ids = gep1(
                    S["ids_" + name], zext(e.mul(e.add(k0, row0, I32), c(4, I32), I32))
                )
            for i in range(64 // step):
                kok = e.cmp("sgt", kleft, c(step * i, I32), I32)
                if lane_ids is None:
                    p = e.op(f"llvm.getelementptr {stage_ids}[{4 * step * i}] : ({P1}) -> {P1}, i8")
                    out.append((guarded_load_i32(kok, p), kok))
                else:
                    row = e.fresh("id" + name)
                    e.emit(
                        f"{row}, {row}ok = gpu.shuffle idx {held[name]}, {lane_of(i)}, {c(32, I32)} : i32"
                    )
                    out.append((row, kok))
            return out

        if g.gather_a:
            # K-rows k0 + t/16 + RS_A i; past the expert's end there is no token id
            kleft = e.sub(e.sub(S["kcnt"], k0, I32), arow32, I32)
            half = i32(e.div(lane, c(16))) if lane_ids is not None else None
            rows["a"] = gathered_rows(
                "a", arow32, RS_A, kleft, lambda i: e.add(c(2 * i, I32), half, I32)
            )
        if g.b == "rows_mn":
            kleft = e.sub(e.sub(S["kcnt"], k0, I32), mrow32, I32)
            if g.gather_b:
                # only rows of the expert: past its end (an empty last expert, T = 0)
                # there is no token id to read
                rows["b"] = gathered_rows("b", mrow32, RS_B, kleft, lambda i: c(i, I32))
            else:
                rows["b"] = []
                for i in range(64 // RS_B):
                    kok = e.cmp("sgt", kleft, c(RS_B * i, I32), I32)
                    rows["b"].append(
                        (e.add(e.add(S["brow0"], k0, I32), c(RS_B * i, I32), I32), kok)
                    )
        return rows

    def rows_by_tma(S, k0, slot, slot_bytes):
        """MOE_GEMM_ROWS_TMA: the TMA thread loads the expert's rows [k0, k0 + 64) of the
        non-gathered operand as 64x64 boxes (the image the copies write) when the k-step
        is whole, and only arrives when it is not. Returns `partial`, the condition under
        which the caller copies the operand by cp.async instead."""
        full = e.cmp("sge", e.sub(S["kcnt"], k0, I32), c(BK, I32), I32)
        if_begin(is_t0)
        bar = full_bar(i32(slot))

        def load_boxes():
            tx = (A_TILE_BYTES if g.tma_rows_a else 0) + (B_TILE_BYTES if g.tma_rows_b else 0)
            # the slot may last have been written by cp.async (generic proxy); the boxes
            # write it through the async proxy
            e.emit(
                "nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}"
            )
            e.emit(f"nvvm.mbarrier.arrive.expect_tx {bar}, {c(tx, I32)} : {P3}, i32")
            row = e.add(i32(S["elo"]), k0, I32)
            boxes = []
            if g.tma_rows_a:  # A: 128 columns m0 + 64 j, MN-major
                boxes += [
                    (A["amap"], e.add(i32(S["m0"]), c(64 * j, I32), I32), j * 64 * 64 * 2)
                    for j in range(2)
                ]
            if g.tma_rows_b:  # B: 256 columns n0 + 64 j
                boxes += [
                    (
                        A["browmap"],
                        e.add(i32(S["n0"]), c(64 * j, I32), I32),
                        A_TILE_BYTES + j * 64 * 64 * 2,
                    )
                    for j in range(4)
                ]
            for tmap, col, off in boxes:
                dst = gep3(sptr, e.add(slot_bytes, c(off, I32), I32))
                dst7 = e.op(f"llvm.addrspacecast {dst} : {P3} to !llvm.ptr<7>")
                e.emit(
                    f"nvvm.cp.async.bulk.tensor.shared.cluster.global {dst7}, {tmap}, {bar}, "
                    f"box[{col}, {row}] : !llvm.ptr<7>, !llvm.ptr"
                )

        e.if_else(full, load_boxes, lambda: e.emit(f"nvvm.mbarrier.arrive {bar} : {P3}"))
        if_end()
        return e.cmp("slt", e.sub(S["kcnt"], k0, I32), c(BK, I32), I32)

    def issue_stage(S, kt, slot, enabled, srcs=None):
        """The loads of k-tile kt into ring slot `slot` (both index values): cp.async
        copies of A (and of token-row B), TMA boxes of weight B."""
        if srcs is None:
            srcs = load_rows(S, kt)
        k0 = e.mul(i32(kt), c(BK, I32), I32)
        slot_bytes = e.mul(i32(slot), c(STAGE_BYTES, I32), I32)
        koff = zext(e.mul(k0, c(2, I32), I32))
        adst = gep3(a_dst0, slot_bytes)
        partial = None
        if g.tma_rows_a or g.tma_rows_b:
            partial = rows_by_tma(S, k0, slot, slot_bytes)
        if g.tma_rows_a:
            if_begin(partial)
        if g.a == "mn":
            # K-rows k0 + t/16 + RS_A i of the expert; those past its end copy nothing
            kleft = e.sub(e.sub(S["kcnt"], k0, I32), arow32, I32)
            on = e.op(f"arith.andi {S['acol_ok']}, {enabled} : i1")
            abytes = e.select(on, c(16, I32), c(0, I32), I32)
            if not g.gather_a:
                src = gep1(S["a_ptr"], wide(k0, lda2))
            for i in range(64 // RS_A):
                if g.gather_a:
                    row, kok = srcs["a"][i]
                    src = gep1(S["a_ptr"], wide(row, lda2))
                else:
                    if i:
                        src = gep1(src, a_step)
                    kok = e.cmp("sgt", kleft, c(RS_A * i, I32), I32)
                dst = e.op(f"llvm.getelementptr {adst}[{i * RS_A * 128}] : ({P3}) -> {P3}, i8")
                cp_async(dst, src, e.select(kok, abytes, c(0, I32), I32))
            if g.tma_rows_a:
                if_end()
        else:
            # the K columns left past this thread's chunk, as bytes to copy (0-16)
            krem = e.sub(e.sub(dimk32, k0, I32), kchunk8, I32)
            kv = e.select(
                e.cmp("slt", krem, c(8, I32), I32), e.maxs(krem, c(0, I32), I32), c(8, I32), I32
            )
            kbytes = e.select(enabled, e.mul(kv, c(2, I32), I32), c(0, I32), I32)
            for i, (row, ok) in enumerate(S["a_rows"]):
                dst = e.op(f"llvm.getelementptr {adst}[{i * RS_K * 128}] : ({P3}) -> {P3}, i8")
                cp_async(dst, gep1(row, koff), e.select(ok, kbytes, c(0, I32), I32))
        # B
        if g.tma_b:
            on = e.op(f"arith.andi {is_t0}, {enabled} : i1")
            if_begin(on)
            bar = full_bar(i32(slot))
            e.emit(f"nvvm.mbarrier.arrive.expect_tx {bar}, {c(B_TILE_BYTES, I32)} : {P3}, i32")
            btile = gep3(b_tile0, slot_bytes)
            n0, ex = S["n0_32"], S["e32"]
            if g.b == "w_k":
                boxes = [[k0, n0, ex]]  # W [E][N][K]: 256 rows of 64 K
            elif g.b == "w_mn":
                # W [E][K][N]: columns n0 + 64 j of K-rows k0 + [0, 64)
                boxes = [[e.add(n0, c(64 * j, I32), I32), k0, ex] for j in range(4)]
            else:
                # W [E][K][2][h]: gate (0) and up (1) columns n0 + 64 j; columns past h
                # are zero-filled
                boxes = [
                    [e.add(n0, c(64 * (j % 2), I32), I32), c(j // 2, I32), k0, ex] for j in range(4)
                ]
            for j, coords in enumerate(boxes):
                dst = (
                    e.op(f"llvm.getelementptr {btile}[{j * 64 * 64 * 2}] : ({P3}) -> {P3}, i8")
                    if j
                    else btile
                )
                # a CTA's shared memory is its own window of shared::cluster
                dst7 = e.op(f"llvm.addrspacecast {dst} : {P3} to !llvm.ptr<7>")
                e.emit(
                    f"nvvm.cp.async.bulk.tensor.shared.cluster.global {dst7}, {A['bmap']}, {bar}, "
                    f"box[{', '.join(coords)}] : !llvm.ptr<7>, !llvm.ptr"
                )
            if_end()
        else:
            if g.tma_rows_b:
                if_begin(partial)
            bdst = [gep3(b, slot_bytes) for b in b_dst0]
            on = e.op(f"arith.andi {S['bcol_ok']}, {enabled} : i1")
            bbytes = e.select(on, c(16, I32), c(0, I32), I32)
            for i in range(64 // RS_B):
                row, kok = srcs["b"][i]
                src = gep1(S["b_ptr"], wide(row, ldb2))
                p = i % len(bdst)
                dst = e.op(
                    f"llvm.getelementptr {bdst[p]}[{(i - p) * RS_B * 128}] : ({P3}) -> {P3}, i8"
                )
                cp_async(dst, src, e.select(kok, bbytes, c(0, I32), I32))
            if g.tma_rows_b:
                if_end()
        if g.ws:
            # full[slot] gets this thread's arrival when its copies have landed
            e.emit(f"nvvm.cp.async.mbarrier.arrive {full_bar(i32(slot))} {{noinc = true}} : {P3}")
        else:
            e.emit("nvvm.cp.async.commit.group")

    def prologue(S):
        for s in range(stages - 1):
            issue_stage(S, c(s), c(s), e.cmp("ult", c(s), S["numk"]))

    def wgmma_stage(acc, rs, count=4, pending=1):
        """The first `count` of the 4 wgmma of ring slot rs (16 K-rows each) on acc,
        committed; waits until only `pending` groups are in flight (1: this one, so the
        slot of the step before may be refilled)."""
        a_layout = "col" if g.a == "mn" else "row"
        b_layout = "col" if g.b == "w_k" else "row"
        soff = e.mul(i64(rs), c(STAGE_BYTES // 16, "i64"), "i64")
        da_s = e.add(desc_a0, soff, "i64")
        db_s = e.add(desc_b0, soff, "i64")
        e.emit("nvvm.wgmma.fence.aligned")
        for kk in range(count):
            aoff = kk * 128 if g.a == "mn" else kk * 2  # 16 K-rows of 128 B, or 32 B
            da = e.add(da_s, c(aoff, "i64"), "i64") if kk else da_s
            boff = kk * 2 if g.b == "w_k" else kk * 128  # 32 B or 16 K-rows of 128 B
            db = e.add(db_s, c(boff, "i64"), "i64") if kk else db_s
            acc = e.op(
                f"nvvm.wgmma.mma_async {da}, {db}, {acc}, <m = 64, n = {BN}, k = 16>, "
                f"D[<f32>, <one>, <wrapped>], A[<bf16>, <one>, <{a_layout}>], B[<bf16>, <one>, <{b_layout}>] : {ACC} -> {ACC}",
                "acc",
            )
        e.emit("nvvm.wgmma.commit.group.sync.aligned")
        e.emit(f"nvvm.wgmma.wait.group.sync.aligned {pending}")
        return acc

    def mainloop(S, phases):
        """The k-loop over the ring; returns the accumulator (wgmma still in flight)
        and the mbarrier phases after it. Bit s of `phases` is the parity of the next
        phase of full[s] to wait for: a slot is filled as often as it is waited on, so
        the bits carry from tile to tile."""
        acc0 = e.op(f"llvm.mlir.zero : {ACC}", "acc")
        res, kt, a0, rs, ph = (e.fresh(h) for h in ("kloop", "kt", "a", "rs", "ph"))
        # rs: the ring slot read this step (kt % stages), carried to avoid a division
        e.emit(
            f"{res}:3 = scf.for {kt} = {c(0)} to {S['numk']} step {c(1)} "
            f"iter_args({a0} = {acc0}, {rs} = {c(0)}, {ph} = {phases}) -> ({ACC}, index, i32) {{"
        )
        outer = e.indent
        e.indent = outer + "  "
        nk = e.add(kt, c(stages - 1))
        # k-tile nk goes to the slot read last step: (kt - 1) % stages
        ws = e.select(e.cmp("eq", rs, c(0)), c(stages - 1), e.sub(rs, c(1)))
        next_srcs = load_rows(S, nk)
        e.emit(f"nvvm.cp.async.wait.group {stages - 2}")
        e.emit(
            "nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}"
        )
        ph_next = ph
        if g.tma_b:
            rs32 = i32(rs)
            parity = e.op(
                f"arith.andi {e.op(f'arith.shrui {ph}, {rs32} : i32')}, {c(1, I32)} : i32"
            )
            bar = full_bar(rs32)
            e.emit(
                f"nvvm.mbarrier.try_wait.parity {bar}, {parity}, {c(0x989680, I32)} : {P3}, i32, i32"
            )
            ph_next = e.op(
                f"arith.xori {ph}, {e.op(f'arith.shli {c(1, I32)}, {rs32} : i32')} : i32"
            )
        e.emit("gpu.barrier")
        cur = wgmma_stage(a0, rs)
        e.emit("gpu.barrier")
        issue_stage(S, nk, ws, e.cmp("ult", nk, S["numk"]), next_srcs)
        rs_next = e.select(e.cmp("eq", rs, c(stages - 1)), c(0), e.add(rs, c(1)))
        e.emit(f"scf.yield {cur}, {rs_next}, {ph_next} : {ACC}, index, i32")
        e.indent = outer
        e.emit("}")
        e.emit("nvvm.wgmma.wait.group.sync.aligned 0")
        e.emit("nvvm.cp.async.wait.group 0")
        return f"{res}#0", f"{res}#2"

    if_begin, if_end = e.if_begin, e.if_end

    # Accumulator value v of warpgroup wg sits at row 64*wg + 16*(warp%4) +
    # lane/4 + 8*((v/2)%2) and column 8*(v/4) + 2*(lane%4) + v%2 of the tile.
    warp_row0 = e.add(e.mul(wg, c(64)), e.mul(e.rem(warp, c(4)), c(16)))  # the warp's 16 rows
    qrow = e.add(warp_row0, e.div(lane, c(4)))
    qcol = e.mul(e.rem(lane, c(4)), c(2))

    def out_base(S):
        """Where the tile's C block starts: expert e's [M, N] block of the weight
        gradients' [E, M, N] output, 0 for the others."""
        return e.mul(e.mul(S["expert"], A["dim_m"]), A["dim_n"]) if g.epi != "store_bf16" else c(0)

    def write_half(S, stage, h):
        """Half h of C from the staging buffer to global memory in 16-byte stores.
        A thread keeps one column group and walks rows 16 (SwiGLU: 32) apart, so its
        addresses are one pointer and a fixed step and its staging offsets constants:
        index math here cost a quarter of a small-K weight gradient's time (Nsight
        Compute, deepseek-v3)."""
        m0, n0, m_end = S["m0"], S["n0"], S["m_end"]
        base = h * BM * BN // 2

        def sload(idx):
            return e.op(
                f"vector.load {stage}[{idx}] {{alignment = 16}} : {SBF16}, vector<{V}xbf16>"
            )

        def gstore(vec, ptr, ok):
            if_begin(ok)
            e.emit(f"llvm.store {vec}, {ptr} {{alignment = 16 : i64}} : vector<{V}xbf16>, {P1}")
            if_end()

        def left(a, b):
            """a - b as i32 (negative when b is past a)"""
            return e.sub(i32(a), i32(b), I32)

        if g.epi == "swiglu":
            # rows tid/8 + 32 j, 16-byte group q = tid%8 of the 64 gate columns (and
            # group q + 8: the same up columns)
            half = A["dim_n"]
            q, lr0 = e.rem(tid, c(8)), e.div(tid, c(8))
            swz = e.rem(lr0, c(8))
            row0 = e.add(c(base), e.mul(lr0, c(BN // 2)))
            g_idx = e.add(row0, e.mul(e.xor(q, swz), c(V)))
            u_idx = e.add(row0, e.mul(e.xor(e.add(q, c(8)), swz), c(V)))
            col = e.add(n0, e.add(c(64 * h), e.mul(q, c(V))))
            col_ok = e.cmp("ult", col, half)
            r0 = e.add(m0, lr0)
            mleft = left(m_end, r0)
            half2 = e.mul(i32(half), c(2, I32), I32)
            hp = gep1(
                hout_ptr, e.mul(i64(e.add(e.mul(r0, e.mul(half, c(2))), col)), c(2, "i64"), "i64")
            )
            if g.store_a:
                ap = gep1(aout_ptr, e.mul(i64(e.add(e.mul(r0, half), col)), c(2, "i64"), "i64"))
            h_step = wide(c(32, I32), e.mul(half2, c(2, I32), I32))
            a_step = wide(c(32, I32), half2)
            up_off = zext(half2)
            for j in range(BM * (BN // 4) // V // GEMM_THREADS):
                if j:
                    hp = gep1(hp, h_step)
                    if g.store_a:
                        ap = gep1(ap, a_step)
                gv = sload(e.add(g_idx, c(j * 32 * (BN // 2))))
                uv = sload(e.add(u_idx, c(j * 32 * (BN // 2))))
                ok = e.op(f"arith.andi {col_ok}, {e.cmp('sgt', mleft, c(32 * j, I32), I32)} : i1")
                if_begin(ok)
                e.emit(f"llvm.store {gv}, {hp} {{alignment = 16 : i64}} : vector<{V}xbf16>, {P1}")
                e.emit(
                    f"llvm.store {uv}, {gep1(hp, up_off)} {{alignment = 16 : i64}} : vector<{V}xbf16>, {P1}"
                )
                if g.store_a:
                    # a = silu(g) * u from the bf16-rounded h, as backward sees it
                    avals = []
                    for u in range(V):
                        g32 = e.op(
                            f"arith.extf {e.op(f'vector.extract {gv}[{u}] : bf16 from vector<{V}xbf16>')} : bf16 to f32"
                        )
                        u32 = e.op(
                            f"arith.extf {e.op(f'vector.extract {uv}[{u}] : bf16 from vector<{V}xbf16>')} : bf16 to f32"
                        )
                        _, silu = silu_parts(e, g32)
                        avals.append(e.op(f"arith.truncf {e.fmul(silu, u32)} : f32 to bf16"))
                    av = e.op(f"vector.from_elements {', '.join(avals)} : vector<{V}xbf16>")
                    e.emit(
                        f"llvm.store {av}, {ap} {{alignment = 16 : i64}} : vector<{V}xbf16>, {P1}"
                    )
                if_end()
            return
        obase = out_base(S)
        q, l0 = e.rem(tid, c(16)), e.div(tid, c(16))
        step = wide(c(16, I32), e.mul(i32(A["ldc"]), c(2, I32), I32))
        # 16-byte group q of row l0 + 16 j
        sidx = e.add(e.add(c(base), e.mul(l0, c(BN // 2))), e.mul(e.xor(q, e.rem(l0, c(8))), c(V)))
        col = e.add(n0, e.add(c(128 * h), e.mul(q, c(V))))
        col_ok = e.cmp("ult", col, A["dim_n"])
        r0 = e.add(m0, l0)
        mleft = left(m_end, r0)
        first = e.add(obase, e.add(e.mul(r0, A["ldc"]), col))
        # M, N and the varlen ends are multiples of 8 here, so a group is all in or out
        ptr = gep1(cout_ptr, e.mul(i64(first), c(2, "i64"), "i64"))
        for j in range(BM * (BN // 2) // V // GEMM_THREADS):
            if j:
                ptr = gep1(ptr, step)
            vec = sload(e.add(sidx, c(j * 16 * (BN // 2))))
            ok = e.op(f"arith.andi {col_ok}, {e.cmp('sgt', mleft, c(16 * j, I32), I32)} : i1")
            gstore(vec, ptr, ok)

    def packed_bf16x2(acc, v):
        """Accumulator values v and v + 1 as two bf16 in an i32, an stmatrix register."""
        lo = e.op(f"llvm.extractvalue {acc}[{v}] : {ACC}", "f")
        hi = e.op(f"llvm.extractvalue {acc}[{v + 1}] : {ACC}", "f")
        pair = e.op(f"vector.from_elements {lo}, {hi} : vector<2xf32>")
        bf = e.op(f"arith.truncf {pair} : vector<2xf32> to vector<2xbf16>")
        return e.op(f"llvm.bitcast {bf} : vector<2xbf16> to i32")

    def stmatrix_tile(acc, place):
        """The warp's 16 rows of C into shared memory, two column groups of both 8-row
        halves an stmatrix.x4. The accumulator fragment is stmatrix's: lane l holds row l/4,
        columns 2 (l%4) + [0, 2) of each 8x8 matrix, and gives the address of row l%8 of
        matrix l/8 (matrices: rows 0-7 and 8-15 of group j, then of group j + 1).
        place(row), given the tile row of this lane's address, returns dst(j): where that
        row's groups j and j + 1 go."""
        row = e.add(
            warp_row0, e.add(e.mul(e.rem(e.div(lane, c(8)), c(2)), c(8)), e.rem(lane, c(8)))
        )
        dst_of = place(row)
        for j in range(0, BN // V, 2):
            regs = [packed_bf16x2(acc, 4 * j + 2 * q) for q in range(4)]
            e.emit(
                f"nvvm.stmatrix {dst_of(j)}, {', '.join(regs)} {{layout = #nvvm.mma_layout<row>, "
                "shape = #nvvm.ld_st_matrix_shape<m = 8, n = 8>, "
                f"eltType = #nvvm.ld_st_matrix_elt_type<b16>}} : {P3}, i32, i32, i32, i32"
            )

    def stage_rows_stmatrix(stage_ptr, acc):
        """MOE_GEMM_BULK_STORE: C into the padded staging rows (BULK_ROW elements a row)."""

        def place(row):
            off = e.add(e.mul(row, c(BULK_ROW)), e.mul(e.div(lane, c(16)), c(V)))
            base = gep3(stage_ptr, i32(e.mul(off, c(2))))
            return lambda j: gep3(base, c(j * V * 2, I32)) if j else base

        stmatrix_tile(acc, place)

    def stage_boxes_stmatrix(stage_ptr, acc):
        """MOE_GEMM_TMA_STORE: C into four 128x64 boxes of 128-byte rows (box b: columns
        64 b + [0, 64), TMA_BOX_BYTES apart), 128B-swizzled as the TMA store reads them:
        16-byte group q of row r at q ^ (r % 8). Lane l's row is r % 8 = l % 8 and its group
        j + l / 16 with j even, so its swizzled group is (j % 8) ^ (l / 16 ^ l % 8): four
        offsets a lane."""

        def place(row):
            w = e.xor(e.div(lane, c(16)), e.rem(lane, c(8)))
            base = gep3(stage_ptr, i32(e.mul(row, c(128))))
            group_off = [i32(e.mul(e.xor(w, c(k)), c(16))) for k in (0, 2, 4, 6)]
            boxes = [gep3(base, c(b * TMA_BOX_BYTES, I32)) if b else base for b in range(BN // 64)]
            return lambda j: gep3(boxes[j // 8], group_off[(j % 8) // 2])

        stmatrix_tile(acc, place)

    def tma_store_boxes(S, stage_ptr):
        """MOE_GEMM_TMA_STORE: consumer thread 0 stores the four boxes to expert e's block
        of C (or to rows m0 + [0, 128) of the varlen-M GEMMs' C); the map clips rows past
        M and columns past N."""
        if_begin(e.cmp("eq", tid, c(0)))
        m0, n0 = i32(S["m0"]), i32(S["n0"])
        ex = [i32(S["expert"])] if g.tma_store else []
        for b in range(BN // 64):
            src = gep3(stage_ptr, c(b * TMA_BOX_BYTES, I32)) if b else stage_ptr
            col = e.add(n0, c(64 * b, I32), I32) if b else n0
            if g.reduce_store:
                e.emit(
                    f"nvvm.cp.async.bulk.tensor.reduce {A['cmap']}, {src}, box[{col}, {m0}] "
                    f"{{redKind = #nvvm.tma_redux_kind<add>}} : !llvm.ptr, {P3}"
                )
                continue
            e.emit(
                f"nvvm.cp.async.bulk.tensor.global.shared.cta {A['cmap']}, {src}, "
                f"box[{', '.join([col, m0] + ex)}] : !llvm.ptr, {P3}"
            )
        e.emit("nvvm.cp.async.bulk.commit.group")
        if_end()

    def bulk_store_rows(S, stage_ptr):
        """MOE_GEMM_BULK_STORE: consumer thread t < BM copies staging row t to row m0 + t of
        C (of expert e's block for the weight gradients) in one cp.async.bulk, if that row
        is the tile's. A partial last N tile copies its columns rounded up to 8 (a bulk
        copy moves multiples of 16 bytes): as write_half's 16-byte groups, into the row's
        padding up to ldc (the router's gradient, N = E, ldc = E rounded up to 8)."""
        m0, n0, m_end = S["m0"], S["n0"], S["m_end"]
        obase = out_base(S)
        row = e.add(m0, tid)
        ok = e.op(f"arith.andi {e.cmp('ult', tid, c(BM))}, {e.cmp('ult', row, m_end)} : i1")
        if_begin(ok)
        first = e.add(obase, e.add(e.mul(row, A["ldc"]), n0))
        dst = gep1(cout_ptr, e.mul(i64(first), c(2, "i64"), "i64"))
        src = gep3(stage_ptr, i32(e.mul(tid, c(BULK_ROW * 2))))
        cols8 = e.mul(e.div(e.add(e.sub(A["dim_n"], n0), c(V - 1)), c(V)), c(V))
        size = i32(e.mul(e.minu(cols8, c(BN)), c(2)))
        e.emit(f"nvvm.cp.async.bulk.global.shared.cta {dst}, {src}, {size} : {P1}, {P3}")
        e.emit("nvvm.cp.async.bulk.commit.group")
        if_end()

    def advance(slot, ph):
        """The ring slot after `slot` and its phase parity (flipped on wrapping)."""
        nxt = e.add(slot, c(1))
        wrap = e.cmp("eq", nxt, c(stages))
        return e.select(wrap, c(0), nxt), e.select(wrap, e.xor(ph, c(1, I32), I32), ph, I32)

    def wg_busy(S):
        """Whether warpgroup wg's 64 rows of the varlen-M tile hold any of the expert's, as
        a vote of the warp: ptxas cannot tell that the comparison is the same in every
        lane, and a k-loop under a branch it takes for divergent loses the uniform
        datapath (a version without the vote sent its wgmma descriptors through R2UR)."""
        busy = e.cmp("ult", e.add(S["m0"], e.mul(wg, c(64))), S["m_end"])
        return e.op(f"nvvm.vote.sync all {c(-1, I32)}, {busy} -> i1")

    def mainloop_ws(S, slot0, ph0):
        """kloop_ws, or with MOE_GEMM_IDLE_SKIP for a warpgroup that owns none of a
        dynamically scheduled tile's rows, idle_kloop_ws."""
        if not g.idle_skip:
            return kloop_ws(S, slot0, ph0)
        return e.if_values(
            wg_busy(S),
            [ACC, "index", "i32"],
            lambda: list(kloop_ws(S, slot0, ph0)),
            lambda: list(idle_kloop_ws(S, slot0, ph0)),
            "wgk",
        )

    def idle_kloop_ws(S, slot0, ph0):
        """The k-loop of a warpgroup with no rows in the tile: each slot is waited for
        (so no release runs ahead of the producer's phase) and freed at once."""
        res, kt, rs, ph = (e.fresh(h) for h in ("idle", "kt", "rs", "ph"))
        e.emit(
            f"{res}:2 = scf.for {kt} = {c(0)} to {S['numk']} step {c(1)} "
            f"iter_args({rs} = {slot0}, {ph} = {ph0}) -> (index, i32) {{"
        )
        outer = e.indent
        e.indent = outer + "  "
        e.emit(
            f"nvvm.mbarrier.try_wait.parity {full_bar(i32(rs))}, {ph}, {c(0x989680, I32)} : {P3}, i32, i32"
        )
        if_begin(e.cmp("eq", lane, c(0)))
        e.emit(f"nvvm.mbarrier.arrive {empty_bar(i32(rs))} : {P3}")
        if_end()
        nslot, nph = advance(rs, ph)
        e.emit(f"scf.yield {nslot}, {nph} : index, i32")
        e.indent = outer
        e.emit("}")
        # zeros: an undefined accumulator (the epilogue stores none of its rows) made
        # ptxas spill in down and dX
        return e.op(f"llvm.mlir.zero : {ACC}", "acc"), f"{res}#0", f"{res}#1"

    def kloop_ws(S, slot0, ph0):
        """A consumer's k-loop: wait for full[slot], multiply, and release the slot of
        the step before once its wgmma have completed. Returns the accumulator and the
        ring position (slot, parity) after the tile.

        The weight gradients' K (an expert's tokens) ends inside its last k-step, whose
        rows past the end are zero-filled: that step runs apart, after the loop, with
        only the wgmma whose 16 K-rows hold tokens (deepseek-v3's bench routing gives an
        expert 5-674 tokens: many end in a k-step of a few rows). Each
        count is a branch of straight-line wgmma ending in wait_group 0: a wgmma under
        a branch inside the loop made ptxas fence every one of them (C7519)."""
        acc0 = e.op(f"llvm.mlir.zero : {ACC}", "acc")
        res, kt, a0, rs, ph, prev = (e.fresh(h) for h in ("kloop", "kt", "a", "rs", "ph", "prev"))
        nloop = S["numk"]
        if g.sched == "varlen_k":
            nloop = e.op(f"arith.index_castui {e.div(S['kcnt'], c(BK, I32), I32)} : i32 to index")
        e.emit(
            f"{res}:4 = scf.for {kt} = {c(0)} to {nloop} step {c(1)} "
            f"iter_args({a0} = {acc0}, {rs} = {slot0}, {ph} = {ph0}, {prev} = {c(0)}) "
            f"-> ({ACC}, index, i32, index) {{"
        )
        outer = e.indent
        e.indent = outer + "  "

        def wait_full(slot, parity):
            e.emit(
                f"nvvm.mbarrier.try_wait.parity {full_bar(i32(slot))}, {parity}, {c(0x989680, I32)} : {P3}, i32, i32"
            )
            # the producer's cp.async wrote through the generic proxy; wgmma reads
            # through the async proxy
            e.emit(
                "nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}"
            )

        def release(cond, slot):
            """lane 0 of each warp frees `slot` if cond"""
            if_begin(e.op(f"arith.andi {cond}, {e.cmp('eq', lane, c(0))} : i1"))
            e.emit(f"nvvm.mbarrier.arrive {empty_bar(i32(slot))} : {P3}")
            if_end()

        wait_full(rs, ph)
        cur = wgmma_stage(a0, rs)
        # the step before has been read
        release(e.cmp("ugt", kt, c(0)), prev)
        nslot, nph = advance(rs, ph)
        e.emit(f"scf.yield {cur}, {nslot}, {nph}, {rs} : {ACC}, index, i32, index")
        e.indent = outer
        e.emit("}")
        looped = e.cmp("ugt", nloop, c(0))
        acc, slot, parity, last = (f"{res}#{j}" for j in range(4))
        if g.sched != "varlen_k":
            e.emit("nvvm.wgmma.wait.group.sync.aligned 0")
            release(looped, last)
            return acc, slot, parity
        kleft = e.sub(S["kcnt"], e.mul(i32(nloop), c(BK, I32), I32), I32)

        def partial_step(count):
            """the tail with `count` wgmma, or a branch on kleft between count and more"""
            if count == 4:
                return wgmma_stage(acc, slot, 4, 0)
            return e.if_values(
                e.cmp("sgt", kleft, c(16 * count, I32), I32),
                [ACC],
                lambda: [partial_step(count + 1)],
                lambda: [wgmma_stage(acc, slot, count, 0)],
                "kpart",
            )[0]

        def tail():
            wait_full(slot, parity)
            tail_acc = partial_step(1)
            release(looped, last)
            release(c(1, "i1"), slot)
            return [tail_acc, *advance(slot, parity)]

        def no_tail():
            e.emit("nvvm.wgmma.wait.group.sync.aligned 0")
            release(looped, last)
            return [acc, slot, parity]

        return e.if_values(
            e.cmp("sgt", kleft, c(0, I32), I32), [ACC, "index", "i32"], tail, no_tail, "ktail"
        )

    if g.persistent:
        # write_half's destinations
        if g.epi == "swiglu":
            hout_ptr = gptr(A["hout"], "memref<?xbf16>")
            if g.store_a:
                aout_ptr = gptr(A["aout"], "memref<?xbf16>")
        else:
            cout_ptr = gptr(A["cout"], "memref<?xbf16>")
    if g.ws:
        stage = e.op(
            f"memref.view {smem}[{e.add(pad, c(g.ring_bytes))}][{c(g.stage_c_bytes // 2)}] : {SMEM} to {SBF16}",
            "stg",
        )
        stage_ptr = gep3(sptr, c(g.ring_bytes, I32))

        # Both roles walk the same tiles in the same order; a tile's k-steps go round
        # the ring, each slot's phase parity flipping on every wrap.
        def tile_loop(role, tile):
            """scf.for over this CTA's tiles carrying the ring position (slot, parity);
            tile(t, slot, parity) emits one tile and returns the position after it."""
            t, sl, ph, out = e.fresh("t"), e.fresh("sl"), e.fresh("ph"), e.fresh(role)
            e.emit(
                f"{out}:2 = scf.for {t} = {bid} to {total} step {gridx} "
                f"iter_args({sl} = {c(0)}, {ph} = {c(0, I32)}) -> (index, i32) {{"
            )
            loop_indent = e.indent
            e.indent += "  "
            nsl, nph = tile(t, sl, ph)
            e.emit(f"scf.yield {nsl}, {nph} : index, i32")
            e.indent = loop_indent
            e.emit("}")

        def tile_while(hint, inits, body):
            """scf.while over the tiles: carries `inits` (RING_TYPES: the tile first) while
            the tile is below `total`; body(values) emits a tile and returns the next
            values."""
            out = e.fresh(hint)
            args = [e.fresh(hint + "a") for _ in inits]
            tys = ", ".join(RING_TYPES)
            e.emit(
                f"{out}:{len(inits)} = scf.while ({', '.join(f'{a} = {v}' for a, v in zip(args, inits))}) "
                f": ({tys}) -> ({tys}) {{"
            )
            outer = e.indent
            e.indent = outer + "  "
            e.emit(f"scf.condition({e.cmp('ult', args[0], total)}) {', '.join(args)} : {tys}")
            e.indent = outer
            e.emit("} do {")
            values = [e.fresh(hint + "b") for _ in inits]
            e.emit(f"^bb0({', '.join(f'{v}: {t}' for v, t in zip(values, RING_TYPES))}):")
            e.indent = outer + "  "
            e.emit(f"scf.yield {', '.join(body(values))} : {tys}")
            e.indent = outer
            e.emit("}")

        def advance_tile_ring(j, q):
            """the tile ring's entry after j (of 2) and its parity"""
            return e.xor(j, c(1)), e.select(e.cmp("eq", j, c(1)), e.xor(q, c(1, I32), I32), q, I32)

        RING_TYPES = ["index", "index", "i32", "index", "i32"]  # tile, slot, parity, entry, parity

        def uniform_tile(ptr):
            """The tile id at ptr (shared), through redux.sync: its result is a uniform
            register, where a value loaded from shared memory is a per-lane one, and
            everything a tile derives from it (its k-steps, the ring slots after it)
            would leave the uniform datapath: ptxas then turned each mbarrier arrive into
            a loop over the lanes' addresses (R2UR, BRA.U.ANY)."""
            t = e.op(f"llvm.load volatile {ptr} : {P3} -> i32")
            t = e.op(f"nvvm.redux.sync umin {t}, {c(-1, I32)} : i32 -> i32")
            return e.op(f"arith.index_castui {t} : i32 to index")

        def producer_tiles_dynamic():
            """MOE_GEMM_DYNAMIC, the producer warpgroup: publish tile t to the consumers
            (a tile past the end: none left, and they stop), claim the next while t
            loads, and pass it to the warpgroup through next[j] and barrier 2."""
            slot_ptr = gep1(
                gptr(A["tile_counter"], "memref<?xi32>"),
                zext(e.mul(i32(A["counter_slot"]), c(4, I32), I32)),
            )

            def publish(t, j, q):
                # (the whole warpgroup waits: a wait loop in thread 0's branch took the
                # ring slots off the uniform datapath)
                e.emit(
                    f"nvvm.mbarrier.try_wait.parity {tile_empty(i32(j))}, {e.xor(q, c(1, I32), I32)}, "
                    f"{c(0x989680, I32)} : {P3}, i32, i32"
                )
                if_begin(is_t0)
                e.emit(f"llvm.store volatile {i32(t)}, {sched_word(0, i32(j))} : i32, {P3}")
                e.emit(f"nvvm.mbarrier.arrive {tile_full(i32(j))} : {P3}")
                if_end()

            def claim(nxt_ptr):
                """thread 0 takes the next tile from the counter into next[j] (the first
                tiles are 0 .. grid - 1, one a CTA; the counter hands out the rest)"""
                claimed = e.op(f"llvm.atomicrmw add {slot_ptr}, {c(1, I32)} monotonic : {P1}, i32")
                e.emit(
                    f"llvm.store volatile {e.add(claimed, i32(gridx), I32)}, {nxt_ptr} : i32, {P3}"
                )

            def produce(args):
                t, sl, ph, j, q = args
                nxt_ptr = sched_word(8, i32(j))

                # The claim waits for the atomic's answer (about a microsecond): issued at
                # the tile's start it held up every tile's first loads (ptxas waits for it
                # before the k-loop). It goes after the loads of k-step min(numk, STAGES) - 1
                # instead, where the producer next waits for a free slot anyway.
                def after_step(S, kt):
                    when = e.sub(e.minu(S["numk"], c(stages)), c(1))
                    if_begin(e.op(f"arith.andi {is_t0}, {e.cmp('eq', kt, when)} : i1"))
                    claim(nxt_ptr)
                    if_end()

                def after_loop(S):
                    # a tile with no k-steps (past the experts' last) claims here
                    if_begin(e.op(f"arith.andi {is_t0}, {e.cmp('eq', S['numk'], c(0))} : i1"))
                    claim(nxt_ptr)
                    if_end()

                nsl, nph = producer_tile(t, sl, ph, after_step, after_loop)
                # (next[j] is written again two tiles on, after every producer thread has
                # passed the barrier of the tile between: no thread can still be reading it)
                e.emit(f"nvvm.barrier id = {c(2, I32)} number_of_threads = {c(128, I32)}")
                nxt = uniform_tile(nxt_ptr)
                nj, nq = advance_tile_ring(j, q)
                publish(nxt, nj, nq)
                return [nxt, nsl, nph, nj, nq]

            # (published at the end of the tile before, as the consumers receive it)
            publish(bid, c(0), c(0, I32))
            tile_while("pt", [bid, c(0), c(0, I32), c(0), c(0, I32)], produce)

        def consumer_tiles_dynamic():
            """MOE_GEMM_DYNAMIC, the consumer warpgroups: the tiles the producer publishes,
            until one past the end. Each tile's id is received at the end of the tile
            before: a loop whose check waits on an mbarrier took the ring slots off the
            uniform datapath (ptxas then sees the loop's exit as divergent)."""

            def receive(j, q):
                e.emit(
                    f"nvvm.mbarrier.try_wait.parity {tile_full(i32(j))}, {q}, {c(0x989680, I32)} : {P3}, i32, i32"
                )
                t = uniform_tile(sched_word(0, i32(j)))
                e.emit(f"nvvm.mbarrier.arrive {tile_empty(i32(j))} : {P3}")
                return [t, *advance_tile_ring(j, q)]

            def consume(args):
                t, sl, ph, j, q = args
                nsl, nph = consumer_tile(t, sl, ph)
                nt, nj, nq = receive(j, q)
                return [nt, nsl, nph, nj, nq]

            first, j1, q1 = receive(c(0), c(0, I32))
            tile_while("ct", [first, c(0), c(0, I32), j1, q1], consume)

        def produce_step(S, kt, slot, parity, srcs):
            """One k-step of the producer: wait for the slot to be free, then issue its
            copies from the rows srcs() gives. Returns the ring position after it."""
            # a fresh barrier's phase before the first (parity 1) counts as complete
            e.emit(
                f"nvvm.mbarrier.try_wait.parity {empty_bar(i32(slot))}, {e.xor(parity, c(1, I32), I32)}, "
                f"{c(0x989680, I32)} : {P3}, i32, i32"
            )
            issue_stage(S, kt, slot, c(1, "i1"), srcs())
            return advance(slot, parity)

        def ids_of(S, kt):
            """pick for lane_ids_at: k-tile kt of tile S"""
            k0 = e.mul(i32(kt), c(BK, I32), I32)
            return lambda name: (
                gep1(S["ids_" + name], zext(e.mul(k0, c(4, I32), I32))),
                e.sub(S["kcnt"], k0, I32),
            )

        def producer_tiles_pipelined():
            """The producer's tiles with the gathered ids a k-step ahead: the last k-step
            of a tile loads the next tile's first (and a tile with no k-steps passes its
            own first on, which are none)."""
            S0 = setup(bid)
            ids0 = lane_ids_at(ids_of(S0, c(0)))
            nid = len(ids0)
            id_ty = ", ".join(["i32"] * nid)

            def open_for(hint, lo, hi, step, slot, parity, ids_in):
                """scf.for from lo to hi carrying the ring position and the ids; returns the
                loop's result, its induction variable and the carried values."""
                iv, sl, ph, out = e.fresh(hint), e.fresh("sl"), e.fresh("ph"), e.fresh(hint + "o")
                ids = [e.fresh("ids") for _ in range(nid)]
                carried = ", ".join(f"{v} = {v0}" for v, v0 in zip(ids, ids_in))
                e.emit(
                    f"{out}:{2 + nid} = scf.for {iv} = {lo} to {hi} step {step} "
                    f"iter_args({sl} = {slot}, {ph} = {parity}, {carried}) -> (index, i32, {id_ty}) {{"
                )
                e.indent += "  "
                return out, iv, sl, ph, ids

            _, t, sl, ph, ids = open_for("t", bid, total, gridx, c(0), c(0, I32), ids0)
            S = setup(t)
            Sn = setup(e.add(t, gridx))
            kout, kt, ksl, kph, kids = open_for("kt", c(0), S["numk"], c(1), sl, ph, ids)
            # the next k-step's ids first: their latency overlaps this step's wait and copies
            kn = e.add(kt, c(1))
            last = e.cmp("eq", kn, S["numk"])
            here, there = ids_of(S, kn), ids_of(Sn, c(0))

            def pick(name):
                (p1, l1), (p2, l2) = here(name), there(name)
                return (
                    e.op(f"arith.select {last}, {p2}, {p1} : {P1}"),
                    e.select(last, l2, l1, I32),
                )

            nxt = lane_ids_at(pick)
            nslot, nph = produce_step(S, kt, ksl, kph, lambda: load_rows(S, kt, kids))
            e.emit(f"scf.yield {nslot}, {nph}, {', '.join(nxt)} : index, i32, {id_ty}")
            e.indent = e.indent[:-2]
            e.emit("}")
            # no k-steps: this tile loaded nothing, the next one's first ids are still due
            empty = e.cmp("eq", S["numk"], c(0))
            first = e.if_values(
                empty,
                ["i32"] * nid,
                lambda: lane_ids_at(ids_of(Sn, c(0))),
                lambda: [f"{kout}#{2 + j}" for j in range(nid)],
                "first",
            )
            e.emit(f"scf.yield {kout}#0, {kout}#1, {', '.join(first)} : index, i32, {id_ty}")
            e.indent = e.indent[:-2]
            e.emit("}")

        def producer_tile(t, sl, ph, after_step=None, after_loop=None):
            """The producer's k-steps of tile t; after_step(S, kt) and after_loop(S), if
            given, emit code after each and after the last."""
            S = setup(t)
            kt, ksl, kph, kout = e.fresh("kt"), e.fresh("ks"), e.fresh("kp"), e.fresh("pk")
            e.emit(
                f"{kout}:2 = scf.for {kt} = {c(0)} to {S['numk']} step {c(1)} "
                f"iter_args({ksl} = {sl}, {kph} = {ph}) -> (index, i32) {{"
            )
            e.indent += "  "
            # the token ids first: their loads overlap the wait for the slot
            srcs = load_rows(S, kt)
            nslot, nph = produce_step(S, kt, ksl, kph, lambda: srcs)
            if after_step:
                after_step(S, kt)
            e.emit(f"scf.yield {nslot}, {nph} : index, i32")
            e.indent = e.indent[:-2]
            e.emit("}")
            if after_loop:
                after_loop(S)
            return f"{kout}#0", f"{kout}#1"

        def consumer_tile(t, sl, ph):
            S = setup(t)
            acc, nsl, nph = mainloop_ws(S, sl, ph)
            if_begin(S["valid"])
            if g.bulk_store:
                # this thread's copy of the last tile has read its staging row
                e.emit("nvvm.cp.async.bulk.wait_group 0 {read}")
            consumer_barrier()  # the last tile's stores have read the staging buffer
            if g.bulk_store:

                def store(by_boxes):
                    (stage_boxes_stmatrix if by_boxes else stage_rows_stmatrix)(stage_ptr, acc)
                    # the generic-proxy writes, visible to the bulk copies (async proxy)
                    e.emit(
                        "nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}"
                    )
                    consumer_barrier()
                    (tma_store_boxes if by_boxes else bulk_store_rows)(S, stage_ptr)

                if g.tma_store_rows and not g.reduce_store:
                    # (a branch the whole consumer warpgroup pair takes alike)
                    whole = e.cmp("ule", e.add(S["m0"], c(BM)), S["m_end"])
                    e.if_else(whole, lambda: store(True), lambda: store(False))
                else:
                    store(g.tma_store or g.reduce_store)
            else:
                for h in (0, 1):
                    stage_half(e, g, stage, acc, h, qrow, qcol, lane)
                consumer_barrier()
                for h in (0, 1):
                    write_half(S, stage, h)
            if_end()
            return nsl, nph

        e.if_begin(e.cmp("uge", tid, c(GEMM_THREADS)))
        e.emit(f"nvvm.setmaxregister decrease {WS_PRODUCER_REGS}")
        if g.sched == "varlen_k" and (g.gather_a or g.gather_b):
            producer_tiles_pipelined()
        elif g.dynamic:
            producer_tiles_dynamic()
        else:
            tile_loop("pt", producer_tile)
        # the last copies land before the warpgroup exits
        e.emit("nvvm.cp.async.commit.group")
        e.emit("nvvm.cp.async.wait.group 0")
        e.emit("} else {")
        e.indent += "  "
        e.emit(f"nvvm.setmaxregister increase {WS_CONSUMER_REGS}")
        if g.dynamic:
            consumer_tiles_dynamic()
        else:
            tile_loop("ct", consumer_tile)
        if g.bulk_store:
            # the last tile's copies complete before the CTA (and its shared memory) goes
            e.emit("nvvm.cp.async.bulk.wait_group 0")
        e.if_end()
    elif g.persistent:
        S0 = setup(bid)
        prologue(S0)
        t, ph = e.fresh("t"), e.fresh("ph")
        e.emit(
            f"{ph}_out = scf.for {t} = {bid} to {total} step {gridx} "
            f"iter_args({ph} = {c(0, I32)}) -> (i32) {{"
        )
        loop_indent = e.indent
        e.indent += "  "
        S = setup(t)
        acc, ph_next = mainloop(S, ph)
        e.emit("gpu.barrier")
        # C goes through a bf16 buffer over the last ring slot and past it; the
        # next tile's first loads take the other slots while C is written out.
        stage_off = c((stages - 1) * STAGE_BYTES)
        stage = e.op(
            f"memref.view {smem}[{e.add(pad, stage_off)}][{c(STAGE_C_BYTES // 2)}] : {SMEM} to {SBF16}",
            "stg",
        )
        if_begin(S["valid"])
        for h in (0, 1):
            stage_half(e, g, stage, acc, h, qrow, qcol, lane)
        if_end()
        prologue(setup(e.add(t, gridx)))
        e.emit("gpu.barrier")
        if_begin(S["valid"])
        for h in (0, 1):
            write_half(S, stage, h)
        if_end()
        e.emit(f"scf.yield {ph_next} : i32")
        e.indent = loop_indent
        e.emit("}")
        # the last prefetch (of no tile) zero-fills; it lands before the CTA exits
        e.emit("nvvm.cp.async.wait.group 0")
    else:
        S = setup(bid)
        prologue(S)
        acc, _ = mainloop(S, c(0, I32))
        if_begin(S["valid"])
        ring_epilogue(
            e,
            g,
            A,
            S,
            smem,
            pad,
            acc,
            qrow,
            qcol,
            warp,
            lane,
            wg,
            tid,
            stage_rows_bf16=lambda: stage_rows_stmatrix(sptr, acc),
        )
        if_end()

    e.emit("gpu.return")
    args = ", ".join(f"%{n}: {t}" for n, t in sig)
    head = (
        f"    gpu.func @{g.name}({args}) kernel attributes "
        f"{{known_block_size = array<i32: {g.threads}, 1, 1>}} {{"
    )
    return "\n".join([head] + e.const_lines + e.lines + ["    }"])


def build_tile_table(e, A, cumv, tid, barrier):
    """cum[x] = M-tiles of experts [0, x) for x <= E (E <= TABLE_EXPERTS), by
    GEMM_THREADS threads that synchronise with barrier(): thread t sums experts
    4t..4t+3, warps scan with shuffles, warp totals go through
    cum[TABLE_EXPERTS + 1 + warp]."""
    c = e.const
    SI = f"memref<?xi32, {WG}>"
    E = A["num_experts"]
    lane = e.rem(tid, c(32))
    warp = e.div(tid, c(32))
    vals = []
    for i in range(4):
        ex = e.add(e.mul(tid, c(4)), c(i))
        inb = e.cmp("ult", ex, E)
        cnt = e.fresh("tc")
        e.emit(f"{cnt} = scf.if {inb} -> (i32) {{")
        e.indent += "  "
        lo = e.op(f"memref.load {A['offsets']}[{ex}] : memref<?xi32>")
        hi = e.op(f"memref.load {A['offsets']}[{e.add(ex, c(1))}] : memref<?xi32>")
        t = e.div(e.add(e.sub(hi, lo, "i32"), c(BM - 1, "i32"), "i32"), c(BM, "i32"), "i32")
        e.emit(f"scf.yield {t} : i32")
        e.indent = e.indent[:-2]
        e.emit("} else {")
        e.emit(f"  scf.yield {c(0, 'i32')} : i32")
        e.emit("}")
        vals.append(cnt)
    own = e.add(e.add(vals[0], vals[1], "i32"), e.add(vals[2], vals[3], "i32"), "i32")
    s = own
    for d in (1, 2, 4, 8, 16):
        y = e.fresh("up")
        e.emit(f"{y}, {y}ok = gpu.shuffle up {s}, {c(d, 'i32')}, {c(32, 'i32')} : i32")
        s = e.select(e.cmp("uge", lane, c(d)), e.add(s, y, "i32"), s, "i32")
    e.emit(f"scf.if {e.cmp('eq', lane, c(31))} {{")
    e.emit(f"  memref.store {s}, {cumv}[{e.add(warp, c(TABLE_EXPERTS + 1))}] : {SI}")
    e.emit("}")
    barrier()
    w, acc, acc2 = e.fresh("w"), e.fresh("wp"), e.fresh("wq")
    e.emit(
        f"{acc} = scf.for {w} = {c(0)} to {warp} step {c(1)} iter_args({acc2} = {c(0, 'i32')}) -> (i32) {{"
    )
    e.indent += "  "
    ws = e.op(f"memref.load {cumv}[{e.add(w, c(TABLE_EXPERTS + 1))}] : {SI}")
    e.emit(f"scf.yield {e.add(acc2, ws, 'i32')} : i32")
    e.indent = e.indent[:-2]
    e.emit("}")
    run = e.sub(e.add(acc, s, "i32"), own, "i32")
    for i in range(4):
        run = e.add(run, vals[i], "i32")
        e.emit(f"memref.store {run}, {cumv}[{e.add(e.mul(tid, c(4)), c(i + 1))}] : {SI}")
    e.emit(f"scf.if {e.cmp('eq', tid, c(0))} {{")
    e.emit(f"  memref.store {c(0, 'i32')}, {cumv}[{c(0)}] : {SI}")
    e.emit("}")
    barrier()


# ---- epilogues of the persistent kernels ------------------------------------
# Half h of the tile is a 128x128 bf16 block of the staging buffer. Plain and
# transposed stores take columns [128h, 128h + 128); SwiGLU takes gate columns
# [64h, 64h + 64) and the up columns 128 + the same, so a row holds both halves
# of its outputs. Row-wise staging: row r, 16-byte group q at q ^ (r % 8);
# transposed (for the transposed store): column c is a staging row, group q of 8
# tile rows at q ^ ((c / 2) % 8). Both keep the fragment stores and the 16-byte
# reads free of bank conflicts.
V = 8


def half_groups(g, h):
    """(accumulator column group j, staging group jl) of half h."""
    if g.epi == "swiglu":
        return [(8 * h + q, q) for q in range(8)] + [(16 + 8 * h + q, 8 + q) for q in range(8)]
    return [(16 * h + q, q) for q in range(16)]


def stage_half(e, g, stage, acc, h, qrow, qcol, lane):
    c = e.const
    base = c(h * BM * BN // 2)
    swz = e.div(lane, c(4))  # (fragment row) % 8
    for j, jl in half_groups(g, h):
        for i in range(2):
            row = e.add(qrow, c(8 * i))
            vals = []
            for cc in range(2):
                v = 4 * j + 2 * i + cc
                f = e.op(f"llvm.extractvalue {acc}[{v}] : {ACC}", "f")
                vals.append(e.op(f"arith.truncf {f} : f32 to bf16"))
            idx = e.add(
                base, e.add(e.mul(row, c(BN // 2)), e.add(e.mul(e.xor(c(jl), swz), c(V)), qcol))
            )
            vec = e.op(f"vector.from_elements {vals[0]}, {vals[1]} : vector<2xbf16>")
            e.emit(
                f"vector.store {vec}, {stage}[{idx}] {{alignment = 4}} : {SBF16}, vector<2xbf16>"
            )


def silu_parts(e, g32):
    """(sigmoid(g), silu(g)) in f32."""
    sgm = e.op(f"func.call @__moe_gpu_sigmoid({g32}) : (f32) -> f32")
    return sgm, e.fmul(g32, sgm)


def dswiglu_loads(e, g, A, r, col):
    """What the dSwiGLU of row r, columns col + [0, V) of h reads, as loaded: [gate, up]
    as vector<8xbf16> (and w = wrow[r] with routing weights), carried into the next
    iteration of the epilogue's loop and widened there by dswiglu_widen. r and col must be
    in bounds: the caller clamps them, so the loads need no branch."""
    half = A["dim_n"]
    hrow = e.mul(r, e.mul(half, e.const(2)))
    vals = [
        e.op(
            f"vector.load {A['hsaved']}[{e.add(hrow, e.add(off, col))}] {{alignment = 16}} : "
            f"memref<?xbf16>, vector<{V}xbf16>"
        )
        for off in (e.const(0), half)
    ]
    if g.has_w:
        vals.append(e.op(f"memref.load {A['wrow']}[{r}] : memref<?xf32>"))
    return vals


def dswiglu_load_types(g):
    return [f"vector<{V}xbf16>"] * 2 + (["f32"] if g.has_w else [])


def dswiglu_widen(e, g, A, r, raw):
    """(hrow, w, gate, up) of row r from dswiglu_loads' values: hrow = where row r of H
    starts, the rest in f32, w = 1 without routing weights."""
    w = raw[2] if g.has_w else e.const(1.0, "f32")
    hrow = e.mul(r, e.mul(A["dim_n"], e.const(2)))
    return (hrow, w, e.bf16x8_to_f32(raw[0]), e.bf16x8_to_f32(raw[1]))


def dswiglu_group(e, g, A, r, col, a_accs, loaded, ok):
    """dSwiGLU of row r, columns col + [0, V) of h from dswiglu_widen's values: a_accs =
    dA there (unscaled, f32). Stores dH (gate and up) and w*a where ok, and returns the
    row's part of dS there (0 elsewhere): the sum of dA * a over the V columns. Fused
    multiply-adds where a product is summed, and d silu / dg as s + s (g - silu)
    (docs/gpu-kernels.md, A7)."""
    c = e.const
    half = A["dim_n"]
    hrow, w, gs, us = loaded

    def bf16(x):
        return e.op(f"arith.truncf {x} : f32 to bf16")

    def vstore(vals, idx, mem):
        vec = e.op(f"vector.from_elements {', '.join(vals)} : vector<{V}xbf16>")
        e.emit(
            f"vector.store {vec}, {mem}[{idx}] {{alignment = 16}} : memref<?xbf16>, vector<{V}xbf16>"
        )

    dgs, dus, was = [], [], []
    part = c(0.0, "f32")
    for u in range(V):
        sgm, silu = silu_parts(e, gs[u])
        a = e.fmul(silu, us[u])
        da = e.fmul(a_accs[u], w)
        # d silu / dg = s (1 + g (1 - s)) = s + s (g - silu)
        dsilu = e.ffma(sgm, e.fsub(gs[u], silu), sgm)
        dgs.append(bf16(e.fmul(e.fmul(da, us[u]), dsilu)))
        dus.append(bf16(e.fmul(da, silu)))
        was.append(bf16(e.fmul(w, a)))
        part = e.ffma(a_accs[u], a, part)
    e.if_begin(ok)
    vstore(dgs, e.add(hrow, col), A["dh"])
    vstore(dus, e.add(hrow, e.add(half, col)), A["dh"])
    vstore(was, e.add(e.mul(r, half), col), A["wa"])
    e.if_end()
    return e.select(ok, part, c(0.0, "f32"), "f32")


# ---- epilogues of the other kernels (through the ring) ------------------------
def ring_epilogue(e, g, A, S, smem, pad, acc, qrow, qcol, warp, lane, wg, tid, stage_rows_bf16):
    """The ring is free after the k-loop: the tile goes through it so the epilogue walks
    the tile in an order that makes the global stores coalesced, with few live registers.
    store_f32 stages the fp32 tile. The dSwiGLU stages dA rounded to bf16 (as the GEMM's
    output is in the HF block): stage_rows_bf16() writes it by stmatrix into rows of
    BULK_ROW elements from the ring's start, read back 8 values a lane in one 16-byte load
    (32 shared-memory instructions a thread a tile)."""
    c = e.const
    m0, n0, m_end = S["m0"], S["n0"], S["m_end"]
    SF = f"memref<?xf32, {WG}>"
    dswiglu = g.epi == "dswiglu"
    rows_per_batch = DACT_UNROLL * (GEMM_THREADS // 32)

    # The dSwiGLU walks rows (a warp per row, 8 columns a lane: coalesced H loads and dH,
    # w*a stores): warp w takes rows w + 8 i of the batch at ep. Rows past the expert's end
    # and columns past n read the last valid ones (no branch holds a load) and store nothing.
    def dswiglu_columns():
        """(lc, col_ok, col_in, last_row): the lane's columns in the tile, whether they are
        in n, the clamped first column in n, the expert's last row."""
        half = A["dim_n"]
        lc = e.mul(lane, c(V))
        col = e.add(n0, lc)
        col_ok = e.cmp("ult", col, half)
        return lc, col_ok, e.select(col_ok, col, e.sub(half, c(V))), e.sub(m_end, c(1))

    def dswiglu_row(ep, u, cols):
        """(tile row, clamped row, whether to store) of the warp's row u of the batch at ep."""
        _, col_ok, _, last_row = cols
        lr = e.add(e.add(ep, warp), c(8 * u))
        r = e.add(m0, lr)
        r_ok = e.cmp("ult", r, m_end)
        r_in = e.select(r_ok, r, last_row)
        return lr, r_in, e.op(f"arith.andi {r_ok}, {col_ok} : i1")

    if dswiglu:
        cols = dswiglu_columns()

        def batch_loads(ep):
            return [
                v
                for u in range(DACT_UNROLL)
                for v in dswiglu_loads(e, g, A, dswiglu_row(ep, u, cols)[1], cols[2])
            ]

        # the first batch's loads fly while dA is staged
        first_loads = batch_loads(c(0))
    e.emit("gpu.barrier")
    if dswiglu:
        stage = e.op(f"memref.view {smem}[{pad}][{c(BM * BULK_ROW)}] : {SMEM} to {SBF16}", "st")
        stage_rows_bf16()
    else:
        stage = e.op(f"memref.view {smem}[{pad}][{c(BM * BN)}] : {SMEM} to {SF}", "st")

    def stage_index(lr, lc):
        # rows of 256 f32 with the column XOR-ed by row % 32: row-wise and
        # column-wise walks over the tile are both free of bank conflicts
        return e.add(e.mul(lr, c(BN)), e.xor(lc, e.rem(lr, c(32))))

    if not dswiglu:
        for v in range(BN // 2):
            j, i, cc = v // 4, (v // 2) % 2, v % 2
            val = e.op(f"llvm.extractvalue {acc}[{v}] : {ACC}", "f")
            idx = stage_index(e.add(qrow, c(8 * i)), e.add(qcol, c(8 * j + cc)))
            e.emit(f"memref.store {val}, {stage}[{idx}] : {SF}")
    e.emit("gpu.barrier")

    if_begin, if_end = e.if_begin, e.if_end

    def loop_begin(count, name):
        e.emit(f"scf.for %{name} = {tid} to {c(count)} step {c(GEMM_THREADS)} {{")
        e.indent += "  "
        return f"%{name}"

    def staged(lr, lc):
        return e.op(f"memref.load {stage}[{stage_index(lr, lc)}] : {SF}")

    def staged_group(lr, lc):
        """dA of row lr, columns lc + [0, V) in f32 (lc a multiple of V)."""
        idx = e.add(e.mul(lr, c(BULK_ROW)), lc)
        vec = e.op(f"vector.load {stage}[{idx}] {{alignment = 16}} : {SBF16}, vector<{V}xbf16>")
        return e.bf16x8_to_f32(vec)

    def vstore(vec, mem, idx, ty):
        e.emit(
            f"vector.store {vec}, {mem}[{idx}] {{alignment = 16}} : memref<?x{ty}>, vector<{V}x{ty}>"
        )

    if g.epi == "store_f32":
        it = loop_begin(BM * BN // V, "ep")
        lr, lc = e.div(it, c(BN // V)), e.mul(e.rem(it, c(BN // V)), c(V))
        vals = [staged(lr, e.add(lc, c(u))) for u in range(V)]
        r = e.add(m0, lr)
        col = e.add(n0, lc)
        # M, N and the varlen ends are multiples of 8 here, so a group is all in or out
        ok = e.op(f"arith.andi {e.cmp('ult', r, m_end)}, {e.cmp('ult', col, A['dim_n'])} : i1")
        if_begin(ok)
        vec = e.op(f"vector.from_elements {', '.join(vals)} : vector<{V}xf32>")
        vstore(vec, A["cout"], e.add(e.mul(r, A["ldc"]), col), "f32")
        if_end()
        if_end()
    elif dswiglu:
        # acc = dA (unscaled) for columns n0 + [0,256) of n; w = wrow[r] (1 without
        # routing weights); the weight gradients read dH and w*a MN-major from these rows.
        # With dS, each warp sums its row's products acc*a in a fixed order.
        ds_off = e.add(pad, c(g.ring_bytes))
        stage_ds = e.op(f"memref.view {smem}[{ds_off}][{c(BM)}] : {SMEM} to {SF}", "std")

        def finish_row(lr, r_in, ok, loaded):
            part = dswiglu_group(e, g, A, r_in, cols[2], staged_group(lr, cols[0]), loaded, ok)
            if g.has_ds:
                # a warp holds one row, 8 columns per lane
                for mask in (16, 8, 4, 2, 1):
                    name = e.fresh("sh")
                    e.emit(
                        f"{name}, {name}ok = gpu.shuffle xor {part}, {c(mask, 'i32')}, {c(32, 'i32')} : f32"
                    )
                    part = e.fadd(part, name)
                if_begin(e.cmp("eq", lane, c(0)))
                e.emit(f"memref.store {part}, {stage_ds}[{lr}] : {SF}")
                if_end()

        # A warp's MOE_GEMM_DACT_UNROLL rows a batch, their H (and w) loaded a batch ahead
        # and carried through the loop: a batch's loads wait behind the previous batch's
        # arithmetic instead of in front of its own (the last batch loads itself again,
        # L1 hits, so that no branch holds a load).
        types = dswiglu_load_types(g) * DACT_UNROLL
        carried = [e.fresh("ld") for _ in types]
        res = e.fresh("eps")
        e.emit(
            f"{res}:{len(types)} = scf.for %ep = {c(0)} to {c(BM)} step {c(rows_per_batch)} iter_args("
            + ", ".join(f"{a} = {b}" for a, b in zip(carried, first_loads))
            + f") -> ({', '.join(types)}) {{"
        )
        e.indent += "  "
        nxt = batch_loads(e.minu(e.add("%ep", c(rows_per_batch)), c(BM - rows_per_batch)))
        per_row = len(dswiglu_load_types(g))
        for u in range(DACT_UNROLL):
            lr, r_in, ok = dswiglu_row("%ep", u, cols)
            finish_row(
                lr,
                r_in,
                ok,
                dswiglu_widen(e, g, A, r_in, carried[per_row * u : per_row * (u + 1)]),
            )
        e.emit(f"scf.yield {', '.join(nxt)} : {', '.join(types)}")
        if_end()
        e.emit("gpu.barrier")
        if g.has_ds:
            r = e.add(m0, tid)
            if_begin(e.op(f"arith.andi {e.cmp('ult', tid, c(BM))}, {e.cmp('ult', r, m_end)} : i1"))
            total = e.op(f"memref.load {stage_ds}[{tid}] : {SF}")
            e.emit(
                f"memref.store {total}, {A['dspart']}[{e.add(e.mul(r, A['num_ntiles']), S['by'])}] : memref<?xf32>"
            )
            if_end()
    else:
        raise ValueError(g.epi)


GEMMS = [
    Gemm("moe_gemm_up_gather", "gather", "w_mn_swiglu", "swiglu", "varlen_m"),
    Gemm("moe_gemm_up_rows", "rows", "w_mn_swiglu", "swiglu", "varlen_m"),
    # H alone, for its recomputation in backward
    Gemm("moe_gemm_up_gather_h", "gather", "w_mn_swiglu", "swiglu", "varlen_m", store_a=False),
    Gemm("moe_gemm_up_rows_h", "rows", "w_mn_swiglu", "swiglu", "varlen_m", store_a=False),
    Gemm("moe_gemm_rows_mn_bf16", "rows", "w_mn", "store_bf16", "varlen_m"),
    Gemm("moe_gemm_rows_mn_f32", "rows", "w_mn", "store_f32", "varlen_m"),
    Gemm("moe_gemm_rows_k_bf16", "rows", "w_k", "store_bf16", "varlen_m"),
    Gemm("moe_gemm_dact_gather", "gather", "w_k", "dswiglu", "varlen_m", has_w=True, has_ds=True),
    Gemm("moe_gemm_dact_rows", "rows", "w_k", "dswiglu", "varlen_m"),
    # dW_down = (w A)^T dOut[q]; dW_gate_up = x[q]^T dH, [d, 2h] as the weights are
    Gemm("moe_gemm_wgrad_gather", "mn", "rows_mn", "store_bf16_w", "varlen_k", gather_b=True),
    Gemm("moe_gemm_wgrad_gather_a", "mn", "rows_mn", "store_bf16_w", "varlen_k", gather_a=True),
    Gemm("moe_gemm_wgrad_rows", "mn", "rows_mn", "store_bf16_w", "varlen_k"),
]
# dx += dlogits W_r^T (the router's dX, one problem; __moe_gpu_router_grad_acc) by TMA
# reduce-add boxes: where the row-wise GEMMs store by TMA boxes (MOE_GEMM_WS=all,
# MOE_GEMM_BULK_STORE=1 and MOE_GEMM_TMA_STORE=1, the defaults). Under other settings the
# library has no __moe_gpu_router_grad_acc, and convert-moe-to-gpu keeps the adds of the
# router's dx.
ROUTER_GRAD_ACC = next(g for g in GEMMS if g.name == "moe_gemm_rows_k_bf16").tma_store_rows
if ROUTER_GRAD_ACC:
    GEMMS.append(
        Gemm("moe_gemm_rows_k_bf16_acc", "rows", "w_k", "store_bf16", "varlen_m", reduce_store=True)
    )


# ---------------------------------------------------------------------------
# Kernels that are not GEMMs. One thread per token (router), per routing slot
# (dispatch, weights) or per 8 columns (gather-sums); 128 threads per block.
# ---------------------------------------------------------------------------
KB = f"known_block_size = array<i32: {THREADS}, 1, 1>"


def kernel(name, args, body):
    head = f"    gpu.func @{name}({args}) kernel attributes {{{KB}}} {{"
    return head + "\n" + body.rstrip() + "\n      gpu.return\n    }"


GID = """      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %c128 = arith.constant 128 : index
      %gid0 = arith.muli %bid, %c128 : index
      %gid = arith.addi %gid0, %tid : index
"""

# The router's weight gradient splits its tokens into slices of at least this many.
ROUTER_SPLIT_TOKENS = 1024
# Tokens a block of the kernels that run a warp a token (THREADS / 32).
TOKEN_WARPS = THREADS // 32


def warp_per_token(body):
    """A per-token kernel body written for one thread a token (GID + body), run by a warp a
    token instead: %gid is the warp's token, every `scf.for %e = %c0 to %E` over the experts
    walks them 32 apart from the lane, and the max and sum loops (results %mx and %sum,
    yielding %m2 and %s2) end in a reduction over the warp by xor shuffles, so every lane
    holds the token's value. A thread a token read each row of E values three to five times
    from global memory, one after another (deepseek-v3: 0.06 and 0.28 ms)."""
    head = (
        """      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %tw32 = arith.constant 32 : index
      %twarps = arith.constant """
        + str(TOKEN_WARPS)
        + """ : index
      %lane = arith.remui %tid, %tw32 : index
      %twarp = arith.divui %tid, %tw32 : index
      %gid0 = arith.muli %bid, %twarps : index
      %gid = arith.addi %gid0, %twarp : index
      %tw32_i32 = arith.constant 32 : i32
"""
        + "".join(f"      %tw{m}_i32s = arith.constant {m} : i32\n" for m in (16, 8, 4, 2, 1))
    )
    assert body.startswith(GID)
    body = head + body[len(GID) :]
    loops = body.count("scf.for %e = %c0 to %E step %c1")
    body = body.replace("scf.for %e = %c0 to %E step %c1", "scf.for %e = %lane to %E step %tw32")
    assert loops >= 2
    for result, yielded, combine in (
        ("%mx", "%m2", "arith.maximumf"),
        ("%sum", "%s2", "arith.addf"),
    ):
        body = body.replace(f"{result} = scf.for %e = %lane", f"{result}l = scf.for %e = %lane", 1)
        m = re.search(rf"\n( *)scf\.yield {yielded} : f32\n( *)\}}\n", body)
        ind = m.group(2)
        red, cur = [], f"{result}l"
        for mask in (16, 8, 4, 2, 1):
            red.append(
                f"{ind}{result}_o{mask}, {result}_k{mask} = gpu.shuffle xor {cur}, %tw{mask}_i32s, %tw32_i32 : f32"
            )
            nxt = result if mask == 1 else f"{result}_r{mask}"
            red.append(f"{ind}{nxt} = {combine} {cur}, {result}_o{mask} : f32")
            cur = nxt
        body = body[: m.end()] + "\n".join(red) + "\n" + body[m.end() :]
    return body


SIMPLE = []

# softmax or sigmoid of the router logits, per token; with %round, the logits are first
# rounded to bf16 in place (routing round_logits: a bf16 nn.Linear router's logits)
SIMPLE.append(
    kernel(
        "moe_router_scores",
        "%logits: memref<?xf32>, %scores: memref<?xf32>, %T: index, %E: index, %scoring: i32, "
        "%round: i1",
        warp_per_token(
            GID
            + """      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %zero = arith.constant 0.0 : f32
      %one = arith.constant 1.0 : f32
      %ninf = arith.constant 0xFF800000 : f32
      %ok = arith.cmpi ult, %gid, %T : index
      scf.if %ok {
        %base = arith.muli %gid, %E : index
        scf.if %round {
          scf.for %e = %c0 to %E step %c1 {
            %i = arith.addi %base, %e : index
            %l = memref.load %logits[%i] : memref<?xf32>
            %h = arith.truncf %l : f32 to bf16
            %r = arith.extf %h : bf16 to f32
            memref.store %r, %logits[%i] : memref<?xf32>
          }
        }
        %soft = arith.cmpi eq, %scoring, %c0_i32 : i32
        scf.if %soft {
          %mx = scf.for %e = %c0 to %E step %c1 iter_args(%m = %ninf) -> (f32) {
            %i = arith.addi %base, %e : index
            %l = memref.load %logits[%i] : memref<?xf32>
            %m2 = arith.maximumf %m, %l : f32
            scf.yield %m2 : f32
          }
          %sum = scf.for %e = %c0 to %E step %c1 iter_args(%s = %zero) -> (f32) {
            %i = arith.addi %base, %e : index
            %l = memref.load %logits[%i] : memref<?xf32>
            %d = arith.subf %l, %mx : f32
            %x = func.call @__moe_gpu_exp(%d) : (f32) -> f32
            %s2 = arith.addf %s, %x : f32
            scf.yield %s2 : f32
          }
          scf.for %e = %c0 to %E step %c1 {
            %i = arith.addi %base, %e : index
            %l = memref.load %logits[%i] : memref<?xf32>
            %d = arith.subf %l, %mx : f32
            %x = func.call @__moe_gpu_exp(%d) : (f32) -> f32
            %p = arith.divf %x, %sum : f32
            memref.store %p, %scores[%i] : memref<?xf32>
          }
        } else {
          scf.for %e = %c0 to %E step %c1 {
            %i = arith.addi %base, %e : index
            %l = memref.load %logits[%i] : memref<?xf32>
            %nl = arith.negf %l : f32
            %x = func.call @__moe_gpu_exp(%nl) : (f32) -> f32
            %den = arith.addf %x, %one : f32
            %p = arith.divf %one, %den : f32
            memref.store %p, %scores[%i] : memref<?xf32>
          }
        }
      }
"""
        )
        .replace("%c0_i32 : i32", "%czi : i32")
        .replace("%soft = arith", "%czi = arith.constant 0 : i32\n        %soft = arith"),
    )
)


def select_kernel():
    """Top-k (group-limited) selection, weights, renormalisation and scaling: a warp a token.

    The order is the CPU path's (docs/cpu-path.md section 2): the larger score first, the
    smaller index on a tie, NaN after every number (the smaller index first among NaNs);
    "no candidate" after everything. As a key: (class, value, index), class 2 for a number,
    1 for NaN, 0 for none. Lane l holds experts l, l + 32, ... (E <= 1024: a 32-bit mask
    of its picks; convert-moe-to-gpu refuses more) and finds its best candidate, and five
    xor shuffles give every lane the warp's best, one pick a round. Groups: lane l scores
    groups l and l + 32 (the sum of the group's two best, G <= 64: an i64 mask), and the
    warp picks topk_groups of them the same way. One thread a token scanned every expert
    k times from global memory (1.0 ms of deepseek-v3's step)."""
    em = Emitter()
    lines = em.lines  # lines with their own indentation go here directly

    def op(ind, text, hint="v"):
        em.indent = ind
        return em.op(text, hint)

    def better(ind, a, b):
        """a before b in the order above (a, b: (class i32, value f32, index i32))."""
        gtk = op(ind, f"arith.cmpi sgt, {a[0]}, {b[0]} : i32")
        eqk = op(ind, f"arith.cmpi eq, {a[0]}, {b[0]} : i32")
        num = op(ind, f"arith.cmpi eq, {a[0]}, %c2_i32 : i32")
        nan = op(ind, f"arith.cmpi eq, {a[0]}, %c1_i32 : i32")
        vgt = op(ind, f"arith.cmpf ogt, {a[1]}, {b[1]} : f32")
        veq = op(ind, f"arith.cmpf oeq, {a[1]}, {b[1]} : f32")
        ilt = op(ind, f"arith.cmpi slt, {a[2]}, {b[2]} : i32")
        tie = op(ind, f"arith.andi {veq}, {ilt} : i1")
        by_value = op(ind, f"arith.ori {vgt}, {tie} : i1")
        num_first = op(ind, f"arith.andi {num}, {by_value} : i1")
        nan_first = op(ind, f"arith.andi {nan}, {ilt} : i1")
        same_class = op(
            ind, f"arith.andi {eqk}, {op(ind, f'arith.ori {num_first}, {nan_first} : i1')} : i1"
        )
        return op(ind, f"arith.ori {gtk}, {same_class} : i1")

    def pick(ind, cond, a, b):
        return tuple(
            op(ind, f"arith.select {cond}, {x}, {y} : {t}")
            for x, y, t in zip(a, b, ("i32", "f32", "i32"))
        )

    def key(ind, cand, value, index):
        nan = op(ind, f"arith.cmpf uno, {value}, {value} : f32")
        cls = op(ind, f"arith.select {nan}, %c1_i32, %c2_i32 : i32")
        return (op(ind, f"arith.select {cand}, {cls}, %c0_i32 : i32"), value, index)

    def warp_best(ind, a):
        for mask in (16, 8, 4, 2, 1):
            other = []
            for x, t in zip(a, ("i32", "f32", "i32")):
                name = em.fresh("sh")
                lines.append(
                    f"{ind}{name}, {name}ok = gpu.shuffle xor {x}, %c{mask}_i32, %c32_i32 : {t}"
                )
                other.append(name)
            a = pick(ind, better(ind, tuple(other), a), tuple(other), a)
        return a

    def cval(ind, e):
        """c = s + bias of expert e (index)"""
        si = op(ind, f"arith.addi %base, {e} : index")
        sv = op(ind, f"memref.load %scores[{si}] : memref<?xf32>")
        bv, bl = em.fresh(), em.fresh("bl")
        lines.append(f"{ind}{bv} = scf.if %hasb -> (f32) {{")
        lines.append(f"{ind}  {bl} = memref.load %bias[{e}] : memref<?xf32>")
        lines.append(f"{ind}  scf.yield {bl} : f32")
        lines.append(f"{ind}}} else {{")
        lines.append(f"{ind}  scf.yield %zero : f32")
        lines.append(f"{ind}}}")
        return op(ind, f"arith.addf {sv}, {bv} : f32")

    def i32(ind, v):
        return op(ind, f"arith.index_cast {v} : index to i32")

    ind = "        "
    lines += [
        f"{ind}%base = arith.muli %t, %E : index",
        f"{ind}%obase = arith.muli %t, %k : index",
        f"{ind}%hasb = arith.cmpi ugt, %nbias, %c0 : index",
        f"{ind}%gsize = arith.divui %E, %G : index",
        # this lane's experts: lane + 32 i < E
        f"{ind}%ni0 = arith.addi %E, %c31 : index",
        f"{ind}%ni1 = arith.subi %ni0, %lane : index",
        f"{ind}%ni = arith.divui %ni1, %c32 : index",
        f"{ind}%multi = arith.cmpi ugt, %G, %c1 : index",
        f"{ind}%gsel = scf.if %multi -> (i64) {{",
    ]
    ind2 = ind + "  "
    # the scores of groups lane and lane + 32
    groups = []
    for j in (0, 1):
        g = op(ind2, f"arith.addi %lane, %c{32 * j} : index", "g")
        valid = op(ind2, f"arith.cmpi ult, {g}, %G : index")
        res = em.fresh("gs")
        lines.append(f"{ind2}{res}:2 = scf.if {valid} -> (i32, f32) {{")
        ind3 = ind2 + "  "
        lo = op(ind3, f"arith.muli {g}, %gsize : index")
        hi = op(ind3, f"arith.addi {lo}, %gsize : index")
        # the group's best two in one pass: (A, B)
        top, e = em.fresh("top"), em.fresh("ge")
        A = tuple(em.fresh(h) for h in ("ak", "av", "ai"))
        B = tuple(em.fresh(h) for h in ("bk", "bv", "bi"))
        inits = ", ".join(f"{v} = {i}" for v, i in zip(A + B, ("%c0_i32", "%zero", "%cm1_i32") * 2))
        lines.append(
            f"{ind3}{top}:6 = scf.for {e} = {lo} to {hi} step %c1 iter_args({inits}) "
            f"-> (i32, f32, i32, i32, f32, i32) {{"
        )
        ind4 = ind3 + "  "
        x = key(ind4, "%true", cval(ind4, e), i32(ind4, e))
        xa = better(ind4, x, A)
        xb = better(ind4, x, B)
        nA = pick(ind4, xa, x, A)
        nB = pick(ind4, xa, A, pick(ind4, xb, x, B))
        lines.append(f"{ind4}scf.yield {', '.join(nA + nB)} : i32, f32, i32, i32, f32, i32")
        lines.append(f"{ind3}}}")
        two = op(ind3, "arith.cmpi ugt, %gsize, %c1 : index")
        total = op(ind3, f"arith.addf {top}#1, {top}#4 : f32")
        score = op(ind3, f"arith.select {two}, {total}, {top}#1 : f32")
        gk = key(ind3, "%true", score, "%c0_i32")
        lines.append(f"{ind3}scf.yield {gk[0]}, {score} : i32, f32")
        lines.append(f"{ind2}}} else {{")
        lines.append(f"{ind3}scf.yield %c0_i32, %zero : i32, f32")
        lines.append(f"{ind2}}}")
        groups.append((f"{res}#0", f"{res}#1", i32(ind2, g), g))
    # topk_groups picks among the groups
    gs = op(ind2, "scf.for %gr = %c0 to %TG step %c1 iter_args(%mask = %c0_i64) -> (i64) {", "gp")
    ind3 = ind2 + "  "
    cands = []
    for gk, gv, gi, g in groups:
        bit = op(
            ind3, f"arith.shli %c1_i64, {op(ind3, f'arith.index_cast {g} : index to i64')} : i64"
        )
        taken = op(
            ind3, f"arith.cmpi ne, {op(ind3, f'arith.andi %mask, {bit} : i64')}, %c0_i64 : i64"
        )
        cands.append((op(ind3, f"arith.select {taken}, %c0_i32, {gk} : i32"), gv, gi))
    mine = pick(ind3, better(ind3, cands[1], cands[0]), cands[1], cands[0])
    win = warp_best(ind3, mine)
    wbit = op(ind3, f"arith.shli %c1_i64, {op(ind3, f'arith.extui {win[2]} : i32 to i64')} : i64")
    lines.append(f"{ind3}%nmask = arith.ori %mask, {wbit} : i64")
    lines.append(f"{ind3}scf.yield %nmask : i64")
    lines.append(f"{ind2}}}")
    lines.append(f"{ind2}scf.yield {gs} : i64")
    lines.append(f"{ind}}} else {{")
    lines.append(f"{ind2}scf.yield %allg : i64")
    lines.append(f"{ind}}}")

    # k picks among the experts of the chosen groups
    lines.append(
        f"{ind}%pk:2 = scf.for %j = %c0 to %k step %c1 iter_args(%taken = %c0_i32, %tot = %zero) -> (i32, f32) {{"
    )

    ind2 = ind + "  "
    best = em.fresh("ls")
    lines.append(
        f"{ind2}{best}:3 = scf.for %it = %c0 to %ni step %c1 iter_args(%sk = %c0_i32, %sv = %zero, "
        f"%si = %cm1_i32) -> (i32, f32, i32) {{"
    )
    ind3 = ind2 + "  "
    e32 = op(ind3, "arith.muli %it, %c32 : index")
    e = op(ind3, f"arith.addi {e32}, %lane : index")
    eg = op(ind3, f"arith.index_cast {op(ind3, f'arith.divui {e}, %gsize : index')} : index to i64")
    gbit = op(ind3, f"arith.shli %c1_i64, {eg} : i64")
    in_group = op(
        ind3, f"arith.cmpi ne, {op(ind3, f'arith.andi %gsel, {gbit} : i64')}, %c0_i64 : i64"
    )
    mine_bit = op(ind3, f"arith.shli %c1_i32, {i32(ind3, '%it')} : i32")
    free = op(
        ind3, f"arith.cmpi eq, {op(ind3, f'arith.andi %taken, {mine_bit} : i32')}, %c0_i32 : i32"
    )
    cand = op(ind3, f"arith.andi {in_group}, {free} : i1")
    x = key(ind3, cand, cval(ind3, e), i32(ind3, e))
    cur = ("%sk", "%sv", "%si")
    nxt = pick(ind3, better(ind3, x, cur), x, cur)
    lines.append(f"{ind3}scf.yield {', '.join(nxt)} : i32, f32, i32")
    lines.append(f"{ind2}}}")
    win = warp_best(ind2, (f"{best}#0", f"{best}#1", f"{best}#2"))
    # the verifier leaves a candidate every round; a pick of none would read scores[base]
    wi = op(
        ind2, f"arith.index_cast {op(ind2, f'arith.maxsi {win[2]}, %c0_i32 : i32')} : i32 to index"
    )
    own = op(ind2, f"arith.cmpi eq, {op(ind2, f'arith.remui {wi}, %c32 : index')}, %lane : index")
    obit = op(
        ind2, f"arith.shli %c1_i32, {i32(ind2, op(ind2, f'arith.divui {wi}, %c32 : index'))} : i32"
    )
    ntaken = op(
        ind2, f"arith.select {own}, {op(ind2, f'arith.ori %taken, {obit} : i32')}, %taken : i32"
    )
    ui = op(ind2, f"arith.addi %base, {wi} : index")
    u = op(ind2, f"memref.load %scores[{ui}] : memref<?xf32>")
    lines += [
        f"{ind2}%slot = arith.addi %obase, %j : index",
        f"{ind2}scf.if %lead {{",
        f"{ind2}  memref.store {win[2]}, %experts[%slot] : memref<?xi32>",
        f"{ind2}  memref.store {u}, %weights[%slot] : memref<?xf32>",
        f"{ind2}}}",
        f"{ind2}%tot2 = arith.addf %tot, {u} : f32",
        f"{ind2}scf.yield {ntaken}, %tot2 : i32, f32",
        f"{ind}}}",
        f"{ind}%nz = arith.cmpf une, %pk#1, %zero : f32",
        f"{ind}%div = arith.andi %renorm, %nz : i1",
        f"{ind}scf.if %lead {{",
        f"{ind}  scf.for %j = %c0 to %k step %c1 {{",
        f"{ind}    %slot = arith.addi %obase, %j : index",
        f"{ind}    %w = memref.load %weights[%slot] : memref<?xf32>",
        f"{ind}    %wq = arith.divf %w, %pk#1 : f32",
        f"{ind}    %w2 = arith.select %div, %wq, %w : f32",
        f"{ind}    %w3 = arith.mulf %w2, %scaling : f32",
        f"{ind}    memref.store %w3, %weights[%slot] : memref<?xf32>",
        f"{ind}  }}",
        f"{ind}}}",
    ]
    head = [
        "      %tid = gpu.thread_id x",
        "      %bid = gpu.block_id x",
        "      %c0 = arith.constant 0 : index",
        "      %c1 = arith.constant 1 : index",
        "      %c31 = arith.constant 31 : index",
        "      %c32 = arith.constant 32 : index",
        f"      %cwarps = arith.constant {TOKEN_WARPS} : index",
        "      %c0_i32 = arith.constant 0 : i32",
        "      %c1_i32 = arith.constant 1 : i32",
        "      %c2_i32 = arith.constant 2 : i32",
        "      %cm1_i32 = arith.constant -1 : i32",
        "      %c16_i32 = arith.constant 16 : i32",
        "      %c8_i32 = arith.constant 8 : i32",
        "      %c4_i32 = arith.constant 4 : i32",
        "      %c32_i32 = arith.constant 32 : i32",
        "      %c1_i64 = arith.constant 1 : i64",
        "      %c0_i64 = arith.constant 0 : i64",
        "      %allg = arith.constant -1 : i64",
        "      %zero = arith.constant 0.0 : f32",
        "      %true = arith.constant true",
        "      %lane = arith.remui %tid, %c32 : index",
        "      %warp = arith.divui %tid, %c32 : index",
        "      %t0 = arith.muli %bid, %cwarps : index",
        "      %t = arith.addi %t0, %warp : index",
        "      %lead = arith.cmpi eq, %lane, %c0 : index",
        # t is the same for the whole warp, so the shuffles below see every lane
        "      %ok = arith.cmpi ult, %t, %T : index",
        "      scf.if %ok {",
    ]
    body = "\n".join(head + lines + ["      }"])
    return kernel(
        "moe_router_select",
        "%scores: memref<?xf32>, %bias: memref<?xf32>, %nbias: index, %T: index, "
        "%E: index, %k: index, %G: index, %TG: index, %renorm: i1, %scaling: f32, "
        "%weights: memref<?xf32>, %experts: memref<?xi32>",
        body,
    )


SIMPLE.append(select_kernel())

DISPATCH_CHUNK = 1024

# Dispatch, step 1: per chunk of 1024 routing slots, the rank of each slot among
# the earlier slots of the chunk with the same expert, and per-expert counts.
SIMPLE.append(f"""    gpu.func @moe_dispatch_rank(%experts: memref<?xi32>, %Tk: index, %E: index, %rank: memref<?xi32>, %cnt: memref<?xi32>)
        workgroup(%sh: memref<{DISPATCH_CHUNK}xi32, {WG}>, %shc: memref<{DISPATCH_CHUNK}xi32, {WG}>) kernel attributes {{{KB}}} {{
      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c128 = arith.constant 128 : index
      %chunk = arith.constant {DISPATCH_CHUNK} : index
      %m1 = arith.constant -1 : i32
      %z = arith.constant 0 : i32
      %one = arith.constant 1 : i32
      %base = arith.muli %bid, %chunk : index
      scf.for %s = %tid to %chunk step %c128 {{
        %i = arith.addi %base, %s : index
        %in = arith.cmpi ult, %i, %Tk : index
        %v = scf.if %in -> (i32) {{
          %x = memref.load %experts[%i] : memref<?xi32>
          %xi = arith.index_cast %x : i32 to index
          %ge = arith.cmpi sge, %x, %z : i32
          %lt = arith.cmpi slt, %xi, %E : index
          %ok = arith.andi %ge, %lt : i1
          %r = arith.select %ok, %x, %m1 : i32
          scf.yield %r : i32
        }} else {{
          scf.yield %m1 : i32
        }}
        memref.store %v, %sh[%s] : memref<{DISPATCH_CHUNK}xi32, {WG}>
        memref.store %z, %shc[%s] : memref<{DISPATCH_CHUNK}xi32, {WG}>
      }}
      gpu.barrier
      scf.for %s = %tid to %chunk step %c128 {{
        %i = arith.addi %base, %s : index
        %v = memref.load %sh[%s] : memref<{DISPATCH_CHUNK}xi32, {WG}>
        %ok = arith.cmpi sge, %v, %z : i32
        scf.if %ok {{
          %r = scf.for %j = %c0 to %s step %c1 iter_args(%acc = %z) -> (i32) {{
            %w = memref.load %sh[%j] : memref<{DISPATCH_CHUNK}xi32, {WG}>
            %same = arith.cmpi eq, %w, %v : i32
            %inc = arith.select %same, %one, %z : i32
            %acc2 = arith.addi %acc, %inc : i32
            scf.yield %acc2 : i32
          }}
          memref.store %r, %rank[%i] : memref<?xi32>
          %vi = arith.index_cast %v : i32 to index
          %old = memref.atomic_rmw addi %one, %shc[%vi] : (i32, memref<{DISPATCH_CHUNK}xi32, {WG}>) -> i32
        }}
      }}
      gpu.barrier
      %cbase = arith.muli %bid, %E : index
      scf.for %e = %tid to %E step %c128 {{
        %n = memref.load %shc[%e] : memref<{DISPATCH_CHUNK}xi32, {WG}>
        %ci = arith.addi %cbase, %e : index
        memref.store %n, %cnt[%ci] : memref<?xi32>
      }}
      gpu.return
    }}""")

# Dispatch, step 2 (one block): per expert, exclusive prefix of the chunk counts
# in chunk order; then the expert offsets.
SIMPLE.append(
    kernel(
        "moe_dispatch_scan",
        "%cnt: memref<?xi32>, %nchunks: index, %E: index, %offsets: memref<?xi32>",
        """      %tid = gpu.thread_id x
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c128 = arith.constant 128 : index
      %z = arith.constant 0 : i32
      scf.for %e = %tid to %E step %c128 {
        %tot = scf.for %ch = %c0 to %nchunks step %c1 iter_args(%run = %z) -> (i32) {
          %i0 = arith.muli %ch, %E : index
          %i = arith.addi %i0, %e : index
          %n = memref.load %cnt[%i] : memref<?xi32>
          memref.store %run, %cnt[%i] : memref<?xi32>
          %run2 = arith.addi %run, %n : i32
          scf.yield %run2 : i32
        }
        %e1 = arith.addi %e, %c1 : index
        memref.store %tot, %offsets[%e1] : memref<?xi32>
      }
      gpu.barrier
      %first = arith.cmpi eq, %tid, %c0 : index
      scf.if %first {
        memref.store %z, %offsets[%c0] : memref<?xi32>
        %s = scf.for %e = %c0 to %E step %c1 iter_args(%acc = %z) -> (i32) {
          %e1 = arith.addi %e, %c1 : index
          %n = memref.load %offsets[%e1] : memref<?xi32>
          %acc2 = arith.addi %acc, %n : i32
          memref.store %acc2, %offsets[%e1] : memref<?xi32>
          scf.yield %acc2 : i32
        }
      }
""",
    )
)

# Dispatch, step 3: rows[t, j] and token_ids[row]; rows from offsets[E] on get token 0.
SIMPLE.append(
    kernel(
        "moe_dispatch_place",
        "%experts: memref<?xi32>, %rank: memref<?xi32>, %cnt: memref<?xi32>, %offsets: memref<?xi32>, "
        "%Tk: index, %k: index, %E: index, %R: index, %token_ids: memref<?xi32>, %rows: memref<?xi32>",
        GID
        + f"""      %z = arith.constant 0 : i32
      %m1 = arith.constant -1 : i32
      %chunk = arith.constant {DISPATCH_CHUNK} : index
      %in = arith.cmpi ult, %gid, %Tk : index
      scf.if %in {{
        %x = memref.load %experts[%gid] : memref<?xi32>
        %xi = arith.index_cast %x : i32 to index
        %ge = arith.cmpi sge, %x, %z : i32
        %lt = arith.cmpi slt, %xi, %E : index
        %ok = arith.andi %ge, %lt : i1
        scf.if %ok {{
          %ch = arith.divui %gid, %chunk : index
          %ci0 = arith.muli %ch, %E : index
          %ci = arith.addi %ci0, %xi : index
          %before = memref.load %cnt[%ci] : memref<?xi32>
          %off = memref.load %offsets[%xi] : memref<?xi32>
          %rk = memref.load %rank[%gid] : memref<?xi32>
          %r0 = arith.addi %off, %before : i32
          %row = arith.addi %r0, %rk : i32
          memref.store %row, %rows[%gid] : memref<?xi32>
          %t = arith.divui %gid, %k : index
          %ti = arith.index_cast %t : index to i32
          %rowi = arith.index_cast %row : i32 to index
          memref.store %ti, %token_ids[%rowi] : memref<?xi32>
        }} else {{
          memref.store %m1, %rows[%gid] : memref<?xi32>
        }}
      }}
      %inr = arith.cmpi ult, %gid, %R : index
      scf.if %inr {{
        %used = memref.load %offsets[%E] : memref<?xi32>
        %usedi = arith.index_cast %used : i32 to index
        %tail = arith.cmpi uge, %gid, %usedi : index
        scf.if %tail {{
          memref.store %z, %token_ids[%gid] : memref<?xi32>
        }}
      }}
""",
    )
)

# out[t, :] = sum_j w[t, j] * src[rows[t, j], :] (w = 1 without weights), f32,
# j ascending: the combine and the dx reduction, deterministic.
GATHER_SUM_ARGS = (
    "%src: memref<?xbf16>, %rows: memref<?xi32>, %w: memref<?xf32>, %has_w: i1, "
    "%T: index, %k: index, %d: index, %out: memref<?xbf16>"
)
GATHER_SUM_BODY = """      %tid = gpu.thread_id x
      %t = gpu.block_id x
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c8 = arith.constant 8 : index
      %c1024 = arith.constant 1024 : index
      %z = arith.constant 0 : i32
      %one = arith.constant 1.0 : f32
      %zv = arith.constant dense<0.0> : vector<8xf32>
      %ok = arith.cmpi ult, %t, %T : index
      scf.if %ok {
        %sbase = arith.muli %t, %k : index
        %obase = arith.muli %t, %d : index
        %col0 = arith.muli %tid, %c8 : index
        scf.for %col = %col0 to %d step %c1024 {
          %acc = scf.for %j = %c0 to %k step %c1 iter_args(%a = %zv) -> (vector<8xf32>) {
            %si = arith.addi %sbase, %j : index
            %r = memref.load %rows[%si] : memref<?xi32>
            %valid = arith.cmpi sge, %r, %z : i32
            %a2 = scf.if %valid -> (vector<8xf32>) {
              %ri = arith.index_cast %r : i32 to index
              %src0 = arith.muli %ri, %d : index
              %srci = arith.addi %src0, %col : index
              %v = vector.load %src[%srci] {alignment = 16} : memref<?xbf16>, vector<8xbf16>
              %vf = arith.extf %v : vector<8xbf16> to vector<8xf32>
              %wv = scf.if %has_w -> (f32) {
                %ww = memref.load %w[%si] : memref<?xf32>
                scf.yield %ww : f32
              } else {
                scf.yield %one : f32
              }
              %wb = vector.broadcast %wv : f32 to vector<8xf32>
              %prod = arith.mulf %vf, %wb : vector<8xf32>
              %s = arith.addf %a, %prod : vector<8xf32>
              scf.yield %s : vector<8xf32>
            } else {
              scf.yield %a : vector<8xf32>
            }
            scf.yield %a2 : vector<8xf32>
          }
          %ob = arith.truncf %acc : vector<8xf32> to vector<8xbf16>
          %oi = arith.addi %obase, %col : index
          vector.store %ob, %out[%oi] {alignment = 16} : memref<?xbf16>, vector<8xbf16>
        }
      }
"""
SIMPLE.append(kernel("moe_gather_sum", GATHER_SUM_ARGS, GATHER_SUM_BODY))


def accumulating_gather_sum(body):
    """moe_gather_sum's body summing from out's values (in f32, one rounding) instead of
    zero: out's 8 values are loaded before the sum over j and stored back after it."""
    edits = [
        ("      %zv = arith.constant dense<0.0> : vector<8xf32>\n", ""),
        (
            "          %acc = scf.for %j = %c0 to %k step %c1 iter_args(%a = %zv)",
            "          %oi = arith.addi %obase, %col : index\n"
            "          %held = vector.load %out[%oi] {alignment = 16} : memref<?xbf16>, vector<8xbf16>\n"
            "          %heldf = arith.extf %held : vector<8xbf16> to vector<8xf32>\n"
            "          %acc = scf.for %j = %c0 to %k step %c1 iter_args(%a = %heldf)",
        ),
        (
            "          %oi = arith.addi %obase, %col : index\n          vector.store",
            "          vector.store",
        ),
    ]
    for old, new in edits:
        assert body.count(old) == 1, old
        body = body.replace(old, new)
    return body


SIMPLE.append(
    kernel("moe_gather_sum_acc", GATHER_SUM_ARGS, accumulating_gather_sum(GATHER_SUM_BODY))
)

# wrow[rows[t, j]] = weights[t, j]: the routing weight of each expert-ordered row.
SIMPLE.append(
    kernel(
        "moe_scatter_weights",
        "%weights: memref<?xf32>, %rows: memref<?xi32>, %Tk: index, %wrow: memref<?xf32>",
        GID
        + """      %z = arith.constant 0 : i32
      %in = arith.cmpi ult, %gid, %Tk : index
      scf.if %in {
        %r = memref.load %rows[%gid] : memref<?xi32>
        %ok = arith.cmpi sge, %r, %z : i32
        scf.if %ok {
          %ri = arith.index_cast %r : i32 to index
          %w = memref.load %weights[%gid] : memref<?xf32>
          memref.store %w, %wrow[%ri] : memref<?xf32>
        }
      }
""",
    )
)

# Kernels whose work is one thread's: %first is thread 0 of block 0; %c7 and
# %cm8 round counts up to a multiple of 8.
FIRST_THREAD = """      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %z = arith.constant 0 : i32
      %c7 = arith.constant 7 : i32
      %cm8 = arith.constant -8 : i32
      %t0 = arith.cmpi eq, %tid, %c0 : index
      %b0 = arith.cmpi eq, %bid, %c0 : index
      %first = arith.andi %t0, %b0 : i1
"""

# One problem of T rows for the grouped kernels (shared expert, router GEMMs):
# offsets = [0, T].
SIMPLE.append(
    kernel(
        "moe_single_offsets",
        "%offsets: memref<?xi32>, %T: index",
        FIRST_THREAD
        + """      scf.if %first {
        %ti = arith.index_cast %T : index to i32
        memref.store %z, %offsets[%c0] : memref<?xi32>
        memref.store %ti, %offsets[%c1] : memref<?xi32>
      }
""",
    )
)

# offsets[i] = min(i * chunk, T) for i <= S: the router's weight gradient split along its
# tokens into S slices, run as S "experts" of the varlen-K GEMM.
SIMPLE.append(
    kernel(
        "moe_split_offsets",
        "%offsets: memref<?xi32>, %T: index, %chunk: index, %S: index",
        GID
        + """      %in = arith.cmpi ule, %gid, %S : index
      scf.if %in {
        %at = arith.muli %gid, %chunk : index
        %o = arith.minui %at, %T : index
        %oi = arith.index_cast %o : index to i32
        memref.store %oi, %offsets[%gid] : memref<?xi32>
      }
""",
    )
)

# dst[r, c] = sum over s < S of src[s, r, c] (f32, in order of s), for c < cdst: the
# slices of a split weight gradient summed, and the padding columns of src dropped.
SIMPLE.append(
    kernel(
        "moe_sum_splits_bf16",
        "%src: memref<?xbf16>, %dst: memref<?xbf16>, %R: index, %csrc: index, %cdst: index, "
        "%S: index",
        GID
        + """      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %zero = arith.constant 0.0 : f32
      %total = arith.muli %R, %cdst : index
      %in = arith.cmpi ult, %gid, %total : index
      scf.if %in {
        %r = arith.divui %gid, %cdst : index
        %col = arith.remui %gid, %cdst : index
        %row0 = arith.muli %r, %csrc : index
        %at = arith.addi %row0, %col : index
        %slice = arith.muli %R, %csrc : index
        %sum = scf.for %sl = %c0 to %S step %c1 iter_args(%acc = %zero) -> (f32) {
          %off = arith.muli %sl, %slice : index
          %i = arith.addi %off, %at : index
          %v = memref.load %src[%i] : memref<?xbf16>
          %vf = arith.extf %v : bf16 to f32
          %a2 = arith.addf %acc, %vf : f32
          scf.yield %a2 : f32
        }
        %b = arith.truncf %sum : f32 to bf16
        memref.store %b, %dst[%gid] : memref<?xbf16>
      }
""",
    )
)

# d_weights[t, j] = sum over N tiles of the dS partials of its row, in tile order.
SIMPLE.append(
    kernel(
        "moe_dweights",
        "%dspart: memref<?xf32>, %rows: memref<?xi32>, %Tk: index, %nt: index, %dweights: memref<?xf32>",
        GID
        + """      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %z = arith.constant 0 : i32
      %zero = arith.constant 0.0 : f32
      %in = arith.cmpi ult, %gid, %Tk : index
      scf.if %in {
        %r = memref.load %rows[%gid] : memref<?xi32>
        %ok = arith.cmpi sge, %r, %z : i32
        %s = scf.if %ok -> (f32) {
          %ri = arith.index_cast %r : i32 to index
          %b = arith.muli %ri, %nt : index
          %acc = scf.for %i = %c0 to %nt step %c1 iter_args(%a = %zero) -> (f32) {
            %ii = arith.addi %b, %i : index
            %p = memref.load %dspart[%ii] : memref<?xf32>
            %a2 = arith.addf %a, %p : f32
            scf.yield %a2 : f32
          }
          scf.yield %acc : f32
        } else {
          scf.yield %zero : f32
        }
        memref.store %s, %dweights[%gid] : memref<?xf32>
      }
""",
    )
)

# Router backward to the logits, per token (docs/cpu-path.md "Router gradient"):
# writes dlogits as bf16 [T, E8] for the two GEMMs.
SIMPLE.append(
    kernel(
        "moe_router_grad_logits",
        "%logits: memref<?xf32>, %experts: memref<?xi32>, %dw: memref<?xf32>, %dlin: memref<?xf32>, "
        "%has_dlin: i1, %T: index, %E: index, %k: index, %scoring: i32, %renorm: i1, %scaling: f32, "
        "%dl: memref<?xbf16>, %ldl: index",
        warp_per_token(
            GID
            + """      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %z = arith.constant 0 : i32
      %zero = arith.constant 0.0 : f32
      %one = arith.constant 1.0 : f32
      %ninf = arith.constant 0xFF800000 : f32
      %ok = arith.cmpi ult, %gid, %T : index
      scf.if %ok {
        %base = arith.muli %gid, %E : index
        %obase = arith.muli %gid, %k : index
        %soft = arith.cmpi eq, %scoring, %z : i32
        %mx = scf.for %e = %c0 to %E step %c1 iter_args(%m = %ninf) -> (f32) {
          %i = arith.addi %base, %e : index
          %l = memref.load %logits[%i] : memref<?xf32>
          %m2 = arith.maximumf %m, %l : f32
          scf.yield %m2 : f32
        }
        %sum = scf.for %e = %c0 to %E step %c1 iter_args(%s = %zero) -> (f32) {
          %i = arith.addi %base, %e : index
          %l = memref.load %logits[%i] : memref<?xf32>
          %d = arith.subf %l, %mx : f32
          %x = func.call @__moe_gpu_exp(%d) : (f32) -> f32
          %s2 = arith.addf %s, %x : f32
          scf.yield %s2 : f32
        }
        // S = sum_j u_j and sum_j dw_j u_j over the valid picks
        %sums:2 = scf.for %j = %c0 to %k step %c1 iter_args(%S = %zero, %W = %zero) -> (f32, f32) {
          %si = arith.addi %obase, %j : index
          %ej = memref.load %experts[%si] : memref<?xi32>
          %eji = arith.index_cast %ej : i32 to index
          %ge = arith.cmpi sge, %ej, %z : i32
          %lt = arith.cmpi slt, %eji, %E : index
          %valid = arith.andi %ge, %lt : i1
          %r:2 = scf.if %valid -> (f32, f32) {
            %li = arith.addi %base, %eji : index
            %l = memref.load %logits[%li] : memref<?xf32>
            %u = func.call @__moe_gpu_score(%l, %mx, %sum, %soft) : (f32, f32, f32, i1) -> f32
            %dwj = memref.load %dw[%si] : memref<?xf32>
            %S2 = arith.addf %S, %u : f32
            %p = arith.mulf %dwj, %u : f32
            %W2 = arith.addf %W, %p : f32
            scf.yield %S2, %W2 : f32, f32
          } else {
            scf.yield %S, %W : f32, f32
          }
          scf.yield %r#0, %r#1 : f32, f32
        }
        %nz = arith.cmpf une, %sums#0, %zero : f32
        %S2 = arith.mulf %sums#0, %sums#0 : f32
        // <ds, s> = sum_j du_j u_j
        %dsdot = scf.for %j = %c0 to %k step %c1 iter_args(%acc = %zero) -> (f32) {
          %si = arith.addi %obase, %j : index
          %ej = memref.load %experts[%si] : memref<?xi32>
          %eji = arith.index_cast %ej : i32 to index
          %ge = arith.cmpi sge, %ej, %z : i32
          %lt = arith.cmpi slt, %eji, %E : index
          %valid = arith.andi %ge, %lt : i1
          %r = scf.if %valid -> (f32) {
            %li = arith.addi %base, %eji : index
            %l = memref.load %logits[%li] : memref<?xf32>
            %u = func.call @__moe_gpu_score(%l, %mx, %sum, %soft) : (f32, f32, f32, i1) -> f32
            %dwj = memref.load %dw[%si] : memref<?xf32>
            %du = func.call @__moe_gpu_dweight(%dwj, %sums#0, %sums#1, %S2, %nz, %renorm, %scaling) : (f32, f32, f32, f32, i1, i1, f32) -> f32
            %p = arith.mulf %du, %u : f32
            %a2 = arith.addf %acc, %p : f32
            scf.yield %a2 : f32
          } else {
            scf.yield %acc : f32
          }
          scf.yield %r : f32
        }
        scf.for %e = %c0 to %E step %c1 {
          %li = arith.addi %base, %e : index
          %l = memref.load %logits[%li] : memref<?xf32>
          %s = func.call @__moe_gpu_score(%l, %mx, %sum, %soft) : (f32, f32, f32, i1) -> f32
          %ds = scf.for %j = %c0 to %k step %c1 iter_args(%acc = %zero) -> (f32) {
            %si = arith.addi %obase, %j : index
            %ej = memref.load %experts[%si] : memref<?xi32>
            %eji = arith.index_cast %ej : i32 to index
            %same = arith.cmpi eq, %eji, %e : index
            %r = scf.if %same -> (f32) {
              %dwj = memref.load %dw[%si] : memref<?xf32>
              %du = func.call @__moe_gpu_dweight(%dwj, %sums#0, %sums#1, %S2, %nz, %renorm, %scaling) : (f32, f32, f32, f32, i1, i1, f32) -> f32
              %a2 = arith.addf %acc, %du : f32
              scf.yield %a2 : f32
            } else {
              scf.yield %acc : f32
            }
            scf.yield %r : f32
          }
          %g = scf.if %soft -> (f32) {
            %q = arith.subf %ds, %dsdot : f32
            %v = arith.mulf %s, %q : f32
            scf.yield %v : f32
          } else {
            %oms = arith.subf %one, %s : f32
            %q = arith.mulf %s, %oms : f32
            %v = arith.mulf %ds, %q : f32
            scf.yield %v : f32
          }
          %g2 = scf.if %has_dlin -> (f32) {
            %x = memref.load %dlin[%li] : memref<?xf32>
            %y = arith.addf %g, %x : f32
            scf.yield %y : f32
          } else {
            scf.yield %g : f32
          }
          %gb = arith.truncf %g2 : f32 to bf16
          %dli0 = arith.muli %gid, %ldl : index
          %dli = arith.addi %dli0, %e : index
          memref.store %gb, %dl[%dli] : memref<?xbf16>
        }
      }
"""
        ),
    )
)

# dst[r, c] = src[r, c] for c < ncopy, else 0 (c < cdst): pads the expert dimension of
# the router's [*, E] matrices to a multiple of 8 columns (16-byte rows for cp.async
# and vector stores) and takes the padding off again.
for _ty in ("bf16", "f32"):
    SIMPLE.append(
        kernel(
            f"moe_repack_{_ty}",
            f"%src: memref<?x{_ty}>, %dst: memref<?x{_ty}>, %R: index, %csrc: index, %cdst: index, "
            "%ncopy: index",
            GID
            + f"""      %zero = arith.constant 0.0 : {_ty}
      %total = arith.muli %R, %cdst : index
      %in = arith.cmpi ult, %gid, %total : index
      scf.if %in {{
        %r = arith.divui %gid, %cdst : index
        %col = arith.remui %gid, %cdst : index
        %keep = arith.cmpi ult, %col, %ncopy : index
        %v = scf.if %keep -> ({_ty}) {{
          %si0 = arith.muli %r, %csrc : index
          %si = arith.addi %si0, %col : index
          %x = memref.load %src[%si] : memref<?x{_ty}>
          scf.yield %x : {_ty}
        }} else {{
          scf.yield %zero : {_ty}
        }}
        memref.store %v, %dst[%gid] : memref<?x{_ty}>
      }}
""",
        )
    )

# out = a + b, bf16 with an f32 add (gradient accumulation across uses). A thread takes 8
# elements: one 16-byte load of each operand and one store (the buffers are 16-byte aligned,
# the ABI's rule); the last thread's partial group goes element by element. With one
# element a thread the [T, d] add ran at a quarter of the memory bandwidth (H200: 0.32 ms
# for mixtral-8x7b's 400 MB).
SIMPLE.append(
    kernel(
        "moe_add",
        "%a: memref<?xbf16>, %b: memref<?xbf16>, %out: memref<?xbf16>, %N: index",
        GID
        + """      %c1 = arith.constant 1 : index
      %c8 = arith.constant 8 : index
      %base = arith.muli %gid, %c8 : index
      %end = arith.addi %base, %c8 : index
      %full = arith.cmpi ule, %end, %N : index
      scf.if %full {
        %x = vector.load %a[%base] {alignment = 16} : memref<?xbf16>, vector<8xbf16>
        %y = vector.load %b[%base] {alignment = 16} : memref<?xbf16>, vector<8xbf16>
        %xf = arith.extf %x : vector<8xbf16> to vector<8xf32>
        %yf = arith.extf %y : vector<8xbf16> to vector<8xf32>
        %s = arith.addf %xf, %yf : vector<8xf32>
        %sb = arith.truncf %s : vector<8xf32> to vector<8xbf16>
        vector.store %sb, %out[%base] {alignment = 16} : memref<?xbf16>, vector<8xbf16>
      } else {
        %last = arith.minui %end, %N : index
        %lo = arith.minui %base, %last : index
        scf.for %i = %lo to %last step %c1 {
          %x = memref.load %a[%i] : memref<?xbf16>
          %y = memref.load %b[%i] : memref<?xbf16>
          %xf = arith.extf %x : bf16 to f32
          %yf = arith.extf %y : bf16 to f32
          %s = arith.addf %xf, %yf : f32
          %sb = arith.truncf %s : f32 to bf16
          memref.store %sb, %out[%i] : memref<?xbf16>
        }
      }
""",
    )
)

DEVICE_FUNCS = """    // exp(x) = 2^(x log2 e) on the SFU (ex2.approx, ~2 ulp): no libdevice, so the PTX
    // of every format is self-contained.
    func.func private @__moe_gpu_exp(%x: f32) -> f32 {
      %log2e = arith.constant 1.44269504 : f32
      %y = arith.mulf %x, %log2e : f32
      %r = nvvm.inline_ptx "ex2.approx.ftz.f32 $0, $1;" ro(%y : f32) -> f32
      return %r : f32
    }
    // sigmoid(x) = 1 / (1 + exp(-x)) by rcp.approx (1 ulp): an IEEE division branches to a
    // slow path per element (SASS: BSSY, CALL), which the epilogues pay on every value.
    // For x < -88 the sum is inf and the reciprocal 0.
    func.func private @__moe_gpu_sigmoid(%x: f32) -> f32 {
      %one = arith.constant 1.0 : f32
      %n = arith.negf %x : f32
      %e = func.call @__moe_gpu_exp(%n) : (f32) -> f32
      %d = arith.addf %e, %one : f32
      %r = nvvm.inline_ptx "rcp.approx.ftz.f32 $0, $1;" ro(%d : f32) -> f32
      return %r : f32
    }
    func.func private @__moe_gpu_score(%l: f32, %mx: f32, %sum: f32, %soft: i1) -> f32 {
      %one = arith.constant 1.0 : f32
      %r = scf.if %soft -> (f32) {
        %d = arith.subf %l, %mx : f32
        %x = func.call @__moe_gpu_exp(%d) : (f32) -> f32
        %p = arith.divf %x, %sum : f32
        scf.yield %p : f32
      } else {
        %nl = arith.negf %l : f32
        %x = func.call @__moe_gpu_exp(%nl) : (f32) -> f32
        %den = arith.addf %x, %one : f32
        %p = arith.divf %one, %den : f32
        scf.yield %p : f32
      }
      return %r : f32
    }
    func.func private @__moe_gpu_dweight(%dw: f32, %S: f32, %W: f32, %S2: f32, %nz: i1, %renorm: i1, %scaling: f32) -> f32 {
      %zero = arith.constant 0.0 : f32
      %a = arith.divf %dw, %S : f32
      %b = arith.divf %W, %S2 : f32
      %c = arith.subf %a, %b : f32
      %r = arith.select %nz, %c, %zero : f32
      %q = arith.select %renorm, %r, %dw : f32
      %out = arith.mulf %q, %scaling : f32
      return %out : f32
    }"""


# ---------------------------------------------------------------------------
# Host functions (docs/gpu-path.md section 1): launches on one async token.
# ---------------------------------------------------------------------------
class Host:
    def __init__(self, name, args):
        self.e = Emitter("    ")
        self.name = name
        self.args = args
        self.tok = "%token"
        # MOE_GEMM_DYNAMIC's tile counters: buffers of COUNTER_WORDS zeroed words, one a
        # launch, freed at the end of the function
        self.counters, self.counter_words_used = [], COUNTER_WORDS

    def c(self, v, ty="index"):
        return self.e.const(v, ty)

    def dim(self, mem, ty, i):
        return self.e.op(f"memref.dim {mem}, {self.c(i)} : {ty}", "dim")

    def flat(self, mem, ty):
        rank = ty.count("?x")
        elt = ty.split("x")[-1].rstrip(">")
        if rank == 1:
            return mem
        dims = ", ".join(str(i) for i in range(rank))
        return self.e.op(
            f"memref.collapse_shape {mem} [[{dims}]] : {ty} into memref<?x{elt}>", "flat"
        )

    def ceil(self, a, b):
        e = self.e
        return e.div(e.add(a, self.c(b - 1)), self.c(b))

    def grid(self, v):
        # a launch needs at least one block; kernels bound-check.
        return self.e.op(f"arith.maxui {v}, {self.c(1)} : index", "g")

    def alloc(self, size, elt):
        e = self.e
        buf = e.fresh("buf")
        tok = e.fresh("t")
        e.emit(f"{buf}, {tok} = gpu.alloc async [{self.tok}] ({size}) : memref<?x{elt}>")
        self.tok = tok
        return buf

    def tile_counter(self):
        """(buffer, word) of a zeroed tile counter for one launch of a dynamic GEMM."""
        if self.counter_words_used == COUNTER_WORDS:
            buf = self.alloc(self.c(COUNTER_WORDS), "i32")
            self.tok = self.e.op(
                f"gpu.memset async [{self.tok}] {buf}, {self.c(0, 'i32')} : memref<?xi32>, i32", "t"
            )
            self.counters.append(buf)
            self.counter_words_used = 0
        self.counter_words_used += 1
        return self.counters[-1], self.c(self.counter_words_used - 1)

    def dealloc(self, buf, elt):
        self.tok = self.e.op(f"gpu.dealloc async [{self.tok}] {buf} : memref<?x{elt}>", "t")

    def weight_map(self, g, v):
        """The device address of the tensor map of B = W ([E] x rows of ldb elements)
        for g's TMA boxes (moeTensorMapDeviceBf16: cached by its arguments, so a
        training step finds its weights' maps without a copy)."""
        e = self.e
        N, K, E, ldb = v["dim_n"], v["dim_k"], v["num_experts"], v["ldb"]
        row = e.mul(ldb, self.c(2))  # bytes
        if g.b == "w_mn":  # [E][K][N]
            dims, strides, box = [N, K, E], [row, e.mul(K, row)], [64, 64, 1]
        elif g.b == "w_k":  # [E][N][K]
            dims, strides, box = [K, N, E], [row, e.mul(N, row)], [64, BN, 1]
        else:  # w_mn_swiglu: [E][K][2][h], gate and up halves of each row
            dims, strides, box = (
                [N, self.c(2), K, E],
                [e.mul(N, self.c(2)), row, e.mul(K, row)],
                [64, 1, 64, 1],
            )
        return self.tensor_map(v["bmat"], dims, strides, box)

    def out_map(self, v):
        """The tensor map of the weight gradients' C, [E][M][N] with rows ldc elements
        apart and experts M N apart (out_base), in 128x64 boxes (MOE_GEMM_TMA_STORE)."""
        e = self.e
        M, N, E = v["dim_m"], v["dim_n"], v["num_experts"]
        return self.tensor_map(
            v["cout"],
            [N, M, E],
            [e.mul(v["ldc"], self.c(2)), e.mul(e.mul(M, N), self.c(2))],
            [64, BM, 1],
        )

    def rows_map(self, mat, rows, cols, ld, box_rows=64):
        """The tensor map of a [rows, cols] bf16 matrix with rows ld elements apart, in
        boxes of 64 columns by box_rows (MOE_GEMM_ROWS_TMA's operands: 64; the varlen-M
        GEMMs' C of MOE_GEMM_TMA_STORE: 128); a per-call buffer costs an upload the first time
        its address is seen. No rows (T = 0): a null map, which no k-step reads (a map
        cannot have an empty dimension)."""
        e = self.e
        out = e.fresh("rmap")
        e.emit(f"{out} = scf.if {e.cmp('ugt', rows, self.c(0))} -> (!llvm.ptr) {{")
        e.indent += "  "
        tmap = self.tensor_map(mat, [cols, rows], [e.mul(ld, self.c(2))], [64, box_rows])
        e.emit(f"scf.yield {tmap} : !llvm.ptr")
        e.indent = e.indent[:-2]
        e.emit("} else {")
        e.emit(f"  {out}z = llvm.mlir.zero : !llvm.ptr")
        e.emit(f"  scf.yield {out}z : !llvm.ptr")
        e.emit("}")
        return out

    def tensor_map(self, mat, dims, strides, box):
        """moeTensorMapDeviceBf16 of `mat`: dims innermost first, strides in bytes."""
        e = self.e

        def i64(x):
            return e.op(f"arith.index_cast {x} : index to i64")

        zero = self.c(0, "i64")
        dims = [i64(x) for x in dims] + [zero] * (4 - len(dims))
        strides = [i64(x) for x in strides] + [zero] * (3 - len(strides))
        box = [self.c(b, "i64") for b in box] + [zero] * (4 - len(box))
        addr = e.op(f"memref.extract_aligned_pointer_as_index {mat} : memref<?xbf16> -> index")
        ptr = e.op(f"llvm.inttoptr {i64(addr)} : i64 to !llvm.ptr")
        args = [ptr, self.c(len(box) - box.count(zero), "i64")] + dims + strides + box
        return e.op(
            f"func.call @moeTensorMapDeviceBf16({', '.join(args)}) : "
            f"(!llvm.ptr{', i64' * 12}) -> !llvm.ptr",
            "map",
        )

    def launch_gemm(self, kernel, mtiles, ntiles, gz, args):
        """GEMM kernels take one x index per (M-tile, N-tile) and raster it themselves;
        persistent ones get one CTA an SM (at most one a tile) and walk all tiles."""
        g = next(x for x in GEMMS if x.name == kernel)
        e = self.e
        tiles = e.mul(self.grid(mtiles), ntiles)
        if g.persistent:
            tiles = e.minu(e.mul(tiles, gz), self.c(NUM_CTAS))
            gz = self.c(1)
        self.launch(kernel, tiles, self.c(1), gz, args, g.launch_smem, g.threads)

    def launch(self, kernel, gx, gy, gz, args, smem=0, threads=THREADS):
        e = self.e
        one = self.c(1)
        threads = self.c(threads)
        arglist = ", ".join(f"{v} : {t}" for v, t in args)
        sm = f" dynamic_shared_memory_size {self.c(smem, 'i32')}" if smem else ""
        self.tok = e.op(
            f"gpu.launch_func async [{self.tok}] @moe_kernels::@{kernel} blocks in ({self.grid(gx)}, {self.grid(gy)}, {self.grid(gz)}) "
            f"threads in ({threads}, {one}, {one}){sm} args({arglist})",
            "t",
        )

    def text(self):
        for buf in self.counters:
            self.dealloc(buf, "i32")
        self.counters = []
        args = ", ".join(f"%{n}: {t}" for n, t in self.args)
        head = f"  func.func private @__moe_gpu_{self.name}(%token: !gpu.async.token, {args}) -> !gpu.async.token {{"
        return "\n".join(
            [head]
            + [line.replace("      ", "    ", 1) for line in self.e.const_lines]
            + self.e.lines
            + [f"    return {self.tok} : !gpu.async.token", "  }"]
        )


I32V, F32V, BF16V = "memref<?xi32>", "memref<?xf32>", "memref<?xbf16>"
M2 = {"bf16": "memref<?x?xbf16>", "f32": "memref<?x?xf32>", "i32": "memref<?x?xi32>"}
M3 = "memref<?x?x?xbf16>"
IDX = "index"


def gemm_args(h, kernel, values):
    """Arguments of a GEMM launch in the kernel's signature order."""
    g = next(x for x in GEMMS if x.name == kernel)
    if g.tma_b:
        values = dict(values, bmap=h.weight_map(g, values))
    if g.tma_rows_a:
        values = dict(
            values, amap=h.rows_map(values["amat"], values["rows"], values["dim_m"], values["lda"])
        )
    if g.tma_rows_b:
        values = dict(
            values,
            browmap=h.rows_map(values["bmat"], values["rows"], values["dim_n"], values["ldb"]),
        )
    if g.tma_store:
        values = dict(values, cmap=h.out_map(values))
    if g.tma_store_rows:
        values = dict(
            values,
            cmap=h.rows_map(values["cout"], values["dim_m"], values["dim_n"], values["ldc"], BM),
        )
    if g.dynamic:
        counter, slot = h.tile_counter()
        values = dict(values, tile_counter=counter, counter_slot=slot)
    out = []
    for name, ty in gemm_signature(g):
        out.append((values[name], ty))
    return out


def repack(h, src, dst, rows, csrc, cdst, ncopy, ty):
    one = h.c(1)
    h.launch(
        f"moe_repack_{ty}",
        h.ceil(h.e.mul(rows, cdst), THREADS),
        one,
        one,
        [
            (src, f"memref<?x{ty}>"),
            (dst, f"memref<?x{ty}>"),
            (rows, IDX),
            (csrc, IDX),
            (cdst, IDX),
            (ncopy, IDX),
        ],
    )


def padded_copy(h, src, rows, cols, cols8, ty):
    """[rows, cols] -> a new [rows, cols8] buffer, zero in the padding columns."""
    dst = h.alloc(h.e.mul(rows, cols8), ty)
    repack(h, src, dst, rows, cols, cols8, cols, ty)
    return dst


def single_offsets(h, T):
    offs = h.alloc(h.c(2), "i32")
    h.launch("moe_single_offsets", h.c(1), h.c(1), h.c(1), [(offs, I32V), (T, IDX)])
    return offs


def host_router():
    h = Host(
        "router",
        [
            ("x", M2["bf16"]),
            ("wr", M2["bf16"]),
            ("bias", F32V),
            ("scoring", "i32"),
            ("renormalize", "i1"),
            ("num_groups", IDX),
            ("topk_groups", IDX),
            ("scaling", "f32"),
            ("round_logits", "i1"),
            ("weights", M2["f32"]),
            ("experts", M2["i32"]),
            ("logits", M2["f32"]),
        ],
    )
    e = h.e
    T = h.dim("%x", M2["bf16"], 0)
    d = h.dim("%x", M2["bf16"], 1)
    E = h.dim("%wr", M2["bf16"], 1)
    k = h.dim("%weights", M2["f32"], 1)
    xf, wrf = h.flat("%x", M2["bf16"]), h.flat("%wr", M2["bf16"])
    lf = h.flat("%logits", M2["f32"])
    wf, ef = h.flat("%weights", M2["f32"]), h.flat("%experts", M2["i32"])
    offs = single_offsets(h, T)
    one = h.c(1)
    E8 = round8(h, E)
    wrp = padded_copy(h, wrf, d, E, E8, "bf16")
    lp = h.alloc(h.grid(e.mul(T, E8)), "f32")
    h.launch_gemm(
        "moe_gemm_rows_mn_f32",
        e.add(h.ceil(T, BM), one),
        h.ceil(E8, BN),
        one,
        gemm_args(
            h,
            "moe_gemm_rows_mn_f32",
            dict(
                offsets=offs,
                num_experts=one,
                amat=xf,
                lda=d,
                bmat=wrp,
                ldb=E8,
                dim_m=T,
                dim_n=E8,
                dim_k=d,
                cout=lp,
                ldc=E8,
            ),
        ),
    )
    repack(h, lp, lf, T, E8, E, E, "f32")
    h.dealloc(lp, "f32")
    h.dealloc(wrp, "bf16")
    scores = h.alloc(e.mul(T, E), "f32")
    h.launch(
        "moe_router_scores",
        h.ceil(T, TOKEN_WARPS),
        one,
        one,
        [
            (lf, F32V),
            (scores, F32V),
            (T, IDX),
            (E, IDX),
            ("%scoring", "i32"),
            ("%round_logits", "i1"),
        ],
    )
    nb = h.dim("%bias", F32V, 0)
    h.launch(
        "moe_router_select",
        h.ceil(T, TOKEN_WARPS),
        one,
        one,
        [
            (scores, F32V),
            ("%bias", F32V),
            (nb, IDX),
            (T, IDX),
            (E, IDX),
            (k, IDX),
            ("%num_groups", IDX),
            ("%topk_groups", IDX),
            ("%renormalize", "i1"),
            ("%scaling", "f32"),
            (wf, F32V),
            (ef, I32V),
        ],
    )
    h.dealloc(scores, "f32")
    h.dealloc(offs, "i32")
    return h.text()


def host_dispatch():
    h = Host(
        "dispatch",
        [("experts", M2["i32"]), ("token_ids", I32V), ("offsets", I32V), ("rows", M2["i32"])],
    )
    e = h.e
    one = h.c(1)
    T = h.dim("%experts", M2["i32"], 0)
    k = h.dim("%experts", M2["i32"], 1)
    Tk = e.mul(T, k)
    E = e.sub(h.dim("%offsets", I32V, 0), one)
    R = h.dim("%token_ids", I32V, 0)
    ef, rf = h.flat("%experts", M2["i32"]), h.flat("%rows", M2["i32"])
    nchunks = h.ceil(Tk, DISPATCH_CHUNK)
    rank = h.alloc(Tk, "i32")
    cnt = h.alloc(e.mul(h.grid(nchunks), E), "i32")
    h.launch(
        "moe_dispatch_rank",
        nchunks,
        one,
        one,
        [(ef, I32V), (Tk, IDX), (E, IDX), (rank, I32V), (cnt, I32V)],
    )
    h.launch(
        "moe_dispatch_scan",
        one,
        one,
        one,
        [(cnt, I32V), (nchunks, IDX), (E, IDX), ("%offsets", I32V)],
    )
    h.launch(
        "moe_dispatch_place",
        h.ceil(e.op(f"arith.maxui {Tk}, {R} : index"), THREADS),
        one,
        one,
        [
            (ef, I32V),
            (rank, I32V),
            (cnt, I32V),
            ("%offsets", I32V),
            (Tk, IDX),
            (k, IDX),
            (E, IDX),
            (R, IDX),
            ("%token_ids", I32V),
            (rf, I32V),
        ],
    )
    h.dealloc(rank, "i32")
    h.dealloc(cnt, "i32")
    return h.text()


def ffn_forward(h, x, ids, offs, E, wguf, wdf, yf, hf, M, d, n, up_kernel):
    """up (gather or rows) + SwiGLU, then down (yf None: not run, only H is wanted, by
    the up kernel's variant that writes no A); A lives only between the two."""
    e = h.e
    one = h.c(1)
    values = dict(
        offsets=offs,
        num_experts=E,
        amat=x,
        lda=d,
        bmat=wguf,
        ldb=e.mul(n, h.c(2)),
        dim_m=M,
        dim_n=n,
        dim_k=d,
        hout=hf,
    )
    if ids:
        values["ids"] = ids
    if yf is None:
        h.launch_gemm(
            up_kernel + "_h",
            e.add(h.ceil(M, BM), E),
            h.ceil(n, BN // 2),
            one,
            gemm_args(h, up_kernel + "_h", values),
        )
        return
    a = h.alloc(h.grid(e.mul(M, n)), "bf16")
    values["aout"] = a
    h.launch_gemm(
        up_kernel, e.add(h.ceil(M, BM), E), h.ceil(n, BN // 2), one, gemm_args(h, up_kernel, values)
    )
    h.launch_gemm(
        "moe_gemm_rows_mn_bf16",
        e.add(h.ceil(M, BM), E),
        h.ceil(d, BN),
        one,
        gemm_args(
            h,
            "moe_gemm_rows_mn_bf16",
            dict(
                offsets=offs,
                num_experts=E,
                amat=a,
                lda=n,
                bmat=wdf,
                ldb=d,
                dim_m=M,
                dim_n=d,
                dim_k=n,
                cout=yf,
                ldc=d,
            ),
        ),
    )
    h.dealloc(a, "bf16")


def host_expert_ffn(with_y=True):
    """expert_ffn, or without y expert_ffn_h: a recomputation in backward wants only H
    (docs/memory.md)."""
    y = [("y", M2["bf16"])] if with_y else []
    h = Host(
        "expert_ffn" if with_y else "expert_ffn_h",
        [
            ("x", M2["bf16"]),
            ("token_ids", I32V),
            ("offsets", I32V),
            ("wgu", M3),
            ("wd", M3),
            ("act", "i32"),
        ]
        + y
        + [("h", M2["bf16"])],
    )
    d = h.dim("%x", M2["bf16"], 1)
    R = h.dim("%token_ids", I32V, 0)
    E = h.dim("%wd", M3, 0)
    n = h.dim("%wd", M3, 1)
    ffn_forward(
        h,
        h.flat("%x", M2["bf16"]),
        "%token_ids",
        "%offsets",
        E,
        h.flat("%wgu", M3),
        h.flat("%wd", M3),
        h.flat("%y", M2["bf16"]) if with_y else None,
        h.flat("%h", M2["bf16"]),
        R,
        d,
        n,
        "moe_gemm_up_gather",
    )
    return h.text()


def host_shared_expert(with_y=True):
    """shared_expert, or without y shared_expert_h (the recomputation of H)."""
    y = [("y", M2["bf16"])] if with_y else []
    h = Host(
        "shared_expert" if with_y else "shared_expert_h",
        [("x", M2["bf16"]), ("wgu", M2["bf16"]), ("wd", M2["bf16"]), ("act", "i32")]
        + y
        + [("h", M2["bf16"])],
    )
    T = h.dim("%x", M2["bf16"], 0)
    d = h.dim("%x", M2["bf16"], 1)
    m = h.dim("%wd", M2["bf16"], 0)
    offs = single_offsets(h, T)
    ffn_forward(
        h,
        h.flat("%x", M2["bf16"]),
        None,
        offs,
        h.c(1),
        h.flat("%wgu", M2["bf16"]),
        h.flat("%wd", M2["bf16"]),
        h.flat("%y", M2["bf16"]) if with_y else None,
        h.flat("%h", M2["bf16"]),
        T,
        d,
        m,
        "moe_gemm_up_rows",
    )
    h.dealloc(offs, "i32")
    return h.text()


def host_combine(accumulate=False):
    """__moe_gpu_combine; accumulate: __moe_gpu_combine_acc, which adds the combined rows
    to what out holds."""
    h = Host(
        "combine_acc" if accumulate else "combine",
        [("y", M2["bf16"]), ("weights", M2["f32"]), ("rows", M2["i32"]), ("out", M2["bf16"])],
    )
    one = h.c(1)
    T = h.dim("%weights", M2["f32"], 0)
    k = h.dim("%weights", M2["f32"], 1)
    d = h.dim("%y", M2["bf16"], 1)
    h.launch(
        "moe_gather_sum_acc" if accumulate else "moe_gather_sum",
        T,
        one,
        one,
        [
            (h.flat("%y", M2["bf16"]), BF16V),
            (h.flat("%rows", M2["i32"]), I32V),
            (h.flat("%weights", M2["f32"]), F32V),
            (h.c(1, "i1"), "i1"),
            (T, IDX),
            (k, IDX),
            (d, IDX),
            (h.flat("%out", M2["bf16"]), BF16V),
        ],
    )
    return h.text()


def launch_wgrad(h, gathered, queue_arg, queue, values):
    """A weight gradient, a GEMM over each expert's tokens (varlen K): the kernel
    `gathered` with the dispatch queue as its `queue_arg` (the operand whose rows are
    tokens), or, without a queue, the rows in order."""
    kernel = gathered if queue else "moe_gemm_wgrad_rows"
    if queue:
        values = dict(values, **{queue_arg: queue})
    h.launch_gemm(
        kernel,
        h.ceil(values["dim_m"], BM),
        h.ceil(values["dim_n"], BN),
        values["num_experts"],
        gemm_args(h, kernel, values),
    )


def ffn_backward(
    h, x, dout, ids, offs, E, wguf, wdf, hf, wrow, M, d, n, dxe, dwguf, dwdf, dspart, nt, experts
):
    """dA (+ dSwiGLU, dS), dX_e, dW_down, dW_gate_up of one grouped FFN."""
    e = h.e
    one = h.c(1)
    two_n = e.mul(n, h.c(2))
    dh = h.alloc(e.mul(M, two_n), "bf16")
    wa = h.alloc(h.grid(e.mul(M, n)), "bf16")
    kernel = "moe_gemm_dact_gather" if experts else "moe_gemm_dact_rows"
    values = dict(
        offsets=offs,
        num_experts=E,
        amat=dout,
        lda=d,
        bmat=wdf,
        ldb=d,
        dim_m=M,
        dim_n=n,
        dim_k=d,
        hsaved=hf,
        dh=dh,
        wa=wa,
    )
    if experts:
        values.update(ids=ids, wrow=wrow, dspart=dspart, num_ntiles=nt)
    h.launch_gemm(kernel, e.add(h.ceil(M, BM), E), h.ceil(n, BN), one, gemm_args(h, kernel, values))
    h.launch_gemm(
        "moe_gemm_rows_k_bf16",
        e.add(h.ceil(M, BM), E),
        h.ceil(d, BN),
        one,
        gemm_args(
            h,
            "moe_gemm_rows_k_bf16",
            dict(
                offsets=offs,
                num_experts=E,
                amat=dh,
                lda=two_n,
                bmat=wguf,
                ldb=two_n,
                dim_m=M,
                dim_n=d,
                dim_k=two_n,
                cout=dxe,
                ldc=d,
            ),
        ),
    )
    queue = ids if experts else None
    # dW_down = (w A)^T dOut[q]: the token rows are B; dW_gate_up = x[q]^T dH: they are A
    # (rows: of w A and dH, for MOE_GEMM_ROWS_TMA's maps)
    launch_wgrad(
        h,
        "moe_gemm_wgrad_gather",
        "bids",
        queue,
        dict(
            offsets=offs,
            num_experts=E,
            amat=wa,
            lda=n,
            bmat=dout,
            ldb=d,
            dim_m=n,
            dim_n=d,
            dim_k=h.c(0),
            cout=dwdf,
            ldc=d,
            rows=M,
        ),
    )
    launch_wgrad(
        h,
        "moe_gemm_wgrad_gather_a",
        "ids",
        queue,
        dict(
            offsets=offs,
            num_experts=E,
            amat=x,
            lda=d,
            bmat=dh,
            ldb=two_n,
            dim_m=d,
            dim_n=two_n,
            dim_k=h.c(0),
            cout=dwguf,
            ldc=two_n,
            rows=M,
        ),
    )
    h.dealloc(dh, "bf16")
    h.dealloc(wa, "bf16")


def round8(h, v):
    e = h.e
    return e.mul(h.ceil(v, 8), h.c(8))


def host_expert_combine_grad(accumulate=False):
    """__moe_gpu_expert_combine_grad; accumulate: __moe_gpu_expert_combine_grad_acc, which
    adds the experts' dx to what dx holds."""
    h = Host(
        "expert_combine_grad_acc" if accumulate else "expert_combine_grad",
        [
            ("x", M2["bf16"]),
            ("token_ids", I32V),
            ("offsets", I32V),
            ("rows", M2["i32"]),
            ("weights", M2["f32"]),
            ("wgu", M3),
            ("wd", M3),
            ("h", M2["bf16"]),
            ("dout", M2["bf16"]),
            ("act", "i32"),
            ("dx", M2["bf16"]),
            ("d_weights", M2["f32"]),
            ("d_wgu", M3),
            ("d_wd", M3),
        ],
    )
    e = h.e
    one = h.c(1)
    T = h.dim("%x", M2["bf16"], 0)
    d = h.dim("%x", M2["bf16"], 1)
    k = h.dim("%rows", M2["i32"], 1)
    Tk = e.mul(T, k)
    R = h.dim("%token_ids", I32V, 0)
    E = h.dim("%wd", M3, 0)
    n = h.dim("%wd", M3, 1)
    rowsf, wf = h.flat("%rows", M2["i32"]), h.flat("%weights", M2["f32"])
    wrow = h.alloc(h.grid(R), "f32")
    h.launch(
        "moe_scatter_weights",
        h.ceil(Tk, THREADS),
        one,
        one,
        [(wf, F32V), (rowsf, I32V), (Tk, IDX), (wrow, F32V)],
    )
    nt = h.ceil(n, BN)
    dspart = h.alloc(h.grid(e.mul(R, nt)), "f32")
    dxe = h.alloc(e.mul(R, d), "bf16")
    ffn_backward(
        h,
        h.flat("%x", M2["bf16"]),
        h.flat("%dout", M2["bf16"]),
        "%token_ids",
        "%offsets",
        E,
        h.flat("%wgu", M3),
        h.flat("%wd", M3),
        h.flat("%h", M2["bf16"]),
        wrow,
        R,
        d,
        n,
        dxe,
        h.flat("%d_wgu", M3),
        h.flat("%d_wd", M3),
        dspart,
        nt,
        True,
    )
    h.launch(
        "moe_dweights",
        h.ceil(Tk, THREADS),
        one,
        one,
        [
            (dspart, F32V),
            (rowsf, I32V),
            (Tk, IDX),
            (nt, IDX),
            (h.flat("%d_weights", M2["f32"]), F32V),
        ],
    )
    h.launch(
        "moe_gather_sum_acc" if accumulate else "moe_gather_sum",
        T,
        one,
        one,
        [
            (dxe, BF16V),
            (rowsf, I32V),
            (wrow, F32V),
            (h.c(0, "i1"), "i1"),
            (T, IDX),
            (k, IDX),
            (d, IDX),
            (h.flat("%dx", M2["bf16"]), BF16V),
        ],
    )
    for buf, ty in ((dxe, "bf16"), (dspart, "f32"), (wrow, "f32")):
        h.dealloc(buf, ty)
    return h.text()


def host_shared_expert_grad():
    h = Host(
        "shared_expert_grad",
        [
            ("x", M2["bf16"]),
            ("wgu", M2["bf16"]),
            ("wd", M2["bf16"]),
            ("h", M2["bf16"]),
            ("dy", M2["bf16"]),
            ("act", "i32"),
            ("dx", M2["bf16"]),
            ("d_wgu", M2["bf16"]),
            ("d_wd", M2["bf16"]),
        ],
    )
    T = h.dim("%x", M2["bf16"], 0)
    d = h.dim("%x", M2["bf16"], 1)
    m = h.dim("%wd", M2["bf16"], 0)
    offs = single_offsets(h, T)
    ffn_backward(
        h,
        h.flat("%x", M2["bf16"]),
        h.flat("%dy", M2["bf16"]),
        None,
        offs,
        h.c(1),
        h.flat("%wgu", M2["bf16"]),
        h.flat("%wd", M2["bf16"]),
        h.flat("%h", M2["bf16"]),
        None,
        T,
        d,
        m,
        h.flat("%dx", M2["bf16"]),
        h.flat("%d_wgu", M2["bf16"]),
        h.flat("%d_wd", M2["bf16"]),
        None,
        None,
        False,
    )
    h.dealloc(offs, "i32")
    return h.text()


def host_router_grad(accumulate=False):
    """__moe_gpu_router_grad; accumulate: __moe_gpu_router_grad_acc, which adds dx's part
    to what dx holds."""
    h = Host(
        "router_grad_acc" if accumulate else "router_grad",
        [
            ("x", M2["bf16"]),
            ("wr", M2["bf16"]),
            ("logits", M2["f32"]),
            ("experts", M2["i32"]),
            ("d_weights", M2["f32"]),
            ("d_logits", M2["f32"]),
            ("scoring", "i32"),
            ("renormalize", "i1"),
            ("scaling", "f32"),
            ("dx", M2["bf16"]),
            ("d_wr", M2["bf16"]),
        ],
    )
    e = h.e
    one = h.c(1)
    T = h.dim("%x", M2["bf16"], 0)
    d = h.dim("%x", M2["bf16"], 1)
    E = h.dim("%wr", M2["bf16"], 1)
    k = h.dim("%experts", M2["i32"], 1)
    E8 = round8(h, E)
    dl = h.alloc(h.grid(e.mul(T, E8)), "bf16")
    has = e.cmp("ugt", h.dim("%d_logits", M2["f32"], 0), h.c(0))
    h.launch(
        "moe_router_grad_logits",
        h.ceil(T, TOKEN_WARPS),
        one,
        one,
        [
            (h.flat("%logits", M2["f32"]), F32V),
            (h.flat("%experts", M2["i32"]), I32V),
            (h.flat("%d_weights", M2["f32"]), F32V),
            (h.flat("%d_logits", M2["f32"]), F32V),
            (has, "i1"),
            (T, IDX),
            (E, IDX),
            (k, IDX),
            ("%scoring", "i32"),
            ("%renormalize", "i1"),
            ("%scaling", "f32"),
            (dl, BF16V),
            (E8, IDX),
        ],
    )
    offs = single_offsets(h, T)
    xf = h.flat("%x", M2["bf16"])
    wrp = padded_copy(h, h.flat("%wr", M2["bf16"]), d, E, E8, "bf16")
    dx_gemm = "moe_gemm_rows_k_bf16_acc" if accumulate else "moe_gemm_rows_k_bf16"
    h.launch_gemm(
        dx_gemm,
        e.add(h.ceil(T, BM), one),
        h.ceil(d, BN),
        one,
        gemm_args(
            h,
            dx_gemm,
            dict(
                offsets=offs,
                num_experts=one,
                amat=dl,
                lda=E8,
                bmat=wrp,
                ldb=E8,
                dim_m=T,
                dim_n=d,
                dim_k=E,
                cout=h.flat("%dx", M2["bf16"]),
                ldc=d,
            ),
        ),
    )
    # dW_r = x^T dlogits, [d, E8]: K = T tokens, but only ceil(d / 128) output tiles, so
    # the tokens are split into S slices (S tiles a 128 rows of d, at most NUM_CTAS tiles
    # in all, at least ROUTER_SPLIT_TOKENS tokens a slice), each slice's [d, E8] written
    # in bf16 and the S summed in f32. A slice's columns past E come from the padding of
    # dlogits, which nothing writes; the sum reads columns < E only.
    S = e.maxs(one, e.minu(e.div(h.c(NUM_CTAS), h.ceil(d, BM)), e.div(T, h.c(ROUTER_SPLIT_TOKENS))))
    chunk = e.mul(h.ceil(e.div(e.add(T, e.sub(S, one)), S), BK), h.c(BK))
    soffs = h.alloc(e.add(S, one), "i32")
    h.launch(
        "moe_split_offsets",
        h.ceil(e.add(S, one), THREADS),
        one,
        one,
        [(soffs, I32V), (T, IDX), (chunk, IDX), (S, IDX)],
    )
    dwrp = h.alloc(e.mul(S, e.mul(d, E8)), "bf16")
    launch_wgrad(
        h,
        None,
        None,
        None,
        dict(
            offsets=soffs,
            num_experts=S,
            amat=xf,
            lda=d,
            bmat=dl,
            ldb=E8,
            dim_m=d,
            dim_n=E8,
            dim_k=h.c(0),
            cout=dwrp,
            ldc=E8,
        ),
    )
    h.launch(
        "moe_sum_splits_bf16",
        h.ceil(e.mul(d, E), THREADS),
        one,
        one,
        [
            (dwrp, BF16V),
            (h.flat("%d_wr", M2["bf16"]), BF16V),
            (d, IDX),
            (E8, IDX),
            (E, IDX),
            (S, IDX),
        ],
    )
    for buf, ty in ((dl, "bf16"), (offs, "i32"), (soffs, "i32"), (wrp, "bf16"), (dwrp, "bf16")):
        h.dealloc(buf, ty)
    return h.text()


def host_add():
    h = Host("add", [("a", BF16V), ("b", BF16V), ("out", BF16V)])
    one = h.c(1)
    N = h.dim("%a", BF16V, 0)
    h.launch(
        "moe_add",
        h.ceil(h.ceil(N, 8), THREADS),
        one,
        one,
        [("%a", BF16V), ("%b", BF16V), ("%out", BF16V), (N, IDX)],
    )
    return h.text()


def main():
    out = [
        "// GENERATED by gen_gpu_library.py; do not edit. The sm_90a kernels and host functions",
        "// of the GPU path (docs/gpu-path.md).",
        "module attributes {gpu.container_module} {",
        "  gpu.module @moe_kernels {",
    ]
    out += [gen_gemm(g) for g in GEMMS] + SIMPLE
    out.append(DEVICE_FUNCS)
    out.append("  }")
    # libmoe_runtime (runtime/include/moe/Runtime/Runtime.h)
    out.append(
        "  func.func private @moeTensorMapDeviceBf16(!llvm.ptr" + ", i64" * 12 + ") -> !llvm.ptr"
    )
    for fn in (
        host_router,
        host_dispatch,
        host_expert_ffn,
        lambda: host_expert_ffn(with_y=False),
        host_combine,
        host_shared_expert,
        lambda: host_shared_expert(with_y=False),
        host_expert_combine_grad,
        host_shared_expert_grad,
        host_router_grad,
        host_add,
    ):
        out.append(fn())
    # the accumulating host functions (adds of the layer folded into them by
    # convert-moe-to-gpu; docs/gpu-path.md)
    for fn in (host_combine, host_expert_combine_grad):
        out.append(fn(accumulate=True))
    if ROUTER_GRAD_ACC:
        out.append(host_router_grad(accumulate=True))
    out.append("}")
    text = "\n".join(out) + "\n"
    if len(sys.argv) == 3 and sys.argv[1] == "-o":
        path = sys.argv[2]
        if os.path.exists(path) and not os.path.isfile(path):
            # a device or a pipe (-o /dev/null): renaming over it would replace it by a file
            with open(path, "w") as f:
                f.write(text)
            return
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
