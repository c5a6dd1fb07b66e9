"""Predefined kernel ops (matmul, elementwise, reductions, rms_norm) as one-op block graphs.

Writing a predefined op as the block graph a person would write for it means one lowering and
one renderer serve both kinds of kernel, and the float interpreter can check the equivalence of
the two forms.  Grids follow the AStitch rule for row-shaped ops and about one wave of 64×64
output tiles for matmuls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kernels.hardware import DeviceSpec
from search.ir import GRID_DIMS, OPS, BlockGraph, ShapeError

from ._mapping import astitch_rule, largest_divisor_at_most

PREDEFINED_MATMUL_TILE = 64  # a predefined matmul kernel: block tiles of at most 64 along m, n and k


def _spread(sizes: Sequence[tuple[int, int]], blocks: int) -> dict[int, int]:
    """Split ``blocks`` over (dim, size) pairs, outermost first: {dim: grid factor}."""
    out, left = {}, max(1, blocks)
    for dim, size in sizes[:GRID_DIMS]:
        f = largest_divisor_at_most(size, left)
        if f > 1:
            out[dim] = f
            left = max(1, left // f)
    return out


def predefined_block_graph(kind: str, attrs: dict, specs: Sequence[tuple[tuple[int, ...], str]],
                           out: tuple[int, ...], spec: DeviceSpec) -> BlockGraph:
    """The block graph of kernel op ``kind`` over inputs ``specs`` producing shape ``out``."""
    rank = len(out)
    if kind == "matmul":
        return _matmul(specs, out)
    if kind in ("sum", "mean") and attrs["dim"] != rank - 1:
        d = attrs["dim"]
        factors = _spread([(i, out[i]) for i in range(rank) if i != d],
                          max(1, math.prod(out) // 1024))
    elif rank == 1:
        factors = _spread([(0, out[0])], max(1, out[0] // 4096))
    else:
        rows = math.prod(out[:-1])
        rule = astitch_rule(rows, specs[0][0][-1], spec)
        factors = _spread([(i, out[i]) for i in range(rank - 1)], rows // rule.rows_per_block)
    grid = tuple(factors.values()) or (1,)
    bg = BlockGraph(grid, 1, (128,), specs)
    tiles = [bg.input(i, _imap_skip(factors, s, out, skip=-1), -1) for i, (s, _) in enumerate(specs)]
    if kind in ("sum", "mean"):
        y = bg.apply(kind, tiles[0], dim=attrs["dim"])
    elif OPS[kind].attrs:  # mul_scalar, add_scalar, rms_norm: the op's own attributes
        y = bg.apply(kind, *tiles, **attrs)
    else:
        y = bg.apply(kind, *tiles)
    omap = tuple(list(factors) + [-1] * (GRID_DIMS - len(factors)))
    bg.new_output(bg.forloop_accum(y), omap)
    return _checked(bg, specs, out, kind)


def _matmul(specs: Sequence[tuple[tuple[int, ...], str]], out: tuple[int, ...]) -> BlockGraph:
    (sa, _), (sb, _) = specs
    rank = len(out)
    m, n, k = out[-2], out[-1], sa[-1]
    factors: dict[int, int] = {}
    for d in range(rank - 2):
        if len(factors) < GRID_DIMS - 1:
            factors[d] = out[d]
    factors[rank - 2] = m // largest_divisor_at_most(m, PREDEFINED_MATMUL_TILE)
    if len(factors) < GRID_DIMS:
        factors[rank - 1] = n // largest_divisor_at_most(n, PREDEFINED_MATMUL_TILE)
    factors = {d: f for d, f in factors.items() if f > 1}
    f = k // largest_divisor_at_most(k, PREDEFINED_MATMUL_TILE)
    grid = tuple(factors.values()) or (1,)
    bg = BlockGraph(grid, f, (128,), specs)
    a = bg.input(0, _imap_skip(factors, sa, out, skip=rank - 1), rank - 1)
    b = bg.input(1, _imap_skip(factors, sb, out, skip=rank - 2), rank - 2)
    omap = tuple(list(factors) + [-1] * (GRID_DIMS - len(factors)))
    bg.new_output(bg.forloop_accum(bg.matmul(a, b)), omap)
    return _checked(bg, specs, out, "matmul")


def _imap_skip(factors: dict[int, int], shape: tuple[int, ...], out: tuple[int, ...],
               skip: int) -> tuple:
    """Like _imap, but grid dims over ``skip`` (a dim this operand does not have) replicate."""
    dims = list(factors)
    return tuple((-1 if dims[g] == skip or shape[dims[g]] != out[dims[g]] else dims[g])
                 if g < len(dims) else -1 for g in range(GRID_DIMS))


def _checked(bg: BlockGraph, specs, out, kind: str) -> BlockGraph:
    got = bg.output_specs(specs)[0][0]
    if tuple(got) != tuple(out):
        raise ShapeError(f"predefined {kind}: block graph produces {got}, expected {out}")
    return bg
