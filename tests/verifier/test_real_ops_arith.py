"""The ops real model blocks use (add_scalar, neg, rsqrt, tanh, rms_norm's eps) in both
arithmetics: the float reference computes what numpy does, and the finite field keeps the
identities a decomposition relies on (rsqrt = 1/sqrt, 1 - x = neg(x) + 1, eps added exactly)
while telling apart what differs (another eps, tanh vs sigmoid)."""

from __future__ import annotations

import numpy as np
import pytest

from search import KernelGraph, parse_program
from verifier import FieldArith, FloatArith, equivalent, run


def _program(body: str, shape: str = "[4, 16]") -> KernelGraph:
    return parse_program(f"name: t\ndtype: float32\ninputs:\n  X: {shape}\n"
                         f"body: |\n  {body}\noutputs: [O]\n").build()


def test_float_reference_of_each_new_op_is_numpys():
    x = np.random.default_rng(0).uniform(0.5, 1.5, (4, 16))
    cases = {
        "O = X + 1e-6": x + 1e-6, "O = 1 - X": 1 - x, "O = X - 2": x - 2, "O = -X": -x,
        "O = rsqrt(X)": 1 / np.sqrt(x), "O = tanh(X)": np.tanh(x),
        "O = rms_norm(X, eps=0.5)": x / np.sqrt((x * x).mean(-1, keepdims=True) + 0.5),
    }
    for body, want in cases.items():
        (got,) = run(_program(body), [x], FloatArith())
        np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=body)


@pytest.mark.parametrize("arithmetic", ["field", "float"])
def test_decompositions_are_equivalent(arithmetic):
    pairs = [
        ("O = rms_norm(X, eps=1e-6)", "O = X * rsqrt(mean(square(X), -1) + 1e-6)"),
        ("O = rms_norm(X, eps=1e-6)", "O = X / sqrt(mean(X * X, -1) + 1e-6)"),
        ("O = 1 - X", "O = -(X - 1)"),
        ("O = -X", "O = X * -1"),
        ("O = rsqrt(X)", "O = sqrt(X) / square(sqrt(X))"),
    ]
    for a, b in pairs:
        v = equivalent(_program(a), _program(b), arithmetic=arithmetic)
        assert v.equivalent, (a, b, v.reason)


def test_field_tells_apart_what_differs():
    pairs = [
        ("O = rms_norm(X, eps=1e-6)", "O = rms_norm(X, eps=1e-5)"),
        ("O = rms_norm(X, eps=1e-6)", "O = rms_norm(X)"),
        ("O = tanh(X)", "O = sigmoid(X)"),
        ("O = tanh(X)", "O = 2 * sigmoid(2 * X) - 1"),  # equal in float, a fixed function here
        ("O = X + 1", "O = X + 2"),
        ("O = rsqrt(X)", "O = sqrt(X)"),
    ]
    for a, b in pairs:
        v = equivalent(_program(a), _program(b), arithmetic="field")
        assert not v.equivalent, (a, b)


def test_field_rsqrt_is_the_inverse_of_sqrt_and_neg_is_exact():
    ar = FieldArith()
    (x,) = ar.random_inputs([(64,)], 3, np.random.default_rng(1))
    r = ar.rsqrt(x)
    s = ar.sqrt(x)
    ok = (s != 0)
    assert np.array_equal(ar.mul(r, s)[ok], np.ones_like(r)[ok])
    assert np.array_equal(ar.add(ar.neg(x), x), np.zeros_like(x))
    assert np.array_equal(ar.shift(ar.shift(x, 0.5), -0.5), x)
    assert not np.array_equal(ar.tanh(x), ar.sigmoid(x))
