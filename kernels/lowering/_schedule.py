"""How each loop of a kernel runs: blocking, prefetching, streaming, joining, parallelism.

These choices change the generated code but not what it computes.  They are made here, from
the device table (``DeviceSpec``: cache sizes, kind), and recorded in the plan, so the source
depends on the plan alone — a plan made for one machine prints the same anywhere — and a tuner
can set the ones that matter as knobs (``tile_rows``, ``stream``).  The renderer only reads
them.  On a GPU a block's threads share its loops; these CPU choices stay off there, and a
dialect that cannot express one (CUDA has no register-tiled row matmuls) prints the plain loop.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from kernels.hardware import DeviceSpec, cpu_simd

from ._plan import Access, Kernel, KernelPlan, Let, Level, Loop, Store

STREAM_ROW_MIN, STREAM_ROW_MAX = 16, 16384  # columns of a row streamed via a buffer
PREFETCH_MIN_L2S = 8  # inputs of this many L2 caches or more stream from memory: prefetch
PREFETCH_ROWS = 16  # B rows a register-tiled matmul prefetches ahead of its loads
# short rows of a big input: prefetch this far ahead (floats), one prefetch per cache line
PREFETCH_AHEAD, PREFETCH_ROW_MAX = 2048, 256
TREE_SUM_MAX_COLS = 256  # wider rows: the in-order lane sum is a small share of the row
PARALLEL_MIN_WORK = 1 << 18  # below this, forking threads costs more than it saves
MATMUL_TILE_ROWS = (8, 6, 4, 3, 2)  # rows per register tile, largest dividing the row count
# first (every row of a tile shares one pass over B: gated_mlp's 8 rows in one tile, not two
# of 4, read each 64 MB weight from memory once: 10.0 -> 8.9 ms one thread, 4.7 -> 3.5 ms two)
TILE_ROWS_16_REGS = 6  # rows of a register tile where the ISA has 16 vector registers
TILE_ROWS_TRANSPOSED = 4  # rows of a transposed-B tile: 4 x TUNER_CT accumulators, a + b loads
MATMUL_ROW_MAX = 4096  # widest row a matmul is computed in by rows (a local array per row)


def schedule(kernel: Kernel, plan: KernelPlan, spec: DeviceSpec,
             knobs: Mapping[str, int]) -> None:
    """Annotate ``kernel``'s loops (and the kernel) with how they run on ``spec``."""
    for lp in _loops(kernel):
        _mark_reciprocals(lp)
    if spec.kind != "cpu":
        return
    kernel.parallel = kernel.vblocks * sum(loop_work(lp, kernel) for lp in _loops(kernel)) \
        >= PARALLEL_MIN_WORK
    stream = bool(knobs.get("stream", _streams(kernel, plan, spec)))
    for phase in kernel.phases:
        for stage in ("pre", "body", "post"):
            _join_rows(kernel, [lp for lp in phase.loops if lp.stage == stage])
    for lp in _loops(kernel):
        width = _width(lp, kernel)
        lp.stream = stream and not lp.chunked and STREAM_ROW_MIN <= width <= STREAM_ROW_MAX \
            and _writes_output(lp, kernel, plan)
        lp.prefetch = _row_prefetches(lp, kernel, plan, spec, width)
        lp.tile_rows = 0 if lp.join or _joined_by_next(lp, kernel) else \
            _tile_rows(lp, width, spec, knobs.get("tile_rows"), kernel, plan)
        lp.matmul_rows = lp.tile_rows == 0 and width <= MATMUL_ROW_MAX
        lp.tree_sum = bool(lp.reductions) and not lp.chunked and width <= TREE_SUM_MAX_COLS
        if lp.tile_rows:
            for st in lp.col:
                if isinstance(st, Let) and st.op == "matmul" and _transposed_b(st):
                    st.attrs["transposed_b"] = True  # dot products along k, no prefetch, no pack
                elif isinstance(st, Let) and st.op == "matmul":
                    st.attrs["prefetch"] = _matmul_prefetch(lp, st, kernel, plan, spec)
                    st.attrs["pack"] = _packs_b(lp, st, spec, width)


def loop_work(lp: Loop, k: Kernel) -> int:
    """Multiply-adds (or elements) of one loop per virtual block, for-loop iterations included."""
    depth = max([st.attrs.get("k", 1) for st in lp.col if isinstance(st, Let)
                 and st.op == "matmul"], default=1)
    return lp.rows * lp.cols * depth * (k.forloop if lp.stage == "body" else 1)


def _loops(k: Kernel) -> list[Loop]:
    return [lp for ph in k.phases for lp in ph.loops]


def _width(lp: Loop, k: Kernel) -> int:
    return lp.cols // (k.mapping.split if lp.chunked else 1)


def _buffer(k: Kernel, plan: KernelPlan, view: str):
    name = next(v.buffer for v in k.views if v.name == view)
    return k.buffers[name] if name in k.buffers else plan.globals[name]


def _has_matmul(lp: Loop) -> bool:
    return any(isinstance(st, Let) and st.op == "matmul" for st in lp.col)


def _accesses(lp: Loop) -> list[tuple[str, Access]]:
    """(view, access) of every read and write of a loop."""
    out = []
    for st in (*lp.hoisted, *lp.col, *lp.row):
        for a in (st.access if isinstance(st, Let) else (st.access,)):
            out.append((a.view, a))
    return out


def _mark_reciprocals(lp: Loop) -> None:
    """x / y with y the same for the whole row: one reciprocal per row, then a multiply per
    element (within 1.5 ulp of the division; divisions are the slowest float op)."""
    row_vars = {st.var for st in lp.hoisted if isinstance(st, Let)}
    for st in lp.col:
        if isinstance(st, Let) and st.op == "div" and st.args[1] in row_vars:
            st.attrs["reciprocal"] = True


def _streams(k: Kernel, plan: KernelPlan, spec: DeviceSpec) -> bool:
    """Whether ``k`` writes its output rows with non-temporal stores: when its inputs and
    outputs together exceed half the last-level cache, so the output would only evict what
    is still to be read.  softmax_rows (750000, 32), 192 MB: 17.9 -> 17.0 ms; below that the
    output stays in cache for the next reader and streaming lost (4096 x 1024: 1.48 -> 1.92)."""
    size = sum(math.prod(plan.globals[p].shape) * 4 for p in k.params
               if plan.globals[p].role in ("input", "output"))
    return any(plan.globals[p].role == "output" for p in k.params) and \
        size >= spec.llc_bytes // 2


def _writes_output(lp: Loop, k: Kernel, plan: KernelPlan) -> bool:
    return any(isinstance(st, Store) and _buffer(k, plan, st.access.view).role == "output"
               for st in (*lp.col, *lp.row))


def _row_prefetches(lp: Loop, k: Kernel, plan: KernelPlan, spec: DeviceSpec,
                    width: int) -> tuple[str, ...]:
    """Views of big inputs whose short rows a row loop prefetches PREFETCH_AHEAD floats
    ahead, when the rows are laid end to end: this VM's hardware prefetchers did not keep up
    with a walk over 750000 rows of 32 (softmax_rows, one thread, standalone A/B: the
    generated kernel 13.6 -> 10.0 ms; a hand-written row loop 12.6 -> 6.6 ms with 8 KB ahead,
    7.1 ms with 2 KB, 7.7-8.2 ms with 32 KB).  Longer rows stream well without help (4096 x
    1024 is at copy bandwidth)."""
    if width > PREFETCH_ROW_MAX or lp.chunked or _has_matmul(lp):
        return ()
    out: list[str] = []
    for st in (*lp.hoisted, *lp.col):
        if not (isinstance(st, Let) and st.op == "load"):
            continue
        a = st.access[0]
        b = _buffer(k, plan, a.view)
        if b.role == "input" and a.col == 1 and not a.col_index and a.rows and \
                a.rows[-1] == width and a.view not in out and \
                math.prod(b.shape) * 4 >= PREFETCH_MIN_L2S * spec.l2_bytes:
            out.append(a.view)
    return tuple(out)


def _tile_rows(lp: Loop, width: int, spec: DeviceSpec, most: int | None, k: Kernel,
               plan: KernelPlan) -> int:
    """Rows per register tile of the loop's matmuls (0: no tiling).  Tiles when every matmul
    reads B with unit column stride and the same B rows for the rows of a tile.

    AVX-512 (32 registers, tiles of R rows x 4 vectors): more than 4 rows share one pass over
    B but spill accumulators, worth it only when B's tile does not stay in L1 between passes
    (mha's 64 x 64 B: 7.7 ms at 4 rows, 10.1 ms at 8; gated_mlp's 64 x 512: 10.0 ms at 4, 8.9
    ms at 8); the rows of a tile divide the loop's.  16 registers (AVX2, SSE), B's tile in L1,
    or in L2 with B cached (lora's 4 MB W: 0.81 -> 0.70 ms, one thread): 6 rows x 2 vectors, 12 accumulators, the most that fit, with a shorter last tile where 6
    does not divide the rows (``Loop.tile_rows`` then leaves a remainder): on a Zen 3 core, a
    48 x 64 x 64 product ran at 94 GFLOP/s in 6 x 16 tiles, 77 in 8 x 8 and 64 in 4 x 16, and
    gqa's kernel went 12.9 -> 7.8 ms (one thread, with B packed).  A B streamed from memory
    keeps the rule above, one pass for up to 8 rows: gated_mlp in tiles of 6 + 2 rows took
    42-62 ms against 27-40 in one of 8.  ``most`` (the ``tile_rows`` knob) caps it."""
    mms = [st for st in lp.col if isinstance(st, Let) and st.op == "matmul"]
    if not mms or lp.chunked or width > MATMUL_ROW_MAX:
        return 0
    inner = lp.shape[-2] if len(lp.shape) > 1 else 1
    if most is not None and most <= 0:
        return 0
    if all(_transposed_b(st) for st in mms):
        # B stored transposed: tiles of up to TILE_ROWS_TRANSPOSED rows x TUNER_CT columns
        cap = min(TILE_ROWS_TRANSPOSED, most or TILE_ROWS_TRANSPOSED)
        if _may_leave_remainder(lp, mms, inner):  # 5 rows: a tile of 4 and one of 1
            return min(cap, lp.rows)
        return next((t for t in MATMUL_TILE_ROWS if inner % t == 0 and t <= min(lp.rows, cap)),
                    1)
    if any(st.access[1].col != 1 or st.access[1].col_index or
           (st.access[1].rows and st.access[1].rows[-1]) for st in mms):
        return 0
    b_bytes = max(st.attrs["k"] for st in mms) * width * 4
    cached = b_bytes <= spec.l1_bytes or (b_bytes <= spec.l2_bytes // 2 and not any(
        _from_memory(k, plan, st, spec) for st in mms))
    if cpu_simd(spec)[1] < 32 and cached and (most is None or most >= TILE_ROWS_16_REGS) and \
            _may_leave_remainder(lp, mms, inner):
        return min(TILE_ROWS_16_REGS, lp.rows)
    cap = 8 if b_bytes > spec.l1_bytes else 4
    if most is not None:
        cap = min(cap, most)
    return next((t for t in MATMUL_TILE_ROWS if inner % t == 0 and t <= min(lp.rows, cap)), 1)


def _transposed_b(st: Let) -> bool:
    """Whether a matmul reads B stored transposed (a Linear's weight, ``X @ W.t()``) with A's
    rows and B's stored rows both contiguous along k: then the register tile is a block of
    dot products along k (``mm_rows_t``), which reads W once at memory speed where a walk
    down B's columns reads one float per cache line.  A decode-shape Linear, 4 rows x 1024 x
    2048 on a Zen 4 core: the row-by-row loop took 1.9 ms, PyTorch's MKL 0.6 ms."""
    a, b = st.access
    return a.red == 1 and b.red == 1 and b.col > 1 and not b.col_index and \
        not a.col_index and not (b.rows and b.rows[-1])


def _may_leave_remainder(lp: Loop, mms: list[Let], inner: int) -> bool:
    """Whether a tile may cross from one innermost row block to the next: only when there is
    one block, or no matmul's B depends on the row (a tile reads one B for all its rows)."""
    return inner == lp.rows or all(not any(st.access[1].rows) for st in mms)


def _packs_b(lp: Loop, st: Let, spec: DeviceSpec, width: int) -> bool:
    """Whether a register-tiled matmul copies its B tile into a contiguous buffer once per
    loop: when B's rows lie a multiple of 4 KB apart (then every row falls in the same L1
    sets, and a 64-row tile of K in attention, 16 KB, was served from L2), the tile fits in
    half of L1, the loop makes several row tiles (the copy is read again by each) and B is
    the same for every row.  gqa, one thread, Zen 3: 8.6 -> 7.7 ms."""
    b = st.access[1]
    k = st.attrs["k"]
    return b.red != width and (b.red * 4) % 4096 == 0 and k * width * 4 <= spec.l1_bytes // 2 \
        and lp.rows >= 2 * lp.tile_rows and not any(b.rows) and not st.attrs.get("prefetch")


def _matmul_prefetch(lp: Loop, st: Let, k: Kernel, plan: KernelPlan, spec: DeviceSpec) -> int:
    """How far ahead (floats) the first row tile's matmul prefetches B into L2 (0: none).

    Only in a for-loop, when B's step per iteration is a page or more (the L2 streamer stays
    within a 4 KB page) and B streams from memory (``_from_memory``): lora's 4 MB W, served
    from L3 anyway, went 0.40 -> 0.51-0.66 ms with prefetches.
    When the loop walks down B's rows the prefetch runs PREFETCH_ROWS rows ahead, across into
    the next iteration's tile near the end of this one; otherwise it fetches the same tile of
    the next iteration.  gated_mlp, one thread: no prefetch 12.1-12.7 ms, a whole 64-row tile
    ahead 8.8-10.2 ms, 16 rows ahead 7.9-9.2 ms (8 rows: 9.3 ms, 32 rows: 8.5 ms).
    Without a for-loop, a matmul that walks a long k down B's rows a page or more apart (the
    whole K at once) prefetches PREFETCH_ROWS rows ahead too: gated_mlp's searched structures
    without a for-loop had none and took 7.8-8.8 ms on numpy arrays where the hand-written
    one's 64-row steps took 3.4 (AMD EPYC, AVX-512, 2 threads), and the launch tuned them."""
    b_access = st.access[1]
    v = next(v for v in k.views if v.name == b_access.view)
    kk, row_stride = st.attrs["k"], b_access.red
    if not _from_memory(k, plan, st, spec):
        return 0
    if lp.stage == "body" and k.forloop >= 2:
        if v.iter * 4 < 4096:
            return 0
        return min(PREFETCH_ROWS, kk) * row_stride if v.iter == kk * row_stride else v.iter
    if kk >= 2 * PREFETCH_ROWS and row_stride * 4 >= 4096:
        return PREFETCH_ROWS * row_stride
    return 0


def _from_memory(k: Kernel, plan: KernelPlan, st: Let, spec: DeviceSpec) -> bool:
    """Whether a matmul's B streams from memory: at least PREFETCH_MIN_L2S L2 caches and half
    the last-level cache.  lora's 4 MB W, 8 L2s of a Zen 3 core but served from its L3, took
    1.01 -> 0.92 ms without the prefetches (one thread)."""
    size = math.prod(_buffer(k, plan, st.access[1].view).shape) * 4
    return size >= max(PREFETCH_MIN_L2S * spec.l2_bytes, spec.llc_bytes // 2)


def _join_rows(k: Kernel, loops: list[Loop]) -> None:
    """Mark loops that share the previous loop's walk over the rows (``Loop.join``): when
    each row of a later loop reads only what the same row of the earlier ones wrote (a
    row-reduce-then-broadcast, as in softmax), the row is read back from L1 instead of after
    the whole tile."""
    group: list[Loop] = []
    for lp in loops:
        lp.join = bool(group) and _joins(k, group, lp)
        group = [*group, lp] if lp.join else [lp]


def _joined_by_next(lp: Loop, k: Kernel) -> bool:
    loops = _loops(k)
    i = next(i for i, x in enumerate(loops) if x is lp)
    return i + 1 < len(loops) and loops[i + 1].join


def _joins(k: Kernel, group: list[Loop], lp: Loop) -> bool:
    first = group[0]
    if lp.shape != first.shape or lp.chunked or first.chunked or \
            any(_has_matmul(x) for x in (*group, lp)):
        return False
    buffer_of = {v.name: v.buffer for v in k.views}
    written: dict[str, list[Access]] = {}
    for x in group:
        for st in (*x.col, *x.row):
            if isinstance(st, Store):
                written.setdefault(buffer_of[st.access.view], []).append(st.access)
    for view, acc in _accesses(lp):
        for w in written.get(buffer_of[view], []):
            if acc.rows != w.rows or any(s == 0 for s, n in zip(w.rows, first.shape[:-1],
                                                                  strict=False) if n > 1):
                return False
    mine = {buffer_of[st.access.view] for st in (*lp.col, *lp.row) if isinstance(st, Store)}
    return not any(_overlap(k, buffer_of[v], m) for x in group for v, _ in _accesses(x)
                   for m in mine)


def _overlap(k: Kernel, a: str, b: str) -> bool:
    """Whether buffers ``a`` and ``b`` share memory: the same buffer, or shared-memory space
    ``plan_shared`` gave to both because their lifetimes, counted in loops, do not meet.  A
    joined loop runs inside its group's walk over the rows, so a later loop's buffer placed
    over one the group still reads would overwrite it a row at a time (a column sum read at
    every row, then a row-norm's tile over it: wrong results)."""
    if a == b:
        return True
    x, y = k.buffers.get(a), k.buffers.get(b)
    if x is None or y is None or x.level is not Level.REGIONAL \
            or y.level is not Level.REGIONAL:
        return False
    return x.offset < y.offset + y.nbytes and y.offset < x.offset + x.nbytes
