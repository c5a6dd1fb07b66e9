"""The numeric check every device runs on every newly built kernel, at every shape.

A kernel's outputs are compared with the float64 reference interpreter (``verifier.run`` over
``FloatArith``) run on the *program's* reference graph — never the structure the kernel came
from, so a structure or a config can never be wrong in the same way as its check.  Check inputs
are at the scale of real data (``random_inputs``: activations N(0, 1), weights N(0, 1/fan_in)),
in the dtype the device stores.  The
tolerance follows the dtype the device computes in, and the absolute tolerance grows with the
largest output, so long reductions are judged fairly.

On top of that each output element has a *rounding slack* (``rounding_slack``): how far float32
rounding alone moves that element, estimated by running the reference again with every
rounding simulated as random noise.  An ill-conditioned element — ``(T1 - B) / T1`` where the
96-term dot product T1 nearly cancels (random_4748) — is undetermined in float32 to far more
than rtol, so every correct kernel missed it; its slack admits them.  A well-conditioned
element's slack is orders of magnitude below rtol·|ref|, so the check is as strict as before
there.  An element passes when ``|out - ref| <= atol + rtol·|ref| + slack``.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from search.ir import KernelGraph, to_json
from verifier import FloatArith, real_scale_inputs, run
from verifier import input_roles as input_roles  # re-exported: the roles the inputs are drawn by

# (rtol, atol) by the dtype a kernel's outputs are stored in: every device computes in float32
# and stores a program's inputs and outputs in its dtype (float16/bfloat16 on the CPU too).
TOLERANCE: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-5),
    "float16": (2e-2, 2e-3),
    "bfloat16": (5e-2, 1e-2),
}


def tolerance(dtype: str) -> tuple[float, float]:
    """(rtol, atol) for comparing outputs computed in ``dtype`` with the float64 reference."""
    try:
        return TOLERANCE[dtype]
    except KeyError:
        raise ValueError(f"tolerance: unknown dtype {dtype!r}; known: {sorted(TOLERANCE)}") \
            from None


def random_inputs(graph: KernelGraph, seed: int = 0) -> list[np.ndarray]:
    """float32 check inputs at the scale of real data, at logical shapes
    (``verifier.real_scale_inputs``: activations N(0, 1), weights N(0, 1/fan_in), divisors
    0.5 + |N(0, 1)|).  A transposed input is drawn at its logical shape too (``as_stored``
    gives its memory)."""
    rng = np.random.default_rng(seed)
    return [x[0].astype(np.float32) for x in real_scale_inputs(graph, 1, rng)]


def input_layouts(graph: KernelGraph) -> list[str]:
    """Each program input's layout (``search.ir.LAYOUTS``), in input order."""
    return [graph.input_layout(t) for t in graph.input_ids]


def as_stored(inputs: Sequence[np.ndarray], layouts: Sequence[str]) -> list[np.ndarray]:
    """Logical inputs as the arrays a kernel takes: a transposed input becomes the contiguous
    transpose of its last two dims (what ``W.t()`` of a Linear weight holds)."""
    return [np.ascontiguousarray(np.swapaxes(x, -1, -2)) if lay == "transposed" else x
            for x, lay in zip(inputs, layouts, strict=True)]


def as_logical(inputs: Sequence[np.ndarray], layouts: Sequence[str]) -> list[np.ndarray]:
    """Stored arrays back at their logical shapes (a view, no copy): what the reference
    interpreter reads."""
    return [np.swapaxes(x, -1, -2) if lay == "transposed" else x
            for x, lay in zip(inputs, layouts, strict=True)]


def reference(graph: KernelGraph, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The float64 reference outputs of a concrete graph on (float32) inputs."""
    return [np.asarray(o, np.float64) for o in
            run(graph, [np.asarray(x, np.float64) for x in inputs], FloatArith())]


# The rounding slack (``rounding_slack``).  Every device computes in float32 (half programs
# store in half but compute in float32): a result is rounded to within a relative 2^-24.
ROUNDING_UNIT = 2.0 ** -24
# Draws of the simulated rounding: the slack is SLACK_SAFETY x their RMS deviation from the
# reference.  A kernel's error at an element is one more draw of that kind of noise at worst
# (the noise model's sums are sequential; blocked and vector sums err less: random_4748's
# kernels by 0.1 - 0.6 of the model's RMS), so it exceeds SAFETY x RMS with the probability
# that a Student t with DRAWS degrees of freedom exceeds SAFETY: 0.4 % for 8 draws and 4.
# Fewer draws make the RMS itself unreliable (4 draws of one seed put it at 0.28 of the
# model's at random_4748's element; 8 draws of 40 seeds at 0.6 - 1.6 of it, so a slack of
# 190 - 510 there, where kernels err by 7 - 50); each draw costs about one reference run.
SLACK_DRAWS = 8
SLACK_SAFETY = 4.0
SLACK_SEED = 24  # seeded: the same program and inputs get the same slack everywhere


class _Float32Rounding(FloatArith):
    """The float64 reference with float32 rounding simulated as random noise (Monte Carlo
    arithmetic): every result is scaled by (1 + δ), δ uniform in ±2^-24, and every term of a
    K-term sum (matmul, sum, mean) by (1 + √K·δ).  The √K is accumulation: a float32 sum
    rounds each partial sum, so a term's error is carried through up to K roundings, which
    random signs add to about √K·eps per term — a near-cancelling sum is off by about
    eps·K·rms(term), far more than eps·|sum|.  Relu is exact, so it takes no noise."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng

    def _rounded(self, x: np.ndarray, unit: float = ROUNDING_UNIT) -> np.ndarray:
        x = np.asarray(x, np.float64)
        delta = self._rng.random(x.shape, dtype=np.float32)  # float32 noise: half the cost
        delta -= np.float32(0.5)
        delta *= np.float32(2.0 * unit)
        return x + x * delta  # in float64: 1 + delta would round back to 1 in float32

    def _terms(self, a: np.ndarray, k: int) -> np.ndarray:
        return self._rounded(a, ROUNDING_UNIT * float(np.sqrt(k)))

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._rounded(super().matmul(self._terms(a, a.shape[-1]), b))

    def sum_axes(self, a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        k = int(np.prod([a.shape[ax] for ax in axes]))
        return self._rounded(super().sum_axes(self._terms(a, k), axes))


def _rounds(name: str):
    """``FloatArith``'s op ``name`` with its result rounded (``_Float32Rounding._rounded``)."""
    exact = getattr(FloatArith, name)

    def op(self: _Float32Rounding, *args):
        return self._rounded(exact(self, *args))
    op.__name__ = name
    return op


# every op that rounds its result once (relu is exact; matmul and the sums above round terms)
for _name in ("add", "sub", "mul", "div", "scale", "shift", "exp", "sqrt", "rsqrt", "tanh",
              "sigmoid", "gelu", "divide_by_count"):
    setattr(_Float32Rounding, _name, _rounds(_name))


def rounding_slack(graph: KernelGraph, inputs: Sequence[np.ndarray],
                   outputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Per output element, how far float32 rounding may move it from the float64 ``outputs``
    (the reference of ``graph`` on ``inputs``): SLACK_SAFETY x the RMS deviation of
    SLACK_DRAWS runs under ``_Float32Rounding``, as float32.  An element whose reference or
    draws are not finite gets none (judged as before); a slack beyond float32's range is
    float32's largest value, which admits any finite output: the element is undetermined."""
    arith = _Float32Rounding(np.random.default_rng(SLACK_SEED))
    xs = [np.asarray(x, np.float64) for x in inputs]
    squares = [np.zeros(np.shape(o)) for o in outputs]
    with np.errstate(all="ignore"):  # overflow in a draw: no slack there
        for _ in range(SLACK_DRAWS):
            for acc, draw, ref in zip(squares, run(graph, xs, arith), outputs, strict=True):
                acc += (draw - ref) ** 2
        slack = [SLACK_SAFETY * np.sqrt(acc / SLACK_DRAWS) for acc in squares]
    big = float(np.finfo(np.float32).max)
    return [np.minimum(np.where(np.isfinite(s), s, 0.0), big).astype(np.float32) for s in slack]


@dataclass(frozen=True)
class Expected:
    """What a kernel must produce: float32 outputs and the tolerance to judge them by, an
    element passing when ``|out - outputs| <= atol + rtol·|outputs| + slack``."""

    outputs: list[np.ndarray]
    rtol: float
    atol: float
    slack: list[np.ndarray]  # per element, as ``outputs``: ``rounding_slack``


# Expected outputs by (program, inputs, dtype): a tuner checks every config of every structure
# of a program against the same reference on the same inputs, one trial at a time.  The most
# recent are kept, up to _EXPECTED_CACHE_BYTES of outputs and slack (and always the latest).
_EXPECTED_CACHE: OrderedDict[tuple[str, str, str], Expected] = OrderedDict()
_EXPECTED_CACHE_BYTES = 256 << 20
_EXPECTED_LOCK = threading.Lock()


def _nbytes(want: Expected) -> int:
    return sum(a.nbytes for a in (*want.outputs, *want.slack))


def _digest(inputs: Sequence[np.ndarray]) -> str:
    """The inputs' identity for the cache: sha1, the fastest hashlib has here (3x blake2b:
    70 ms for gated_mlp's 134 MB, less than its reference run)."""
    h = hashlib.sha1(usedforsecurity=False)
    for x in inputs:
        x = np.ascontiguousarray(x)
        h.update(f"{x.shape}{x.dtype.str}".encode())
        h.update(x.data)
    return h.hexdigest()


def expected(graph: KernelGraph, inputs: Sequence[np.ndarray], compute_dtype: str) -> Expected:
    """The reference outputs of ``graph`` on ``inputs`` with the tolerance of ``compute_dtype``
    and each element's rounding slack (cached: the last few programs and inputs).

    A float32 sum of K terms errs by about sqrt(K)·eps·Σ|terms|, which near a cancellation is
    far above rtol·|result|: the absolute tolerance is at least rtol × the largest |output|,
    and an element whose whole value is such an error (a division by that sum) has its
    rounding slack."""
    key = (to_json(graph), _digest(inputs), compute_dtype)
    with _EXPECTED_LOCK:
        if key in _EXPECTED_CACHE:
            _EXPECTED_CACHE.move_to_end(key)
            return _EXPECTED_CACHE[key]
    refs = reference(graph, inputs)
    outs = [e.astype(np.float32) for e in refs]
    rtol, atol = tolerance(compute_dtype)
    scale = max((float(np.max(np.abs(e[np.isfinite(e)]), initial=0.0)) for e in outs),
                default=0.0)
    want = Expected(outs, rtol, max(atol, rtol * scale), rounding_slack(graph, inputs, refs))
    for a in (*want.outputs, *want.slack):
        a.setflags(write=False)  # shared by every caller of the cache
    with _EXPECTED_LOCK:
        _EXPECTED_CACHE[key] = want
        while (len(_EXPECTED_CACHE) > 1 and
               sum(map(_nbytes, _EXPECTED_CACHE.values())) > _EXPECTED_CACHE_BYTES):
            _EXPECTED_CACHE.popitem(last=False)
    return want
