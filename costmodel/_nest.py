"""What one core runs: a lowered plan's loop nests counted as work per core (or SM).

The graph features count a program's work in total (bytes, FLOPs, launches) and each kernel's
grid and schedule knobs.  What a config changes on a CPU is mostly *how that work lands on a
core*: how many blocks each core runs one after another (a grid of 1 leaves a core idle; a
kernel lowering judged not worth forking runs every block on one thread), how often a for-loop
body re-runs its loops, how many rows pay a loop's per-row statements, how many columns fall
outside whole vectors, and whether matmuls run in register tiles, row by row or plainly.  A
tree cannot multiply a block count by a loop's trip count by its statements; counted here, it
reads them directly.  CPU dataset, programs held out (5 folds, 300 trees of 63 leaves, AMD
EPYC): tau 0.542 -> 0.623, top-1 18.5% -> 6.5%, MAPE 0.479 -> 0.318 (docs/costmodel.md).

Counts follow the plan as the renderer prints it (``kernels.lowering``): per work item (a
virtual block, or a split's chunk of one), each loop runs ``rows x cols`` elements, times the
for-loop range in the body stage; a column statement runs per element (a matmul's ``k`` times),
a hoisted or row statement per row.  A physical block holds ``vpack`` items; a core runs
``ceil(blocks / cores)`` blocks (all of them where the kernel does not fork).  Values are log2
of 1 + the count, except shares and counts of kernels.
"""

from __future__ import annotations

import math

from kernels import DeviceSpec, KernelPlan, cpu_simd
from kernels.lowering import Let, Loop, Store

EXP_OPS = frozenset({"exp", "sigmoid", "silu", "gelu", "tanh"})
DIV_OPS = frozenset({"div", "sqrt", "rsqrt"})
# per-core counts, in this order, then the shares and sizes of NEST_REST
WORK = ("matmul", "elementwise", "exp", "div", "load", "store", "row_statements", "rows",
        "loop_entries", "row_reductions", "global_read", "global_write", "tile_access",
        "half_elements", "matmul_tiled", "matmul_rows", "matmul_plain", "prefetched",
        "streamed")
STATEMENTS = ("matmul", "elementwise", "exp", "div", "load", "store", "row_statements",
              "row_reductions")  # what ``core_total`` adds up: the statements run
NEST_REST = ("core_total", "all_cores_total", "vector_share", "short_row_share",
             "serial_kernels", "forked_kernels", "max_k", "min_cols", "max_waves", "phases",
             "max_forloop", "max_items", "max_vpack", "max_split")
NEST_NAMES = tuple(f"core_{w}" for w in WORK) + NEST_REST
NEST_DIM = len(NEST_NAMES)
GPU_LANES = 32  # a warp: the GPU's unit of columns


def _log2(x: float) -> float:
    return math.log2(1.0 + max(0.0, float(x)))


def nest_features(plan: KernelPlan, spec: DeviceSpec) -> list[float]:
    """``NEST_NAMES``' values for ``plan`` lowered for ``spec`` (see the module docstring)."""
    lanes = cpu_simd(spec)[0] if spec.kind == "cpu" else GPU_LANES
    cores = max(spec.sm_count, 1)
    half = plan.dtype != "float32"  # program inputs and outputs stored in half: converted
    core = dict.fromkeys(WORK, 0.0)
    everything = padded = elements = short = 0.0
    serial = forked = phases = 0
    max_k = max_waves = max_forloop = max_items = max_vpack = max_split = 0
    min_cols = math.inf
    for k in plan.kernels:
        per = dict.fromkeys(WORK, 0.0)
        views = {v.name: v.buffer for v in k.views}
        global_views = {name for name, buf in views.items() if buf in set(k.params)}
        for phase in k.phases:
            for lp in phase.loops:
                times = k.forloop if lp.stage == "body" else 1
                cols = lp.cols
                if lp.chunked and k.mapping.split > 1:
                    cols = -(-cols // k.mapping.split)
                rows = lp.rows * times
                n = rows * cols
                elements += n
                padded += rows * -(-cols // lanes) * lanes
                short += n if cols < lanes else 0.0
                min_cols = min(min_cols, cols)
                per["rows"] += rows
                per["loop_entries"] += times
                per["row_reductions"] += n * len(lp.reductions)
                per["prefetched"] += n if lp.prefetch else 0.0
                per["streamed"] += n if lp.stream else 0.0
                for st in lp.col:
                    _statement(st, n, lp, global_views, half, per)
                for st in (*lp.hoisted, *lp.row):
                    per["row_statements"] += rows
                    _statement(st, rows, lp, global_views, half, per)
                max_k = max([max_k] + [int(st.attrs.get("k", 0)) for st in lp.col
                                       if isinstance(st, Let) and st.op == "matmul"])
        waves = -(-k.blocks // (cores if k.parallel else 1))
        for key, v in per.items():
            core[key] += v * k.mapping.vpack * waves
        everything += sum(per[w] for w in STATEMENTS) * k.items
        serial += not k.parallel
        forked += k.parallel
        phases += len(k.phases)
        max_waves, max_forloop = max(max_waves, waves), max(max_forloop, k.forloop)
        max_items, max_vpack = max(max_items, k.items), max(max_vpack, k.mapping.vpack)
        max_split = max(max_split, k.mapping.split)
    return [*(_log2(core[w]) for w in WORK), _log2(sum(core[w] for w in STATEMENTS)),
            _log2(everything),
            elements / padded if padded else 1.0, short / elements if elements else 0.0,
            float(serial), float(forked), _log2(max_k),
            _log2(min_cols if math.isfinite(min_cols) else 0), _log2(max_waves), float(phases),
            _log2(max_forloop), _log2(max_items), _log2(max_vpack), _log2(max_split)]


def _statement(st: Let | Store, n: float, lp: Loop, global_views: set[str], half: bool,
               per: dict[str, float]) -> None:
    """Count one statement run ``n`` times into ``per``."""
    if isinstance(st, Store):
        per["store"] += n
        if st.access.view in global_views:
            per["global_write"] += n
            per["half_elements"] += n * half
        else:
            per["tile_access"] += n
        return
    k = int(st.attrs.get("k", 1)) if st.op == "matmul" else 1
    for a in st.access:
        if a.view in global_views:
            per["global_read"] += n * k
            per["half_elements"] += n * k * half
        else:
            per["tile_access"] += n * k
    if st.op == "matmul":
        per["matmul"] += n * k
        how = "matmul_tiled" if lp.tile_rows else "matmul_rows" if lp.matmul_rows else \
            "matmul_plain"
        per[how] += n * k
    elif st.op == "load":
        per["load"] += n
    elif st.op in EXP_OPS:
        per["exp"] += n
    elif st.op in DIV_OPS:
        per["div"] += n
    else:
        per["elementwise"] += n
