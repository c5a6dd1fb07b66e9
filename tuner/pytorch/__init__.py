"""PyTorch in: ``torch.compile(model, backend="tuner")`` and ``tuner.compile(fn_or_module)``.

The backend captures the regions of a model's ATen graph that the op table writes, runs the
ones with a tuned kernel in the database as that kernel (a ``tuner::kernel`` custom op) and the
rest through Inductor or eagerly; ``report()`` says what was captured and what fell back, and
why.  See docs/pytorch.md.  Importing this wing imports torch.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn.modules import module as _hooks

from .backend import backend, last_report
from .options import Options, make_options
from .report import GraphReport, RegionReport, Report

__all__ = ["Compiled", "GraphReport", "Options", "RegionReport", "Report", "backend", "compile",
           "last_report", "register"]


class Compiled:
    """``torch.compile(fn, backend="tuner")`` with its report: call it as ``fn``.

    A module is compiled through its bound ``forward``: under Dynamo, ``nn.Module.__call__``'s
    machinery (hook checks, a second frame) costs ~3 µs a call, as much as a decode-shape
    kernel.  While the module (or the process) has forward hooks, calls go through the
    compiled module itself, so hooks run as they would without the tuner."""

    def __init__(self, fn: Any, **options: Any) -> None:
        self._report = Report()
        options = {**options, "report": self._report}
        make_options(dict(options))  # bad options fail here, not at the first call

        def compiled(target: Any) -> Any:
            return torch.compile(target, backend=lambda gm, xs: backend(gm, xs, **options))

        self._module = fn if isinstance(fn, torch.nn.Module) else None
        self._fn = compiled(fn.forward if self._module is not None else fn)
        self._with_hooks: Any = None
        self._compiled = compiled
        self._shapes: set = set()
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = self._fn
        if self._module is not None and _hooked(self._module):
            if self._with_hooks is None:
                self._with_hooks = self._compiled(self._module)
            fn = self._with_hooks
        # kernels are tuned at fixed shapes: a call of a kind not seen before (the one that
        # compiles) runs with Dynamo's automatic dynamic shapes off, so each shape gets a
        # graph of its own.  (``dynamic=False`` would patch the config on every call, ~4 µs.)
        # A graph that still comes symbolic falls back, with the reason in the report.
        key: tuple | None = (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), fn,
               *[(getattr(a, "shape", a), getattr(a, "dtype", None)) for a in args],
               *[(k, getattr(a, "shape", a), getattr(a, "dtype", None))
                 for k, a in kwargs.items()])
        try:
            if key in self._shapes:
                return fn(*args, **kwargs)
        except TypeError:  # an argument that cannot be hashed: no fast path
            key = None
        with _static():
            out = fn(*args, **kwargs)
        if key is not None:
            self._shapes.add(key)
        return out

    def report(self) -> Report:
        """What the compiles so far captured, ran as kernels, and let fall back (and why)."""
        return self._report


def _hooked(module: Any) -> bool:
    """Whether calling ``module`` would run a forward hook (its own or a global one)."""
    return bool(module._forward_hooks or module._forward_pre_hooks or
                _hooks._global_forward_hooks or _hooks._global_forward_pre_hooks)


def _static() -> Any:
    import torch._dynamo

    return torch._dynamo.config.patch(automatic_dynamic_shapes=False,
                                      assume_static_by_default=True)


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
