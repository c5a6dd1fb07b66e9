"""Ranking verified structures without a device: fewest kernels, then least global traffic.

Traffic is the bytes every kernel reads and writes in global memory at the program's real
shapes, counting each tensor once per kernel (the ideal, before replication by the grid).
Ties go to the smaller per-block working set, with every grid / loop symbol at a nominal 16,
which is what prefers a for-loop over the shared dimension to one block holding all of it.
"""

from __future__ import annotations

from search import KernelGraph
from search.dims import SymDim
from search.serialize import to_obj

DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
NOMINAL = 16.0


def _size(shape) -> float:
    total = 1.0
    for d in shape:
        if isinstance(d, SymDim):
            total *= d.coef * NOMINAL ** (len(d.num) - len(d.den))
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
                                             s["tile_elements"], s["block_ops"], s["hash"]))
