"""PyTorch in: ``torch.compile(model, backend="tuner")`` and ``tuner.compile(fn_or_module)``.

The backend captures the regions of a model's ATen graph that the op table writes, runs the
ones with a tuned kernel in the database as that kernel (a ``tuner::kernel`` custom op) and the
rest through Inductor or eagerly; ``report()`` says what was captured and what fell back, and
why.  See docs/pytorch.md.  Importing this wing imports torch.
"""

from __future__ import annotations

from typing import Any

from .backend import backend, last_report
from .options import Options, make_options
from .report import GraphReport, RegionReport, Report

__all__ = ["Compiled", "GraphReport", "Options", "RegionReport", "Report", "backend", "compile",
           "last_report", "register"]


class Compiled:
    """``torch.compile(fn, backend="tuner")`` with its report: call it as ``fn``."""

    def __init__(self, fn: Any, **options: Any) -> None:
        import torch

        self._report = Report()
        options = {**options, "report": self._report}
        make_options(dict(options))  # bad options fail here, not at the first call
        # one graph per shape: kernels are tuned at fixed shapes (a symbolic graph falls back)
        self._fn = torch.compile(fn, backend=lambda gm, xs: backend(gm, xs, **options),
                                 dynamic=False)
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    def report(self) -> Report:
        """What the compiles so far captured, ran as kernels, and let fall back (and why)."""
        return self._report


def compile(fn: Any, **options: Any) -> Compiled:  # noqa: A001 - the name users expect
    """Compile ``fn`` (a function or an ``nn.Module``) with the tuner backend; ``options``:
    ``tune`` ("cached", "now", "job"), ``db``, ``budget_s``, ``job_file``, ``fallback``
    ("inductor", "eager"), ``max_ops``, ``verbose``.  See docs/pytorch.md."""
    return Compiled(fn, **options)


def register() -> None:
    """Register the backend as ``tuner`` in this process (the installed package does it
    through its ``torch_dynamo_backends`` entry point; this is for a source checkout)."""
    import torch._dynamo

    if "tuner" not in torch._dynamo.list_backends(exclude_tags=()):  # no entry point here
        torch._dynamo.register_backend(backend, name="tuner")
