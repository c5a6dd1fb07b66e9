"""Mirage's thread-block graphs: ``mi.new_threadblock_graph(...)`` onto the native
``search.BlockGraph``.

Mirage's conventions are the native ones under other names: ``input_map`` (per grid dim x, y,
z: the tensor dim it splits, or -1) is ``imap``, ``forloop_dim`` is ``fmap``, ``output_map``
is ``omap``, and ``forloop_accum(x, acc)`` is ``accum`` with ``acc`` None → ``no_red`` (sum
over iterations), ``"sum"``, ``"mean"``, ``"rms"`` (of the last dim over every iteration).
What has no counterpart here raises ``MirageUnsupported`` naming the call and why.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from search import BlockGraph, ShapeError, Tensor

# Mirage's accumulator names -> the native accum kinds (None: Mirage's default)
ACCUMS = {None: "no_red", "no_red": "no_red", "sum": "sum", "mean": "mean", "rms": "rms"}


class MirageUnsupported(NotImplementedError):
    """A Mirage call this layer cannot express; the message says which and why."""


class TBGraph(BlockGraph):
    """A thread-block graph built with Mirage's spellings; still the native builder."""

    def __init__(self, grid_dim: Sequence[int], block_dim: Sequence[int] = (128, 1, 1),
                 forloop_range: int = 1, reduction_dimx: int = 64) -> None:
        super().__init__(tuple(grid_dim), forloop_range, tuple(block_dim))
        self.reduction_dimx = int(reduction_dimx)

    def new_input(self, dtensor: Tensor | None = None,  # type: ignore[override]
                  input_map: Sequence[int] | None = None, forloop_dim: int | None = None,
                  store_in_dmem: bool = False, *, tensor: Tensor | None = None,
                  imap: Sequence[int] | None = None, fmap: int | None = None) -> Tensor:
        """Mirage's ``new_input(dtensor, input_map, forloop_dim, store_in_dmem=False)`` or the
        native ``new_input(tensor, imap, fmap)``: a tile of a kernel tensor per block."""
        t = dtensor if dtensor is not None else tensor
        if t is None:
            raise TypeError("new_input: give dtensor= (a tensor of the kernel graph)")
        m = input_map if input_map is not None else imap
        f = forloop_dim if forloop_dim is not None else fmap
        # store_in_dmem (keep the tile in device memory) is a placement hint: the lowering
        # chooses memory levels itself
        return super().new_input(t, tuple(m) if m is not None else (-1, -1, -1),
                                 -1 if f is None else int(f))

    def new_output(self, stensor: Tensor | None = None,  # type: ignore[override]
                   output_map: Sequence[int] | None = None, forloop_dim: int = -1,
                   epilogue: Any = None, *, tensor: Tensor | None = None,
                   omap: Sequence[int] | None = None) -> None:
        """Mirage's ``new_output(stensor, output_map, forloop_dim=-1, epilogue=None)``."""
        t = stensor if stensor is not None else tensor
        if t is None:
            raise TypeError("new_output: give stensor= (a tile of this thread-block graph)")
        if forloop_dim != -1:
            raise MirageUnsupported(
                f"new_output(forloop_dim={forloop_dim}): writing a tile per for-loop iteration "
                "is not supported here; accumulate it with forloop_accum and write once")
        if epilogue is not None:
            raise MirageUnsupported(f"new_output(epilogue={epilogue!r}): output epilogues "
                                    "(e.g. allreduce) are not supported here")
        m = output_map if output_map is not None else omap
        super().new_output(t, tuple(m) if m is not None else (-1, -1, -1))

    def forloop_accum(self, tensor: Tensor, acc: str | None = None) -> Tensor:
        """Mirage's ``forloop_accum(x, acc=None)``: the sum over iterations (None), or the
        sum / mean / rms of the last dim over every iteration.  ``"sum_todimx"`` (the last
        dim folded to ``reduction_dimx`` columns) is the plain sum where the tile is already
        that wide."""
        if acc == "sum_todimx":
            width = tensor.shape[-1]
            if width == self.reduction_dimx:
                return super().forloop_accum(tensor, "no_red")
            raise MirageUnsupported(
                f"forloop_accum(x, 'sum_todimx'): folding a {width}-wide tile to "
                f"reduction_dimx={self.reduction_dimx} columns (a strided sum) has no "
                "accumulator here; read the column blocks with the for-loop instead "
                "(forloop_dim on that dim, forloop_accum(x))")
        if acc not in ACCUMS:
            raise ShapeError(f"forloop_accum: acc {acc!r} is not one of Mirage's None, "
                             "'sum', 'mean', 'rms', 'sum_todimx'")
        return super().forloop_accum(tensor, ACCUMS[acc])

    def reduction(self, tensor: Tensor, dim: int) -> Tensor:
        """Mirage's ``reduction(A, dim)``: the sum over ``dim`` of the tile, kept with size 1."""
        return self.apply("sum", tensor, int(dim))

    # --- Mirage calls with no counterpart: one line each on why ---------------------------
    def forloop_accum_rescale(self, *args: Any, **kw: Any) -> Tensor:
        raise MirageUnsupported("forloop_accum_rescale: online-softmax rescaling (a running "
                                "max) has no accumulator here; use forloop_accum without the "
                                "max subtraction")

    def forloop_accum_max(self, *args: Any, **kw: Any) -> Tensor:
        raise MirageUnsupported("forloop_accum_max: a max over iterations has no "
                                "accumulator here (the op table has no max)")

    def reduction_max(self, *args: Any, **kw: Any) -> Tensor:
        raise MirageUnsupported("reduction_max: the op table has no max reduction")

    def reduction_to_dimx(self, *args: Any, **kw: Any) -> Tensor:
        raise MirageUnsupported("reduction_to_dimx: folding a dim to reduction_dimx columns "
                                "(a strided sum) has no op here")

    def concat(self, *args: Any, **kw: Any) -> Tensor:
        raise MirageUnsupported("concat: the op table has no concatenation")

    def clamp(self, *args: Any, **kw: Any) -> Tensor:
        raise MirageUnsupported("clamp: the op table has no clamp")


def new_threadblock_graph(grid_dim: Sequence[int], block_dim: Sequence[int] = (128, 1, 1),
                          forloop_range: int = 1, reduction_dimx: int = 64) -> TBGraph:
    """Mirage's ``mi.new_threadblock_graph(grid_dim, block_dim, forloop_range,
    reduction_dimx)``: the body of a customized kernel (``graph.customized(inputs, tb)``)."""
    return TBGraph(grid_dim, block_dim, forloop_range, reduction_dimx)
