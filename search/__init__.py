"""The µGraph search: abstract expressions (egglog), the enumerator, the deepening driver
(``run_search``, with its default time limit), partitioning big programs into pieces
(``plan_pieces``, ``join_pieces``), the device-free ranking and the random program
generator, standing on the IR (``search.ir``), whose names this face also re-exports
(``from search import Program``).

Imports nothing else of ours.  Packages that need only the IR (``verifier``, ``kernels``,
``costmodel``) import ``search.ir``, not this face.
"""

from .driver import Executor, SearchResult, ShardResult, default_time_limit, run_search
from .enumerate import plan_configs, run_shard, split_shard
from .generate import random_program, random_program_doc
from .ir import (
    ACCUM_KINDS,
    BINARY_OPS,
    BLOCK,
    COMPUTE_OPS,
    DTYPE_BYTES,
    DTYPES,
    EGG_FUNCTIONS,
    ELEMENTWISE_OPS,
    EXTRA,
    GRID_DIMS,
    HANDWRITTEN,
    KERNEL,
    LAYOUTS,
    MAX_RANK,
    OPS,
    ROW_REDUCTIONS,
    SUITE,
    UNARY_OPS,
    BlockGraph,
    GraphFormatError,
    KernelGraph,
    OpDef,
    Program,
    ProgramError,
    ShapeError,
    SymDim,
    Tensor,
    bind_dim,
    builtin_names,
    builtin_program,
    fmt_shape,
    format_graph,
    from_json,
    from_obj,
    handwritten,
    load_program,
    load_program_file,
    new_block_graph,
    new_kernel_graph,
    op_flops,
    parse_program,
    small_instance,
    structural_hash,
    to_json,
    to_obj,
)
from .partition import Piece, costly_contraction, graph_program, join_pieces, plan_pieces
from .ranking import describe, rank
from .space import DEFAULT_BLOCK_OPS, DEFAULT_KERNEL_OPS, Context, Limits, Shard, Stats

__all__ = [
    # the search
    "DEFAULT_BLOCK_OPS", "DEFAULT_KERNEL_OPS", "Context", "Executor", "Limits", "Piece",
    "SearchResult", "Shard", "ShardResult", "Stats", "default_time_limit", "describe",
    "costly_contraction", "graph_program", "join_pieces", "plan_configs", "plan_pieces",
    "random_program", "random_program_doc",
    "rank", "run_search", "run_shard", "split_shard",
    # the IR, re-exported from search.ir
    "ACCUM_KINDS", "BINARY_OPS", "BLOCK", "COMPUTE_OPS", "DTYPES", "DTYPE_BYTES", "EGG_FUNCTIONS",
    "ELEMENTWISE_OPS", "EXTRA", "GRID_DIMS", "HANDWRITTEN", "KERNEL", "LAYOUTS", "MAX_RANK", "OPS",
    "ROW_REDUCTIONS", "SUITE", "UNARY_OPS", "BlockGraph", "GraphFormatError", "KernelGraph",
    "OpDef", "Program", "ProgramError", "ShapeError", "SymDim", "Tensor", "bind_dim",
    "builtin_names", "builtin_program", "fmt_shape", "format_graph", "from_json", "from_obj",
    "handwritten", "load_program", "load_program_file", "new_block_graph", "new_kernel_graph",
    "op_flops", "parse_program", "small_instance", "structural_hash", "to_json", "to_obj",
]
