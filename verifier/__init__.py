"""Equivalence of µGraphs by random tests over a finite field (and the float reference)."""

from .arith import Arithmetic
from .conditioning import input_roles, real_scale_inputs, well_conditioned
from .equiv import DEFAULT_TESTS, Verdict, equivalent
from .field_arith import FLOAT_MATMUL_MAX_K, FieldArith, G, P, Q, build_tables
from .float_arith import FloatArith
from .interp import run

__all__ = ["DEFAULT_TESTS", "FLOAT_MATMUL_MAX_K", "G", "P", "Q", "Arithmetic", "FieldArith",
           "FloatArith", "Verdict", "build_tables", "equivalent", "input_roles",
           "real_scale_inputs", "run", "well_conditioned"]
