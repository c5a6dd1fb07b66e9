"""Property checks of the float and finite-field arithmetics (verifier/float_arith.py,
verifier/field_arith.py)."""

from __future__ import annotations

import time
from fractions import Fraction

import numpy as np
import pytest

from verifier import FLOAT_MATMUL_MAX_K, FieldArith, FloatArith, G, P, Q, build_tables, field_arith

F = FieldArith()
R = FloatArith()
MODS = (P, Q)


def _is_prime(n: int) -> bool:
    # Deterministic Miller–Rabin for n < 3.3e24 with these bases.
    if n < 2:
        return False
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    if n in bases:
        return True
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _field(rng: np.random.Generator, *shape: int, nonzero: bool = False) -> np.ndarray:
    lo = 1 if nonzero else 0
    return np.stack([rng.integers(lo, m, size=shape) for m in MODS])


def _eq(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a, b))


# ---------------------------------------------------------------- constants


def test_primes_and_generator():
    assert _is_prime(Q) and _is_prime(P) and P == 2 * Q + 1
    assert Q % 4 == 3 and P % 4 == 3 and Q < 2**20
    # Q is the largest prime below 2**20 with these properties (the documented search).
    q = 2**20 - 1
    while not (q % 4 == 3 and _is_prime(q) and _is_prime(2 * q + 1)):
        q -= 1
    assert q == Q
    assert G % P != 1 and pow(G, Q, P) == 1  # order exactly Q (Q prime)


def test_float_matmul_threshold_is_tight():
    assert FLOAT_MATMUL_MAX_K * (P - 1) ** 2 < 2**53 <= (FLOAT_MATMUL_MAX_K + 1) * (P - 1) ** 2


def test_tables_complete_and_fast():
    inv, sqrt = field_arith._tables()
    for off, m in ((0, P), (P, Q)):
        x = np.arange(m, dtype=np.int64)
        iv = inv[off : off + m].astype(np.int64)
        assert iv[0] == 0 and np.all(x[1:] * iv[1:] % m == 1)
        s = sqrt[off : off + m].astype(np.int64)
        sq = s * s % m
        legendre = np.array([pow(int(v), (m - 1) // 2, m) for v in x[1:4000]])
        # x**((m+1)/2) = x * legendre(x): the square for residues, minus it for non-residues.
        assert np.all((sq[1:4000] == x[1:4000]) == (legendre == 1))
        assert np.all((sq == x) | (sq == (m - x) % m))
    assert np.array_equal(field_arith._exp_table()[:5], [1, 4, 16, 64, 256])
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        field_arith._inv_sqrt_tables(P), field_arith._inv_sqrt_tables(Q), field_arith._powers(G, P, Q)
        best = min(best, time.perf_counter() - t)
    assert best < 0.3, f"table build took {best:.3f} s"


# ---------------------------------------------------------------- field laws


def test_exp_is_a_homomorphism():
    rng = np.random.default_rng(1)
    a, b = _field(rng, 4, 8, 8), _field(rng, 4, 8, 8)
    assert _eq(F.exp(F.add(a, b)), F.mul(F.exp(a), F.exp(b)))
    assert _eq(F.exp(F.sub(a, a)), np.ones_like(a))
    e = F.exp(a)
    assert np.all(e[1] == 1)
    assert np.array_equal(e[0], [[[pow(G, int(v), P) for v in row] for row in t] for t in a[1]])


def test_div_inverts_mul():
    rng = np.random.default_rng(2)
    a, b = _field(rng, 4, 16, 16), _field(rng, 4, 16, 16)
    b[:, 0, 0, :3] = 0  # some zero divisors in both components
    back = F.div(F.mul(a, b), b)
    nz = b != 0
    assert nz.sum() < b.size and np.array_equal(back[nz], a[nz])
    assert np.all(back[~nz] == 0)  # 1/0 is defined as 0


def test_sqrt_of_square():
    rng = np.random.default_rng(3)
    x = _field(rng, 4, 16, 16)
    sq = F.square(x)
    assert _eq(F.square(F.sqrt(sq)), sq)
    a, b = _field(rng, 4, 16), _field(rng, 4, 16)
    assert _eq(F.sqrt(F.mul(a, b)), F.mul(F.sqrt(a), F.sqrt(b)))  # a power map is multiplicative


def _ref_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.zeros(a.shape[:-1] + b.shape[-1:], dtype=np.int64)
    for c, m in enumerate(MODS):
        for t in range(a.shape[1]):
            for i in range(a.shape[2]):
                for j in range(b.shape[3]):
                    row = [int(v) for v in a[c, t, i]]
                    col = [int(v) for v in b[c, t, :, j]]
                    out[c, t, i, j] = sum(x * y for x, y in zip(row, col, strict=True)) % m
    return out


@pytest.mark.parametrize(
    "k", [1, 7, FLOAT_MATMUL_MAX_K, FLOAT_MATMUL_MAX_K + 1, 2 * FLOAT_MATMUL_MAX_K + 3]
)
def test_matmul_exact(k):
    rng = np.random.default_rng(k)
    a, b = _field(rng, 2, 3, k), _field(rng, 2, k, 2)
    assert _eq(F.matmul(a, b), _ref_matmul(a, b))


@pytest.mark.parametrize(
    "k", [FLOAT_MATMUL_MAX_K, FLOAT_MATMUL_MAX_K + 1, 3 * FLOAT_MATMUL_MAX_K + 1]
)
@pytest.mark.parametrize("below", [1, 2])
def test_matmul_exact_at_worst_case_values(k, below):
    # (P - 2)**2 is odd, so an odd k gives an odd dot product; above 2**53 float64 cannot hold it.
    a = np.stack([np.full((1, 2, k), m - below) for m in MODS])
    b = np.stack([np.full((1, k, 2), m - below) for m in MODS])
    expect = np.stack([np.full((1, 2, 2), k * (m - below) ** 2 % m) for m in MODS])
    assert _eq(F.matmul(a, b), expect)


def test_mean_scale_and_counts():
    rng = np.random.default_rng(4)
    a = _field(rng, 3, 5, 6)
    s = F.sum(a, -1)
    assert s.shape == (2, 3, 5, 1)
    assert _eq(F.scale(F.mean(a, -1), 6), s)
    assert _eq(s, np.stack([a[c].sum(axis=-1, keepdims=True) % m for c, m in enumerate(MODS)]))
    assert _eq(F.scale(F.scale(a, 0.5), 0.5), F.scale(a, 0.25))
    assert _eq(F.scale(F.scale(a, 0.1), 10), a)  # 0.1 is read as 1/10, not its binary value
    assert _eq(F.scale(a, -1), F.sub(np.zeros_like(a), a))
    assert _eq(F.scale(a, Fraction(3, 7)), F.div(F.scale(a, 3), F.scale(np.ones_like(a), 7)))
    n = 1_000_003  # above the float-rounding denominator limit: must still be exact
    assert _eq(F.scale(F.divide_by_count(a, n), n), a)
    assert _eq(F.sum_axes(a, (-1, -2)), F.sum(F.sum(a, -1), -2))
    with pytest.raises(ValueError, match="finite"):
        F.scale(a, float("nan"))
    with pytest.raises(ValueError, match="divisible"):
        F.divide_by_count(a, Q)


def test_non_lax_ops():
    rng = np.random.default_rng(5)
    x = _field(rng, 4, 16, 16)
    assert _eq(F.silu(x), F.mul(x, F.sigmoid(x)))
    outs = [F.sigmoid(x), F.gelu(x), F.relu(x)]
    assert _eq(FieldArith().sigmoid(x.copy()), outs[0])  # a fixed function
    for i in range(3):
        for j in range(i + 1, 3):
            assert np.mean(outs[i] == outs[j]) < 0.01  # a different function per op
    # Distinct arguments practically never collide on both components.
    keys = np.unique(rng.integers(0, P * Q, size=20000))
    y = np.stack([keys // Q, keys % Q])
    h = F.sigmoid(y)
    assert len(np.unique(h[0] * Q + h[1])) == keys.size
    # The q component must depend on x_p too, or exp(sigmoid(x)) would ignore half of x.
    z = y.copy()
    z[0] = (z[0] + 1) % P
    assert np.mean(F.sigmoid(z)[1] == h[1]) < 0.01


def test_field_values_stay_canonical_int64():
    rng = np.random.default_rng(6)
    a, b = _field(rng, 2, 4, 4), _field(rng, 2, 4, 4)
    results = [
        F.add(a, b), F.sub(a, b), F.mul(a, b), F.div(a, b), F.matmul(a, b), F.scale(a, -2.5),
        F.exp(a), F.sqrt(a), F.silu(a), F.gelu(a), F.relu(a), F.mean(a, -2),
        F.divide_by_count(a, 3),
    ]  # fmt: skip
    mod = np.array(MODS).reshape(2, 1, 1, 1)
    for r in results:
        assert r.dtype == np.int64 and np.all(r >= 0) and np.all(r < mod)


def test_field_lower_rank_operand_broadcasts_like_float():
    rng = np.random.default_rng(7)
    a, w = _field(rng, 3, 4, 4), _field(rng, 4, 4)  # w has no test axis
    assert _eq(F.add(a, w), F.add(a, w[:, None]))
    assert _eq(F.matmul(a, w), F.matmul(a, np.broadcast_to(w[:, None], a.shape)))


# ---------------------------------------------------------------- float laws


def test_float_ops():
    rng = np.random.default_rng(8)
    x, y = R.random_inputs([(3, 5), (5, 4)], 2, rng)
    assert np.allclose(R.matmul(x, y), np.einsum("tik,tkj->tij", x, y))
    assert np.allclose(R.mean(x, -1), x.sum(-1, keepdims=True) / 5)
    assert np.allclose(R.sum_axes(x, (-1, -2)), x.sum((-1, -2), keepdims=True))
    assert np.allclose(R.divide_by_count(x, 4), x / 4)
    assert np.allclose(R.scale(R.scale(x, 0.5), 0.5), R.scale(x, Fraction(1, 4)))
    assert np.allclose(R.exp(R.add(x, x)), R.mul(R.exp(x), R.exp(x)))
    assert np.allclose(R.sqrt(R.square(x)), np.abs(x))
    assert np.allclose(R.div(R.mul(x, x), x), x)
    assert np.allclose(R.sigmoid(x), 1 / (1 + np.exp(-x)))
    assert np.allclose(R.silu(x), x / (1 + np.exp(-x)))
    assert np.allclose(R.relu(x), np.where(x > 0, x, 0))
    assert abs(R.gelu(np.array(1.0)) - 0.8411919906) < 1e-9  # tanh approximation
    with np.errstate(all="raise"):
        assert np.allclose(R.sigmoid(np.array([-1000.0, 0.0, 1000.0])), [0.0, 0.5, 1.0])


def test_tests_equal_tolerance_and_nan():
    a = np.array([[1.0, 1e6], [np.nan, np.inf], [1.0, 2.0]])
    b = a.copy()
    b[0, 1] *= 1 + 1e-8
    b[2, 0] += 1e-4
    assert R.tests_equal(a, b, 3).tolist() == [True, True, False]
    assert R.max_error(a, b) == pytest.approx(1e-4 / (1 + 1.0001), rel=1e-9)
    assert R.max_error(a, a) == 0.0
    c = a.copy()
    c[1, 0] = 0.0
    assert R.max_error(a, c) == np.inf and not R.tests_equal(a, c, 3)[1]


# ---------------------------------------------------------------- shared behaviour


@pytest.mark.parametrize("ar", [F, R], ids=["field", "float"])
def test_random_inputs_shapes_and_determinism(ar):
    shapes = [(4, 8), (8,), (2, 3, 5)]
    xs = ar.random_inputs(shapes, 5, np.random.default_rng(9))
    ys = ar.random_inputs(shapes, 5, np.random.default_rng(9))
    zs = ar.random_inputs(shapes, 5, np.random.default_rng(10))
    lead = (2,) if ar is F else ()
    assert [x.shape for x in xs] == [(*lead, 5, *s) for s in shapes]
    assert all(np.array_equal(x, y) for x, y in zip(xs, ys, strict=True))
    assert not any(np.array_equal(x, z) for x, z in zip(xs, zs, strict=True))
    with pytest.raises(ValueError, match="positive"):
        ar.random_inputs([(4, 0)], 5, np.random.default_rng(0))
    with pytest.raises(ValueError, match="tests"):
        ar.random_inputs([(4,)], 0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="negative"):
        ar.sum(xs[0], 0)


def test_random_input_ranges():
    (f,) = F.random_inputs([(64, 64)], 4, np.random.default_rng(11))
    assert f.dtype == np.int64 and f[0].max() >= Q and f[0].max() < P and f[1].max() < Q
    assert f.min() >= 0
    (r,) = R.random_inputs([(64, 64)], 4, np.random.default_rng(11))
    assert np.all((np.abs(r) >= 0.5) & (np.abs(r) <= 1.5))
    assert 0.4 < np.mean(r > 0) < 0.6


@pytest.mark.parametrize("ar", [F, R], ids=["field", "float"])
def test_tests_equal_flags_one_flipped_element(ar):
    (a,) = ar.random_inputs([(6, 6)], 5, np.random.default_rng(12))
    b = a.copy()
    assert ar.tests_equal(a, b, 5).tolist() == [True] * 5 and ar.max_error(a, b) == 0.0
    idx = (1, 3, 2, 4) if ar is F else (3, 2, 4)  # field: only the q component differs
    b[idx] = b[idx] + 1 if ar is F else -b[idx]
    assert ar.tests_equal(a, b, 5).tolist() == [True, True, True, False, True]
    assert ar.max_error(a, b) > 0
    with pytest.raises(ValueError, match="test axis"):
        ar.tests_equal(a, b, 4)
    with pytest.raises(ValueError, match="shapes differ"):
        ar.tests_equal(a, b[..., :3], 5)


def test_small_graph_is_fast():
    rng = np.random.default_rng(13)
    x, w, y = F.random_inputs([(16, 16)] * 3, 8, rng)
    build_tables()

    def graph():
        a = F.exp(F.matmul(x, w))
        c = F.div(a, F.sum(a, -1))
        e = F.div(x, F.sqrt(F.mean(F.square(x), -1)))
        k = F.matmul(F.scale(F.add(F.silu(e), c), 0.5), y)
        return F.tests_equal(k, k, 8)

    best = float("inf")
    for _ in range(30):
        t = time.perf_counter()
        graph()
        best = min(best, time.perf_counter() - t)
    assert best < 2e-3, f"a 13-op graph took {best * 1e3:.2f} ms"


def test_reductions_over_the_first_dim_without_a_test_axis():
    """The kernels' float reference, the library path and the baseline run one value with no
    test axis: a sum or mean over a tensor's first dim must work there (it once raised)."""
    from search import new_kernel_graph
    from verifier import run

    g = new_kernel_graph()
    x = g.new_input((6, 4), "float32")
    g.mark_output(g.mean(g.sum(x, 1), 0))
    value = np.arange(24.0).reshape(6, 4)
    (out,) = run(g, [value], R)
    assert out.shape == (1, 1) and out[0, 0] == pytest.approx(value.sum() / 6)
    assert R.sum(value, -2).shape == (1, 4)
    with pytest.raises(ValueError, match="negative tensor-dim index"):
        R.sum(value, -3)  # past the tensor's dims
    with pytest.raises(ValueError, match="negative tensor-dim index"):
        F.sum(np.zeros((2, 6, 4), np.int64), -3)  # into the field's component axis
