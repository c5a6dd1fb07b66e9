"""The numeric check every device runs on every newly built kernel, at every shape.

A kernel's outputs are compared with the float64 reference interpreter (``verifier.run`` over
``FloatArith``) run on the *program's* reference graph — never the structure the kernel came
from, so a structure or a config can never be wrong in the same way as its check.  The
tolerance follows the dtype the device computes in, and the absolute tolerance grows with the
largest output, so long reductions are judged fairly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from search.ir import KernelGraph
from verifier import FloatArith, run

# (rtol, atol) by the dtype a kernel's outputs are stored in: every device computes in float32
# and stores a program's inputs and outputs in its dtype (float16/bfloat16 on the CPU too).
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


@dataclass(frozen=True)
class Expected:
    """What a kernel must produce: float32 outputs and the tolerance to judge them by."""

    outputs: list[np.ndarray]
    rtol: float
    atol: float


def expected(graph: KernelGraph, inputs: Sequence[np.ndarray], compute_dtype: str) -> Expected:
    """The reference outputs of ``graph`` on ``inputs`` with the tolerance of ``compute_dtype``.

    A float32 sum of K terms errs by about sqrt(K)·eps·Σ|terms|, which near a cancellation is
    far above rtol·|result|: the absolute tolerance is at least rtol × the largest |output|."""
    outs = [e.astype(np.float32) for e in reference(graph, inputs)]
    rtol, atol = tolerance(compute_dtype)
    scale = max((float(np.max(np.abs(e[np.isfinite(e)]), initial=0.0)) for e in outs),
                default=0.0)
    return Expected(outs, rtol, max(atol, rtol * scale))
