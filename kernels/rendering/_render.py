"""``render``: a plan printed in a dialect (default: the one of its device)."""

from __future__ import annotations

from kernels.lowering import KernelPlan

from ._cpp import CppDialect
from ._cstyle import CStyle
from ._cuda import CudaDialect
from ._triton import TritonDialect

DIALECTS: dict[str, type[CStyle] | type[TritonDialect]] = {
    "cuda": CudaDialect, "cpp": CppDialect, "triton": TritonDialect}


def render(plan: KernelPlan | list[KernelPlan], dialect: str | None = None) -> str:
    """Source for ``plan`` in ``dialect`` ('cuda', 'cpp' or 'triton'; default: the dialect
    the plan chose, else its device kind's)."""
    first = plan[0] if isinstance(plan, list) else plan
    dialect = dialect or first.dialect or ("cpp" if first.device_kind == "cpu" else "cuda")
    if dialect not in DIALECTS:
        raise ValueError(f"render: unknown dialect {dialect!r}; use one of {sorted(DIALECTS)}")
    return DIALECTS[dialect]().render(plan)
