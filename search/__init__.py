"""µGraph IR, op table, program builder and program files, the enumerator, the deepening
search driver and the device-free ranking (imports nothing else of ours).

The IR, the op table and the hand-written structures load with the package; the program
language (YAML), the enumerator, the driver, the suite and the random program generator
resolve lazily, on first use: lowering and devices import this package and need none of them.
"""

from importlib import import_module

from .dims import ShapeError, SymDim, bind_dim, fmt_shape
from .graph import BlockGraph, KernelGraph, Tensor, new_block_graph, new_kernel_graph
from .handwritten import HANDWRITTEN, handwritten  # eager: the function, not the module
from .ops import (
    ACCUM_KINDS,
    BINARY_OPS,
    BLOCK,
    COMPUTE_OPS,
    DTYPE_BYTES,
    DTYPES,
    EGG_FUNCTIONS,
    ELEMENTWISE_OPS,
    KERNEL,
    OPS,
    ROW_REDUCTIONS,
    UNARY_OPS,
    OpDef,
    op_flops,
)
from .printing import format_graph
from .serialize import GraphFormatError, from_json, from_obj, structural_hash, to_json, to_obj

_LAZY = {
    "Program": "lang", "ProgramError": "lang", "parse_program": "lang",
    "load_program_file": "lang",
    "SUITE": "suite", "EXTRA": "suite", "builtin_names": "suite", "builtin_program": "suite",
    "load_program": "suite", "small_instance": "suite",
    "DEFAULT_BLOCK_OPS": "space", "DEFAULT_KERNEL_OPS": "space", "Context": "space",
    "Limits": "space", "Shard": "space", "Stats": "space",
    "plan_configs": "enumerate", "split_shard": "enumerate", "run_shard": "enumerate",
    "Executor": "driver", "SearchResult": "driver", "ShardResult": "driver",
    "run_search": "driver",
    "describe": "ranking", "rank": "ranking",
    "random_program": "generate", "random_program_doc": "generate",
}

__all__ = [
    "ACCUM_KINDS", "BINARY_OPS", "BLOCK", "BlockGraph", "COMPUTE_OPS", "KERNEL", "Context", "DEFAULT_BLOCK_OPS",
    "DEFAULT_KERNEL_OPS", "DTYPES", "DTYPE_BYTES", "op_flops", "EGG_FUNCTIONS", "ELEMENTWISE_OPS", "EXTRA",
    "Executor", "GraphFormatError", "HANDWRITTEN", "KernelGraph", "Limits", "OPS", "OpDef",
    "Program", "ProgramError", "ROW_REDUCTIONS", "SUITE", "SearchResult", "ShapeError",
    "Shard", "ShardResult", "Stats", "SymDim", "Tensor", "UNARY_OPS", "bind_dim",
    "builtin_names", "builtin_program", "describe", "fmt_shape", "format_graph", "from_json",
    "from_obj", "handwritten", "load_program", "load_program_file", "new_block_graph",
    "new_kernel_graph", "parse_program", "plan_configs", "random_program", "random_program_doc",
    "rank", "run_search", "run_shard",
    "small_instance", "split_shard", "structural_hash", "to_json", "to_obj",
]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'search' has no attribute {name!r}")
    value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value
