"""The interface of the arithmetics the µGraph interpreter runs over, and what they share.

Two implement it: the float64 reference (``verifier.float_arith.FloatArith``) and a finite field
(``verifier.field_arith.FieldArith``).  A value is a plain ``np.ndarray``: ``lead``
arithmetic-specific axes, then opaque batch axes (tests, grid, loop) owned by the interpreter,
then the tensor dims. Tensor dims are always addressed by negative axis numbers, so the
interpreter never needs to know ``lead``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

__all__ = ["Arithmetic"]


class Arithmetic(ABC):
    """One way of evaluating tensor ops on numpy arrays with ``lead`` private leading axes."""

    name: str
    lead: int

    @abstractmethod
    def random_inputs(
        self, shapes: Sequence[tuple[int, ...]], tests: int, rng: np.random.Generator
    ) -> list[np.ndarray]:
        """One value per shape, with axes (*lead axes, tests, *shape)."""

    @abstractmethod
    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray: ...
    @abstractmethod
    def sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray: ...
    @abstractmethod
    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray: ...
    @abstractmethod
    def div(self, a: np.ndarray, b: np.ndarray) -> np.ndarray: ...
    @abstractmethod
    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray: ...
    @abstractmethod
    def scale(self, a: np.ndarray, c: float | Fraction) -> np.ndarray: ...
    @abstractmethod
    def shift(self, a: np.ndarray, c: float | Fraction) -> np.ndarray:
        """a + c for a numeric constant c (add_scalar, rms_norm's epsilon)."""
    @abstractmethod
    def exp(self, a: np.ndarray) -> np.ndarray: ...
    @abstractmethod
    def sqrt(self, a: np.ndarray) -> np.ndarray: ...
    @abstractmethod
    def rsqrt(self, a: np.ndarray) -> np.ndarray: ...
    @abstractmethod
    def sigmoid(self, a: np.ndarray) -> np.ndarray: ...
    @abstractmethod
    def tanh(self, a: np.ndarray) -> np.ndarray: ...
    @abstractmethod
    def gelu(self, a: np.ndarray) -> np.ndarray: ...
    @abstractmethod
    def relu(self, a: np.ndarray) -> np.ndarray: ...
    @abstractmethod
    def sum_axes(self, a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray: ...
    @abstractmethod
    def divide_by_count(self, a: np.ndarray, n: int) -> np.ndarray: ...
    @abstractmethod
    def tests_equal(self, a: np.ndarray, b: np.ndarray, tests: int) -> np.ndarray: ...
    @abstractmethod
    def max_error(self, a: np.ndarray, b: np.ndarray) -> float: ...

    # -- zero divisors: a test whose divisor is 0 proves nothing ------------------------------
    def begin(self, tests: int) -> None:
        """Start a run of ``tests`` random tests: forget the zero divisors of any earlier run.
        An arithmetic that maps 1/0 to a value (the finite field) records them from here on;
        the float reference has nothing to record."""
        return None

    def untrusted(self, tests: int) -> np.ndarray:
        """bool of shape (*lead, tests): True where a part of a test of the current run met a
        zero divisor, directly or through a value computed from one, so that its result is
        not evidence of equivalence.  A test counts only where its first part (index 0 on the
        lead axes) is trusted; the other parts are then compared only where trusted too.
        All False by default: the float reference has no such event (1/0 is inf there)."""
        return np.zeros((1,) * self.lead + (tests,), dtype=bool)

    def square(self, a: np.ndarray) -> np.ndarray:
        return self.mul(a, a)

    def neg(self, a: np.ndarray) -> np.ndarray:
        """−x as x·(−1) in both arithmetics (exact in the field)."""
        return self.scale(a, -1)

    def silu(self, a: np.ndarray) -> np.ndarray:
        """x·sigmoid(x) in both arithmetics, so that identity survives into the field."""
        return self.mul(a, self.sigmoid(a))

    def sum(self, a: np.ndarray, axis: int) -> np.ndarray:
        return self.sum_axes(a, (axis,))

    def mean(self, a: np.ndarray, axis: int) -> np.ndarray:
        self._check_axes(a, (axis,))
        return self.divide_by_count(self.sum_axes(a, (axis,)), a.shape[axis])

    def _check_axes(self, a: np.ndarray, axes: tuple[int, ...]) -> None:
        # Positive axes would silently land on the private leading axes; refuse them, and
        # negative ones reaching into them.  A test axis is optional: the float reference of
        # the kernels' check, the library path and the baseline run one value, no test axis,
        # and a sum over a tensor's first dim must work there too.
        for ax in axes:
            if not isinstance(ax, (int, np.integer)) or ax >= 0 or -ax > a.ndim - self.lead:
                raise ValueError(
                    f"{self.name} arithmetic: axis {ax!r} must be a negative tensor-dim index "
                    f"(between -1 and {-(a.ndim - self.lead)}) for a value of shape {a.shape}"
                )

    def _test_rows(self, a: np.ndarray, b: np.ndarray, tests: int) -> tuple[np.ndarray, ...]:
        """Both values reshaped to (tests, everything else), after shape checks."""
        if a.shape != b.shape:
            raise ValueError(f"{self.name} tests_equal: shapes differ, {a.shape} vs {b.shape}")
        if a.ndim <= self.lead or a.shape[self.lead] != tests:
            raise ValueError(
                f"{self.name} tests_equal: axis {self.lead} of shape {a.shape} should be the "
                f"test axis of size {tests}"
            )
        return tuple(np.moveaxis(x, self.lead, 0).reshape(tests, -1) for x in (a, b))

    @staticmethod
    def _check_count(n: int) -> None:
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"divide_by_count: n must be a positive int, got {n!r}")

    @staticmethod
    def _check_random_args(shapes: Sequence[tuple[int, ...]], tests: int) -> None:
        if not isinstance(tests, (int, np.integer)) or tests < 1:
            raise ValueError(f"random_inputs: tests must be a positive int, got {tests!r}")
        for i, s in enumerate(shapes):
            if not all(isinstance(d, (int, np.integer)) and d >= 1 for d in s):
                raise ValueError(
                    f"random_inputs: shape #{i} {s!r} must be a tuple of positive ints"
                )
