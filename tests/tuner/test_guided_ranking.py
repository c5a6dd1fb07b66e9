"""``GuidedRanking``, the rule of ``sampler: model`` (and of benchmarks/strategies.py's model
strategy): its kept sums are the sums taken afresh (``next`` adding main effects of the
parameters' values from ``MAIN_EFFECTS_FROM`` measurements on), a history told out of order is summed in
its own order, and ``adapt`` re-learns the device on a copy at 4, 8 and 16 measurements.
(tests/costmodel/test_strategies_bench.py checks the benchmark's picks against the rule
written plainly, on a real model.)"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from support import guided_correction

from tuner.samplers.model import MAIN_EFFECTS_FROM, MAIN_EFFECTS_RIDGE, GuidedRanking


@dataclass
class Shot:
    base: float  # what the stub model predicts, in seconds
    seconds: float = 0.0


class Stub:
    """A cost model: predicts ``base`` shifted by the offset ``adapt`` learns from its shots."""

    def __init__(self) -> None:
        self.offsets: dict[str, float] = {}
        self.mixes: dict[str, list] = {}
        self.adapted: list[int] = []  # how many shots each adapt was given

    def predict(self, samples):
        return np.asarray([s.base for s in samples]) * math.exp(self.offsets.get("d", 0.0))

    def adapt(self, shots):
        self.adapted = [*self.adapted, len(shots)]  # not shared with a shallow copy
        self.offsets["d"] = float(np.mean([math.log(s.seconds / s.base) for s in shots]))


def _space(n: int = 40, seed: int = 0):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 3, (n, 4))
    samples = [Shot(float(b)) for b in rng.uniform(1e-3, 2e-3, n)]
    times = rng.uniform(1e-3, 3e-3, n)
    return samples, codes, times


def _afresh(ranking: GuidedRanking, main_from: float = MAIN_EFFECTS_FROM) -> np.ndarray:
    """What ``next`` ranks by, summed afresh; with ``main_from`` inf, ``corrected``."""
    return ranking.predicted + guided_correction(ranking.codes, ranking.predicted,
                                                 ranking.measured, main_from,
                                                 MAIN_EFFECTS_RIDGE)


def test_the_kept_sums_are_the_sums_taken_afresh_and_adapt_runs_on_a_copy():
    samples, codes, times = _space()
    model = Stub()
    ranking = GuidedRanking(model, samples, codes)
    picked = []
    for _ in range(20):
        i = ranking.next()
        assert i is not None and i not in picked
        assert i == int(np.argmin(np.where(np.isin(np.arange(40), picked), np.inf,
                                           _afresh(ranking))))
        picked.append(i)
        ranking.observe(i, times[i])
    assert np.array_equal(ranking.corrected(), _afresh(ranking, math.inf))
    assert ranking.model.adapted == [4, 8, 16] and model.adapted == [] and not model.offsets


def test_a_history_told_out_of_order_is_summed_in_its_own_order():
    samples, codes, times = _space()
    told = GuidedRanking(Stub(), samples, codes, adapt_at=())
    told.sync([(i, times[i]) for i in (3, 7)])
    told.sync([(i, times[i]) for i in (3, 5, 7, 9)])  # 5 finished after 7 was seen
    fresh = GuidedRanking(Stub(), samples, codes, adapt_at=())
    for i in (3, 5, 7, 9):
        fresh.observe(i, times[i])
    assert told.measured == fresh.measured
    assert np.array_equal(told.corrected(), fresh.corrected())
    assert told.next(exclude=np.arange(40) == 0) == fresh.next(exclude=np.arange(40) == 0)
    assert told.next(exclude=np.ones(40, bool)) is None


def test_the_tie_break_noise_moves_the_ranking_not_the_correction():
    samples, codes, times = _space()
    plain = GuidedRanking(Stub(), samples, codes)
    noisy = GuidedRanking(Stub(), samples, codes, tie_break=1)
    assert np.array_equal(plain.corrected(), noisy.corrected())
    noise = np.random.default_rng(1).normal(0.0, 0.01, 40)
    assert noisy.next() == int(np.argmin(noisy.predicted + noise))
