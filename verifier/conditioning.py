"""Whether a program's float outputs stay finite and moderate on the check's inputs.

Every kernel is checked against the float64 reference on random inputs (magnitude in
[0.5, 1.5], random sign: ``FloatArith.random_inputs``) at float32 tolerance.  A program whose
reference overflows float32 (``exp`` of a long dot product), is NaN (``sqrt`` of a negative,
the norm of an exact zero) or huge (a division by a near-cancelled sum) fails that check for
every structure and config, so a generator of random programs (``search.generate``) uses this
to draw only programs whose measurements can succeed.
"""

from __future__ import annotations

import numpy as np

from search.ir import KernelGraph

from .float_arith import FloatArith
from .interp import run


def well_conditioned(graph: KernelGraph, *, seed: int = 0, tests: int = 2,
                     limit: float = 1e4) -> bool:
    """True when every output of the concrete ``graph`` is finite and at most ``limit`` in
    magnitude on ``tests`` draws of the check's input distribution."""
    rng = np.random.default_rng(seed)
    shapes = graph.input_shapes()
    ar = FloatArith()
    xs = ar.random_inputs(shapes, tests, rng)
    with np.errstate(all="ignore"):
        outs = run(graph, xs, ar)
    return all(bool(np.all(np.isfinite(o)) and np.max(np.abs(o), initial=0.0) <= limit)
               for o in outs)
