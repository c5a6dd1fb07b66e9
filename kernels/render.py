"""One C-style renderer, two dialects: CUDA and C++ with OpenMP.

Both dialects are ``cstyle.CStyle`` with a handful of hooks overridden (types, conversions,
kernel signature, how blocks are walked, synchronisation, combining a row's lanes), in the
spirit of tinygrad's CStyleLanguage: there is one code generator, not two.  ``render(plan)``
prints a plan in the dialect of its device; any plan prints in either dialect correctly,
because block work is written as loops strided by the thread index.
"""

from __future__ import annotations

import math
from dataclasses import replace

from .cpp_prelude import EXP_F, LANE_SUM, MATMUL_TILE, STREAM_ROW
from .cstyle import CStyle, _indent, _sum_lines
from .devices import _cache_bytes
from .plan import Access, Kernel, KernelPlan, Let, Loop, Store

GROUP_SUM = """template <int L> __device__ __forceinline__ float group_sum(float v, float* red) {
  // sum over the L lanes of a thread group: shuffles inside a warp, shared memory across warps
#pragma unroll
  for (int o = (L < 32 ? L : 32) / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (L <= 32) return v;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  const int first = (threadIdx.x / L) * (L / 32);
  float s = 0.0f;
  for (int q = 0; q < L / 32; ++q) s += red[first + q];
  return s;
}"""
GRID_BARRIER = """__device__ void grid_barrier(unsigned int* bar, unsigned int blocks) {
  // every block is resident (the plan keeps the grid within one wave): count arrivals in
  // bar[0], release by bumping the generation in bar[1]; reusable, counters start at zero
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned int* gen = bar + 1;
    const unsigned int seen = *gen;
    __threadfence();
    if (atomicAdd(bar, 1u) == blocks - 1) {
      atomicExch(bar, 0u);
      __threadfence();
      atomicAdd(bar + 1, 1u);
    } else {
      while (*gen == seen) { }
    }
    __threadfence();
  }
  __syncthreads();
}"""
MATMUL_TILE_ROWS = (8, 6, 4, 3, 2)  # rows per register tile, largest dividing the row count first
# (every row of a tile shares one pass over B: gated_mlp's 8 rows in one tile, not two of 4,
# read each 64 MB weight from memory once: 10.0 -> 8.9 ms one thread, 4.7 -> 3.5 ms two;
# up to 4 rows when B's tile stays in L1, see CppDialect.matmul_tile_rows)
STREAM_ROW_MIN, STREAM_ROW_MAX = 16, 16384  # columns of a row streamed via a buffer
PREFETCH_MIN_L2S = 8  # B sizes (in L2 caches) whose next for-loop tile is prefetched
PREFETCH_ROWS = 16  # B rows a register-tiled matmul prefetches ahead of its loads
# short rows of a big input: prefetch this far ahead (floats), one prefetch per cache line
PREFETCH_AHEAD, PREFETCH_ROW_MAX = 2048, 256
TREE_SUM_MAX_COLS = 256  # wider rows: the in-order lane sum is a small share of the row
PARALLEL_MIN_WORK = 1 << 18  # below this, forking threads costs more than it saves
CUDA_TYPES = {"float16": ("half", "__half2float", "__float2half"),
              "bfloat16": ("__nv_bfloat16", "__bfloat162float", "__float2bfloat16")}


class CudaDialect(CStyle):
    """CUDA: blocks are CUDA blocks, rows of a tile over thread groups, sums by shuffles."""

    name = "cuda"
    fn_prefix = "__device__ __forceinline__"

    def prelude(self, plans: list[KernelPlan]) -> list[str]:
        lines = ["#include <cuda_fp16.h>", "#include <cuda_bf16.h>",
                 f"{self.fn_prefix} float exp_f(float x) {{ return expf(x); }}",
                 *super().prelude(plans), GROUP_SUM]
        return lines + ([GRID_BARRIER] if any(p.barriers for p in plans) else [])

    def ctype(self, dtype: str) -> str:
        return CUDA_TYPES[dtype][0] if dtype in CUDA_TYPES else "float"

    def load(self, expr: str, dtype: str) -> str:
        return f"{CUDA_TYPES[dtype][1]}({expr})" if dtype in CUDA_TYPES else expr

    def convert(self, value: str, dtype: str) -> str:
        return f"{CUDA_TYPES[dtype][2]}({value})" if dtype in CUDA_TYPES else value

    def kernel_open(self, k: Kernel, plan: KernelPlan, params: list[str]) -> list[str]:
        sig = [self._param(k, plan, p) for p in params]
        sig += ["float* __restrict__ ws", "unsigned int* __restrict__ bar"]
        lines = [f'extern "C" __global__ void __launch_bounds__({k.mapping.threads}) '
                 f"{k.name}({', '.join(sig)}) {{", "  const int tid = threadIdx.x;"]
        if k.smem_bytes:
            lines.append(f"  __shared__ __align__(16) float smem[{-(-k.smem_bytes // 4)}];")
        if "red" in k.buffers:
            lines.append(f"  float* const red = smem + {k.buffers['red'].offset // 4};")
        return lines

    def _param(self, k: Kernel, plan: KernelPlan, p: str) -> str:
        b = plan.globals[p]
        return f"{'const ' if b.role == 'input' else ''}{self.ctype(b.dtype)}* __restrict__ {p}"

    def work_loop(self, k: Kernel) -> list[str]:
        return [f"for (int w = blockIdx.x; w < {k.items}; w += gridDim.x) {{"]

    def block_sync(self) -> list[str]:
        return ["__syncthreads();"]

    def grid_sync(self, k: Kernel) -> list[str]:
        return [f"grid_barrier(bar + {2 * k.barrier_index}, gridDim.x);"]

    def group_sum(self, var: str, lanes: int) -> list[str]:
        if lanes == 1:
            return []
        red = "red" if "red" in self._k.buffers else "nullptr"
        return [f"{var} = group_sum<{lanes}>({var}, {red});"]

    def entry(self, plan: KernelPlan) -> list[str]:
        lines = [f"// launches, in order (workspace: {plan.workspace_floats} floats; bar: "
                 f"{2 * plan.barriers} zeroed unsigned ints):"]
        for k in plan.kernels:
            lines.append(f"//   {k.name}<<<{k.blocks}, {k.mapping.threads}>>>"
                         f"({', '.join(k.params)}, ws, bar)")
        return lines


class CppDialect(CStyle):
    """C++/OpenMP: a block runs on one thread (every stride is 1); blocks are an omp for."""

    name = "cpp"
    matmul_by_rows = True
    _streaming = _streamed = False  # this kernel streams output rows; this work item did

    def prelude(self, plans: list[KernelPlan]) -> list[str]:
        stream = [STREAM_ROW] if any(_streams(k, p) for p in plans for k in p.kernels) else []
        return ["#include <math.h>", "#include <stdlib.h>", "#include <string.h>", EXP_F,
                MATMUL_TILE, LANE_SUM, *stream, *super().prelude(plans)]

    def threads(self, k: Kernel) -> int:
        return 1

    def kernel_open(self, k: Kernel, plan: KernelPlan, params: list[str]) -> list[str]:
        sig = [f"{'const ' if plan.globals[p].role == 'input' else ''}float* __restrict__ {p}"
               for p in params] + ["float* __restrict__ ws"]
        work = k.vblocks * sum(_loop_work(lp, k) for ph in k.phases for lp in ph.loops)
        lines = [f"static void {k.name}({', '.join(sig)}) {{",
                 f"#pragma omp parallel if({work} >= {PARALLEL_MIN_WORK})  // ~multiply-adds",
                 "{"]
        if k.smem_bytes:
            size = -(-k.smem_bytes // 64) * 64
            lines.append(f"  float* const smem = static_cast<float*>(aligned_alloc(64, {size}));"
                         "  // this thread's \"shared memory\"")
        return lines

    def kernel_close(self, k: Kernel) -> list[str]:
        return (["  free(smem);"] if k.smem_bytes else []) + ["}", "}"]

    def work_loop(self, k: Kernel) -> list[str]:
        self._streaming, self._streamed = _streams(k, self._plan), False
        return ["#pragma omp for schedule(static)", f"for (int w = 0; w < {k.items}; ++w) {{"]

    def work_loop_close(self, k: Kernel) -> list[str]:
        return ["  stream_fence();", "}"] if self._streamed else ["}"]

    def _row_body(self, lp: Loop, lanes: int, split: int, width: int,
                  guards: list[str]) -> list[str]:
        self._row_streams: list[tuple[str, str]] = []
        self._stream_width = width if self._streaming and lanes == 1 and split == 1 and \
            STREAM_ROW_MIN <= width <= STREAM_ROW_MAX else 0
        body = super()._row_body(lp, lanes, split, width, guards)
        pf = self._row_prefetches(lp, lanes, split, width)
        at = len(self.coord_lines(lp))
        return body[:at] + pf + body[at:]

    def _row_prefetches(self, lp: Loop, lanes: int, split: int, width: int) -> list[str]:
        """Prefetch what a row loop reads of a big input PREFETCH_AHEAD floats ahead, when
        the rows are short and laid end to end: this VM's hardware prefetchers did not keep
        up with a walk over 750000 rows of 32 (softmax_rows, one thread, standalone A/B: the
        generated kernel 13.6 -> 10.0 ms; a hand-written row loop 12.6 -> 6.6 ms with 8 KB
        ahead, 7.1 ms with 2 KB, 7.7-8.2 ms with 32 KB).  Longer rows stream well without
        help (4096 x 1024 is at copy bandwidth)."""
        if lanes != 1 or split != 1 or width > PREFETCH_ROW_MAX or lp.chunked or \
                _has_matmul(lp):
            return []
        out, seen = [], set()
        coords = [f"i{d}" for d in range(len(lp.shape) - 1)]
        for st in (*lp.hoisted, *lp.col):
            if not (isinstance(st, Let) and st.op == "load"):
                continue
            a = st.access[0]
            b = self.buffer(self._k, self._plan, self._view_buffer(a.view))
            if b.role != "input" or a.col != 1 or a.col_index or not a.rows or \
                    a.rows[-1] != width or a.view in seen or \
                    math.prod(b.shape) * 4 < PREFETCH_MIN_L2S * _cache_bytes(2, 1 << 20):
                continue
            seen.add(a.view)
            start = f"{a.view} + {self._index(replace(a, col=0), coords)} + {PREFETCH_AHEAD}"
            out += [f"for (int p = 0; p < {width}; p += 16) "
                    f"__builtin_prefetch({start} + p, 0, 3);  // rows ahead of {a.view}"]
        return out

    def _store(self, st: Store, coords: list[str], guards: list[str]) -> list[str]:
        """An output row written once, column by column, goes to a row buffer that
        ``col_loop`` then copies out with non-temporal stores (``_streams``)."""
        a = st.access
        if not self._stream_width or st.accumulate or st.guard or guards or a.col != 1 or \
                a.col_index or a.chunked or \
                self.buffer(self._k, self._plan, self._view_buffer(a.view)).role != "output":
            return super()._store(st, coords, guards)
        start = f"{a.view} + {self._index(replace(a, col=0), coords)}"
        names = [s for s, _ in self._row_streams]
        if start not in names:
            self._row_streams.append((start, f"o_row{len(names)}"))
        buf = dict(self._row_streams)[start]
        return [f"{buf}[c] = {st.var};  // to {a.view}, streamed after the row"]

    def matmul_tile_rows(self, lp: Loop, lanes: int, width: int) -> int:
        """Tile when every matmul reads B with unit column stride and the same B rows for
        the rows of a tile (B independent of the innermost row coordinate)."""
        mms = [st for st in lp.col if isinstance(st, Let) and st.op == "matmul"]
        if not mms or lanes != 1 or self.threads(self._k) != 1 or lp.chunked or \
                width > self.MATMUL_ROW_MAX:
            return 0
        inner = lp.shape[-2] if len(lp.shape) > 1 else 1
        if any(st.access[1].col != 1 or st.access[1].col_index or
               (st.access[1].rows and st.access[1].rows[-1]) for st in mms):
            return 0
        # more than 4 rows share one pass over B but spill accumulators: worth it only when
        # B's tile does not stay in L1 between passes (mha's 64 x 64 B: 7.7 ms at 4 rows,
        # 10.1 ms at 8; gated_mlp's 64 x 512: 10.0 ms at 4, 8.9 ms at 8)
        b_bytes = max(st.attrs["k"] for st in mms) * width * 4
        most = 8 if b_bytes > _cache_bytes(1, 32 << 10) else 4
        return next((t for t in MATMUL_TILE_ROWS if inner % t == 0 and t <= min(lp.rows, most)),
                    1)

    def matmul_tiles(self, lp: Loop, rows: int, width: int) -> list[str]:
        coords = [f"i{d}" for d in range(len(lp.shape) - 1)]
        out = []
        for st in (s for s in lp.col if isinstance(s, Let) and s.op == "matmul"):
            a, b = (replace(x, col=0) for x in st.access)
            arr = f"m_{st.var}"
            self._mm_index[st.var] = f"{arr}[(r - r0) * {width} + c]"
            out += [f"// {st.comment} ({rows} row(s) x {width} in registers, k = "
                    f"{st.attrs['k']})",
                    f"alignas(64) float {arr}[{rows * width}];", "{",
                    f"  const float* a_rows[{rows}];",
                    f"  for (int r = r0; r < r0 + {rows}; ++r) {{",
                    *_indent(self.coord_lines(lp), "    "),
                    f"    a_rows[r - r0] = {a.view} + {self._index(a, coords)};", "  }",
                    "  const int r = r0;", *_indent(self.coord_lines(lp)),
                    f"  mm_rows<{rows}>(a_rows, {a.red}, {b.view} + {self._index(b, coords)}, "
                    f"{b.red}, {st.attrs['k']}, {width}, {arr}, "
                    f"{self._prefetch_offset(lp, b.view, st.attrs['k'], b.red)});",
                    "}"]
        return out

    def _prefetch_offset(self, lp: Loop, view: str, k: int, row_stride: int) -> str:
        """How far ahead (floats) the first row tile's matmul prefetches B into L2 (0: no
        prefetch; prefetches past the end are harmless, they do not fault).

        Only in a for-loop, when B's step per iteration is a page or more (the L2 streamer
        stays within a 4 KB page) and B is at least PREFETCH_MIN_L2S L2 caches, so it streams
        from memory: lora's 4 MB W, served from L3 anyway, went 0.40 -> 0.51-0.66 ms with
        prefetches.  When the loop walks down B's rows (each iteration's tile starts where the
        last one ended) the prefetch runs PREFETCH_ROWS rows ahead, across into the next
        iteration's tile near the end of this one; otherwise it fetches the same tile of the
        next iteration.  gated_mlp, one thread: no prefetch 12.1-12.7 ms, a whole 64-row
        tile ahead 8.8-10.2 ms, 16 rows ahead 7.9-9.2 ms (8 rows: 9.3 ms, 32 rows: 8.5 ms)."""
        v = next(v for v in self._k.views if v.name == view)
        b = self.buffer(self._k, self._plan, v.buffer)
        if lp.stage != "body" or self._k.forloop < 2 or v.iter * 4 < 4096 or \
                math.prod(b.shape) * 4 < PREFETCH_MIN_L2S * _cache_bytes(2, 1 << 20):
            return "0"
        ahead = min(PREFETCH_ROWS, k) * row_stride if v.iter == k * row_stride else v.iter
        return f"r0 == 0 ? {ahead} : 0"

    def row_groups(self, loops: list[Loop]) -> list[list[Loop]]:
        """Join consecutive loops over the same rows when each row of a later loop reads only
        what the same row of the earlier ones wrote (a row-reduce-then-broadcast, as in
        softmax): the row is read back from L1 instead of after the whole tile."""
        if not loops or self.threads(self._k) != 1:
            return super().row_groups(loops)
        groups: list[list[Loop]] = [[loops[0]]]
        for lp in loops[1:]:
            if self._joins(groups[-1], lp):
                groups[-1].append(lp)
            else:
                groups.append([lp])
        return groups

    def _joins(self, group: list[Loop], lp: Loop) -> bool:
        first = group[0]
        if lp.shape != first.shape or lp.chunked or first.chunked or \
                any(_has_matmul(x) for x in (*group, lp)):
            return False
        written = {}
        for x in group:
            for st in (*x.col, *x.row):
                if isinstance(st, Store):
                    written.setdefault(self._view_buffer(st.access.view), []).append(st.access)
        for view, acc in _accesses(lp):
            buf = self._view_buffer(view)
            for w in written.get(buf, []):
                if acc.rows != w.rows or any(s == 0 for s, n in zip(w.rows, first.shape[:-1],
                                                                      strict=False) if n > 1):
                    return False
        mine = {self._view_buffer(st.access.view) for st in (*lp.col, *lp.row)
                if isinstance(st, Store)}
        return not any(self._view_buffer(v) in mine for x in group for v, _ in _accesses(x))

    def grid_sync(self, k: Kernel) -> list[str]:
        return ["// grid barrier: the implicit barrier at the end of the omp for above"]

    def col_loop(self, lp: Loop, body: list[str], sums: list[tuple[str, str, str]],
                 cols: tuple[str, str, str], width: int) -> list[str]:
        """Sums over a short row as one vector of lane partials combined by halves
        (``lane_sum``): GCC ends an `omp simd` reduction by adding its lanes in order, 16
        dependent adds per row with AVX-512, which for rows of 32 cost as much as the exps."""
        rows = getattr(self, "_row_streams", [])
        out = self._col_loop(lp, body, sums, cols, width)
        if rows:
            self._streamed = True
            out = [f"alignas(64) float {buf}[{width}];" for _, buf in rows] + out + \
                [f"stream_row({start}, {buf}, {width});" for start, buf in rows]
        return out

    def _col_loop(self, lp: Loop, body: list[str], sums: list[tuple[str, str, str]],
                  cols: tuple[str, str, str], width: int) -> list[str]:
        start, end, step = cols
        if not sums or start != "0" or step != "++c" or width > TREE_SUM_MAX_COLS:
            return super().col_loop(lp, body, sums, cols, width)
        parts = [(f"p_{a}", v, note) for a, v, note in sums]
        out = [f"alignas(64) float {p}[TUNER_VL] = {{}};" for p, _, _ in parts]
        out += ["int cv = 0;", f"for (; cv + TUNER_VL <= {end}; cv += TUNER_VL) {{",
                "  #pragma omp simd", "  for (int l = 0; l < TUNER_VL; ++l) {",
                "    const int c = cv + l;", *_indent(body + _sum_lines(parts, "[l]"), "    "),
                "  }", "}",
                *[f"{a} += lane_sum({p});" for (a, _, _), (p, _, _) in zip(sums, parts, strict=True)],
                f"for (int c = cv; c < {end}; ++c) {{", *_indent(body + _sum_lines(sums)), "}"]
        return ["{", *_indent(out), "}"]

    def col_pragma(self, lp: Loop | None, accs: list[str]) -> list[str]:
        return ["#pragma omp simd" + (f" reduction(+:{', '.join(accs)})" if accs else "")]

    def entry(self, plan: KernelPlan) -> list[str]:
        lines = ['extern "C" void kernel(float** inputs, float** outputs) {']
        if plan.workspace_floats:
            size = -(-plan.workspace_floats * 4 // 64) * 64
            lines.append(f"  static float* const ws = static_cast<float*>(aligned_alloc(64, "
                         f"{size}));  // workspace, allocated once")
        else:
            lines.append("  float* const ws = nullptr;")
        for k in plan.kernels:
            args = [f"{'inputs' if plan.globals[p].role == 'input' else 'outputs'}"
                    f"[{plan.globals[p].io_index}]" for p in k.params] + ["ws"]
            lines.append(f"  {k.name}({', '.join(args)});")
        return lines + ["}"]


def _streams(k: Kernel, plan: KernelPlan) -> bool:
    """Whether ``k`` writes its output rows with non-temporal stores: when its inputs and
    outputs together exceed half the last-level cache, so the output would only evict what
    is still to be read.  softmax_rows (750000, 32), 192 MB: 17.9 -> 17.0 ms; below that the
    output stays in cache for the next reader and streaming lost (4096 x 1024: 1.48 -> 1.92)."""
    size = sum(math.prod(plan.globals[p].shape) * 4 for p in k.params
               if plan.globals[p].role in ("input", "output"))
    return any(plan.globals[p].role == "output" for p in k.params) and \
        size >= _cache_bytes(3, 32 << 20) // 2


def _has_matmul(lp: Loop) -> bool:
    return any(isinstance(st, Let) and st.op == "matmul" for st in lp.col)


def _accesses(lp: Loop) -> list[tuple[str, Access]]:
    """(view, access) of every read and write of a loop."""
    out = []
    for st in (*lp.hoisted, *lp.col, *lp.row):
        for a in (st.access if isinstance(st, Let) else (st.access,)):
            out.append((a.view, a))
    return out


def _loop_work(lp: Loop, k: Kernel) -> int:
    """Multiply-adds (or elements) of one loop per virtual block, for-loop iterations included."""
    depth = max([st.attrs.get("k", 1) for st in lp.col if isinstance(st, Let)
                 and st.op == "matmul"], default=1)
    return lp.rows * lp.cols * depth * (k.forloop if lp.stage == "body" else 1)


DIALECTS: dict[str, type[CStyle]] = {"cuda": CudaDialect, "cpp": CppDialect}


def render(plan: KernelPlan | list[KernelPlan], dialect: str | None = None) -> str:
    """Source for ``plan`` in ``dialect`` ('cuda' or 'cpp'; default: the plan's device kind)."""
    first = plan[0] if isinstance(plan, list) else plan
    dialect = dialect or ("cpp" if first.device_kind == "cpu" else "cuda")
    if dialect not in DIALECTS:
        raise ValueError(f"render: unknown dialect {dialect!r}; use one of {sorted(DIALECTS)}")
    return DIALECTS[dialect]().render(plan)
