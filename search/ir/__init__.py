"""The µGraph IR: the op table, symbolic dims, kernel and block graphs with their builder,
canonical JSON and the structural hash, the listing, the program language (YAML), the built-in
suite and the hand-written fused structures.

The ground floor every package stands on: ``verifier``, ``kernels``, ``costmodel`` and the
search algorithm above it (``search``) import these names; this package imports nothing else
of ours.
"""

from .core import Graph, Op, Tensor, TensorInfo
from .dims import ShapeError, SymDim, bind_dim, fmt_shape
from .graph import BlockGraph, KernelGraph, new_block_graph, new_kernel_graph
from .handwritten import HANDWRITTEN, handwritten  # the function: it shadows the module's name
from .lang import Program, ProgramError, load_program_file, parse_program
from .ops import (
    ACCUM_KINDS,
    BINARY_OPS,
    BLOCK,
    COMPUTE_OPS,
    DTYPE_BYTES,
    DTYPES,
    EGG_FUNCTIONS,
    ELEMENTWISE_OPS,
    GRID_DIMS,
    KERNEL,
    LAYOUTS,
    MAX_RANK,
    OPS,
    ROW_REDUCTIONS,
    UNARY_OPS,
    Expr,
    OpDef,
    op_flops,
)
from .printing import format_graph
from .serialize import GraphFormatError, from_json, from_obj, structural_hash, to_json, to_obj
from .suite import EXTRA, SUITE, builtin_names, builtin_program, load_program, small_instance

__all__ = [
    "ACCUM_KINDS", "BINARY_OPS", "BLOCK", "COMPUTE_OPS", "DTYPES", "DTYPE_BYTES", "EGG_FUNCTIONS",
    "ELEMENTWISE_OPS", "EXTRA", "GRID_DIMS", "HANDWRITTEN", "KERNEL", "LAYOUTS", "MAX_RANK", "OPS",
    "ROW_REDUCTIONS", "SUITE", "UNARY_OPS", "BlockGraph", "Expr", "Graph", "GraphFormatError",
    "KernelGraph", "Op", "OpDef", "Program", "ProgramError", "ShapeError", "SymDim", "Tensor",
    "TensorInfo", "bind_dim", "builtin_names", "builtin_program", "fmt_shape", "format_graph",
    "from_json", "from_obj", "handwritten", "load_program", "load_program_file",
    "new_block_graph", "new_kernel_graph", "op_flops", "parse_program", "small_instance",
    "structural_hash", "to_json", "to_obj",
]
