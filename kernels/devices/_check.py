"""The numeric check every device runs on every newly built kernel, at every shape.

A kernel's outputs are compared with the float64 reference interpreter (``verifier.run`` over
``FloatArith``) run on the *program's* reference graph — never the structure the kernel came
from, so a structure or a config can never be wrong in the same way as its check.  Check inputs
are at the scale of real data (``random_inputs``: activations N(0, 1), weights N(0, 1/fan_in)),
in the dtype the device stores.  The
tolerance follows the dtype the device computes in, and the absolute tolerance grows with the
largest output, so long reductions are judged fairly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from search.ir import KernelGraph
from verifier import FloatArith, real_scale_inputs, run
from verifier import input_roles as input_roles  # re-exported: the roles the inputs are drawn by

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
    """float32 check inputs at the scale of real data, at logical shapes
    (``verifier.real_scale_inputs``: activations N(0, 1), weights N(0, 1/fan_in), divisors
    0.5 + |N(0, 1)|).  A transposed input is drawn at its logical shape too (``as_stored``
    gives its memory)."""
    rng = np.random.default_rng(seed)
    return [x[0].astype(np.float32) for x in real_scale_inputs(graph, 1, rng)]


def input_layouts(graph: KernelGraph) -> list[str]:
    """Each program input's layout (``search.ir.LAYOUTS``), in input order."""
    return [graph.input_layout(t) for t in graph.input_ids]


def as_stored(inputs: Sequence[np.ndarray], layouts: Sequence[str]) -> list[np.ndarray]:
    """Logical inputs as the arrays a kernel takes: a transposed input becomes the contiguous
    transpose of its last two dims (what ``W.t()`` of a Linear weight holds)."""
    return [np.ascontiguousarray(np.swapaxes(x, -1, -2)) if lay == "transposed" else x
            for x, lay in zip(inputs, layouts, strict=True)]


def as_logical(inputs: Sequence[np.ndarray], layouts: Sequence[str]) -> list[np.ndarray]:
    """Stored arrays back at their logical shapes (a view, no copy): what the reference
    interpreter reads."""
    return [np.swapaxes(x, -1, -2) if lay == "transposed" else x
            for x, lay in zip(inputs, layouts, strict=True)]


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
