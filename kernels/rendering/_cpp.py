"""The C++/OpenMP dialect: a block runs on one thread (every stride is 1), blocks are an
``omp for``; register-tiled matmuls, streamed output rows, prefetches and tree sums where the
plan's schedule asks for them (``kernels.lowering`` decides; this prints)."""

from __future__ import annotations

from dataclasses import replace

from kernels.lowering import Kernel, KernelPlan, Let, Loop, Store

from ._cpp_prelude import (
    CPP_TYPES,
    EXP_F,
    HALF,
    LANE_SUM,
    MATMUL_REGISTER_TILES,
    MATMUL_TRANSPOSED_TILES,
    STREAM_ROW,
)
from ._cstyle import CStyle, _indent, _sum_lines

PREFETCH_AHEAD = 2048  # floats: how far ahead a row loop prefetches its inputs' rows


class CppDialect(CStyle):
    """C++/OpenMP: a block runs on one thread (every stride is 1); blocks are an omp for."""

    name = "cpp"
    register_tiles = True
    _streamed = False  # this work item streamed output rows (a fence ends it)

    def prelude(self, plans: list[KernelPlan]) -> list[str]:
        loops = [lp for p in plans for k in p.kernels for ph in k.phases for lp in ph.loops]
        stream = [STREAM_ROW] if any(lp.stream for lp in loops) else []
        transposed = [MATMUL_TRANSPOSED_TILES] if any(
            isinstance(st, Let) and st.attrs.get("transposed_b") for lp in loops
            for st in lp.col) else []
        return ["#include <math.h>", "#include <stdlib.h>", "#include <string.h>", EXP_F, HALF,
                MATMUL_REGISTER_TILES, LANE_SUM, *transposed, *stream, *super().prelude(plans)]

    def threads(self, k: Kernel) -> int:
        return 1

    # program inputs and outputs stay in the program's dtype; values are float32 in registers
    def ctype(self, dtype: str) -> str:
        return CPP_TYPES[dtype][0] if dtype in CPP_TYPES else "float"

    def load(self, expr: str, dtype: str) -> str:
        return f"to_f({expr})" if dtype in CPP_TYPES else expr

    def convert(self, value: str, dtype: str) -> str:
        return f"{CPP_TYPES[dtype][1]}({value})" if dtype in CPP_TYPES else value

    def kernel_open(self, k: Kernel, plan: KernelPlan, params: list[str]) -> list[str]:
        sig = [f"{'const ' if plan.globals[p].role == 'input' else ''}"
               f"{self.ctype(plan.globals[p].dtype)}* __restrict__ {p}"
               for p in params] + ["float* __restrict__ ws"]
        fork = "#pragma omp parallel" if k.parallel else \
            "#pragma omp parallel if(0)  // too little work to fork threads for"
        lines = [f"static void {k.name}({', '.join(sig)}) {{", fork, "{"]
        if k.smem_bytes:
            size = -(-k.smem_bytes // 64) * 64
            lines.append(f"  float* const smem = static_cast<float*>(aligned_alloc(64, {size}));"
                         "  // this thread's \"shared memory\"")
        return lines

    def kernel_close(self, k: Kernel) -> list[str]:
        return (["  free(smem);"] if k.smem_bytes else []) + ["}", "}"]

    def work_loop(self, k: Kernel) -> list[str]:
        self._streamed = False
        return ["#pragma omp for schedule(static)", f"for (int w = 0; w < {k.items}; ++w) {{"]

    def work_loop_close(self, k: Kernel) -> list[str]:
        return ["  stream_fence();", "}"] if self._streamed else ["}"]

    def _row_body(self, lp: Loop, lanes: int, split: int, width: int,
                  guards: list[str]) -> list[str]:
        self._row_streams: list[tuple[str, str]] = []
        self._stream_width = width if lp.stream else 0
        body = super()._row_body(lp, lanes, split, width, guards)
        pf = self._row_prefetches(lp, lanes, split, width)
        at = len(self.coord_lines(lp))
        return body[:at] + pf + body[at:]

    def _row_prefetches(self, lp: Loop, lanes: int, split: int, width: int) -> list[str]:
        """Prefetches of the inputs' rows ``PREFETCH_AHEAD`` floats ahead (``Loop.prefetch``)."""
        out = []
        coords = [f"i{d}" for d in range(len(lp.shape) - 1)]
        for view in lp.prefetch:
            a = next(st.access[0] for st in (*lp.hoisted, *lp.col)
                     if isinstance(st, Let) and st.op == "load" and st.access[0].view == view)
            start = f"{a.view} + {self._index(replace(a, col=0), coords)} + {PREFETCH_AHEAD}"
            out += [f"for (int p = 0; p < {width}; p += 16) "
                    f"__builtin_prefetch({start} + p, 0, 3);  // rows ahead of {a.view}"]
        return out

    def _store(self, st: Store, coords: list[str], guards: list[str]) -> list[str]:
        """An output row written once, column by column, goes to a row buffer that
        ``col_loop`` then copies out with non-temporal stores (``_streams``)."""
        a = st.access
        out = self.buffer(self._k, self._plan, self._view_buffer(a.view))
        if not self._stream_width or st.accumulate or st.guard or guards or a.col != 1 or \
                a.col_index or a.chunked or out.role != "output" or out.dtype != "float32":
            return super()._store(st, coords, guards)
        start = f"{a.view} + {self._index(replace(a, col=0), coords)}"
        names = [s for s, _ in self._row_streams]
        if start not in names:
            self._row_streams.append((start, f"o_row{len(names)}"))
        buf = dict(self._row_streams)[start]
        return [f"{buf}[c] = {st.var};  // to {a.view}, streamed after the row"]

    def matmul_tiles(self, lp: Loop, rows: int, width: int, count: str) -> list[str]:
        coords = [f"i{d}" for d in range(len(lp.shape) - 1)]
        out = []
        for st in (s for s in lp.col if isinstance(s, Let) and s.op == "matmul"):
            bt = st.attrs.get("transposed_b")
            name = "mm_rows_t" if bt else "mm_rows"
            call = f"{name}<{rows}>(" if count == str(rows) else f"{name}_n<{rows}>({count}, "
            ldb = st.access[1].col  # a transposed B: its columns are its stored rows
            a, b = (replace(x, col=0) for x in st.access)
            arr = f"m_{st.var}"
            self._mm_index[st.var] = f"{arr}[(r - r0) * {width} + c]"
            b_tile, b_stride = (f"pk_{st.var}", width) if st.attrs.get("pack") else \
                (f"{b.view} + {self._index(b, coords)}", b.red)
            args = f"a_rows, {b_tile}, {ldb}, {st.attrs['k']}, {width}, {arr});" if bt else \
                (f"a_rows, {a.red}, {b_tile}, {b_stride}, {st.attrs['k']}, {width}, "
                 f"{arr}, {_prefetch(st)});")
            out += [f"// {st.comment} ({rows} row(s) x {width} in registers, k = "
                    f"{st.attrs['k']})",
                    f"alignas(64) float {arr}[{rows * width}];", "{",
                    f"  const {self._ctype_of(a.view)}* a_rows[{rows}];",
                    f"  for (int r = r0; r < r0 + {count}; ++r) {{",
                    *_indent(self.coord_lines(lp), "    "),
                    f"    a_rows[r - r0] = {a.view} + {self._index(a, coords)};", "  }",
                    "  const int r = r0;", *_indent(self.coord_lines(lp)),
                    f"  {call}{args}", "}"]
        return out

    def _ctype_of(self, view: str) -> str:
        return self.ctype(self.buffer(self._k, self._plan, self._view_buffer(view)).dtype)

    def matmul_packs(self, lp: Loop, width: int) -> list[str]:
        out = []
        for st in (s for s in lp.col if isinstance(s, Let) and s.op == "matmul"):
            if st.attrs.get("pack"):
                b, k = replace(st.access[1], col=0), st.attrs["k"]
                out += [f"// B of {st.var}: rows {b.red} floats apart share L1 sets; one "
                        "contiguous copy for every row tile",
                        f"alignas(64) float pk_{st.var}[{k * width}];",
                        f"pack_rows(pk_{st.var}, {b.view} + {self._index(b, [])}, {k}, "
                        f"{width}, {b.red});"]
        return out

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
        if not sums or not lp.tree_sum or start != "0" or step != "++c":
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

    def max_pragma(self, var: str) -> list[str]:
        return [f"#pragma omp simd reduction(max:{var})"]

    def entry(self, plan: KernelPlan) -> list[str]:
        lines = ['extern "C" void kernel(float** inputs, float** outputs) {']
        if plan.workspace_floats:
            size = -(-plan.workspace_floats * 4 // 64) * 64
            lines.append(f"  static float* const ws = static_cast<float*>(aligned_alloc(64, "
                         f"{size}));  // workspace, allocated once")
        else:
            lines.append("  float* const ws = nullptr;")
        for k in plan.kernels:
            args = [self._io_arg(plan, p) for p in k.params] + ["ws"]
            lines.append(f"  {k.name}({', '.join(args)});")
        return lines + ["}"]

    def _io_arg(self, plan: KernelPlan, p: str) -> str:
        """``inputs[i]`` / ``outputs[i]`` (the entry's float** convention), as the storage
        type the kernel takes: a half program's arrays are passed as they are."""
        b = plan.globals[p]
        ref = f"{'inputs' if b.role == 'input' else 'outputs'}[{b.io_index}]"
        if b.dtype not in CPP_TYPES:
            return ref
        const = "const " if b.role == "input" else ""
        return f"reinterpret_cast<{const}{self.ctype(b.dtype)}*>({ref})"


def _prefetch(st: Let) -> str:
    """A register-tiled matmul's B prefetch distance: only its first row tile fetches."""
    ahead = st.attrs.get("prefetch", 0)
    return f"r0 == 0 ? {ahead} : 0" if ahead else "0"
