"""Equivalence of µGraphs by random tests over a finite field (and the float reference)."""

from .arith import Arithmetic, FieldArith, FloatArith, P, Q
from .equiv import DEFAULT_TESTS, Verdict, equivalent
from .interp import run

__all__ = ["DEFAULT_TESTS", "P", "Q", "Arithmetic", "FieldArith", "FloatArith", "Verdict",
           "equivalent", "run"]
