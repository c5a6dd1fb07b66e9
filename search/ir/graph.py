"""The µGraph IR: kernel graphs and block graphs, built op by op with shapes checked at once.

Both levels are lists of ops over numbered tensors.  A graph is also its own builder (in the
spirit of Mirage's Python API): ``g.matmul(a, b)`` appends an op and returns the new tensor,
so a shape error surfaces at the line that caused it.  Only ops, their inputs and their
attributes are facts; shapes are derived, which is what lets one structure be re-instantiated
at other shapes or bound to another config.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .core import Graph, Tensor, TensorInfo
from .dims import Dim, ShapeError, Size, bind_dim, bind_size, divide, fmt_shape, multiply
from .ops import BLOCK, DTYPES, GRID_DIMS, KERNEL, LAYOUTS, MAX_RANK
from .printing import format_graph


def _check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ShapeError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return dtype


class KernelGraph(Graph):
    """Tensors in device memory; ops are predefined kernels or graph-defined kernels."""

    level = KERNEL

    def new_input(self, shape: Sequence[int], dtype: str = "float16",
                  name: str | None = None, layout: str = "row") -> Tensor:
        """A program input of logical ``shape``; ``layout="transposed"``: its memory holds
        the contiguous transpose of the last two dims (``ops.LAYOUTS``)."""
        return self._append("input", (), {"shape": tuple(shape), "dtype": dtype,
                                          "layout": layout}, name)[0]

    def input_layout(self, tid: int) -> str:
        """The layout of kernel input tensor ``tid`` ("row" for any other tensor)."""
        for op in self.ops_of("input"):
            if op.outputs[0] == tid:
                return op.attrs.get("layout", "row")
        return "row"

    def mark_output(self, tensor: Tensor) -> None:
        if tensor.graph is not self:
            raise ShapeError(f"mark_output: {tensor} belongs to another graph")
        self._append("output", (tensor.id,), {})

    def graph_kernel(self, block_graph: BlockGraph) -> list[Tensor]:
        """Add a graph-defined kernel running ``block_graph``; returns its output tensors."""
        for t in block_graph.sources:
            if t.graph is not self:
                raise ShapeError(f"graph_kernel: block input {t} belongs to another graph")
        return self._append("graph_kernel", [t.id for t in block_graph.sources],
                            {"block_graph": block_graph})

    customized = graph_kernel  # Mirage's name for the same thing

    def _infer(self, kind: str, inputs: Sequence[int], attrs: dict) -> list[TensorInfo]:
        if kind == "input":
            shape = attrs["shape"]
            if not 1 <= len(shape) <= MAX_RANK or not all(
                    isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
                raise ShapeError(f"input: shape must be 1 to {MAX_RANK} positive integers, "
                                 f"got {shape!r}")
            attrs["shape"] = tuple(shape)
            layout = attrs.pop("layout", "row")
            if layout not in LAYOUTS:
                raise ShapeError(f"input: layout {layout!r} is not one of {', '.join(LAYOUTS)}")
            if layout != "row":
                if len(shape) < 2:
                    raise ShapeError(f"input: a {layout} input has at least 2 dims, got "
                                     f"{fmt_shape(tuple(shape))}")
                attrs["layout"] = layout  # "row" is not stored: graphs hash as before
            return [TensorInfo(tuple(shape), _check_dtype(attrs["dtype"]))]
        if kind == "output":
            return []
        if kind == "graph_kernel":
            bg: BlockGraph = attrs["block_graph"]
            specs = [(self.tensors[i].shape, self.tensors[i].dtype) for i in inputs]
            return [TensorInfo(s, d) for s, d in bg.output_specs(specs)]
        return super()._infer(kind, inputs, attrs)

    # --- derived views -------------------------------------------------------------------
    def block_graphs(self) -> list[BlockGraph]:
        return [op.attrs["block_graph"] for op in self.ops_of("graph_kernel")]

    def symbols(self) -> set[str]:
        return {s for bg in self.block_graphs() for s in bg.symbols()}

    def input_shapes(self) -> list[tuple[int, ...]]:
        return [self.tensors[t].shape for t in self.input_ids]  # type: ignore[misc]

    def replay(self, input_shapes: Sequence[Sequence[int]] | None = None,
               config: Mapping[str, int] | None = None) -> KernelGraph:
        """A copy with other input shapes and/or symbols bound; every shape rule re-checked."""
        shapes = list(input_shapes) if input_shapes is not None else None
        if shapes is not None and len(shapes) != len(self.input_ids):
            raise ShapeError(f"expected {len(self.input_ids)} input shapes, got {len(shapes)}")
        new = KernelGraph()
        k = 0
        for op in self.ops:
            attrs = dict(op.attrs)
            if op.kind == "input" and shapes is not None:
                attrs["shape"] = tuple(shapes[k])
                k += 1
            if op.kind == "graph_kernel":
                specs = [(new.tensors[i].shape, new.tensors[i].dtype) for i in op.inputs]
                attrs["block_graph"] = attrs["block_graph"].replay(specs, config)
            name = self.tensors[op.outputs[0]].name if op.outputs else None
            new._append(op.kind, op.inputs, attrs, name)
        return new

    def bind(self, config: Mapping[str, int]) -> KernelGraph:
        """Bind grid / for-loop symbols; raises when a tile size is not a whole number."""
        return self.replay(config=config)

    def is_concrete(self) -> bool:
        return not self.symbols()

    def __repr__(self) -> str:
        return format_graph(self)


class BlockGraph(Graph):
    """The body of a graph-defined kernel: what one thread block computes.

    ``grid`` (≤ 3 dims) and ``forloop_range`` may be symbols.  Inputs read a tile of a kernel
    tensor: ``imap[g]`` names the tensor dim that grid dim ``g`` splits (-1 replicates) and
    ``fmap`` the dim the for-loop walks (-1: the same tile every iteration).  Ops on body
    tiles run every iteration; ``accum`` folds them over the loop; ops on accumulated tiles
    run once after it (the epilogue) and may also read loop-invariant tiles; outputs take
    epilogue tiles and ``omap`` places them.
    """

    level = BLOCK

    def __init__(self, grid: Sequence[Size], forloop_range: Size = 1,
                 block: Sequence[Size] = (128,),
                 input_specs: Sequence[tuple[tuple[Dim, ...], str]] = ()) -> None:
        super().__init__()
        if not 1 <= len(grid) <= GRID_DIMS:
            raise ShapeError(f"grid has 1 to {GRID_DIMS} dims, got {tuple(grid)}")
        self.grid: tuple[Size, ...] = tuple(grid) + (1,) * (GRID_DIMS - len(grid))
        self.forloop_range: Size = forloop_range
        self.block: tuple[Size, ...] = tuple(block) + (1,) * (GRID_DIMS - len(block))
        for s in (*self.grid, self.forloop_range, *self.block):
            if not (isinstance(s, str) and s.isidentifier()) and not (
                    isinstance(s, int) and not isinstance(s, bool) and s >= 1):
                raise ShapeError(f"grid, forloop_range and block sizes must be positive "
                                 f"integers or symbol names, got {s!r}")
        self.input_specs: list[tuple[tuple[Dim, ...], str]] = [
            (tuple(s), d) for s, d in input_specs]
        self.sources: list[Tensor] = []  # kernel tensors, when built with the builder

    # --- building ------------------------------------------------------------------------
    def new_input(self, tensor: Tensor, imap: Sequence[int] = (-1, -1, -1),
                  fmap: int = -1) -> Tensor:
        """Read a tile of kernel tensor ``tensor`` (Mirage's ``new_input``)."""
        self.sources.append(tensor)
        self.input_specs.append((tensor.shape, tensor.dtype))
        return self.input(len(self.input_specs) - 1, imap, fmap)

    def input(self, index: int, imap: Sequence[int] = (-1, -1, -1), fmap: int = -1) -> Tensor:
        imap = tuple(imap) + (-1,) * (GRID_DIMS - len(imap))
        return self._append("input", (), {"index": index, "imap": imap, "fmap": fmap})[0]

    def new_output(self, tensor: Tensor, omap: Sequence[int] = (-1, -1, -1)) -> None:
        omap = tuple(omap) + (-1,) * (GRID_DIMS - len(omap))
        self._append("output", (tensor.id,), {"omap": omap})

    def forloop_accum(self, tensor: Tensor, kind: str = "no_red") -> Tensor:
        return self.apply("accum", tensor, kind=kind)

    # --- shape rules specific to the block level ------------------------------------------
    def _stage(self, kind: str, ins: Sequence[TensorInfo]) -> str:
        """body: varies per iteration; invariant: same every iteration; epilogue: after."""
        stages = {t.stage for t in ins}
        if kind == "accum":
            if "epilogue" in stages:
                raise ShapeError("accum: its operand must be a per-iteration tile, "
                                 "not an already accumulated one")
            return "epilogue"
        if {"body", "epilogue"} <= stages:
            raise ShapeError(f"{kind}: mixes per-iteration tiles with accumulated ones; "
                             "pass the per-iteration tile through accum first")
        for stage in ("epilogue", "body"):
            if stage in stages:
                return stage
        return "invariant"

    def _infer(self, kind: str, inputs: Sequence[int], attrs: dict) -> list[TensorInfo]:
        if kind == "input":
            return [self._input_tile(attrs)]
        if kind == "output":
            tile = self.tensors[inputs[0]]
            if tile.stage != "epilogue":
                raise ShapeError("output: a block output must pass through a for-loop "
                                 "accumulator (accum) first")
            self._place(tile.shape, attrs)
            return []
        return super()._infer(kind, inputs, attrs)

    def _input_tile(self, attrs: dict) -> TensorInfo:
        index, imap, fmap = attrs["index"], tuple(attrs["imap"]), attrs["fmap"]
        attrs["imap"] = imap
        if not 0 <= index < len(self.input_specs):
            raise ShapeError(f"input: index {index} but the kernel passes "
                             f"{len(self.input_specs)} tensor(s)")
        shape, dtype = self.input_specs[index]
        rank = len(shape)
        where = f"input {index} {fmt_shape(shape)}"
        if len(imap) != GRID_DIMS or any(not -1 <= m < rank for m in imap):
            raise ShapeError(f"{where}: imap {imap} must give, per grid dim, a tensor dim "
                             f"in 0..{rank - 1} or -1")
        mapped = [m for m in imap if m >= 0]
        if len(mapped) != len(set(mapped)):
            raise ShapeError(f"{where}: imap {imap} splits one tensor dim by two grid dims")
        if not -1 <= fmap < rank:
            raise ShapeError(f"{where}: fmap {fmap} must be a tensor dim in 0..{rank - 1} or -1")
        tile = list(shape)
        try:
            for g, m in enumerate(imap):
                if m >= 0:
                    tile[m] = divide(tile[m], self.grid[g])
            if fmap >= 0:
                tile[fmap] = divide(tile[fmap], self.forloop_range)
        except ShapeError as err:
            raise ShapeError(f"{where}: {err} (imap {imap}, fmap {fmap}, grid {self.grid}, "
                             f"forloop_range {self.forloop_range})") from None
        return TensorInfo(tuple(tile), dtype, stage="body" if fmap >= 0 else "invariant")

    def _place(self, tile: tuple[Dim, ...], attrs: dict) -> tuple[Dim, ...]:
        """The kernel-level shape of an output tile laid out over the grid by ``omap``."""
        omap = tuple(attrs["omap"])
        attrs["omap"] = omap
        rank = len(tile)
        if len(omap) != GRID_DIMS or any(not -1 <= m < rank for m in omap):
            raise ShapeError(f"output: omap {omap} must give, per grid dim, a tensor dim in "
                             f"0..{rank - 1} or -1")
        mapped = [m for m in omap if m >= 0]
        if len(mapped) != len(set(mapped)):
            raise ShapeError(f"output: omap {omap} places two grid dims on one tensor dim")
        shape = list(tile)
        for g, m in enumerate(omap):
            if m >= 0:
                shape[m] = multiply(shape[m], self.grid[g])
            elif self.grid[g] != 1:
                raise ShapeError(f"output: grid dim {g} (size {self.grid[g]}) is not placed by "
                                 f"omap {omap}; blocks along it would overwrite each other")
        return tuple(shape)

    # --- derived views -------------------------------------------------------------------
    def output_specs(self, input_specs: Sequence[tuple[tuple[Dim, ...], str]]
                     ) -> list[tuple[tuple[Dim, ...], str]]:
        """Kernel-level (shape, dtype) of each output, given the kernel tensors passed in."""
        if [(tuple(s), d) for s, d in input_specs] != self.input_specs:
            raise ShapeError(
                "graph_kernel: the block graph was built for inputs "
                f"{[fmt_shape(s) for s, _ in self.input_specs]} but receives "
                f"{[fmt_shape(s) for s, _ in input_specs]}")
        return [(self._place(self.tensors[op.inputs[0]].shape, dict(op.attrs)),
                 self.tensors[op.inputs[0]].dtype) for op in self.ops_of("output")]

    def symbols(self) -> set[str]:
        return {s for s in (*self.grid, self.forloop_range, *self.block) if isinstance(s, str)}

    def replay(self, input_specs: Sequence[tuple[tuple[Dim, ...], str]],
               config: Mapping[str, int] | None = None) -> BlockGraph:
        """A copy over other kernel inputs and/or with symbols bound; every rule re-checked."""
        def sz(s: Size) -> Size:
            return bind_size(s, config) if config is not None and isinstance(s, str) \
                and s in config else s

        new = BlockGraph(tuple(sz(s) for s in self.grid), sz(self.forloop_range),
                         tuple(sz(s) for s in self.block), input_specs)
        for op in self.ops:
            new._append(op.kind, op.inputs, dict(op.attrs))
        return new

    def bind(self, config: Mapping[str, int]) -> BlockGraph:
        specs = [(tuple(bind_dim(d, config) for d in s), dt) for s, dt in self.input_specs]
        return self.replay(specs, config)

    def concrete_grid(self) -> tuple[int, int, int]:
        if self.symbols():
            raise ShapeError(f"block graph still has unbound symbols {sorted(self.symbols())}")
        return tuple(self.grid)  # type: ignore[return-value]


def new_kernel_graph() -> KernelGraph:
    """Start a program (Mirage's ``mi.new_kernel_graph()``)."""
    return KernelGraph()


def new_block_graph(grid: Sequence[Size], forloop_range: Size = 1,
                    block: Sequence[Size] = (128,)) -> BlockGraph:
    """Start the body of a graph-defined kernel (Mirage's ``new_threadblock_graph``)."""
    return BlockGraph(grid, forloop_range, block)
