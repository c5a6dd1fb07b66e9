"""``tuning: {sampler: model}``: measure configs in the order the learned cost model ranks them.

The model (trained from this database's measurements, ``tuner model train``) predicts every
legal config of a structure's space (a seeded sample of ``candidates`` where the space is
larger); the study measures the best-ranked config not tried yet, then corrects the ranking
with what it measured — each measured config's error (log measured / predicted) is spread to
the others, weighted by 2^-(parameters that differ) with a prior weight of one on the model —
and repeats.  After 4, 8 and 16 measurements it also re-fits the model's view of the device
from them (``CostModel.adapt``: which known devices' rankings the measured configs follow),
so a device the model never saw is learned from its first few configs (few-shot).  A Kernel
Tuner space (no µGraph) is predicted from its parameters.  The AStitch default and its warm-start neighbours still go first (they are
enqueued trials, which Optuna hands out before asking a sampler).  benchmarks/strategies.py
measures the same rule on real GPU spaces against Kernel Tuner's strategies.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from costmodel import CostModel, Sample, device_profile, featurize, featurize_params

from .registry import make_sampler


class ModelSampler(BaseSampler):
    """An Optuna sampler ranked by a ``costmodel.CostModel``; ``bind`` gives it the study's
    structure, device and config space before the first ask."""

    def __init__(self, model: CostModel, *, seed: int = 0, candidates: int = 2048) -> None:
        self.model, self.seed, self.candidates = model, seed, candidates
        self._fallback = make_sampler("random", seed)
        self._params: list[dict[str, Any]] = []
        self._index: dict[tuple, int] = {}
        self._predicted = np.zeros(0)
        self._codes = np.zeros((0, 0), np.int64)
        self._dists: dict[str, BaseDistribution] = {}
        self._samples: list[Sample] = []
        self._adapted_at = 0

    def bind(self, task: Any, codec: Any, dists: dict[str, BaseDistribution]) -> None:
        """Predict the candidates of ``task.space`` (a ``tuner.pipeline.tune.StudyTask``)."""
        configs = [c for c in task.space.configs() if task.space.check(c) is None]
        if len(configs) > self.candidates:
            configs = random.Random(self.seed).sample(configs, self.candidates)
        self._dists = dict(dists)
        self._params = [codec.encode(c) for c in configs]
        names = sorted(dists)
        self._index = {tuple(p[n] for n in names): i for i, p in enumerate(self._params)}
        self._codes = np.asarray([[p[n] for n in names] for p in self._params], np.int64)
        self._names = names
        if not configs:
            self._predicted = np.zeros(0)
            return
        self.model = copy.copy(self.model)  # adapt() below learns this study's device only
        self.model.offsets, self.model.mixes = dict(self.model.offsets), dict(self.model.mixes)
        self._samples = study_samples(task, configs)
        self._predicted = np.log(np.maximum(self.model.predict(self._samples), 1e-12))

    ADAPT_AT = (4, 8, 16)  # measurements after which the device is re-learned from them

    def _adapt(self, measured: list[tuple[int, float]]) -> None:
        shots = []
        for i, value in measured:
            s = copy.copy(self._samples[i])
            s.seconds = value
            shots.append(s)
        self.model.adapt(shots)
        self._predicted = np.log(np.maximum(self.model.predict(self._samples), 1e-12))
        self._adapted_at = len(measured)

    # -- Optuna's sampler interface ---------------------------------------------------------

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial
                                    ) -> dict[str, BaseDistribution]:
        return self._dists

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not len(self._predicted):
            return {}
        tried = np.zeros(len(self._predicted), bool)
        measured: list[tuple[int, float]] = []
        for past in study.get_trials(deepcopy=False):
            i = self._index.get(tuple(past.params.get(n) for n in self._names))
            if i is None:
                continue
            tried[i] = True
            if past.state == TrialState.COMPLETE and past.value and past.value > 0:
                measured.append((i, float(past.value)))
        due = [k for k in self.ADAPT_AT if self._adapted_at < k <= len(measured)]
        if due:
            self._adapt(measured)
        num = np.zeros(len(self._predicted))
        den = np.ones(len(self._predicted))
        for i, value in measured:
            residual = math.log(value) - self._predicted[i]
            weight = 2.0 ** -(self._codes != self._codes[i]).sum(1)
            num += weight * residual
            den += weight
        if tried.all():
            return {}
        score = np.where(tried, np.inf, self._predicted + num / den)
        return dict(self._params[int(np.argmin(score))])

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)


def study_samples(task: Any, configs: Sequence[dict]) -> list[Sample]:
    """The samples of a study's ``configs``: lowered µGraph configs, or a Kernel Tuner space's
    parameters (``task.structure`` None), on the device as the cost model knows it."""
    profile = device_profile(task.device_key)
    kt = task.structure_obj.get("kernel_tuner") if task.structure is None else None
    if kt is not None:
        return [featurize_params(c, kt["keys"], kt["problem_size"], profile.spec,
                                 group=task.structure_hash, program=task.program,
                                 device=task.device_key, known_device=profile.known)
                for c in configs]
    return [featurize(task.structure, c, task.spec, group=task.structure_hash,
                      program=task.program, device=task.device_key,
                      known_device=profile.known) for c in configs]


def predicted_order(model: CostModel, structure: Any, configs: Sequence[dict], spec: Any,
                    device_key: str = "") -> list[tuple[dict, float]]:
    """``configs`` with their predicted seconds, fastest first (``tuner model predict``)."""
    known = device_profile(device_key).known if device_key else True
    samples = [featurize(structure, c, spec, device=device_key, known_device=known)
               for c in configs]
    pred = model.predict(samples) if samples else np.zeros(0)
    return sorted(zip(configs, (float(p) for p in pred), strict=True), key=lambda x: x[1])
