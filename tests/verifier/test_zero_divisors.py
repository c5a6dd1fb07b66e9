"""A test in which a divisor is zero proves nothing.

The finite field maps 1/0 to 0 to stay total, so a structure that divides by an identically
zero expression computed 0·(1/0 := 0) = 0 and matched a reference whose output is 0
(random_5814 of the dataset: per for-loop chunk centring and rms_norm, which at a chunk of one
column is 0/0, NaN in the built kernel, but was "equivalent" in the field).  The verifier now
drops such tests and redraws them, and says so when a divisor is zero on every draw."""

from __future__ import annotations

import numpy as np
import pytest

from search import HANDWRITTEN, KernelGraph, new_block_graph, new_kernel_graph, parse_program
from verifier import FieldArith, equivalent
from verifier import equiv as equiv_module

# random_5814: O is identically 0 (the mean of a centred row, normalised, is 0)
BODY_5814 = "T0 = mean(X, 1)\n  T1 = sub(X, T0)\n  T2 = rms_norm(T1)\n  O = mean(T2, 1)"


def _program(body: str, inputs: str = "X: [32, 16]", dtype: str = "bfloat16") -> KernelGraph:
    return parse_program(f"name: t\ndtype: {dtype}\ninputs:\n  {inputs}\n"
                         f"body: |\n  {body}\noutputs: [O]\n").build()


def _chunked_5814(grid: int, loop: int) -> KernelGraph:
    """The structure the search found for random_5814: each for-loop chunk of a row is
    centred and rms-normalised on its own, and the chunks' means are averaged.  Equivalent
    while a chunk has ≥ 2 columns; at 1 column the chunk centred is exactly 0 and rms_norm
    divides 0 by sqrt(mean(0²)) = 0."""
    g = new_kernel_graph()
    X = g.new_input((32, 16), "bfloat16", "X")
    bg = new_block_graph((grid,), loop)
    x = bg.new_input(X, imap=(0,), fmap=1)
    centred = bg.sub(x, bg.mean(x, 1))
    bg.new_output(bg.forloop_accum(bg.rms_norm(centred), "mean"), omap=(0,))
    g.mark_output(g.graph_kernel(bg)[0])
    return g


def test_a_structure_dividing_by_an_identically_zero_expression_is_not_equivalent():
    reference = _program(BODY_5814)
    v = equivalent(reference, _chunked_5814(4, 16), tests=2)  # run_trial's field check
    assert not v.equivalent
    assert "a divisor is zero on every random input" in v.reason
    assert "the candidate divides by an expression that is identically zero" in v.reason
    assert v.inconclusive == equiv_module.ZERO_DIVISOR_ROUNDS * 2
    v = equivalent(reference, _chunked_5814(4, 16))
    assert not v.equivalent and "identically zero" in v.reason


@pytest.mark.parametrize("loop", [1, 2, 8])
def test_the_same_structure_with_chunks_of_several_columns_still_verifies(loop):
    v = equivalent(_program(BODY_5814), _chunked_5814(4, loop))
    assert v.equivalent, v.reason
    assert v.inconclusive == 0 and v.max_error == 0


def test_the_searched_structure_is_rejected_at_a_chunk_of_one_column():
    """The same case through the structure JSON's symbols, as run_trial binds them."""
    g = new_kernel_graph()
    X = g.new_input((32, 16), "bfloat16", "X")
    bg = new_block_graph(("g0",), "F")
    x = bg.new_input(X, imap=(0,), fmap=1)
    bg.new_output(bg.forloop_accum(bg.rms_norm(bg.sub(x, bg.mean(x, 1))), "mean"), omap=(0,))
    g.mark_output(g.graph_kernel(bg)[0])
    reference = _program(BODY_5814)
    assert equivalent(reference, g, config={"g0": 4, "F": 8}, tests=2).equivalent
    assert not equivalent(reference, g, config={"g0": 4, "F": 16}, tests=2).equivalent


def test_a_reference_that_divides_by_zero_is_named():
    v = equivalent(_program("O = rms_norm(X - X)"), _program("O = X - X"))
    assert not v.equivalent and "the reference divides by" in v.reason


def test_inverse_records_zero_divisors_per_test_and_component():
    ar = FieldArith()
    a = np.ones((2, 3, 4), dtype=np.int64)
    a[0, 1, 2] = 0  # test 1, p component
    a[1, 2, 0] = 0  # test 2, q component
    ar.begin(3)
    assert (ar.inverse(a)[a == 0] == 0).all()
    assert ar.zero_divisors == 2
    assert ar.untrusted(3).tolist() == [[False, True, False], [False, False, True]]
    ar.exp(a)  # exp reads the q part to make the p part: test 2's p part is now suspect too
    assert ar.untrusted(3).tolist() == [[False, True, True], [False, True, True]]
    ar.begin(3)
    assert ar.zero_divisors == 0 and not ar.untrusted(3).any()


class _ZeroFirstTest(FieldArith):
    """Field arithmetic whose first draw has X = 0 in test 0 (a chance zero divisor)."""

    draws = 0

    def random_inputs(self, shapes, tests, rng):
        values = super().random_inputs(shapes, tests, rng)
        if type(self).draws == 0:
            values[0][:, 0] = 0
        type(self).draws += 1
        return values


def test_a_chance_zero_divisor_is_redrawn(monkeypatch):
    monkeypatch.setitem(equiv_module.ARITHMETICS, "field", _ZeroFirstTest)
    ref = _program("O = rms_norm(X)", "X: [4, 16]", "float32")
    good = _program("O = X / sqrt(mean(X * X, -1))", "X: [4, 16]", "float32")
    bad = _program("O = X / sqrt(sum(X * X, -1))", "X: [4, 16]", "float32")
    _ZeroFirstTest.draws = 0
    v = equivalent(ref, good)
    assert v.equivalent, v.reason
    assert v.inconclusive == 1 and "1 more dropped" in v.reason and _ZeroFirstTest.draws == 2
    _ZeroFirstTest.draws = 0
    v = equivalent(ref, bad)
    assert not v.equivalent and "differs from reference output 0 in 4/4 tests" in v.reason


def test_a_divisor_zero_only_in_the_exp_free_part_still_verifies():
    """exp's q component is 1, so exp(X) - exp(2X) is 0 mod q on every input though not in
    the reals: those tests still count on their p component, which sees exp faithfully."""
    inputs = "X: [4, 16]\n  Y: [4, 16]"
    ref = _program("O = Y / (exp(X) - exp(2 * X))", inputs, "float32")
    same = _program("O = (Y + Y) / (2 * exp(X) - 2 * exp(X + X))", inputs, "float32")
    other = _program("O = Y / (exp(X) - exp(3 * X))", inputs, "float32")
    v = equivalent(ref, same)
    assert v.equivalent and v.inconclusive == 0, v.reason
    assert not equivalent(ref, other).equivalent


@pytest.mark.parametrize("name", ["rmsnorm_matmul", "rmsnorm_residual"])
def test_handwritten_norm_structures_meet_no_zero_divisor(name):
    from search import load_program, small_instance

    program = small_instance(load_program(name))
    structure = HANDWRITTEN[name](program)
    for value in (1, 2):
        v = equivalent(program.build(), structure,
                       config={s: value for s in structure.symbols()}, tests=8)
        assert v.equivalent and v.inconclusive == 0, v.reason
