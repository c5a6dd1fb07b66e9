"""AStitch's adaptive thread mapping, and the default config it gives a structure.

The rule of thumb (AStitch, ASPLOS'22): a row-reduction kernel whose rows are fewer than the
blocks one wave can hold and whose rows are long (> 1024) gets *task splitting* (each row cut
across several blocks, partial sums combined in global memory); otherwise rows are *packed*:
many short rows share a block (*horizontal packing*, a group of ``lanes`` threads per row), a
long row fills a block on its own.  *Vertical packing* (a block walks several work items) keeps
the blocks within one wave when a grid barrier needs every block resident.  The same rule
gives the default config of a structure, which the tuner also uses as its prior.

Device limits come from ``kernels.devices`` only.  On a CPU a "block" runs on one thread, a
wave is one block per core, and the rule packs rows so a block's tile stays cache-sized.
"""

from __future__ import annotations

import math
from collections.abc import Mapping as MappingT
from dataclasses import dataclass
from itertools import product

from kernels.hardware import DeviceSpec
from search.ir import (
    DTYPE_BYTES,
    ELEMENTWISE_OPS,
    ROW_REDUCTIONS,
    BlockGraph,
    KernelGraph,
    ShapeError,
)

from ._plan import pad

# Config keys that are not structure symbols.  smem_kb: the shared-memory budget of a block in
# KiB (0: every Regional tile Global), the tuner's choice of memory level; default the device's.
# triton: 1 prints the plan in the Triton dialect (GPU only), stages its software-pipelining
# depth (Triton's num_stages), splitk the programs per virtual block that share its for-loop
# (split-K, Triton only: ``_splitk.split_k``), splitk_launches 1 or 2 how its part after the
# loop runs (by the last program of each virtual block, or in a second launch; absent: 2, the
# form configs stored before the knob existed were measured with).
KNOBS = ("block", "lanes", "split", "vpack", "smem_kb", "tile_rows", "stream", "triton",
         "stages", "splitk", "splitk_launches")
ZERO_OK = ("smem_kb", "tile_rows", "stream", "triton")  # knobs for which 0 means "none" / "off"
SWITCHES = ("stream", "triton")  # knobs that are 0 or 1
LONG_ROW = 1024  # AStitch: rows longer than this are worth splitting across blocks
ELEMS_PER_THREAD = 4  # a thread handles about this many elements of a long row
CPU_TILE_ELEMS = 8192  # CPU: elements per block tile (32 KiB of floats: L1/L2 resident)
# ops a row-reduction kernel is made of (no matmul): the rule applies to its block graphs
ROW_OPS = frozenset({"input", "output", "accum"}) | ELEMENTWISE_OPS | ROW_REDUCTIONS


@dataclass(frozen=True)
class RowRule:
    """What the rule decides for ``rows`` rows of ``row_len`` elements."""

    scheme: str  # horizontal | row | split
    rows_per_block: int
    threads: int
    lanes: int
    split: int
    reason: str


def pow2ceil(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def largest_divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of ``n`` that is ≤ ``cap`` (at least 1): grids must divide exactly."""
    for d in range(max(1, min(n, cap)), 0, -1):
        if n % d == 0:
            return d
    return 1


def blocks_per_wave(spec: DeviceSpec, threads: int) -> int:
    """Blocks that can be resident at once: the bound for a grid barrier to be safe."""
    if spec.kind == "cpu":
        return spec.sm_count
    per_sm = min(spec.max_blocks_per_sm, spec.max_threads_per_sm // max(1, threads))
    return spec.sm_count * max(1, per_sm)


def astitch_rule(rows: int, row_len: int, spec: DeviceSpec) -> RowRule:
    """Split when rows < blocks per wave and rows are longer than 1024, else pack."""
    if rows < 1 or row_len < 1:
        raise ValueError(f"astitch_rule: rows ({rows}) and row_len ({row_len}) must be ≥ 1")
    gpu = spec.kind != "cpu"
    big = min(spec.max_threads_per_block, 1024) if gpu else 1
    wave = blocks_per_wave(spec, big)
    if rows < wave and row_len > LONG_ROW:
        cap = wave // rows if gpu else -(-wave // rows)
        split = largest_divisor_at_most(row_len, cap)
        if split >= 2:
            return RowRule("split", 1, big, big, split,
                           f"{rows} rows < {wave} blocks per wave and rows of {row_len} > "
                           f"{LONG_ROW}: each row split across {split} blocks")
    if not gpu:
        rpb = max(1, CPU_TILE_ELEMS // row_len)
        rpb = min(rpb, max(1, rows // (4 * spec.sm_count)))  # keep every core busy
        rpb = largest_divisor_at_most(rows, rpb)
        return RowRule("horizontal" if rpb > 1 else "row", rpb, 1, 1, 1,
                       f"cpu: {rpb} row(s) of {row_len} per block (cache-sized tile)")
    lanes = min(max(32, pow2ceil(-(-row_len // ELEMS_PER_THREAD))), big)
    if lanes < 256:
        rpb_max = big // lanes
        wave_packed = blocks_per_wave(spec, big)
        rpb = min(rpb_max, max(1, rows // wave_packed))
        rpb = largest_divisor_at_most(rows, rpb)
        threads = min(big, -(-rpb * lanes // 32) * 32)
        scheme = "horizontal" if rpb > 1 else "row"
        reason = (f"rows of {row_len}: {lanes} threads per row, {rpb} rows packed per "
                  f"{threads}-thread block")
        return RowRule(scheme, rpb, threads, lanes, 1, reason)
    return RowRule("row", 1, lanes, lanes, 1,
                   f"rows of {row_len}: one row per block of {lanes} threads")


# ---------------------------------------------------------------- structures


def is_row_form(bg: BlockGraph) -> bool:
    """Elementwise ops and reductions over the last dim only, no for-loop: rows are
    independent, so rows may be packed into blocks or split across them."""
    if bg.forloop_range != 1:
        return False
    for op in bg.ops:
        if op.kind not in ROW_OPS:
            return False
        if op.kind in ("sum", "mean") and op.attrs["dim"] != len(bg.tensors[op.inputs[0]].shape) - 1:
            return False
    return True


def divisibility_constraints(graph: KernelGraph) -> list[tuple[int, tuple[str, ...]]]:
    """(size, symbols): the product of the symbols' values must divide size."""
    out = []
    for bg in graph.block_graphs():
        for op in bg.ops_of("input"):
            shape, _ = bg.input_specs[op.attrs["index"]]
            for d, size in enumerate(shape):
                parts = [bg.grid[g] for g, m in enumerate(op.attrs["imap"]) if m == d]
                if op.attrs["fmap"] == d:
                    parts.append(bg.forloop_range)
                fixed = math.prod(p for p in parts if isinstance(p, int))
                syms = tuple(p for p in parts if isinstance(p, str))
                if syms and isinstance(size, int) and size % fixed == 0:
                    out.append((size // fixed, syms))
    return out


def divisors(n: int, keep: int = 40, include: tuple[int, ...] = ()) -> list[int]:
    """Divisors of ``n``; when there are many, a log-spaced subset plus ``include``."""
    divs = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    divs = sorted(set(divs + [n // d for d in divs]))
    if len(divs) > keep:
        step = (len(divs) - 1) / (keep - 1)
        divs = sorted({divs[round(i * step)] for i in range(keep)} |
                      {d for d in include if n % d == 0})
    return divs


def _candidates(graph: KernelGraph, include: MappingT[str, int] | None = None
                ) -> list[dict[str, int]]:
    """Bindings of the structure's symbols that divide every dim they split."""
    cons = divisibility_constraints(graph)
    symbols = sorted(graph.symbols())
    values = {}
    for s in symbols:
        g = 0
        for size, syms in cons:
            if s in syms:
                g = math.gcd(g, size)
        extra = (include[s],) if include and s in include else ()
        values[s] = divisors(g or 1, include=extra)
    found = []
    for combo in product(*(values[s] for s in symbols)):
        binding = dict(zip(symbols, combo, strict=True))
        if all(size % math.prod(binding[s] for s in syms) == 0 for size, syms in cons):
            found.append(binding)
    return found


def _grid_blocks(bg: BlockGraph, binding: MappingT[str, int]) -> int:
    return math.prod(binding.get(g, g) if isinstance(g, str) else g for g in bg.grid)


def default_config(graph: KernelGraph, spec: DeviceSpec) -> dict[str, int]:
    """Bind a structure's symbols (and set the mapping knobs) by the AStitch rule.

    Row-form kernels get the rows per block, threads, lanes and split the rule chooses.  Other
    kernels (matmuls, attention) get about one wave of blocks and a for-loop step of ~64 along
    the dim the loop walks: enough work per block to hide latency, tiles that fit.
    """
    symbols = sorted(graph.symbols())
    bgs = graph.block_graphs()
    config: dict[str, int] = {}
    if bgs and all(is_row_form(bg) for bg in bgs):
        bg = bgs[0]
        out_shape = graph.tensors[graph.ops_of("graph_kernel")[0].outputs[0]].shape
        rows, row_len = math.prod(out_shape[:-1]), out_shape[-1]
        rule = astitch_rule(rows, row_len, spec)
        want = rows // rule.rows_per_block
        grid_syms = [g for g in bg.grid if isinstance(g, str)]
        hint = {grid_syms[0]: want} if len(grid_syms) == 1 else None
        candidates = _candidates(graph, hint) if symbols else [{}]

        def score(b: MappingT[str, int]) -> tuple:
            n = _grid_blocks(bg, b)
            return (n < want, abs(math.log2(n / want)))

        config.update(min(candidates, key=score))
        config.update(block=rule.threads, lanes=rule.lanes, split=rule.split)
        return config
    candidates = _candidates(graph) if symbols else [{}]
    if not candidates:
        raise ShapeError(f"default_config: no binding of {symbols} divides the input shapes")
    wave = blocks_per_wave(spec, 128) if spec.kind != "cpu" else 4 * spec.sm_count
    cons = divisibility_constraints(graph)

    def score_general(b: MappingT[str, int]) -> tuple:
        blocks = max(_grid_blocks(bg, b) for bg in bgs) if bgs else 1
        steps = [size // math.prod(b[s] for s in syms) for size, syms in cons
                 if any(s == bg.forloop_range for bg in bgs for s in syms)]
        step = min(steps) if steps else 64
        return (abs(math.log2(blocks / wave)), abs(math.log2(max(1, step) / 64)),
                -_inner_rows(bgs, b))

    config.update(min(candidates, key=score_general))
    config["block"] = 1 if spec.kind == "cpu" else 128
    return config


def triton_smem_bytes(bg: BlockGraph, dtype: str, stages: int) -> int:
    """About what Triton keeps in shared memory for one bound graph-defined kernel: its input
    tiles (padded as the Triton dialect holds them, in the stored dtype), those its for-loop
    walks once per buffered stage (``stages - 1``), the others once.  Measured on an H100:
    a 16x512 @ 512x512 float16 step asked for 1,081,472 bytes (twice the two tiles) and
    gated_mlp's loop-free 4096x32 weight tiles 262,144; both failed to compile."""
    walked = whole = 0
    for op in bg.ops_of("input"):
        shape = bg.tensors[op.outputs[0]].shape
        rows = math.prod(int(d) for d in shape[:-1]) if len(shape) > 1 else 1
        tile = pad(rows) * pad(int(shape[-1]) if shape else 1)
        if op.attrs.get("fmap", -1) >= 0 and int(bg.forloop_range) > 1:
            walked += tile
        else:
            whole += tile
    return (walked * max(1, stages - 1) + whole) * DTYPE_BYTES.get(dtype, 4)


# The most values of one computed tile a thread may hold in the Triton dialect.  In the H100
# sweeps of 2026-11-22..27 every Triton config that ran right held at most 32, and every one
# above 64 failed (4 of 4): gqa's searched structure at its default held a 256 x 4096 float32
# accumulator over 128 threads (8192 each) and did not finish compiling in 60 s; 512 and two
# of 128 failed to compile (Triton 3.6 asked for 262-320 KB of shared memory to convert their
# layouts, which triton_smem_bytes does not count).
TRITON_TILE_VALUES_PER_THREAD = 64


def triton_tile_values(bg: BlockGraph) -> int:
    """The most values of one computed tile of a bound graph-defined kernel (rows and columns
    padded to powers of two, as the Triton dialect holds them): a loop's tile lives in the
    program's registers.  Input tiles are left out: a matmul's operands are staged through
    shared memory (``triton_smem_bytes``), and an input read elementwise has a computed tile
    of its shape."""
    loaded = {op.outputs[0] for op in bg.ops_of("input")}
    most = 1
    for tid, t in enumerate(bg.tensors):
        if tid not in loaded:
            shape = [int(d) for d in t.shape] or [1]
            most = max(most, pad(math.prod(shape[:-1])) * pad(shape[-1]))
    return most


def triton_default_config(graph: KernelGraph, spec: DeviceSpec) -> dict[str, int]:
    """The default for the Triton dialect: whole rows per program (no task splitting), and
    for matmul kernels tiles that fit shared memory, output tiles whose dims are powers of two
    of 16 or more (tl.dot's tiles) and at least 64 columns wide (128-byte weight rows: on an
    H100 rmsnorm_matmul's 96 tiles of 64 beat its 384 of 16, which fill the SMs, 1.7-1.9x),
    then the grid that keeps the most of the SMs' waves busy, and a for-loop step of ~64;
    128 threads, more where a tile would hold over TRITON_TILE_VALUES_PER_THREAD a thread."""
    bgs = graph.block_graphs()
    if not graph.symbols() or (bgs and all(is_row_form(bg) for bg in bgs)):
        config = default_config(graph, spec) if graph.symbols() else {}
        return {**config, "split": 1, "triton": 1, "stages": 3}
    candidates = _candidates(graph, None)
    if not candidates:
        raise ShapeError(f"triton_default_config: no binding of {sorted(graph.symbols())} "
                         "divides the input shapes")
    cons = divisibility_constraints(graph)
    grid_syms = {g for bg in bgs for g in bg.grid if isinstance(g, str)}

    def tiles(b: MappingT[str, int]) -> list[int]:
        out = []
        for bg in bgs:
            bound = bg.bind({k: v for k, v in b.items() if k in bg.symbols()})
            for op in bound.ops_of("output"):
                out += [int(d) for d in bound.tensors[op.inputs[0]].shape[-2:]]
        return out

    def tiles_ok(b: MappingT[str, int]) -> bool:
        """Every output tile dim a power of two >= 16, or the whole dim (a decode's rows)."""
        whole = tiles({s: (v if s not in grid_syms else 1) for s, v in b.items()})
        return all(d == w or (d >= 16 and not d & (d - 1))
                   for d, w in zip(tiles(b), whole, strict=True))

    dtype = graph.tensors[graph.input_ids[0]].dtype if graph.input_ids else "float32"

    def values(b: MappingT[str, int]) -> int:
        return max((triton_tile_values(bg.bind({k: v for k, v in b.items()
                                                 if k in bg.symbols()})) for bg in bgs),
                   default=1)

    def threads(b: MappingT[str, int]) -> int:
        """128, or as many more (up to 1024) as keep TRITON_TILE_VALUES_PER_THREAD a thread."""
        need = -(-values(b) // TRITON_TILE_VALUES_PER_THREAD)
        return min(1024, max(128, 1 << max(0, need - 1).bit_length()))

    def fits(b: MappingT[str, int]) -> bool:
        """The tiles fit a block's shared memory at the default 3 stages and its threads'
        registers."""
        return values(b) <= TRITON_TILE_VALUES_PER_THREAD * threads(b) and all(
            triton_smem_bytes(bg.bind({k: v for k, v in b.items() if k in bg.symbols()}),
                              dtype, 3) <= spec.smem_per_block_optin for bg in bgs)

    def wide(b: MappingT[str, int]) -> bool:
        """Output tiles of >= 64 columns (or the whole row): each weight row read is 128
        bytes of float16.  On an H100 rmsnorm_matmul's 96 tiles of 64 columns ran in 0.063 ms,
        its 384 tiles of 16 columns (which fill the SMs) in 0.108-0.121 ms."""
        whole = tiles({s: (v if s not in grid_syms else 1) for s, v in b.items()})[1::2]
        return all(d >= min(64, w) for d, w in zip(tiles(b)[1::2], whole, strict=True))

    def score(b: MappingT[str, int]) -> tuple:
        blocks = max(_grid_blocks(bg, b) for bg in bgs)
        fill = blocks / (-(-blocks // spec.sm_count) * spec.sm_count)
        steps = [size // math.prod(b[s] for s in syms) for size, syms in cons
                 if any(s == bg.forloop_range for bg in bgs for s in syms)]
        step = min(steps) if steps else 64
        return (not fits(b), not tiles_ok(b), not wide(b), -round(fill, 2),
                abs(math.log2(max(1, step) / 64)), -_inner_rows(bgs, b))

    best = min(candidates, key=score)
    return {**best, "block": threads(best), "triton": 1, "stages": 3}


def _inner_rows(bgs: list[BlockGraph], binding: MappingT[str, int]) -> int:
    """Rows of the innermost row dim of the output tiles (the fewest over the kernels): on a
    tie, split outer (batch) dims over the grid first, so a block's rows share one matmul
    operand tile and register tiles of several rows form."""
    rows = []
    for bg in bgs:
        bound = bg.bind({k: v for k, v in binding.items() if k in bg.symbols()})
        for op in bound.ops_of("output"):
            shape = bound.tensors[op.inputs[0]].shape
            rows.append(int(shape[-2]) if len(shape) > 1 else 1)
    return min(rows, default=0)


def split_config(config: MappingT[str, int] | None) -> tuple[dict[str, int], dict[str, int]]:
    """(symbol bindings, mapping knobs) of a config dict."""
    config = dict(config or {})
    knobs = {k: int(config.pop(k)) for k in KNOBS if k in config}
    for k, v in knobs.items():
        if k in SWITCHES and v not in (0, 1):
            raise ValueError(f"config: {k}={v} must be 0 (off) or 1 (on)")
        if k == "splitk_launches" and v not in (1, 2):
            raise ValueError(f"config: splitk_launches={v} must be 1 (the last program of a "
                             "virtual block finishes it) or 2 (an epilogue launch does)")
        if v < (0 if k in ZERO_OK else 1):
            raise ValueError(f"config: {k}={v} must be a positive integer"
                             f"{' or 0' if k in ZERO_OK else ''}")
    return config, knobs
