"""The GPU library generator (lib/Conversion/MoEToGPU/gen_gpu_library.py): its knobs, the
warp-specialised GEMMs' layout and synchronisation, and its errors. The kernels themselves
are checked by lit (PTX, ptxas) and on the GPU (test/GPU/ops_check.py)."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GENERATOR = os.path.join(ROOT, "lib", "Conversion", "MoEToGPU", "gen_gpu_library.py")


def load(monkeypatch, **env):
    """A fresh copy of the generator module with MOE_GEMM_* taken from env (its settings
    are read at import)."""
    for key in (
        "MOE_GEMM_WS",
        "MOE_GEMM_WS_REGS",
        "MOE_GEMM_PSTAGES",
        "MOE_GEMM_GROUP_M",
        "MOE_GEMM_ROWS_TMA",
        "MOE_GEMM_BULK_STORE",
        "MOE_GEMM_DACT_UNROLL",
        "MOE_GEMM_TMA_STORE",
        "MOE_GEMM_DYNAMIC",
        "MOE_GEMM_IDLE_SKIP",
    ):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    spec = importlib.util.spec_from_file_location("gen_gpu_library_under_test", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def generate(tmp_path, **env):
    out = tmp_path / "library.mlir"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("MOE_GEMM_", "MOE_GPU_"))}
    full_env.update(env)
    proc = subprocess.run(
        [sys.executable, GENERATOR, "-o", str(out)], env=full_env, capture_output=True, text=True
    )
    return proc, (out.read_text() if proc.returncode == 0 else "")


def kernel_bodies(text):
    """{name: text} of every gpu.func in the library."""
    heads = list(re.finditer(r"^    gpu\.func @(\w+)\(", text, re.M))
    return {
        m.group(1): text[m.start() : (heads[i + 1].start() if i + 1 < len(heads) else len(text))]
        for i, m in enumerate(heads)
    }


@pytest.mark.parametrize(
    "ws, extra",
    [
        ("all", {}),
        ("gather", {}),
        ("none", {}),
        ("all", {"MOE_GEMM_BULK_STORE": "0"}),
        ("all", {"MOE_GEMM_BULK_STORE": "wgrad"}),
        ("all", {"MOE_GEMM_TMA_STORE": "0"}),
        ("all", {"MOE_GEMM_DYNAMIC": "rows"}),
        ("all", {"MOE_GEMM_DYNAMIC": "all"}),
    ],
)
def test_shared_memory_layout_fits_and_does_not_overlap(monkeypatch, ws, extra):
    gen = load(monkeypatch, MOE_GEMM_WS=ws, **extra)
    selected = []
    for g in gen.GEMMS:
        assert g.launch_smem <= gen.MAX_SMEM, g.name
        if not g.ws:
            assert g.threads == gen.GEMM_THREADS, g.name
            continue
        selected.append(g.name)
        assert g.persistent and g.threads == 384, g.name
        # ring, then C's staging buffer, then the tile table (varlen_m), then full[s] and
        # empty[s]; the launch asks for 1 KiB of alignment on top
        assert g.cum_offset >= g.ring_bytes + g.stage_c_bytes, g.name
        if g.tma_store or g.tma_store_rows:  # four 128x64 boxes; row-wise: padded rows too
            assert g.stage_c_bytes >= gen.STAGE_C_BYTES, g.name
            assert g.stage_c_bytes >= gen.BULK_STAGE_C_BYTES or not g.tma_store_rows, g.name
            assert g.ring_bytes % 1024 == 0, g.name  # the boxes' 128B swizzle
        assert g.ring_bytes == g.stages * gen.STAGE_BYTES, g.name
        table = gen.CUM_BYTES if g.sched == "varlen_m" else 0
        assert g.bar_offset >= g.cum_offset + table and g.bar_offset % 8 == 0, g.name
        assert g.bar_offset + 16 * g.stages + 1024 <= g.launch_smem, g.name
        if g.dynamic:  # the tile ids' ring after empty[s]
            assert g.sched_offset == g.bar_offset + 16 * g.stages, g.name
            assert g.sched_offset + gen.SCHED_BYTES + 1024 <= g.launch_smem <= gen.MAX_SMEM, g.name
    dynamic = {
        "0": [],
        "rows": ["moe_gemm_rows_mn_bf16", "moe_gemm_rows_k_bf16", "moe_gemm_rows_k_bf16_acc"],
        "all": [
            "moe_gemm_up_gather",
            "moe_gemm_up_rows",
            "moe_gemm_up_gather_h",
            "moe_gemm_up_rows_h",
            "moe_gemm_rows_mn_bf16",
            "moe_gemm_rows_k_bf16",
            "moe_gemm_rows_k_bf16_acc",
        ],
    }
    assert [g.name for g in gen.GEMMS if g.dynamic] == (
        dynamic[extra.get("MOE_GEMM_DYNAMIC", "0")] if ws == "all" else []
    )
    persistent = [g.name for g in gen.GEMMS if g.persistent]
    if ws == "all":
        assert selected == persistent
    elif ws == "gather":
        assert selected == [n for n in persistent if "gather" in n]
    else:
        assert selected == []


def test_warp_specialised_kernels_synchronise_safely(tmp_path):
    proc, text = generate(tmp_path)
    assert proc.returncode == 0, proc.stderr
    bodies = kernel_bodies(text)
    ws = [n for n, body in bodies.items() if "setmaxregister" in body]
    assert sorted(ws) == sorted(
        [
            "moe_gemm_up_gather",
            "moe_gemm_up_rows",
            "moe_gemm_up_gather_h",
            "moe_gemm_up_rows_h",
            "moe_gemm_rows_mn_bf16",
            "moe_gemm_rows_k_bf16",
            "moe_gemm_rows_k_bf16_acc",
            "moe_gemm_wgrad_gather",
            "moe_gemm_wgrad_gather_a",
            "moe_gemm_wgrad_rows",
        ]
    )
    for name in ws:
        body = bodies[name]
        assert "known_block_size = array<i32: 384, 1, 1>" in body, name
        split = body.index("nvvm.setmaxregister decrease 72")
        assert body.index("nvvm.setmaxregister increase 216") > split, name
        # a block-wide barrier after the roles split would wait for threads that never come
        assert body.rfind("gpu.barrier") < split, name
        after = body[split:]
        assert "nvvm.cp.async.mbarrier.arrive" in after and "{noinc = true}" in after, name
        # empty[s], full[s] in the k-loop, and full[s] once more for the weight gradients'
        # partial last k-step
        waits = 3 if "wgrad" in name else 2
        assert after.count("nvvm.mbarrier.try_wait.parity") == waits, name
        assert "nvvm.barrier id = " in after, name  # the consumers' own barrier 1
        # full[s] counts the 128 producers (+1 for the TMA thread), empty[s] the 8 consumer warps
        consts = dict(re.findall(r"(%c\d+) = arith\.constant (\d+) : i32", body))
        counts = [int(consts[c]) for c in re.findall(r"nvvm\.mbarrier\.init %\w+, (%\w+)", body)]
        full = 129 if "cp.async.bulk.tensor" in body else 128
        assert counts == [full, 8] * 3, (name, counts)
    for name, body in bodies.items():
        if name.startswith("moe_gemm") and name not in ws:
            assert "known_block_size = array<i32: 256, 1, 1>" in body, name
            assert "setmaxregister" not in body and "cp.async.mbarrier.arrive" not in body, name


@pytest.mark.parametrize("skip", ["1", "0"])
def test_dynamic_schedule(tmp_path, skip):
    """MOE_GEMM_DYNAMIC=rows: down and dX take their tiles from an atomic counter, the
    producer passes each to its warpgroup (barrier 2, 128 threads) and to the consumers
    (tile_full/tile_empty), every thread reads it through redux.sync (a uniform register),
    and each host function zeroes one counter word a launch and frees the buffer after.
    With MOE_GEMM_IDLE_SKIP=1 (the default) a tile's idle warpgroup waits for and frees
    each slot without wgmma. The default (0) is the static schedule, byte for byte."""
    proc, text = generate(tmp_path, MOE_GEMM_DYNAMIC="rows", MOE_GEMM_IDLE_SKIP=skip)
    assert proc.returncode == 0, proc.stderr
    bodies = kernel_bodies(text)
    dynamic = ["moe_gemm_rows_mn_bf16", "moe_gemm_rows_k_bf16", "moe_gemm_rows_k_bf16_acc"]
    for name, body in bodies.items():
        if name not in dynamic:
            assert "llvm.atomicrmw" not in body and "scf.while" not in body, name
            continue
        assert "%tile_counter: memref<?xi32>, %counter_slot: index" in body, name
        # one claim in the k-loop (after k-step min(numk, stages) - 1), one for a tile
        # with no k-steps
        assert body.count("llvm.atomicrmw add") == 2, name
        assert body.count("scf.while") == 2, name  # the producer's tiles, the consumers'
        # the producer's next tile; the consumers' first and each next
        assert body.count("nvvm.redux.sync umin") == 3, name
        consts = dict(re.findall(r"(%c\d+) = arith\.constant (-?\d+) : i32", body))
        named = re.findall(r"nvvm\.barrier id = (%\w+) number_of_threads = (%\w+)", body)
        assert ("2", "128") in [(consts[a], consts[b]) for a, b in named], name
        counts = [int(consts[c]) for c in re.findall(r"nvvm\.mbarrier\.init %\w+, (%\w+)", body)]
        assert counts == [129, 8] * 3 + [1, 256] * 2, (name, counts)
        after = body[body.index("nvvm.setmaxregister decrease") :]
        # empty[s] and full[s] as before; tile_empty twice (the first tile, then each
        # next), tile_full twice; the idle warpgroup's full[s]
        waits = 6 + (1 if skip == "1" else 0)
        assert after.count("nvvm.mbarrier.try_wait.parity") == waits, name
        assert ("nvvm.vote.sync all" in body) == (skip == "1"), name
    counted = []
    for match in re.finditer(r"func\.func private @__moe_gpu_(\w+)\((.*?)\n  \}", text, re.S):
        fn = match.group(2)
        launches = re.findall(
            r"@moe_kernels::@(moe_gemm_rows_(?:mn|k)_bf16(?:_acc)?) .*?args\((.*)\)", fn
        )
        if not launches:
            assert "gpu.memset" not in fn, match.group(1)
            continue
        buffers = re.findall(
            r"(%buf\d+), %t\d+ = gpu\.alloc async \[%t?\w+\] \(%c\d+\) : memref<\?xi32>\n"
            r" *%t\d+ = gpu\.memset async \[%t\d+\] \1, (%c\d+) : memref<\?xi32>, i32",
            fn,
        )
        assert len(buffers) == 1, match.group(1)
        buf = buffers[0][0]
        assert re.search(rf"gpu\.dealloc async \[%t\d+\] {buf} : memref<\?xi32>", fn), match.group(
            1
        )
        slots = [
            re.search(rf"{buf} : memref<\?xi32>, (%c\d+) : index\s*$", args).group(1)
            for _, args in launches
        ]
        assert len(set(slots)) == len(slots), (match.group(1), slots)  # a word a launch
        counted.append(match.group(1))
    assert sorted(counted) == [
        "expert_combine_grad",
        "expert_combine_grad_acc",
        "expert_ffn",
        "router_grad",
        "router_grad_acc",
        "shared_expert",
        "shared_expert_grad",
    ]
    assert (
        generate(tmp_path)[1]
        == generate(tmp_path, MOE_GEMM_DYNAMIC="0", MOE_GEMM_IDLE_SKIP=skip)[1]
    )
    assert "llvm.atomicrmw" not in generate(tmp_path)[1]


def test_partial_last_k_step_skips_the_zero_rows(tmp_path):
    """A weight gradient's partial last k-step runs after the k-loop with 1-4 wgmma, each
    count straight-line and drained (wait_group 0): under a branch inside the loop ptxas
    fenced every wgmma (C7519). The other GEMMs keep their 4 a k-step."""
    proc, text = generate(tmp_path)
    assert proc.returncode == 0, proc.stderr
    bodies = kernel_bodies(text)
    for name, body in bodies.items():
        if not name.startswith("moe_gemm"):
            continue
        mmas = re.findall(r"^( *)%\w+ = nvvm\.wgmma\.mma_async", body, re.M)
        if "wgrad" in name:
            # 4 in the loop; 1 + 2 + 3 + 4 in the tail's branches
            assert len(mmas) == 14, (name, len(mmas))
            tail = body[body.index("ktail") :]
            assert tail.count("nvvm.wgmma.wait.group.sync.aligned 0") == 5, name
            for count in (1, 2, 3):
                assert re.search(rf"arith\.constant {16 * count} : i32", body), (name, count)
        else:
            assert len(mmas) == 4, (name, len(mmas))
            assert "ktail" not in body, name


def test_rows_by_tma(tmp_path):
    """MOE_GEMM_ROWS_TMA=1 (the default): the weight gradients with a gathered operand take
    the other one by TMA boxes of a per-call map in whole k-steps (full[s] then counts the
    TMA thread too) and by cp.async in an expert's partial last k-step."""
    proc, text = generate(tmp_path)
    assert proc.returncode == 0, proc.stderr
    bodies = kernel_bodies(text)
    for name, mapname, boxes in (
        ("moe_gemm_wgrad_gather", "%amap", 2),
        ("moe_gemm_wgrad_gather_a", "%browmap", 4),
    ):
        body = bodies[name]
        assert f"{mapname}: !llvm.ptr" in body.splitlines()[0], name
        assert body.count("nvvm.cp.async.bulk.tensor.shared.cluster.global") == boxes, name
        assert f"nvvm.prefetch tensormap, {mapname}" not in body, name  # null without rows
        consts = dict(re.findall(r"(%c\d+) = arith\.constant (\d+) : i32", body))
        counts = [int(consts[c]) for c in re.findall(r"nvvm\.mbarrier\.init %\w+, (%\w+)", body)]
        assert counts == [129, 8] * 3, (name, counts)
        # the TMA thread arrives without bytes when the k-step is partial
        tma = body.index("nvvm.mbarrier.arrive.expect_tx")
        assert re.search(r"\} else \{\s+nvvm\.mbarrier\.arrive %", body[tma:]), name
    # the host functions pass the maps: one per call of each weight gradient
    off = generate(tmp_path, MOE_GEMM_ROWS_TMA="0")[1]
    assert text.count("func.call @moeTensorMapDeviceBf16") > off.count(
        "func.call @moeTensorMapDeviceBf16"
    )
    assert "%amap" not in off and "%browmap" not in off
    assert (
        "%amap" not in bodies["moe_gemm_wgrad_rows"]
        and "%browmap" not in bodies["moe_gemm_wgrad_rows"]
    )


def test_bulk_store_variant(tmp_path):
    """MOE_GEMM_BULK_STORE=1 (the default): the warp-specialised kernels with a plain bf16
    C stage it by stmatrix (16 x4 a consumer thread: 128 rows x 256 columns) and copy it out
    by one bulk copy a row; a thread waits for its copy to have read the staging row before
    the next tile's barrier, and for all of them before it exits. SwiGLU's epilogue is
    unchanged; =0 stores from the threads, =wgrad bulk-stores the weight gradients only."""
    proc, text = generate(tmp_path, MOE_GEMM_BULK_STORE="1", MOE_GEMM_TMA_STORE="0")
    assert proc.returncode == 0, proc.stderr
    bodies = kernel_bodies(text)
    for name in (
        "moe_gemm_rows_mn_bf16",
        "moe_gemm_rows_k_bf16",
        "moe_gemm_wgrad_gather",
        "moe_gemm_wgrad_gather_a",
        "moe_gemm_wgrad_rows",
    ):
        body = bodies[name]
        assert body.count("nvvm.stmatrix") == 16, name
        assert body.count("nvvm.cp.async.bulk.global.shared.cta") == 1, name
        read_wait = body.index("nvvm.cp.async.bulk.wait_group 0 {read}")
        assert read_wait < body.index("nvvm.stmatrix"), name
        assert body.index(
            "nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>", body.index("nvvm.stmatrix")
        ) < body.index("nvvm.cp.async.bulk.global"), name
        # the wait for the writes too, after the tile loop
        assert re.search(r"nvvm\.cp\.async\.bulk\.wait_group 0\n", body[read_wait:]), name
        assert "llvm.store" not in body, name  # no per-thread stores of C left
    for name in ("moe_gemm_up_gather", "moe_gemm_dact_gather"):
        assert "cp.async.bulk.global" not in bodies[name]
    assert "nvvm.stmatrix" not in bodies["moe_gemm_up_gather"]
    assert generate(tmp_path, MOE_GEMM_TMA_STORE="0")[1] == text
    # the dSwiGLU stages dA by stmatrix whatever the setting (its rows, not C)
    dact = ["moe_gemm_dact_gather", "moe_gemm_dact_rows"]
    bodies = kernel_bodies(generate(tmp_path, MOE_GEMM_BULK_STORE="0")[1])
    assert sorted(n for n, b in bodies.items() if "nvvm.stmatrix" in b) == dact
    # "wgrad": the weight gradients' kernels only
    bodies = kernel_bodies(generate(tmp_path, MOE_GEMM_BULK_STORE="wgrad")[1])
    assert sorted(n for n, b in bodies.items() if "nvvm.stmatrix" in b) == dact + [
        "moe_gemm_wgrad_gather",
        "moe_gemm_wgrad_gather_a",
        "moe_gemm_wgrad_rows",
    ]


def test_tma_store_variant(tmp_path):
    """MOE_GEMM_TMA_STORE=1 (the default): the experts' weight gradients stage C in four
    128B-swizzled 128x64 boxes and consumer thread 0 stores them by four TMA box stores of a
    [E][M][N] map; down and dX do so for a whole tile (2D [rows, N] map) and keep the
    row-wise bulk copies for an expert's partial last tile. The staging buffer is read (the
    issuing thread's wait) before the next tile's stmatrix, and written out before exit."""
    proc, text = generate(tmp_path)
    assert proc.returncode == 0, proc.stderr
    bodies = kernel_bodies(text)
    tensor_store = re.compile(
        r"nvvm\.cp\.async\.bulk\.tensor\.global\.shared\.cta %cmap, %\w+, box\[([^\]]*)\]"
    )
    for name, rank, row_stores in (
        ("moe_gemm_wgrad_gather", 3, 0),
        ("moe_gemm_wgrad_gather_a", 3, 0),
        ("moe_gemm_rows_mn_bf16", 2, 1),
        ("moe_gemm_rows_k_bf16", 2, 1),
    ):
        body = bodies[name]
        assert "%cmap: !llvm.ptr" in body.split("\n")[0], name
        boxes = tensor_store.findall(body)
        assert len(boxes) == 4 and all(len(b.split(",")) == rank for b in boxes), name
        assert body.count("nvvm.cp.async.bulk.global.shared.cta") == row_stores, name
        # 16 stmatrix a path: the boxes, and the padded rows where a tile can be partial
        assert body.count("nvvm.stmatrix") == 16 * (1 + row_stores), name
        read_wait = body.index("nvvm.cp.async.bulk.wait_group 0 {read}")
        first_store = tensor_store.search(body).start()
        assert read_wait < body.index("nvvm.stmatrix") < first_store, name
        fence = body.rindex(
            "nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>", 0, first_store
        )
        assert body.index("nvvm.stmatrix") < fence, name
        assert re.search(r"nvvm\.cp\.async\.bulk\.wait_group 0\n", body[first_store:]), name
        assert "llvm.store" not in body, name
    # a whole tile (m0 + 128 <= the expert's end) by boxes, else by rows
    assert re.search(
        r"arith\.cmpi ule, %\w+, %\w+ : index\n\s+scf\.if", bodies["moe_gemm_rows_k_bf16"]
    )
    assert "cp.async.bulk.tensor.global" not in bodies["moe_gemm_wgrad_rows"]
    # the host makes the maps: [E][M][N] in 64 x 128 x 1 boxes, [rows, N] in 64 x 128
    host = text[text.index("func.func private @__moe_gpu_expert_combine_grad") :]
    host = host[: host.index("\n  }\n")]
    consts = dict(re.findall(r"(%c\w*) = arith\.constant (-?\d+) : i64", host))
    maps = set()
    for args in re.findall(r"func\.call @moeTensorMapDeviceBf16\(([^)]*)\)", host):
        a = [x.strip() for x in args.split(",")]
        maps.add((consts.get(a[1]), tuple(consts.get(x) for x in a[-4:])))
    assert ("3", ("64", "128", "1", "0")) in maps, maps  # dW_gate_up's and dW_down's C
    assert ("2", ("64", "128", "0", "0")) in maps, maps  # dX's C
    assert "cp.async.bulk.tensor.global" not in generate(tmp_path, MOE_GEMM_TMA_STORE="0")[1]
    assert "cp.async.bulk.tensor.global" not in generate(tmp_path, MOE_GEMM_BULK_STORE="0")[1]


def test_gathered_ids_come_a_k_step_ahead(tmp_path):
    """The warp-specialised weight gradients' producer loads the token ids of the next
    k-step (one a lane, carried across the k-loop and from a tile's last k-step to the next
    tile) before it waits for this step's slot, and spreads them with shuffles: 8 rows a
    warp of the gathered A, 16 of the gathered B."""
    proc, text = generate(tmp_path)
    assert proc.returncode == 0, proc.stderr
    bodies = kernel_bodies(text)
    for name, shuffles in (("moe_gemm_wgrad_gather_a", 8), ("moe_gemm_wgrad_gather", 16)):
        body = bodies[name]
        producer = body[
            body.index("setmaxregister decrease") : body.index("setmaxregister increase")
        ]
        assert producer.count("gpu.shuffle idx") == shuffles, name
        # tile loop and k-loop both carry one id (i32) beside the ring position
        assert len(re.findall(r"scf\.for .*-> \(index, i32, i32\)", producer)) == 2, name
        kloop = producer[[m.start() for m in re.finditer(r"scf\.for ", producer)][1] :]
        wait = kloop.index("nvvm.mbarrier.try_wait.parity")
        assert re.search(r"llvm\.load %\w+ : !llvm\.ptr<1> -> i32", kloop[:wait]), name
        assert "gpu.shuffle" not in kloop[:wait], name
    # the row-wise weight gradient has no ids to carry
    assert "gpu.shuffle idx" not in bodies["moe_gemm_wgrad_rows"]


def test_swiglu_epilogues_take_no_division(tmp_path):
    """sigmoid by rcp.approx: an IEEE division compiles to a slow-path branch per value
    (BSSY, CALL in the SASS) that the SwiGLU and dSwiGLU epilogues paid on every element."""
    proc, text = generate(tmp_path)
    assert proc.returncode == 0, proc.stderr
    bodies = kernel_bodies(text)
    for name in (
        "moe_gemm_up_gather",
        "moe_gemm_up_rows",
        "moe_gemm_dact_gather",
        "moe_gemm_dact_rows",
    ):
        assert "arith.divf" not in bodies[name], name
        assert "@__moe_gpu_sigmoid" in bodies[name], name
    assert "rcp.approx.ftz.f32" in text


@pytest.mark.parametrize("unroll", ["1", "4", "8"])
def test_dswiglu_epilogue_loads_a_batch_ahead(tmp_path, unroll):
    """A warp reads H (gate and up; and w, the routing weights) of MOE_GEMM_DACT_UNROLL rows
    a batch ahead, from clamped, always valid addresses: the first batch's before dA is
    staged, and each iteration the next batch's before its first arithmetic, carrying the
    loaded vectors to the next iteration. No load sits under a branch: the ifs hold the
    stores (3 a row) and dS's lane-0 store, only where the row and column are in the tile."""
    proc, text = generate(tmp_path, MOE_GEMM_DACT_UNROLL=unroll)
    assert proc.returncode == 0, proc.stderr
    bodies = kernel_bodies(text)
    rows = int(unroll)
    for name in ("moe_gemm_dact_gather", "moe_gemm_dact_rows"):
        body = bodies[name]
        has_w = "gather" in name
        staging = body.index("nvvm.stmatrix")
        head, loop = body[: body.index("scf.for %ep")], body[body.index("scf.for %ep") :]
        before_staging = body[body.index("nvvm.wgmma.wait.group.sync.aligned 0") : staging]
        assert before_staging.count("vector.load %hsaved") == 2 * rows, name
        assert before_staging.count("memref.load %wrow") == (rows if has_w else 0), name
        assert head.count("vector.load %hsaved") == 2 * rows, name
        first_line = loop.split("\n")[0]
        assert first_line.count("iter_args(") == 1, name
        assert first_line.count("vector<8xbf16>") == 2 * rows, name
        first_math = loop.index("@__moe_gpu_sigmoid")
        assert loop[:first_math].count("vector.load %hsaved") == 2 * rows, name
        assert loop[:first_math].count("memref.load %wrow") == (rows if has_w else 0), name
        assert loop.count("vector.load %hsaved") == 2 * rows, name
        carried = 2 * rows + (rows if has_w else 0)
        assert re.search(
            r"scf\.yield (%\w+, ){" + str(carried - 1) + r"}%\w+ : vector<8xbf16>", loop
        ), name
        for block in re.findall(r"scf\.if [^{]*\{(.*?)\n\s*\}", loop, re.S):
            assert "load %hsaved" not in block and "load %wrow" not in block, name


def test_dswiglu_stages_bf16_and_fuses(tmp_path):
    """dA reaches the dSwiGLU's rows in bf16: 16 stmatrix.x4 a thread and one 16-byte load a
    row (the only f32 stores to shared memory are dS's row sums), where the fp32 epilogue
    (store_f32) stores its tile by 128 scalar stores a thread. Two fused multiply-adds a
    value (dS's sum and d silu / dg), and the bf16 inputs widened by shifts and masks."""
    proc, text = generate(tmp_path)
    assert proc.returncode == 0, proc.stderr
    bodies = kernel_bodies(text)
    wg_store = re.compile(r"memref\.store .*: memref<\?xf32, #gpu\.address_space<workgroup>>")
    assert len(wg_store.findall(bodies["moe_gemm_rows_mn_f32"])) == 128
    for name in ("moe_gemm_dact_gather", "moe_gemm_dact_rows"):
        body = bodies[name]
        loop = body[body.index("scf.for %ep") :]
        rows = 4  # MOE_GEMM_DACT_UNROLL's default
        ds_stores = rows if "gather" in name else 0  # a warp's row sums of dS, one a row
        assert body.count("nvvm.stmatrix") == 16, name
        assert len(wg_store.findall(body)) == ds_stores, name
        assert (
            loop.count("vector<8xbf16>") >= rows
            and "memref<?xf32, #gpu" not in loop.split("@__moe_gpu_sigmoid")[0]
        ), name
        assert loop.count("llvm.intr.fma") == 2 * 8 * rows, name
        assert "arith.extf" not in loop and loop.count("arith.andi") >= 4 * 2 * rows, name


def test_recomputed_h_writes_no_a(tmp_path):
    """The up projection's _h kernels (H recomputed in backward) take no A and store only
    H; the host functions of the recomputation launch them and allocate nothing for A."""
    proc, text = generate(tmp_path)
    assert proc.returncode == 0, proc.stderr
    bodies = kernel_bodies(text)
    for name in ("moe_gemm_up_gather", "moe_gemm_up_rows"):
        full, h_only = bodies[name], bodies[name + "_h"]
        assert "%aout" in full.split("\n")[0] and "%aout" not in h_only, name
        # gate and up of H, and A, for each 16-byte group; H alone without A
        assert 3 * h_only.count("llvm.store") == 2 * full.count("llvm.store") > 0, name
        assert "__moe_gpu_sigmoid" not in h_only, name
    ffn_h = text[text.index("func.func private @__moe_gpu_expert_ffn_h(") :]
    ffn_h = ffn_h[: ffn_h.index("\n  }")]
    assert "@moe_kernels::@moe_gemm_up_gather_h " in ffn_h and "gpu.alloc" not in ffn_h


def test_router_kernels_run_a_warp_a_token(tmp_path):
    """The router's per-token kernels run a warp a token: the lanes walk the experts 32
    apart, the max and the sum end in xor shuffles, and the selection reads no pick back
    from global memory (the thread-a-token version scanned its earlier picks for every
    expert of every round)."""
    proc, text = generate(tmp_path)
    assert proc.returncode == 0, proc.stderr
    bodies = kernel_bodies(text)
    for name in ("moe_router_scores", "moe_router_grad_logits"):
        body = bodies[name]
        assert "scf.for %e = %c0 to %E" not in body, name
        assert body.count("scf.for %e = %lane to %E step %tw32") >= 3, name
        assert body.count("gpu.shuffle xor") == 10, name  # the max and the sum, 5 steps each
    select = bodies["moe_router_select"]
    assert "memref.load %experts" not in select
    assert "scf.for %it = %c0 to %ni" in select
    # 5 steps of (class, value, index) for the groups and for the experts
    assert select.count("gpu.shuffle xor") == 2 * 5 * 3
    for name in ("router_select", "router_scores", "router_grad_logits"):
        launch = re.search(rf"@moe_kernels::@moe_{name} blocks in \((%\w+),", text)
        assert launch, name
    # blocks = ceil(T / 4): four tokens a block of 128 threads
    host = text[text.index("func.func private @__moe_gpu_router(") :]
    assert "arith.constant 4 : index" in host[: host.index("@moe_router_select")]


def test_router_weight_gradient_is_split_along_tokens(tmp_path):
    """dW_r = x^T dlogits has ceil(d / 128) output tiles and K = T: the host splits the
    tokens into S slices (offsets by moe_split_offsets), runs them as S experts of the
    varlen-K GEMM into [S, d, E8] and sums the slices in f32 (moe_sum_splits_bf16, which
    also drops the padding columns the repack dropped before)."""
    proc, text = generate(tmp_path)
    assert proc.returncode == 0, proc.stderr
    host = text[text.index("func.func private @__moe_gpu_router_grad(") :]
    host = host[: host.index("\n  }")]
    order = [
        host.index(f"@moe_kernels::@{k} ")
        for k in (
            "moe_router_grad_logits",
            "moe_split_offsets",
            "moe_gemm_wgrad_rows",
            "moe_sum_splits_bf16",
        )
    ]
    assert order == sorted(order)
    assert "@moe_repack_bf16 " not in host[order[2] :]
    bodies = kernel_bodies(text)
    assert "arith.minui %at, %T" in bodies["moe_split_offsets"]
    assert "scf.for %sl = %c0 to %S" in bodies["moe_sum_splits_bf16"]


def test_accumulating_host_functions(tmp_path):
    """The host functions that add their result to what its buffer holds:
    __moe_gpu_router_grad_acc, whose dX GEMM adds every tile into dx by four TMA reduce-add
    boxes (moe_gemm_rows_k_bf16_acc: one problem, so its map clips a partial last tile and
    no tile is stored row by row), and __moe_gpu_combine_acc and
    __moe_gpu_expert_combine_grad_acc, whose gather-sum starts from what out holds
    (moe_gather_sum_acc). Each is its plain form with the _acc kernel."""
    proc, text = generate(tmp_path)
    assert proc.returncode == 0, proc.stderr
    bodies = kernel_bodies(text.split("func.func")[0])
    acc, plain = bodies["moe_gemm_rows_k_bf16_acc"], bodies["moe_gemm_rows_k_bf16"]
    boxes = re.findall(
        r"nvvm\.cp\.async\.bulk\.tensor\.reduce %cmap, %\w+, box\[(%\w+), (%\w+)\] "
        r"\{redKind = #nvvm\.tma_redux_kind<add>\}",
        acc,
    )
    assert len(boxes) == 4 and len({row for _, row in boxes}) == 1, boxes
    assert acc.count("nvvm.cp.async.bulk.tensor.reduce") == 4
    assert "nvvm.cp.async.bulk.tensor.global.shared.cta" not in acc
    assert "nvvm.cp.async.bulk.global.shared.cta" not in acc and "llvm.store" not in acc
    assert acc.count("nvvm.stmatrix") == 16

    # the same GEMM up to its epilogue's stores (but for its constants and the numbering of
    # values): the storing one then branches on a whole tile, the adding one does not
    def numbered(body):
        lines = body.split("nvvm.cp.async.bulk.wait_group 0 {read}")[0].split("\n")
        return re.sub(r"%[cv]\d+", "%_", "\n".join(x for x in lines if "arith.constant" not in x))

    assert numbered(acc).replace("_acc(", "(") == numbered(plain)

    # the gather-sum: out's 8 values loaded and widened before the sum over j, which starts
    # from them instead of zero, and stored to the same place
    gsum, gsum_acc = bodies["moe_gather_sum"], bodies["moe_gather_sum_acc"]
    loop = gsum_acc.index("scf.for %j")
    held = gsum_acc.index("vector.load %out[%oi]")
    assert held < gsum_acc.index("arith.extf %held") < loop
    assert "iter_args(%a = %heldf)" in gsum_acc and "%zv" not in gsum_acc
    assert gsum_acc.count("vector.store %ob, %out[%oi]") == 1
    assert "vector.load %out" not in gsum and "iter_args(%a = %zv)" in gsum

    def host(name):
        fn = text[text.index(f"func.func private @{name}(") :]
        return fn[: fn.index("\n  }\n")]

    for name, kernel in (
        ("router_grad", "moe_gemm_rows_k_bf16"),
        ("combine", "moe_gather_sum"),
        ("expert_combine_grad", "moe_gather_sum"),
    ):
        plain_fn, acc_fn = host(f"__moe_gpu_{name}"), host(f"__moe_gpu_{name}_acc")
        assert f"@moe_kernels::@{kernel}_acc " in acc_fn
        assert f"@moe_kernels::@{kernel} " not in acc_fn
        assert acc_fn.replace("_acc", "") == plain_fn, name
    # nothing else adds by TMA reduce boxes
    assert text.count("nvvm.cp.async.bulk.tensor.reduce") == 4


@pytest.mark.parametrize(
    "env", [{"MOE_GEMM_TMA_STORE": "0"}, {"MOE_GEMM_WS": "gather"}, {"MOE_GEMM_BULK_STORE": "0"}]
)
def test_router_grad_acc_needs_tma_row_stores(tmp_path, env):
    """The accumulating dX adds by TMA reduce boxes: where the row-wise GEMMs store without
    TMA boxes the library has no __moe_gpu_router_grad_acc (nor its GEMM), and still has
    the accumulating combines."""
    proc, text = generate(tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    assert "router_grad_acc" not in text and "moe_gemm_rows_k_bf16_acc" not in text
    assert "tensor.reduce" not in text
    for name in ("combine_acc", "expert_combine_grad_acc"):
        assert f"func.func private @__moe_gpu_{name}(" in text, name


def test_variants_generate(tmp_path):
    for ws in ("gather", "none"):
        proc, text = generate(tmp_path, MOE_GEMM_WS=ws)
        assert proc.returncode == 0, proc.stderr
        assert ("setmaxregister" in text) == (ws == "gather")


def test_output_to_a_pipe_stays_a_pipe(tmp_path):
    """-o writes a regular file through a temporary one and a rename, so a build never
    embeds half a library; a device or a pipe (-o /dev/null as root) is written in place,
    not replaced by a file."""
    import stat
    import threading

    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()), daemon=True)
    reader.start()
    proc = subprocess.run(
        [sys.executable, GENERATOR, "-o", str(fifo)],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("MOE_GEMM_")},
    )
    reader.join(timeout=30)
    if reader.is_alive():  # nothing opened the pipe for writing: let the reader go
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert proc.returncode == 0, proc.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert got and got[0].startswith("// GENERATED by gen_gpu_library.py")
    assert not (tmp_path / "out.fifo.tmp").exists()


@pytest.mark.parametrize(
    "env, message",
    [
        ({"MOE_GEMM_WS": "some"}, "expected all, gather or none"),
        ({"MOE_GEMM_WS_REGS": "80,216"}, "registers the producer never frees"),
        ({"MOE_GEMM_WS_REGS": "72"}, "expected two integers"),
        ({"MOE_GEMM_WS_REGS": "70,216"}, "multiples of 8 from 24 to 256"),
        ({"MOE_GEMM_WS_REGS": "216,72"}, "P <= 168 <= C"),
        ({"MOE_GEMM_PSTAGES": "4"}, "bytes of shared memory"),
        ({"MOE_GEMM_ROWS_TMA": "yes"}, "expected 0 or 1"),
        ({"MOE_GEMM_BULK_STORE": "on"}, "expected 0, 1 or wgrad"),
        ({"MOE_GEMM_TMA_STORE": "2"}, "expected 0 or 1"),
        ({"MOE_GEMM_DACT_UNROLL": "16"}, "expected 1, 2, 4 or 8"),
        ({"MOE_GEMM_DACT_UNROLL": "four"}, "expected 1, 2, 4 or 8"),
        ({"MOE_GEMM_DYNAMIC": "1"}, "expected 0, rows or all"),
        ({"MOE_GEMM_IDLE_SKIP": "yes"}, "expected 0 or 1"),
    ],
)
def test_bad_settings_are_refused_with_a_reason(tmp_path, env, message):
    proc, _ = generate(tmp_path, **env)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
