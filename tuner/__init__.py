"""Tuner: a distributed superoptimizer for GPU tensor programs.

The Python face: build programs like Mirage (``new_kernel_graph``; a Mirage script runs with
``import tuner as mi``, see ``tuner.mirage_compat``), load built-in or file
programs, check equivalence of µGraphs, run a job file (``launch``) and get the best tuned
kernel back from the database (``best`` for the record, ``load`` for a callable, ``status``
for what a database holds), or compile a PyTorch model with the tuned kernels (``compile``, the
``torch.compile`` backend ``tuner``).
"""

from search import BlockGraph, KernelGraph, new_block_graph

from .api import list_programs, load_graph, load_program, program_graph, verify_files
from .mirage_compat import (
    KNGraph,
    TBGraph,
    bfloat16,
    convert_dtype_to_torch_type,
    float16,
    float32,
    generate_cpu_program,
    generate_cuda_program,
    new_kernel_graph,
    new_threadblock_graph,
    set_gpu_device_id,
)
from .serving import UncertainBestWarning, best, load, status


def compile(fn: object, **options: object) -> object:  # noqa: A001 - torch.compile's name
    """``torch.compile(fn, backend="tuner")`` with ``.report()`` (``tuner.pytorch.compile``;
    imported lazily, it pulls in PyTorch).  See docs/pytorch.md."""
    from .pytorch import compile as _compile

    return _compile(fn, **options)


def launch(path: str, **kwargs: object) -> object:
    """Run a job file (``tuner.pipeline.launch``); imported lazily, it pulls in Ray."""
    from .pipeline import launch as _launch

    return _launch(path, **kwargs)  # type: ignore[arg-type]


__all__ = ["BlockGraph", "KNGraph", "KernelGraph", "TBGraph", "UncertainBestWarning", "best", "bfloat16", "compile",
           "convert_dtype_to_torch_type", "float16",
           "float32", "generate_cpu_program", "generate_cuda_program", "launch",
           "list_programs", "load", "load_graph", "load_program", "new_block_graph",
           "new_kernel_graph", "new_threadblock_graph", "program_graph", "set_gpu_device_id",
           "status", "verify_files"]
