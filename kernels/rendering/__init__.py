"""Rendering: one C-style printer, two dialects (CUDA; C++ with OpenMP), and the Triton
dialect, which prints the same plans as tile programs; syntax only.

``render(plan)`` prints a ``KernelPlan`` in the dialect of its device.  Both dialects are
``CStyle`` with a handful of hooks overridden (types, conversions, kernel signature, how blocks
are walked, synchronisation, combining a row's lanes), in the spirit of tinygrad's
CStyleLanguage: one code generator, not two.  What to print is decided by lowering and read
from the plan; a dialect only knows how to say it.
"""

from ._cpp import CppDialect
from ._cpp_prelude import EXP_F
from ._cstyle import BINARY, UNARY, CStyle
from ._cuda import CudaDialect
from ._render import DIALECTS, render
from ._triton import TritonDialect, TritonUnsupported
from ._triton_launch import TritonLaunch, triton_launches

__all__ = ["BINARY", "DIALECTS", "EXP_F", "UNARY", "CStyle", "CppDialect", "CudaDialect", "TritonDialect", "TritonLaunch", "triton_launches",
           "TritonUnsupported", "render"]
