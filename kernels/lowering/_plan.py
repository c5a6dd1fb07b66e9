"""Kernel plans: what lowering decides and rendering prints, as plain data.

A plan is the contract between ``lower`` (which knows µGraphs, AStitch and device limits) and
``render`` (which knows C syntax).  Keeping every decision here — the memory level of every
intermediate, the thread mapping, shared-memory offsets, which loops are fused — lets tests
assert on decisions without parsing generated code, and lets both dialects print the same plan.

Vocabulary.  A *virtual block* is one block of the µGraph's grid.  A *work item* is a virtual
block, or one chunk of it when task splitting cuts its rows across ``split`` physical blocks.
A *physical block* is what the device launches; with vertical packing it walks several work
items.  Inside a block, work is a sequence of *loops*; each loop walks one tile shape as rows
(all dims but the last) × columns (the last dim), rows strided over thread groups and columns
over the ``lanes`` threads of a group, so a plan is correct for any number of threads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Level(str, Enum):
    """AStitch's stitching schemes as storage: where an intermediate lives."""

    LOCAL = "local"  # a scalar in one fused loop (registers)
    REGIONAL = "regional"  # a tile in the block's shared memory
    GLOBAL = "global"  # device memory (kernel tensors, workspace scratch, split partials)


@dataclass
class Buffer:
    """A named array.  Global buffers are kernel tensors or workspace regions; regional ones
    live in a block's shared memory at ``offset`` bytes."""

    name: str
    shape: tuple[int, ...]
    level: Level
    role: str  # input | output | tensor | tile | accum | partial | scratch | splitk | splitk_count
    dtype: str = "float32"  # storage dtype; everything but program inputs/outputs is float32
    offset: int = 0  # regional: bytes into shared memory; workspace: floats into it
    per_item: int = 0  # workspace scratch: floats per work item (or per virtual block)
    per_vblock: bool = False  # workspace scratch indexed by virtual block, not work item
    io_index: int = -1  # input/output: position in the entry point's arrays
    chunk: int = 0  # split kernels: columns held per work item (0: whole rows)
    live: tuple[int, int] = (0, 0)  # regional: first and last loop (kernel-wide index)
    doc: str = ""
    # program inputs: "transposed" when memory holds the contiguous transpose of the last two
    # dims of ``shape`` (which stays the logical shape); read through ``strides``, no copy
    layout: str = "row"
    # split-K partials (role "splitk"): the register tile, or the accumulated output's view,
    # whose per-program partial sums this workspace slot (one per virtual block) gathers
    carries: str = ""

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The shape of the array in memory (what a caller passes for this buffer)."""
        if self.layout == "transposed":
            return (*self.shape[:-2], self.shape[-1], self.shape[-2])
        return self.shape

    @property
    def strides(self) -> tuple[int, ...]:
        """Elements between neighbours along each logical dim: row-major over
        ``stored_shape``, with the last two swapped back for a transposed input."""
        out, s = [], 1
        for d in reversed(self.stored_shape):
            out.append(s)
            s *= d
        st = tuple(reversed(out))
        if self.layout == "transposed":
            return (*st[:-2], st[-1], st[-2])
        return st

    @property
    def elems(self) -> int:
        n = 1
        for d in self.shape[:-1]:
            n *= d
        return n * (self.chunk or (self.shape[-1] if self.shape else 1))

    @property
    def nbytes(self) -> int:
        return 4 * self.elems


@dataclass(frozen=True)
class View:
    """A base pointer for one block: buffer + block/iteration offsets (in elements)."""

    name: str
    buffer: str
    block: tuple[int, int, int] = (0, 0, 0)  # elements per block coordinate b0, b1, b2
    iter: int = 0  # elements per for-loop iteration


@dataclass(frozen=True)
class Access:
    """How a loop reads or writes a view: strides per loop row dim, per column, per reduction
    index (0 means broadcast).  ``chunked``: the column index is relative to the work item's
    chunk.  ``col_index`` replaces the column index (split partials are stored at column j)."""

    view: str
    rows: tuple[int, ...]
    col: int
    red: int = 0
    chunked: bool = False
    col_index: str | None = None


@dataclass
class Let:
    """``var = op(args)``: one µGraph op (or part of one) computed as a float scalar."""

    var: str
    op: str  # load | matmul | reduce | combine | an elementwise op of the op table
    args: tuple[str, ...] = ()
    access: tuple[Access, ...] = ()
    # scalar, k (matmul depth), n (reduce extent); from _schedule: reciprocal (a div by a row
    # value), prefetch (floats ahead a register-tiled matmul fetches B)
    attrs: dict = field(default_factory=dict)
    comment: str = ""


@dataclass
class Store:
    """Write ``var`` through ``access``; ``accumulate`` adds to it after the first iteration."""

    var: str
    access: Access
    accumulate: bool = False
    guard: str | None = None  # extra condition, e.g. "j == 0"
    comment: str = ""
    scale: str = ""  # a running row max: the accumulator is rescaled as it moves (_softmax)


@dataclass
class RowReduce:
    """Sum the column values of ``src`` over the row into the row value ``dst``."""

    src: str
    dst: str
    comment: str = ""


@dataclass
class Loop:
    """One fused loop over a tile: per row, ``hoisted`` loads, the column body, row reductions,
    then per-row statements on the reduced values."""

    shape: tuple[int, ...]
    stage: str  # pre | body | post (body runs every for-loop iteration)
    lanes: int = 1
    chunked: bool = False  # split kernels: columns restricted to the work item's chunk
    hoisted: list[Let] = field(default_factory=list)
    col: list[Let | Store] = field(default_factory=list)
    reductions: list[RowReduce] = field(default_factory=list)
    row: list[Let | Store] = field(default_factory=list)
    comment: str = ""
    # how it runs (``_schedule``; the renderer reads these, the defaults are the plain loop)
    join: bool = False  # shares the previous loop's walk over the rows
    tile_rows: int = 0  # matmuls in register tiles of this many rows (0: none)
    matmul_rows: bool = False  # matmuls row by row (an axpy per k into a local row)
    prefetch: tuple[str, ...] = ()  # input views whose rows are prefetched ahead
    stream: bool = False  # output rows go through a row buffer and non-temporal stores
    tree_sum: bool = False  # row sums as a vector of lane partials combined by halves

    @property
    def rows(self) -> int:
        n = 1
        for d in self.shape[:-1]:
            n *= d
        return n

    @property
    def cols(self) -> int:
        return self.shape[-1]


@dataclass
class Phase:
    """Loops between two grid-wide synchronisations."""

    loops: list[Loop] = field(default_factory=list)


DOT_MIN = 16  # tl.dot needs every dimension of its operands to be at least this


def pad(n: int) -> int:
    """A tile dimension as the Triton dialect holds it: 1 stays 1 (a broadcast dim), anything
    else the power of two at or above it and at least ``DOT_MIN``, so every tile can feed
    ``tl.dot``."""
    return 1 if n == 1 else max(DOT_MIN, 1 << (n - 1).bit_length())


@dataclass
class Mapping:
    """The thread mapping of one kernel (AStitch's adaptive thread mapping)."""

    scheme: str  # horizontal | row | split | tile | vertical+... (documentation only)
    threads: int  # threads per physical block
    lanes: int  # threads per row
    split: int = 1  # physical blocks per virtual block (task splitting)
    vpack: int = 1  # work items per physical block (vertical packing)
    reason: str = ""


@dataclass
class Kernel:
    """One launch (or, with a grid barrier, one launch holding several phases)."""

    name: str
    comment: str
    grid: tuple[int, int, int]  # the µGraph's grid of virtual blocks
    forloop: int
    mapping: Mapping
    phases: list[Phase]
    views: list[View]
    buffers: dict[str, Buffer]  # regional tiles and workspace scratch owned by this kernel
    params: list[str]  # global input/output buffers it takes, in order
    barrier: str = "none"  # none | grid (phases joined by a grid barrier)
    barrier_index: int = -1  # which counter of the plan's barrier array it uses
    smem_bytes: int = 0
    notes: list[str] = field(default_factory=list)
    parallel: bool = True  # worth forking threads for (cpu; ``_schedule``)
    # split-K (the Triton dialect only): programs per virtual block, each running 1/splitk of
    # the for-loop and adding its accumulators into the workspace (``splitk`` buffers); the
    # part after the loop then runs once per virtual block, in a second launch (an epilogue
    # program) or, with ``splitk_launches`` 1, in whichever program adds its sums last (a
    # ``splitk_count`` counter per virtual block tells it)
    splitk: int = 1
    splitk_launches: int = 2

    @property
    def programs(self) -> list[str]:
        """The names of the device programs this kernel launches, in order."""
        if self.splitk > 1 and self.splitk_launches == 2:
            return [f"{self.name}_partial", f"{self.name}_epilogue"]
        return [self.name]

    @property
    def vblocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def items(self) -> int:
        return self.vblocks * self.mapping.split

    @property
    def blocks(self) -> int:
        return -(-self.items // self.mapping.vpack)

    def levels(self) -> dict[str, Level]:
        return {n: b.level for n, b in self.buffers.items()}


@dataclass
class KernelPlan:
    """Everything needed to print, compile and launch a program's kernels, in order."""

    name: str
    device: str  # spec name
    device_kind: str  # cpu | cuda
    dtype: str  # program dtype: inputs and outputs are stored in it (computed in float32)
    kernels: list[Kernel]
    globals: dict[str, Buffer]  # inputs, outputs, kernel-graph intermediates
    workspace_floats: int = 0
    barriers: int = 0  # number of grid-barrier counters (zero-initialised unsigned ints)
    config: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    dialect: str | None = None  # the renderer's dialect when the config chose one (triton)

    @property
    def inputs(self) -> list[Buffer]:
        return sorted((b for b in self.globals.values() if b.role == "input"),
                      key=lambda b: b.io_index)

    @property
    def outputs(self) -> list[Buffer]:
        return sorted((b for b in self.globals.values() if b.role == "output"),
                      key=lambda b: b.io_index)

    def summary(self) -> str:
        """One line per kernel and per non-local buffer: what a reviewer wants to see first."""
        lines = [f"plan {self.name} for {self.device} ({self.device_kind}), "
                 f"workspace {self.workspace_floats} floats, {len(self.kernels)} kernel(s)"]
        for k in self.kernels:
            m = k.mapping
            lines.append(f"  {k.name}: grid {k.grid} F={k.forloop} -> {k.blocks} blocks x "
                         f"{m.threads} threads ({m.scheme}: lanes {m.lanes}, split {m.split}, "
                         f"vpack {m.vpack}), {len(k.phases)} phase(s), barrier {k.barrier}, "
                         f"smem {k.smem_bytes} B"
                         + (f", split-K {k.splitk}" if k.splitk > 1 else ""))
            for b in k.buffers.values():
                where = f"@{b.offset}" if b.level is Level.REGIONAL else f"ws+{b.offset}"
                lines.append(f"    {b.name} {b.shape} {b.role} {b.level.value} {where} {b.doc}")
            lines += [f"    note: {n}" for n in k.notes]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)
