"""Equivalence of two µGraphs by random tests, with a verdict that says why.

Both graphs run on the same seeded random inputs, all tests batched on one axis, and outputs
are matched up to order.  The finite field is the default: a pass means the graphs agree on
``tests`` independent random points of Z_p × Z_q, which bounds the chance that inequivalent
Lax programs pass (docs/verifier.md).  The float arithmetic is the reference semantics and
the tie-breaker for humans: it shows *how far* apart two graphs are.

A test in which either graph divides by zero proves nothing (the field maps 1/0 to 0 only to
stay total): such a test is dropped and redrawn, up to ``ZERO_DIVISOR_ROUNDS`` draws of
``tests`` tests.  A divisor that is a nonzero function of the inputs is zero at a random point
with probability ≤ degree/modulus, so legitimate graphs almost never need a second draw; one
that is zero on every draw is identically zero, and the verdict says so instead of "equivalent".
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import numpy as np

from search.ir import KernelGraph, ShapeError, fmt_shape

from .arith import Arithmetic
from .field_arith import FieldArith, P, Q
from .float_arith import FloatArith
from .interp import run

ARITHMETICS: dict[str, type[Arithmetic]] = {"field": FieldArith, "float": FloatArith}
DEFAULT_TESTS = 4
# draws of ``tests`` fresh random tests while zero divisors leave fewer conclusive tests than
# asked for; a graph dividing by an identically zero expression costs this many runs
ZERO_DIVISOR_ROUNDS = 8


@dataclass
class Verdict:
    equivalent: bool
    reason: str
    arithmetic: str
    tests: int
    seed: int
    output_map: list[int] = field(default_factory=list)  # candidate output i ↔ reference j
    primes: tuple[int, int] | None = None
    max_error: float | None = None
    lax: bool = True  # both graphs in the Lax fragment (no exp of an exp): the bound holds
    inconclusive: int = 0  # tests dropped and redrawn because a divisor was zero in them

    def __bool__(self) -> bool:
        return self.equivalent

    def as_dict(self) -> dict:
        return asdict(self)


def _exp_depth_ok(graph) -> bool:
    """False when some exp reads a value that already went through exp (outside Lax)."""
    tainted: set[int] = set()
    for op in graph.ops:
        if op.kind == "graph_kernel":
            bg = op.attrs["block_graph"]
            inside: set[int] = set()
            for bop in bg.ops:
                src = ({t for t in bop.inputs if t in inside} if bop.kind != "input"
                       else ({0} if op.inputs[bop.attrs["index"]] in tainted else set()))
                if bop.kind == "exp" and src:
                    return False
                if src or bop.kind == "exp":
                    inside.update(bop.outputs)
            outs = [bop.inputs[0] for bop in bg.ops_of("output")]
            tainted.update(t for t, o in zip(op.outputs, outs, strict=True) if o in inside)
            continue
        reads_exp = any(t in tainted for t in op.inputs)
        if op.kind == "exp" and reads_exp:
            return False
        if reads_exp or op.kind == "exp":
            tainted.update(op.outputs)
    return True


def _signature(g: KernelGraph) -> list[tuple]:
    return [(g.tensors[t].shape, g.tensors[t].dtype) for t in g.input_ids]


def _match_outputs(ref: list[np.ndarray], cand: list[np.ndarray], ar: Arithmetic, tests: int
                   ) -> tuple[list[int] | None, list[list[np.ndarray]]]:
    """Candidate output i ↔ reference output perm[i], all tests equal; None if impossible."""
    agree = [[r.shape == c.shape and bool(ar.tests_equal(r, c, tests).all()) for r in ref]
             for c in cand]
    for perm in itertools.permutations(range(len(ref))):
        if all(agree[i][perm[i]] for i in range(len(cand))):
            return list(perm), []
    return None, [[r, c] for r, c in zip(ref, cand, strict=False)]


def equivalent(reference: KernelGraph, candidate: KernelGraph, *, tests: int = DEFAULT_TESTS,
               seed: int = 0, arithmetic: str = "field",
               config: Mapping[str, int] | None = None) -> Verdict:
    """Do ``reference`` and ``candidate`` compute the same outputs (up to output order)?

    ``config`` binds the candidate's grid / for-loop symbols first.  Never raises for a
    candidate that is merely wrong: the verdict carries the reason.
    """
    kind = ARITHMETICS.get(arithmetic)
    if kind is None:
        raise ValueError(f"unknown arithmetic {arithmetic!r}; use one of {sorted(ARITHMETICS)}")
    ar = kind()
    primes = (P, Q) if arithmetic == "field" else None

    def verdict(ok: bool, reason: str, **kw) -> Verdict:
        return Verdict(ok, reason, arithmetic, tests, seed, primes=primes, **kw)

    try:
        if config is not None:
            candidate = candidate.bind(config)
        if candidate.symbols():
            return verdict(False, f"candidate has unbound symbols {sorted(candidate.symbols())};"
                                  " pass a config")
    except ShapeError as err:
        return verdict(False, f"candidate cannot be bound to config {dict(config or {})}: {err}")
    if _signature(reference) != _signature(candidate):
        show = lambda g: [f"{fmt_shape(s)} {d}" for s, d in _signature(g)]  # noqa: E731
        return verdict(False, f"input signatures differ: reference {show(reference)}, "
                              f"candidate {show(candidate)}")
    ref_shapes = sorted(map(str, (reference.tensors[t].shape for t in reference.output_ids)))
    cand_shapes = sorted(map(str, (candidate.tensors[t].shape for t in candidate.output_ids)))
    if ref_shapes != cand_shapes:
        return verdict(False, f"output shapes differ: reference {ref_shapes}, "
                              f"candidate {cand_shapes}")
    ref_out, cand_out, dropped, blame = _conclusive_runs(reference, candidate, ar, tests,
                                                         np.random.default_rng(seed))
    n = ref_out[0].shape[ar.lead] if ref_out else tests  # conclusive tests compared
    perm, _ = _match_outputs(ref_out, cand_out, ar, n) if n else (None, [])
    lax = _exp_depth_ok(reference) and _exp_depth_ok(candidate)
    if perm is not None and n == tests:
        worst = max((ar.max_error(ref_out[perm[i]], c) for i, c in enumerate(cand_out)),
                    default=0.0)
        note = "" if lax or arithmetic != "field" else (
            " (outside the Lax fragment: exp of exp, the false-positive bound does not apply)")
        redrawn = f" ({dropped} more dropped: a divisor was zero in them)" if dropped else ""
        return verdict(True, f"all {len(cand_out)} output(s) agree on {tests} random tests"
                       + redrawn + note, output_map=perm, max_error=worst, lax=lax,
                       inconclusive=dropped)
    if perm is not None or not n:  # too few conclusive tests, and those agree
        draws = f"{ZERO_DIVISOR_ROUNDS} draws of {tests} random tests"
        if not n:
            verb = "divide" if " and " in blame else "divides"
            why = (f"a divisor is zero on every random input ({draws}): the {blame} {verb} "
                   "by an expression that is identically zero")
        else:
            why = (f"only {n} of {tests} tests were conclusive in {draws}: a divisor of the "
                   f"{blame} was zero in the others")
        return verdict(False, why, lax=lax, inconclusive=dropped)
    reasons = []
    for i, c in enumerate(cand_out):
        same = [j for j, r in enumerate(ref_out) if r.shape == c.shape]
        if not same:
            continue
        j = min(same, key=lambda j: ar.max_error(ref_out[j], c))
        failing = int((~ar.tests_equal(ref_out[j], c, n)).sum())
        reasons.append(f"output {i} differs from reference output {j} in {failing}/{n} "
                       f"tests (max error {ar.max_error(ref_out[j], c):.3g})")
    return verdict(False, "; ".join(reasons) or "no output matches",
                   max_error=max((ar.max_error(a, b) for a, b in zip(ref_out, cand_out,
                                                                       strict=False)),
                                 default=None), inconclusive=dropped)


def _conclusive(values: list[np.ndarray], bad: np.ndarray, keep: np.ndarray, lead: int
                ) -> list[np.ndarray]:
    """The tests ``keep`` of each value, with the parts ``bad`` (shape (*lead, tests)) set to
    0: both graphs' values get the same, so a part that met a zero divisor compares equal."""
    return [np.take(np.where(bad.reshape(bad.shape + (1,) * (v.ndim - bad.ndim)), 0, v), keep,
                    axis=lead) for v in values]


def _conclusive_runs(reference: KernelGraph, candidate: KernelGraph, ar: Arithmetic,
                     tests: int, rng: np.random.Generator
                     ) -> tuple[list[np.ndarray], list[np.ndarray], int, str]:
    """Both graphs' outputs on up to ``tests`` conclusive random tests (on the test axis),
    the number of tests dropped because a divisor was zero in them, and whose divisors those
    were ("reference", "candidate" or both).  A test is conclusive when the first part of
    every value (the field's p component) met no zero divisor in either graph; its other parts
    that did are set to 0 on both sides, so they compare equal and prove nothing.  Tests are
    drawn ``tests`` at a time, at most ``ZERO_DIVISOR_ROUNDS`` times; with no zero divisor
    (the usual case) that is one draw, the same inputs as ever for a seed."""
    shapes = [s for s, _ in _signature(reference)]
    kept: list[tuple[list[np.ndarray], list[np.ndarray]]] = []
    have = dropped = 0
    ref_blamed = cand_blamed = False
    for _ in range(ZERO_DIVISOR_ROUNDS):
        inputs = ar.random_inputs(shapes, tests, rng)
        ar.begin(tests)
        ref_out = run(reference, inputs, ar)
        ref_bad = ar.untrusted(tests)
        ar.begin(tests)
        cand_out = run(candidate, inputs, ar)
        cand_bad = ar.untrusted(tests)
        bad = ref_bad | cand_bad
        if not bad.any():
            kept.append((ref_out, cand_out))
            have += tests
            break
        ref_blamed |= bool(ref_bad.any())
        cand_blamed |= bool(cand_bad.any())
        keep = np.flatnonzero(~bad.reshape(-1, tests)[0])
        dropped += tests - keep.size
        kept.append((_conclusive(ref_out, bad, keep, ar.lead),
                     _conclusive(cand_out, bad, keep, ar.lead)))
        have += keep.size
        if have >= tests:
            break
    blame = " and the ".join(w for w, b in (("reference", ref_blamed),
                                            ("candidate", cand_blamed)) if b) or "candidate"
    if len(kept) == 1 and have == tests:
        return kept[0][0], kept[0][1], dropped, blame

    def joined(side: int) -> list[np.ndarray]:
        parts = [k[side] for k in kept]
        return [np.take(np.concatenate(vs, axis=ar.lead), np.arange(min(have, tests)),
                        axis=ar.lead) for vs in zip(*parts, strict=True)]

    return joined(0), joined(1), dropped, blame
