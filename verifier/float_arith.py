"""The float64 reference arithmetic: what built kernels are compared against."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .arith import Arithmetic

__all__ = ["FloatArith"]


class FloatArith(Arithmetic):
    """float64 reference semantics.

    Inputs have magnitude uniform in [0.5, 1.5] and a random sign: nothing divides by an input
    closer to 0 than 0.5, rms denominators are ≥ 0.5, yet sign-dependent ops (relu, silu) see
    both signs. Equality: |a − b| ≤ ATOL + RTOL·|b| elementwise, NaN equal to NaN.
    """

    name = "float"
    lead = 0
    RTOL = 1e-6
    ATOL = 1e-9

    def random_inputs(
        self, shapes: Sequence[tuple[int, ...]], tests: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        self._check_random_args(shapes, tests)
        out = []
        for s in shapes:
            size = (tests, *s)
            sign = rng.integers(0, 2, size=size) * 2 - 1
            out.append(rng.uniform(0.5, 1.5, size=size) * sign)
        return out

    def add(self, a, b):
        return a + b

    def sub(self, a, b):
        return a - b

    def mul(self, a, b):
        return a * b

    def div(self, a, b):
        return a / b

    def matmul(self, a, b):
        return np.matmul(a, b)

    def scale(self, a, c):
        return a * float(c)

    def shift(self, a, c):
        return a + float(c)

    def exp(self, a):
        return np.exp(a)

    def sqrt(self, a):
        return np.sqrt(a)

    def rsqrt(self, a):
        return 1.0 / np.sqrt(a)

    def tanh(self, a):
        return np.tanh(a)

    def sigmoid(self, a):
        # Same function as 1 / (1 + e^-x), but cannot overflow for very negative x.
        return 0.5 + 0.5 * np.tanh(0.5 * a)

    def gelu(self, a):
        """The tanh approximation (what fused GPU kernels usually implement)."""
        return 0.5 * a * (1.0 + np.tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))

    def relu(self, a):
        return np.maximum(a, 0.0)

    def sum_axes(self, a, axes):
        self._check_axes(a, axes)
        return np.sum(a, axis=tuple(axes), keepdims=True)

    def divide_by_count(self, a, n):
        self._check_count(n)
        return a / n

    def tests_equal(self, a, b, tests):
        ra, rb = self._test_rows(a, b, tests)
        with np.errstate(invalid="ignore"):
            close = np.abs(ra - rb) <= self.ATOL + self.RTOL * np.abs(rb)
        # inf - inf is NaN, so equal infinities and NaN pairs are handled separately.
        close |= (ra == rb) | (np.isnan(ra) & np.isnan(rb))
        return close.all(axis=1)

    def max_error(self, a, b) -> float:
        """max |a − b| / (1 + |b|): absolute near 0, relative for large values. Equal
        infinities and NaN pairs count 0, any other NaN counts inf."""
        a, b = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(b, np.float64))
        with np.errstate(invalid="ignore"):
            err = np.abs(a - b) / (1.0 + np.abs(b))
        err[(a == b) | (np.isnan(a) & np.isnan(b))] = 0.0
        err[np.isnan(err)] = np.inf
        return float(err.max()) if err.size else 0.0
