"""Ranking verified structures without a device: fewest kernels, then least global traffic.

Traffic is the bytes every kernel reads and writes in global memory at the program's real
shapes, counting each tensor once per kernel (the ideal, before replication by the grid).
Ties go to the smaller per-block working set, each symbol splitting its dim into at most 16
parts and never into parts below 64 elements (a nominal tiling, before Optuna picks a real
one): that prefers a for-loop over a long shared dimension to one block holding all of it,
and does not reward splitting a dim that is already small.  Then fewer block ops, then fewer
symbols.
"""

from __future__ import annotations

from .ir import DTYPE_BYTES, KernelGraph, SymDim, op_flops, to_obj

NOMINAL = 16.0
MIN_PART = 64


def _size(shape) -> float:
    total = 1.0
    for d in shape:
        if isinstance(d, SymDim):
            parts = min(NOMINAL ** len(d.den), max(1.0, d.coef / MIN_PART))
            total *= d.coef * NOMINAL ** len(d.num) / parts
        else:
            total *= d
    return total


def describe(structure_hash: str, graph: KernelGraph) -> dict:
    kernels = [op for op in graph.ops if op.kind not in ("input", "output")]
    moved = 0.0
    footprint = 0.0
    block_ops = 0
    for op in kernels:
        for t in (*op.inputs, *op.outputs):
            info = graph.tensors[t]
            moved += _size(info.shape) * DTYPE_BYTES[info.dtype]
        if op.kind == "graph_kernel":
            bg = op.attrs["block_graph"]
            block_ops += sum(1 for o in bg.ops if o.kind not in ("input", "output"))
            footprint += sum(_size(t.shape) for t in bg.tensors if t.stage != "epilogue")
    return {"hash": structure_hash, "num_kernels": len(kernels),
            "num_graph_kernels": sum(op.kind == "graph_kernel" for op in kernels),
            "bytes_moved": int(moved), "tile_elements": int(footprint),
            "block_ops": block_ops, "symbols": sorted(graph.symbols()), "graph": to_obj(graph)}


def rank(structures: list[dict]) -> list[dict]:
    return sorted(structures, key=lambda s: (s["num_kernels"], s["bytes_moved"],
                                             s["tile_elements"], s["block_ops"],
                                             len(s["symbols"]), s["hash"]))


def flops(graph: KernelGraph) -> int:
    """Arithmetic of a structure at its real shapes over one block with a two-step for-loop
    (``ops.op_flops`` per op; accumulators free: their adds finish sums already counted).  A body op whose tile does not shrink with the loop
    (work repeated in every iteration) counts twice, so a structure that does such work adds
    to the program's own arithmetic; one block, as grid blocks repeating small work is not
    what this measures."""
    one = graph.replay(None, {s: 2 if s == "F" else 1 for s in graph.symbols()})
    total = 0
    for g in [one] + [op.attrs["block_graph"] for op in one.ops_of("graph_kernel")]:
        for op in g.ops:
            if op.kind in ("input", "output", "graph_kernel", "accum"):
                continue
            steps = int(g.forloop_range) if g.tensors[op.outputs[0]].stage == "body" else 1
            total += steps * op_flops(op.kind, [g.tensors[t].shape for t in op.inputs],
                                      g.tensors[op.outputs[0]].shape)
    return total
