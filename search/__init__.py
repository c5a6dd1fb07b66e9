"""µGraph IR, op table, program builder and program files (imports nothing else of ours)."""

from .dims import ShapeError, SymDim, fmt_shape
from .graph import BlockGraph, KernelGraph, Tensor, new_block_graph, new_kernel_graph
from .ops import (
    ACCUM_KINDS,
    BINARY_OPS,
    DTYPE_BYTES,
    DTYPES,
    EGG_FUNCTIONS,
    ELEMENTWISE_OPS,
    OPS,
    ROW_REDUCTIONS,
    UNARY_OPS,
    OpDef,
)
from .printing import format_graph
from .serialize import GraphFormatError, from_json, structural_hash, to_json

__all__ = [
    "ACCUM_KINDS", "BINARY_OPS", "DTYPES", "DTYPE_BYTES", "EGG_FUNCTIONS", "ELEMENTWISE_OPS",
    "ROW_REDUCTIONS", "UNARY_OPS", "OPS", "BlockGraph", "GraphFormatError", "KernelGraph", "OpDef",
    "ShapeError", "SymDim", "Tensor", "fmt_shape", "format_graph", "from_json", "new_block_graph",
    "new_kernel_graph", "structural_hash", "to_json",
]
