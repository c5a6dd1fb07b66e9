"""Plan → source → compiled kernel for the cpu device, checked against the float reference.

Every newly built kernel is run once, in an isolated worker, on random inputs and compared
with the float64 reference interpreter (``verifier.run`` over ``FloatArith``) with a tolerance
set by the dtype the device computes in: a kernel that crashes, hangs or disagrees comes back
as a status, never as an exception, so a tuner can record it and go on.
"""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kernels.compile import compile_cpp
from kernels.isolate import IsolatedWorker, run_isolated
from search import KernelGraph
from verifier import FloatArith, run

from .lower import concretize, lower, resolve_spec
from .plan import KernelPlan
from .render import render

# (rtol, atol) by the dtype the device computes in: CPU kernels compute float32 whatever the
# program's dtype; CUDA kernels store float16/bfloat16 and accumulate in float32.  check_plan
# raises atol to rtol × the largest |output|, so long reductions are judged fairly.
TOLERANCE: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-5),
    "float16": (2e-2, 2e-3),
    "bfloat16": (5e-2, 1e-2),
}


def tolerance(dtype: str) -> tuple[float, float]:
    """(rtol, atol) for comparing outputs computed in ``dtype`` with the float64 reference."""
    try:
        return TOLERANCE[dtype]
    except KeyError:
        raise ValueError(f"tolerance: unknown dtype {dtype!r}; known: {sorted(TOLERANCE)}") \
            from None


def random_inputs(graph: KernelGraph, seed: int = 0) -> list[np.ndarray]:
    """float32 inputs like the verifier's: magnitude in [0.5, 1.5], random sign."""
    rng = np.random.default_rng(seed)
    shapes = [tuple(graph.tensors[t].shape) for t in graph.input_ids]
    return [a[0].astype(np.float32) for a in FloatArith().random_inputs(shapes, 1, rng)]


def reference(graph: KernelGraph, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The float64 reference outputs of a concrete graph on (float32) inputs."""
    return [np.asarray(o, np.float64) for o in
            run(graph, [np.asarray(x, np.float64) for x in inputs], FloatArith())]


@dataclass
class BuildResult:
    """A built and checked kernel: ``status`` is one of kernels.isolate.STATUSES."""

    status: str
    message: str
    plan: KernelPlan
    source: str
    library: str | None = None
    max_abs_err: list[float] = field(default_factory=list)
    outputs: list[np.ndarray] = field(default_factory=list)
    timing: dict | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def build_cpu(graph: KernelGraph, config: Mapping[str, int] | None = None, *,
              name: str = "prog", seed: int = 0, timing: dict | None = None,
              worker: IsolatedWorker | None = None, timeout_s: float = 60.0,
              inputs: Sequence[np.ndarray] | None = None,
              env: Mapping[str, str | None] | None = None) -> BuildResult:
    """Lower ``graph`` for the cpu, render C++, compile and run it once in a worker, checked
    against the float reference.

    ``timing`` (kernels.timing.measure keyword arguments) also times the kernel in the worker;
    ``inputs`` replaces the random inputs (float32 arrays in the graph's input order); ``env``
    is the worker's environment for this job (e.g. OMP_NUM_THREADS).
    """
    spec = resolve_spec("cpu")
    bound, _, _ = concretize(graph, config, spec)
    plan = lower(graph, config, spec, name)
    return check_plan(plan, bound, seed=seed, timing=timing, worker=worker,
                      timeout_s=timeout_s, inputs=inputs, env=env)


def check_plan(plan: KernelPlan, bound: KernelGraph, *, source: str | None = None,
               seed: int = 0, timing: dict | None = None, worker: IsolatedWorker | None = None,
               timeout_s: float = 60.0, inputs: Sequence[np.ndarray] | None = None,
               env: Mapping[str, str | None] | None = None) -> BuildResult:
    """Run ``plan`` (any device's plan prints correctly in C++) on the cpu against the float
    reference of ``bound``, the concrete graph it was lowered from.  ``source`` replaces the
    C++ rendering (any text with the same entry point)."""
    source = source if source is not None else render(plan, "cpp")
    xs = [np.ascontiguousarray(x, np.float32) for x in inputs] if inputs is not None \
        else random_inputs(bound, seed)
    expected = [e.astype(np.float32) for e in reference(bound, xs)]
    rtol, atol = tolerance("float32")
    # A float32 sum of K terms errs by about sqrt(K)·eps·Σ|terms|, which near a cancellation
    # is far above rtol·|result|: errors are judged against the output's magnitude as well.
    scale = max((float(np.max(np.abs(e[np.isfinite(e)]), initial=0.0)) for e in expected),
                default=0.0)
    atol = max(atol, rtol * scale)
    job = {"source": source, "inputs": xs, "outputs": [tuple(b.shape) for b in plan.outputs],
           "expected": expected, "rtol": rtol, "atol": atol, "timing": timing,
           "env": dict(env or {})}
    res = run_isolated(job, timeout_s, worker)
    return BuildResult(res.status, res.message, plan, source, res.payload.get("library"),
                       list(res.payload.get("max_abs_err", [])),
                       list(res.payload.get("outputs", [])), res.payload.get("timing"))


class CpuKernel:
    """A compiled plan called in this process through ctypes.

    Only for kernels that already passed ``build_cpu``'s isolated check: a faulty kernel here
    would take this process down with it.
    """

    def __init__(self, plan: KernelPlan, library: str | Path | None = None) -> None:
        self.plan = plan
        self.library = Path(library) if library else compile_cpp(render(plan, "cpp"))
        self._fn = ctypes.CDLL(str(self.library)).kernel
        fptr = ctypes.POINTER(ctypes.c_float)
        self._fn.argtypes = [ctypes.POINTER(fptr), ctypes.POINTER(fptr)]
        self._fn.restype = None
        self._fptr = fptr

    def __call__(self, *inputs: np.ndarray, outputs: Sequence[np.ndarray] | None = None
                 ) -> list[np.ndarray]:
        want = [tuple(b.shape) for b in self.plan.inputs]
        if len(inputs) != len(want):
            raise ValueError(f"{self.plan.name}: expected {len(want)} inputs, got {len(inputs)}")
        xs = [np.ascontiguousarray(x, np.float32) for x in inputs]
        for i, (x, s) in enumerate(zip(xs, want, strict=True)):
            if x.shape != s:
                raise ValueError(f"{self.plan.name}: input {i} has shape {x.shape}, expected {s}")
        outs = list(outputs) if outputs is not None else [
            np.empty(b.shape, np.float32) for b in self.plan.outputs]
        for i, (o, b) in enumerate(zip(outs, self.plan.outputs, strict=True)):
            if o.dtype != np.float32 or o.shape != b.shape or not o.flags.c_contiguous:
                raise ValueError(f"{self.plan.name}: output {i} must be a C-contiguous float32 "
                                 f"array of shape {b.shape}")
        ins = (self._fptr * max(1, len(xs)))(*[x.ctypes.data_as(self._fptr) for x in xs])
        ous = (self._fptr * max(1, len(outs)))(*[o.ctypes.data_as(self._fptr) for o in outs])
        self._fn(ins, ous)
        return outs
