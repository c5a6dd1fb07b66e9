"""Gradient-boosted trees (LightGBM) on flat features: the TenSet / MetaSchedule anchor."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from ._features import DEVICE_DIM, Sample
from ._models import LearnedModel, group_rows, within_group
from ._work import WorkPrior


class GbdtModel(LearnedModel):
    """LightGBM on flat features (``Sample.flat``): one booster regresses log seconds (the
    level), the other learns the shape — by default (``shape_objective="lambdarank"``) as a
    ranking, LightGBM's lambdarank over queries of one group (a structure or a Kernel Tuner
    space on one device), graded by each config's rank in its group, so a group's scale never
    enters (leave-one-GPU-out zero-shot tau 0.544 -> 0.567 convolution, 0.596 -> 0.605
    dedispersion; CPU programs held out 0.361 -> 0.418; 400 / 300 trees of 63 leaves, same
    folds, docs/costmodel.md); ``"regression"``: the within-group standardised log seconds,
    the rule before.  Where rows have a µGraph, both also read the log seconds of the work
    prior (``_work``: per device, a cost per unit of work fitted on the training rows), and the
    level regresses what that prior misses: a tree cannot add up a new program's parts, the
    prior can (``work_prior=False``: without it).
    ``time_budget_s`` stops boosting early (half of it each), for the retrain at the end of a
    launch."""

    kind = "gbdt"

    # 1200 trees of 255 leaves: convolution random split tau 0.87 -> 0.92 over 400 of 63
    # (Intel Xeon, 2 cores, under load; benchmarks/costmodel.py)
    RANK_GRADES = 32  # relevance grades of a lambdarank query: the within-group rank, binned
    RANK_QUERY = 256  # rows per lambdarank query: larger groups are cut into random chunks

    def __init__(self, trees: int = 1200, leaves: int = 255, threads: int | None = None,
                 time_budget_s: float | None = None, shape_objective: str = "lambdarank",
                 work_prior: bool = True) -> None:
        super().__init__()
        self.work_prior = work_prior
        self.trees, self.leaves, self.threads = trees, leaves, threads
        self.time_budget_s = time_budget_s
        if shape_objective not in ("regression", "lambdarank"):
            raise ValueError(f"shape_objective {shape_objective!r}: use regression or "
                             "lambdarank")
        self.shape_objective = shape_objective

    def _x(self, samples: Sequence[Sample]) -> np.ndarray:
        """Flat features, and the work prior's log seconds where the model has one (models
        stored before it read the flat features alone)."""
        x = np.stack([s.flat() for s in samples])
        prior = getattr(self, "prior", None)
        return np.c_[x, prior.log_prior(samples)] if prior is not None else x

    def fit(self, samples: Sequence[Sample], *, progress=None, seed: int = 0) -> None:
        prior = WorkPrior().fit(samples) if self.work_prior else None
        self.prior = prior if prior is not None and prior.costs else None  # µGraph rows only
        x = self._x(samples)
        logt = np.log([s.seconds for s in samples])
        # the level learns what the work prior misses (a tree's leaf cannot extrapolate past
        # the times it was trained on; the prior's sum of costs can)
        self.level = self._boost(x, logt - self._base(x), self.trees, seed=seed,
                                 progress=progress)
        if self.shape_objective == "lambdarank":
            self.shape = self._boost(x, logt, self.trees, samples=samples, seed=seed,
                                     progress=progress)
        else:
            self.shape = self._boost(x, within_group(logt, group_rows(samples)), self.trees,
                                     seed=seed, progress=progress)
        self.remember(samples)

    def update(self, samples: Sequence[Sample], *, trees: int, time_budget_s: float | None = None,
               seed: int = 0, progress=None) -> None:
        """Teach the trained model ``samples`` (every row of the groups that gained
        measurements) without refitting it: ``trees`` more trees per booster, boosted from
        its predictions on them (LightGBM's ``init_model``), and their measured ranks in
        place of the ones it kept.  The work prior stays the one fitted on the full rows.
        What a launch's retrain does on a model trained on many rows (``costmodel.update``)."""
        if not samples:
            return
        x = self._x(samples)
        logt = np.log([s.seconds for s in samples])
        half = None if time_budget_s is None else time_budget_s / 2
        self.level = self._boost(x, logt - self._base(x), trees, seed=seed, progress=progress,
                                 init=self.level, budget_s=half)
        if self.ordinal_shape:
            self.shape = self._boost(x, logt, trees, samples=samples, seed=seed,
                                     progress=progress, init=self.shape, budget_s=half)
        else:
            self.shape = self._boost(x, within_group(logt, group_rows(samples)), trees,
                                     seed=seed, progress=progress, init=self.shape,
                                     budget_s=half)
        self.devices.update({s.device: s.graph[-DEVICE_DIM:].copy() for s in samples})
        if getattr(self, "measured", None) is not None:
            self.measured.update(samples)

    def _boost(self, x: np.ndarray, y: np.ndarray, trees: int, *,
               samples: Sequence[Sample] | None = None, seed: int = 0, progress=None,
               init=None, budget_s: float | None = None):
        """One booster of ``trees`` trees on (``x``, ``y``) — lambdarank over the groups of
        ``samples`` (``y``: log seconds) where they are given, squared error otherwise —
        continuing ``init`` where given; stopped at ``budget_s`` (default: half of
        ``time_budget_s``)."""
        import lightgbm

        # one thread unless asked: on a loaded 2-core machine OpenMP's barriers cost more than
        # the trees (a 526-row fit: 4.7 s on one thread, over 5 minutes on two)
        params = {"objective": "regression", "num_leaves": self.leaves, "learning_rate": 0.05,
                  "min_data_in_leaf": 5, "bagging_fraction": 0.9, "bagging_freq": 1,
                  "feature_fraction": 0.9, "num_threads": self.threads or 1, "seed": seed,
                  "verbose": -1}
        if budget_s is None and self.time_budget_s is not None:
            budget_s = self.time_budget_s / 2
        callbacks = []
        if budget_s is not None:
            end = time.perf_counter() + budget_s

            def stop(env) -> None:
                if time.perf_counter() > end:
                    if progress:
                        progress(f"gbdt: time budget reached at tree {env.iteration + 1}")
                    raise lightgbm.callback.EarlyStopException(env.iteration, [])
            callbacks.append(stop)
        if samples is None:
            return lightgbm.train(params, lightgbm.Dataset(x, y), trees, init_model=init,
                                  callbacks=callbacks)
        order, sizes, grades = self._queries(y, group_rows(samples), seed)
        ranked = {**params, "objective": "lambdarank",
                  "label_gain": list(range(self.RANK_GRADES)),
                  "lambdarank_truncation_level": self.RANK_QUERY}
        return lightgbm.train(ranked, lightgbm.Dataset(x[order], grades, group=sizes), trees,
                              init_model=init, callbacks=callbacks)

    @property
    def ordinal_shape(self) -> bool:
        return getattr(self, "shape_objective", "regression") == "lambdarank"

    def _queries(self, logt: np.ndarray, groups: Sequence[np.ndarray], seed: int
                 ) -> tuple[np.ndarray, list[int], np.ndarray]:
        """Lambdarank's queries: each group (one space on one device) cut into random chunks
        of at most ``RANK_QUERY`` rows (its pairs are O(rows^2): a 10k-config space would be
        10^8 pairs a tree; random chunks sample the same pairs without bias), each row graded
        0 (slowest of its group) .. ``RANK_GRADES`` - 1 (fastest) by its rank in the whole
        group.  Returns (row order, query sizes, grades in that order)."""
        rng = np.random.default_rng(seed)
        order: list[np.ndarray] = []
        sizes: list[int] = []
        grades = np.zeros(len(logt))
        for idx in groups:
            rank = np.argsort(np.argsort(-logt[idx], kind="stable"), kind="stable")
            grades[idx] = np.floor((self.RANK_GRADES - 1) * rank / max(len(idx) - 1, 1))
            shuffled = rng.permutation(idx)
            for start in range(0, len(idx), self.RANK_QUERY):
                chunk = shuffled[start:start + self.RANK_QUERY]
                order.append(chunk)
                sizes.append(len(chunk))
        rows = np.concatenate(order)
        return rows, sizes, grades[rows]

    def _raw(self, samples: Sequence[Sample]) -> tuple[np.ndarray, np.ndarray]:
        x = self._x(samples)
        shape = np.asarray(self.shape.predict(x))
        if getattr(self, "shape_objective", "regression") == "lambdarank":
            shape = -shape  # a lambdarank score is higher for faster: shape is log-time-like
        return np.asarray(self.level.predict(x)) + self._base(x), shape

    def _base(self, x: np.ndarray) -> np.ndarray:
        """The level's starting point: the work prior's log seconds (0 where it has none)."""
        if getattr(self, "prior", None) is None:
            return np.zeros(len(x))
        return np.nan_to_num(x[:, -1], nan=0.0)
