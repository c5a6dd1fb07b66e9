"""Mirage's Python API on top of the tuner: bring a Mirage script, change only its import.

    import tuner as mi                      # was: import mirage as mi
    graph = mi.new_kernel_graph()
    X = graph.new_input(dims=(16, 4096), dtype=mi.float16)
    W = graph.new_input(dims=(4096, 6144), dtype=mi.float16)
    D = graph.rms_norm(X, normalized_shape=(4096,))
    O = graph.matmul(D, W)
    graph.mark_output(O)
    optimized = graph.superoptimize()       # search, verify, tune here, store, load
    (out,) = optimized(inputs=[x, w])       # as in Mirage; optimized(x, w) works too

or with the kernel written by hand as a thread-block graph and run as it stands:

    tb = mi.new_threadblock_graph(grid_dim=(64, 1, 1), block_dim=(128, 1, 1),
                                  forloop_range=64, reduction_dimx=64)
    tX = tb.new_input(dtensor=X, input_map=(-1, -1, -1), forloop_dim=1)
    ...
    O = graph.customized([X, W], tb)
    graph.mark_output(O[0])
    outputs = graph(inputs=[x, w])

Three parts: the kernel graph (``_kernel``: Mirage's builder spellings on the native
``search.KernelGraph``), the thread-block graph (``_block``: on ``search.BlockGraph``), running
a graph as written (``_run``) and ``superoptimize`` (``_superoptimize``).  See docs/mirage.md.
"""

from ._block import MirageUnsupported, TBGraph, new_threadblock_graph
from ._kernel import (
    KNGraph,
    bfloat16,
    convert_dtype_to_torch_type,
    float16,
    float32,
    new_kernel_graph,
    set_gpu_device_id,
)
from ._run import generate_cpu_program, generate_cuda_program
from ._superoptimize import Optimized, input_entry, superoptimize, to_program

__all__ = ["KNGraph", "MirageUnsupported", "Optimized", "TBGraph", "bfloat16",
           "convert_dtype_to_torch_type", "float16", "float32", "generate_cpu_program",
           "generate_cuda_program", "input_entry", "new_kernel_graph", "new_threadblock_graph",
           "set_gpu_device_id", "superoptimize", "to_program"]
