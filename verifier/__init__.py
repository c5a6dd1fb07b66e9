"""Equivalence of µGraphs by random tests over a finite field (and the float reference)."""

from .arith import FLOAT_MATMUL_MAX_K, Arithmetic, FieldArith, FloatArith, G, P, Q, build_tables
from .conditioning import well_conditioned
from .equiv import DEFAULT_TESTS, Verdict, equivalent
from .interp import run

__all__ = ["DEFAULT_TESTS", "FLOAT_MATMUL_MAX_K", "G", "P", "Q", "Arithmetic", "FieldArith",
           "FloatArith", "Verdict", "build_tables", "equivalent", "run", "well_conditioned"]
