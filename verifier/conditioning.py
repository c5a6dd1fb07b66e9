"""The check's input distribution, and whether a program's float outputs stay finite and
moderate on it.

Every kernel is checked against the float64 reference on random inputs at the scale of real
data (``real_scale_inputs``: activations N(0, 1), weights N(0, 1/fan_in), divisors
0.5 + |N(0, 1)|; ``kernels.devices.random_inputs`` draws them) at the dtype's tolerance.  A program whose
reference overflows float32 (``exp`` of a long dot product), is NaN (``sqrt`` of a negative,
the norm of an exact zero) or huge (a division by a near-cancelled sum) fails that check for
every structure and config, so a generator of random programs (``search.generate``) uses this
to draw only programs whose measurements can succeed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from search.ir import Graph, KernelGraph

from .float_arith import FloatArith
from .interp import run


def input_roles(graph: KernelGraph) -> list[str]:
    """How each program input is used, which sets the scale of its check values: "weight"
    (the right operand of a matmul), "divisor" (a divisor, or under sqrt / rsqrt) or
    "activation".  Block graphs of a structure are looked into (a tile read straight from a
    kernel input counts for that input)."""
    roles = {t: "activation" for t in graph.input_ids}

    def mark(tid: int | None, role: str) -> None:
        if tid in roles and roles[tid] == "activation":
            roles[tid] = role

    def walk(g: Graph, source: Callable[[int], int | None]) -> None:
        for op in g.ops:
            if op.kind == "graph_kernel":
                bg = op.attrs["block_graph"]
                tiles = {o.outputs[0]: source(op.inputs[o.attrs["index"]])
                         for o in bg.ops_of("input")}
                walk(bg, tiles.get)
            elif op.kind == "matmul":
                mark(source(op.inputs[1]), "weight")
            elif op.kind == "div":
                mark(source(op.inputs[1]), "divisor")
            elif op.kind in ("sqrt", "rsqrt"):
                mark(source(op.inputs[0]), "divisor")

    walk(graph, lambda t: t)
    return [roles[t] for t in graph.input_ids]


def real_scale_inputs(graph: KernelGraph, tests: int, rng: np.random.Generator
                      ) -> list[np.ndarray]:
    """float64 inputs (tests, *shape) at the scale of real data: activations N(0, 1); weights
    (right operands of a matmul) N(0, 1/K) with K their fan-in (the dim the matmul
    contracts), so a product keeps unit scale as in a trained layer; divisors (and what a
    sqrt reads) 0.5 + |N(0, 1)|, as a variance is, so nothing divides by ~0."""
    out = []
    for shape, role in zip(graph.input_shapes(), input_roles(graph), strict=True):
        x = rng.standard_normal((tests, *shape))
        if role == "weight":
            x /= np.sqrt(shape[-2])
        elif role == "divisor":
            x = 0.5 + np.abs(x)
        out.append(x)
    return out


def well_conditioned(graph: KernelGraph, *, seed: int = 0, tests: int = 2,
                     limit: float = 1e4) -> bool:
    """True when every output of the concrete ``graph`` is finite and at most ``limit`` in
    magnitude on ``tests`` draws of the check's input distribution."""
    rng = np.random.default_rng(seed)
    ar = FloatArith()
    xs = real_scale_inputs(graph, tests, rng)
    with np.errstate(all="ignore"):
        outs = run(graph, xs, ar)
    return all(bool(np.all(np.isfinite(o)) and np.max(np.abs(o), initial=0.0) <= limit)
               for o in outs)
