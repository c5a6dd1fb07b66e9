"""The one interpreter of µGraphs, over any arithmetic (float reference or finite field).

Values are numpy arrays whose trailing axes are the tensor's dims and whose leading axes are
opaque batch axes (the arithmetic's own, then one axis of independent tests).  A block graph
is not run block by block: every block and every for-loop iteration is evaluated at once by
viewing each input as ``(*lead, grid0, grid1, grid2, loop, *tile)``.  Tensor dims are always
addressed with negative axes, so the same op code serves kernel tensors, per-iteration tiles
and accumulated tiles, and a block graph costs about as much to check as a kernel graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from search.ir import BINARY_OPS, UNARY_OPS, BlockGraph, KernelGraph, ShapeError

from .arith import Arithmetic


def _compute(kind: str, attrs: Mapping[str, Any], args: list[np.ndarray], ranks: list[int],
             ar: Arithmetic) -> np.ndarray:
    """The meaning of every compute op of the op table, once, in terms of the arithmetic."""
    a = args[0]
    if kind in BINARY_OPS or kind == "matmul":
        return getattr(ar, kind)(a, args[1])
    if kind in UNARY_OPS:
        return getattr(ar, kind)(a)
    if kind == "mul_scalar":
        return ar.scale(a, attrs["scalar"])
    if kind == "add_scalar":
        return ar.shift(a, attrs["scalar"])
    if kind in ("sum", "mean"):
        return getattr(ar, kind)(a, attrs["dim"] - ranks[0])
    if kind == "rms_norm":
        ms = ar.mean(ar.square(a), -1)
        eps = attrs.get("eps", 0.0)
        return ar.div(a, ar.sqrt(ar.shift(ms, eps) if eps else ms))
    raise ShapeError(f"the interpreter has no meaning for op {kind!r}")


def run(graph: KernelGraph, inputs: Sequence[np.ndarray], ar: Arithmetic) -> list[np.ndarray]:
    """Evaluate ``graph`` on ``inputs`` (each ``(*lead, *shape)``); returns its outputs."""
    if graph.symbols():
        raise ShapeError(f"cannot run a structure with unbound symbols {sorted(graph.symbols())};"
                         " bind a config first")
    if len(inputs) != len(graph.input_ids):
        raise ShapeError(f"graph takes {len(graph.input_ids)} inputs, got {len(inputs)}")
    env: dict[int, np.ndarray] = {}
    ins = iter(inputs)
    for op in graph.ops:
        if op.kind == "input":
            value = next(ins)
            shape = graph.tensors[op.outputs[0]].shape
            if tuple(value.shape[-len(shape):]) != tuple(shape):
                raise ShapeError(f"input {graph.tensors[op.outputs[0]].name or op.outputs[0]} "
                                 f"expects shape {shape}, got {value.shape[-len(shape):]}")
            env[op.outputs[0]] = value
        elif op.kind == "output":
            continue
        elif op.kind == "graph_kernel":
            outs = run_block(op.attrs["block_graph"], [env[t] for t in op.inputs], ar)
            env.update(zip(op.outputs, outs, strict=True))
        else:
            ranks = [len(graph.tensors[t].shape) for t in op.inputs]
            env[op.outputs[0]] = _compute(op.kind, op.attrs, [env[t] for t in op.inputs],
                                          ranks, ar)
    return [env[t] for t in graph.output_ids]


def _tile_view(value: np.ndarray, shape: tuple[int, ...], grid: tuple[int, ...], loop: int,
               imap: tuple[int, ...], fmap: int) -> np.ndarray:
    """``(*lead, *shape)`` → ``(*lead, g0, g1, g2, loop, *tile)``; unused axes have size 1."""
    r = len(shape)
    lead = value.ndim - r
    split = [1] * r
    for g, m in enumerate(imap):
        if m >= 0:
            split[m] = grid[g]
    parts: list[int] = []
    for t in range(r):
        f = loop if fmap == t else 1
        parts += [split[t], f, shape[t] // (split[t] * f)]
    v = value.reshape(value.shape[:lead] + tuple(parts) + (1, 1, 1, 1))
    extra = lead + 3 * r  # four singleton axes stand in for unmapped grid dims and no loop
    perm = list(range(lead))
    perm += [lead + 3 * imap[g] if imap[g] >= 0 else extra + g for g in range(3)]
    perm.append(lead + 3 * fmap + 1 if fmap >= 0 else extra + 3)
    perm += [lead + 3 * t + 2 for t in range(r)]
    rest = [a for a in range(v.ndim) if a not in perm]
    v = v.transpose(perm + rest)
    return v.reshape(v.shape[:len(perm)])


def run_block(bg: BlockGraph, inputs: Sequence[np.ndarray], ar: Arithmetic) -> list[np.ndarray]:
    """Evaluate every block and every loop iteration of a concrete block graph at once."""
    grid = bg.concrete_grid()
    loop = int(bg.forloop_range)
    env: dict[int, np.ndarray] = {}
    outputs = []
    for op in bg.ops:
        info = [bg.tensors[t] for t in op.outputs]
        if op.kind == "input":
            shape, _ = bg.input_specs[op.attrs["index"]]
            env[op.outputs[0]] = _tile_view(inputs[op.attrs["index"]], shape, grid, loop,
                                            op.attrs["imap"], op.attrs["fmap"])
        elif op.kind == "accum":
            env[op.outputs[0]] = _accumulate(env[op.inputs[0]], op.attrs["kind"],
                                             len(info[0].shape), loop, ar)
        elif op.kind == "output":
            tile = env[op.inputs[0]]
            r = len(bg.tensors[op.inputs[0]].shape)
            outputs.append(_place_tile(tile, r, grid, op.attrs["omap"]))
        else:
            ranks = [len(bg.tensors[t].shape) for t in op.inputs]
            args = [env[t] for t in op.inputs]
            if info[0].stage == "epilogue":  # loop-invariant tiles lose their loop axis
                args = [np.squeeze(a, axis=-(r + 1)) if bg.tensors[t].stage == "invariant"
                        else a for a, t, r in zip(args, op.inputs, ranks, strict=True)]
            env[op.outputs[0]] = _compute(op.kind, op.attrs, args, ranks, ar)
    return outputs


def _accumulate(value: np.ndarray, kind: str, r: int, loop: int, ar: Arithmetic) -> np.ndarray:
    """Fold the loop axis: a tile that does not vary with the loop still counts every time."""
    axis = -(r + 1)
    shape = list(value.shape)
    shape[axis] = loop
    value = np.broadcast_to(value, shape)
    if kind == "no_red":
        folded = ar.sum_axes(value, (axis,))
    else:
        base = ar.square(value) if kind == "rms" else value
        folded = ar.sum_axes(base, (axis, -1))
        if kind in ("mean", "rms"):
            folded = ar.divide_by_count(folded, loop * value.shape[-1])
        if kind == "rms":
            folded = ar.sqrt(folded)
    return np.squeeze(folded, axis=axis)


def _place_tile(tile: np.ndarray, r: int, grid: tuple[int, ...],
                omap: tuple[int, ...]) -> np.ndarray:
    lead = tile.ndim - r - 3
    full = tile.shape[:lead] + tuple(grid) + tile.shape[lead + 3:]
    v = np.broadcast_to(tile, full)
    owner = {m: g for g, m in enumerate(omap) if m >= 0}
    perm = list(range(lead))
    out_shape = list(v.shape[:lead])
    for t in range(r):
        tile_dim = v.shape[lead + 3 + t]
        if t in owner:
            perm.append(lead + owner[t])
            out_shape.append(grid[owner[t]] * tile_dim)
        else:
            out_shape.append(tile_dim)
        perm.append(lead + 3 + t)
    perm += [lead + g for g in range(3) if omap[g] < 0]  # those grid dims have size 1
    return v.transpose(perm).reshape(out_shape)
