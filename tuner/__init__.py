"""Tuner: a distributed superoptimizer for GPU tensor programs.

The Python face: build programs like Mirage (``new_kernel_graph``), load built-in or file
programs, and check equivalence of µGraphs.
"""

from search import BlockGraph, KernelGraph, new_block_graph, new_kernel_graph

from .api import list_programs, load_graph, load_program, program_graph, verify_files

__all__ = ["BlockGraph", "KernelGraph", "list_programs", "load_graph", "load_program",
           "new_block_graph", "new_kernel_graph", "program_graph", "verify_files"]
