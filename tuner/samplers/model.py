"""``tuning: {sampler: model}``: measure configs in the order the learned cost model ranks them.

The model (trained from this database's measurements, ``tuner model train``) predicts every
legal config of a structure's space (a seeded sample of ``candidates`` where a µGraph's space
is larger; every config a Kernel Tuner cache lists); the study measures the best-ranked config
not tried yet, then corrects the ranking with what it measured — each measured config's error
(log measured / predicted) is spread to the others, weighted by 2^-(parameters that differ)
with a prior weight of one on the model — and repeats. After 4, 8 and 16 measurements it also
re-fits the model's view of the device from them (``CostModel.adapt``: which known devices'
rankings the measured configs follow), so a device the model never saw is learned from its
first few configs (few-shot). A Kernel Tuner space (no µGraph) is predicted from its
parameters. The AStitch default still goes first (an enqueued trial, which Optuna hands
out before asking a sampler), but not its warm-start neighbours (``warm_neighbours``). The rule is
``GuidedRanking``; benchmarks/strategies.py runs that same class on real GPU spaces against
Kernel Tuner's strategies.
"""

from __future__ import annotations

import copy
import json
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState

from costmodel import CostModel, Sample, device_profile, featurize, featurize_params, group_name

from .registry import make_sampler

ADAPT_AT = (4, 8, 16)  # measurements after which the device is re-learned from them
# From this many measurements on, the residuals are also explained by main effects of the
# parameters' values (ridge-fitted, this ridge), which reach configs differing in many
# parameters; the 2^-distance correction takes what they leave.  benchmarks/strategies.py,
# 2026-11-28, AMD EPYC Zen 4, 20 seeds (the first values tried, not tuned): mean P 0.941 ->
# 0.952 (convolution), 0.850 -> 0.864 (dedispersion); W6600 25 -> 15.5 evaluations, MI250X
# 22 -> 30 (docs/costmodel.md)
MAIN_EFFECTS_FROM = 8
MAIN_EFFECTS_RIDGE = 2.0


class GuidedRanking:
    """The model-guided tuning rule, written once: ``ModelSampler`` runs it in a launch and
    benchmarks/strategies.py replays it on Kernel Tuner caches, so what the benchmark measures
    is what ``sampler: model`` does.

    ``next`` is the best-ranked config not measured yet.  The ranking is the model's predicted
    log time of each config (of ``samples``), corrected by what was measured (``observe``):
    each measured config's residual (log measured / predicted) is spread to every config,
    weighted 2^-(number of parameters that differ, ``codes`` being one row of integer
    parameter values per config), against a prior weight of 1 on the model (``corrected``).
    From ``MAIN_EFFECTS_FROM`` measurements on, ``next`` first fits main effects of the
    parameters' values to the residuals (a value measured faster than predicted, as a genetic
    algorithm's recombination would carry it, reaches configs far from the measured ones) and
    spreads only what they leave.  Once the measurements reach a count in ``adapt_at``, the
    device is re-learned from all of them (``CostModel.adapt``, on this ranking's own copy of
    the model: the caller's model is left as it was) before the next ranking.  ``tie_break``:
    a seed for a N(0, 0.01) noise added to the ranking (not to ``corrected``), so that ties
    fall differently per seed (the benchmark's seeds; a launch adds none).

    The 2^-distance sums are kept from one measurement to the next, added in the order in
    which summing them afresh would add them (so the same numbers), and summed afresh only
    when ``adapt`` changes the prediction: the benchmark ranks spaces of ~10^4 configs a few
    hundred times a seed (with main effects, a ridge fit and one product a ranking)."""

    def __init__(self, model: CostModel, samples: Sequence[Sample], codes: np.ndarray, *,
                 adapt_at: Sequence[int] = ADAPT_AT, tie_break: int | None = None) -> None:
        self.model = copy.copy(model)
        self.model.offsets, self.model.mixes = dict(model.offsets), dict(model.mixes)
        self.samples, self.codes, self.adapt_at = samples, codes, tuple(adapt_at)
        self.predicted = self._predict()  # log seconds per config, as the model has it now
        n = len(self.predicted)
        self._noise = (None if tie_break is None
                       else np.random.default_rng(tie_break).normal(0.0, 0.01, n))
        self.measured: list[tuple[int, float]] = []  # (config, seconds), in measured order
        self._weights: list[np.ndarray] = []  # per measurement: its weight on every config
        self._taken = np.zeros(n, bool)
        self._num = np.zeros(n)
        self._den = np.ones(n)  # the prior weight of 1 on "the model is right"
        self._adapted_at = 0
        self._values = _one_hot(codes)  # per config, which value each parameter takes

    def _predict(self) -> np.ndarray:
        """Predicted log seconds of every config (floored at 1 ps: the log of a 0 is -inf)."""
        return np.log(np.maximum(self.model.predict(self.samples), 1e-12))

    def observe(self, index: int, seconds: float) -> None:
        """Config ``index`` was measured at ``seconds``."""
        self.measured.append((index, float(seconds)))
        self._taken[index] = True
        self._weights.append(2.0 ** -(self.codes != self.codes[index]).sum(1))
        self._add(len(self.measured) - 1)

    def sync(self, measured: Sequence[tuple[int, float]]) -> None:
        """Make ``measured`` (every measurement so far, in order) the ranking's: those after
        the ones it has are observed; a history that does not extend its own (a trial that
        finished before an earlier one) replaces it, summed afresh in its order."""
        n = len(self.measured)
        if list(measured[:n]) != self.measured:
            self.measured, self._weights, n = [], [], 0
            self._taken[:] = False
            self._num[:], self._den[:] = 0.0, 1.0
        for index, seconds in measured[n:]:
            self.observe(index, seconds)

    def adapt(self) -> None:
        """Re-learn the device from every measurement so far; the correction is summed afresh
        against the new prediction."""
        shots = []
        for index, seconds in self.measured:
            shot = copy.copy(self.samples[index])
            shot.seconds = seconds
            shots.append(shot)
        self.model.adapt(shots)
        self.predicted = self._predict()
        self._num[:], self._den[:] = 0.0, 1.0
        for k in range(len(self.measured)):
            self._add(k)
        self._adapted_at = len(self.measured)

    def corrected(self) -> np.ndarray:
        """Every config's predicted log time corrected by the measurements (no tie noise)."""
        self._adapt_if_due()
        return self.predicted + self._num / self._den

    def _search_correction(self) -> np.ndarray:
        """What ``next`` adds to each config's predicted log time (class docstring): the
        2^-distance spread, and from ``MAIN_EFFECTS_FROM`` measurements on the main effects
        first.  Not ``corrected``: fitted to configs near the predicted best, the main
        effects find the best sooner but rank the rest of a space worse (16 shots,
        leave-one-GPU-out, tau 0.694 -> 0.616 convolution, 0.674 -> 0.642 dedispersion)."""
        if len(self.measured) < MAIN_EFFECTS_FROM:
            return self._num / self._den
        x = self._values
        index = np.array([i for i, _ in self.measured])
        residual = np.log([t for _, t in self.measured]) - self.predicted[index]
        xm = x[index]
        beta = np.linalg.solve(xm.T @ xm + MAIN_EFFECTS_RIDGE * np.eye(x.shape[1]),
                               xm.T @ residual)
        main = x @ beta
        weights = np.asarray(self._weights)
        return main + weights.T @ (residual - main[index]) / (1.0 + weights.sum(0))

    def next(self, exclude: np.ndarray | None = None) -> int | None:
        """The best-ranked config neither measured nor in ``exclude`` (a mask: configs tried
        without a measurement, as a failed trial); None when no config is left."""
        self._adapt_if_due()
        out = self._taken if exclude is None else self._taken | exclude
        if out.all():
            return None
        score = self.predicted if self._noise is None else self.predicted + self._noise
        return int(np.argmin(np.where(out, np.inf, score + self._search_correction())))

    def _adapt_if_due(self) -> None:
        if any(self._adapted_at < k <= len(self.measured) for k in self.adapt_at):
            self.adapt()

    def _add(self, k: int) -> None:
        index, seconds = self.measured[k]
        residual = math.log(seconds) - self.predicted[index]
        np.add(self._num, self._weights[k] * residual, out=self._num)
        np.add(self._den, self._weights[k], out=self._den)


def _one_hot(codes: np.ndarray) -> np.ndarray:
    """One column per value of each parameter that takes more than one (1.0 where a config
    takes it)."""
    cols = [(codes[:, j][:, None] == np.unique(codes[:, j])[None, :]).astype(np.float64)
            for j in range(codes.shape[1]) if len(np.unique(codes[:, j])) > 1]
    return np.hstack(cols) if cols else np.zeros((len(codes), 0))


class ModelSampler(BaseSampler):
    """An Optuna sampler ranked by a ``costmodel.CostModel`` (``GuidedRanking``); ``bind``
    gives it the study's structure, device and config space before the first ask."""

    def __init__(self, model: CostModel, *, seed: int = 0, candidates: int = 2048,
                 log: Callable[[str], None] | None = None) -> None:
        self.model, self.seed, self.candidates, self.log = model, seed, candidates, log
        self._fallback = make_sampler("random", seed)
        self._params: list[dict[str, Any]] = []
        self._names: list[str] = []
        self._index: dict[tuple, int] = {}
        self._dists: dict[str, BaseDistribution] = {}
        self._ranking: GuidedRanking | None = None
        # how many candidates other devices measured (None: the model trained on the device)
        self.siblings_found: int | None = None

    def bind(self, task: Any, codec: Any, dists: dict[str, BaseDistribution]) -> None:
        """Predict the candidates of ``task.space`` (a ``tuner.pipeline.tune.StudyTask``)."""
        if task.structure is None:  # a Kernel Tuner space: its parameters are its features
            configs = [c for c in task.space.configs() if task.space.check(c) is None]
        else:  # a µGraph config is lowered to be featurized (milliseconds each)
            configs = candidate_configs(task.space, self.candidates, seed=self.seed,
                                        keep=self.model.sibling_configs(
                                            task.program, task.structure_hash,
                                            task.device_key))
        configs, samples = study_samples(task, configs)
        self._say_siblings(task, samples)
        self._dists, self._space, self._codec = dict(dists), task.space, codec
        self._params = [codec.encode(c) for c in configs]
        self._names = names = sorted(dists)
        self._index = {tuple(p[n] for n in names): i for i, p in enumerate(self._params)}
        self._ranking = None
        if configs:
            codes = np.asarray([[p[n] for n in names] for p in self._params], np.int64)
            self._ranking = GuidedRanking(self.model, samples, codes)

    @property
    def warm_neighbours(self) -> bool:
        """Whether a new study should start with the defaults' one-parameter moves to the
        ends of each range (``tuner.pipeline.tune.warm_start``): not where the model ranks
        the space, which then picks from the first trial after the defaults."""
        return self._ranking is None

    def _say_siblings(self, task: Any, samples: Sequence[Sample]) -> None:
        """One line per study on a device the model never trained on: how many candidates
        its siblings measured (what ranks them; none: the trees alone).  The sampler once
        found none for any config, and nothing said so (docs/costmodel.md)."""
        found = self.siblings_found = self.model.siblings_measured(samples)
        if self.log is None or found is None:
            return
        self.log(f"sampler model on {task.device_key} (a device the cost model never trained "
                 f"on): {task.program} {task.structure_hash[:12]}: "
                 + siblings_said(found, len(samples)))

    # -- Optuna's sampler interface ---------------------------------------------------------

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial
                                    ) -> dict[str, BaseDistribution]:
        return self._dists

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if self._ranking is None:
            return {}
        tried = np.zeros(len(self._params), bool)
        measured: list[tuple[int, float]] = []
        for past in study.get_trials(deepcopy=False):
            i = self._position(past.params)
            if i is None:
                continue
            tried[i] = True
            if past.state == TrialState.COMPLETE and past.value and past.value > 0:
                measured.append((i, float(past.value)))
        self._ranking.sync(measured)
        best = self._ranking.next(exclude=tried)
        return {} if best is None else dict(self._params[best])

    def _position(self, params: dict[str, Any]) -> int | None:
        """The candidate a trial's ``params`` measured: the config itself, or its canonical
        form (a trial enqueued or asked before the candidates were canonical measured that
        kernel, and the tuner stored it canonical)."""
        i = self._index.get(tuple(params.get(n) for n in self._names))
        if i is not None or len(params) != len(self._names):
            return i
        canon = self._codec.encode(self._space.canonical(self._codec.decode(params)))
        return self._index.get(tuple(canon.get(n) for n in self._names))

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)


class SiblingsOrTpe(BaseSampler):
    """``sampler: auto`` on a device the model never trained on, where its siblings have
    shown they rank the devices it trained on (``tuner.samplers.factory``): per study, the
    model sampler where other devices measured some of its candidates (their order ranks
    them), TPE where none did (the trees alone, whose order on a device they never saw has
    no measured figure).  Decided at ``bind``; every call goes to the one chosen."""

    def __init__(self, model: CostModel, *, seed: int = 0,
                 log: Callable[[str], None] | None = None) -> None:
        self.model_sampler = ModelSampler(model, seed=seed, log=log)
        self.tpe = make_sampler("tpe", seed)
        self.chosen: BaseSampler = self.tpe
        self.log = log

    def bind(self, task: Any, codec: Any, dists: dict[str, BaseDistribution]) -> None:
        self.model_sampler.bind(task, codec, dists)
        found = self.model_sampler.siblings_found
        self.chosen = self.model_sampler if found is None or found > 0 else self.tpe
        if self.chosen is self.tpe and self.log is not None:
            self.log(f"sampler auto on {task.device_key}: {task.program} "
                     f"{task.structure_hash[:12]}: TPE for this study")

    @property
    def warm_neighbours(self) -> bool:
        return getattr(self.chosen, "warm_neighbours", True)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial
                                    ) -> dict[str, BaseDistribution]:
        return self.chosen.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return self.chosen.sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.chosen.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.chosen.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.chosen.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.chosen.reseed_rng()


def candidate_configs(space: Any, most: int, *, seed: int = 0,
                      keep: Iterable[Mapping[str, Any]] = ()) -> list[dict]:
    """What the model ranks of a µGraph ``space``: its distinct kernels (``canonical``
    configs that its check accepts: a launch measures and stores each kernel once), all of
    them or a seeded sample of ``most`` (never the first ``most`` in the space's order, which
    held only the smallest values of a parameter), and every kernel of ``keep`` in the space:
    the configs other devices measured, which their measurements rank on a device the model
    never trained on (`tuner model predict` of an H200's rmsnorm_matmul from the H100 sweep:
    a sample of 4,096 of its 34,695 kernels held none of the 12 the H100 measured)."""
    seen: dict[str, dict] = {}
    for c in space.configs():
        if space.check(c) is None:
            canon = space.canonical(c)
            seen.setdefault(json.dumps(canon, sort_keys=True), canon)
    legal = list(seen.values())
    out = legal if len(legal) <= most else random.Random(seed).sample(legal, most)
    have = {json.dumps(c, sort_keys=True) for c in out}
    for c in keep:
        key = json.dumps(space.canonical(c), sort_keys=True)
        if key in seen and key not in have:
            out.append(seen[key])
            have.add(key)
    return out


def siblings_said(found: int, candidates: int) -> str:
    """How many candidate configs other devices measured, and so what ranks them (the
    sampler's line per study and ``tuner model predict``'s)."""
    return (f"other devices measured {found} of its {candidates} candidate configs"
            + ("; the trees alone rank them" if found == 0 else
               " (those ranked by their measurements blended with the trees, the rest by the "
               "trees)"))


def study_samples(task: Any, configs: Sequence[dict]) -> tuple[list[dict], list[Sample]]:
    """The configs of ``configs`` the lowering accepts, with their samples: lowered µGraph
    configs, or a Kernel Tuner space's parameters (``task.structure`` None), on the device as
    the cost model knows it.  The space's check does not know every limit the lowering
    applies (on a GPU, a Triton tile's shared memory); a config the lowering refuses (its
    ``ValueError``) is left out, as the study marks it invalid, rather than stop the launch
    (before the check knew the split rule a RoPE region's space held 10 of 35 such configs,
    and binding the model sampler to it failed a whole compile)."""
    profile = device_profile(task.device_key)
    group = group_name(task.structure_hash, task.device_key)  # as the training rows' groups
    kt = task.structure_obj.get("kernel_tuner") if task.structure is None else None
    if kt is not None:
        return list(configs), [featurize_params(c, kt["keys"], kt["problem_size"],
                                                profile.spec, group=group,
                                                program=task.program, device=task.device_key,
                                                known_device=profile.known) for c in configs]
    return _featurized(task.structure, configs, task.spec, device_key=task.device_key,
                      program=task.program, structure_hash=task.structure_hash)


def _featurized(structure: Any, configs: Sequence[dict], spec: Any, *, device_key: str,
               program: str, structure_hash: str) -> tuple[list[dict], list[Sample]]:
    """The configs of a µGraph ``structure`` the lowering accepts, with their samples named
    as the training rows name them (``group_name``); a config it refuses (``ValueError``:
    a Triton tile's shared memory, which the space's check does not know) is left out."""
    known = device_profile(device_key).known if device_key else True
    group = group_name(structure_hash, device_key)
    kept: list[dict] = []
    samples: list[Sample] = []
    binds: dict = {}  # configs differing only in knobs bind the same graph (``concretize``)
    for c in configs:
        try:
            samples.append(featurize(structure, c, spec, group=group, program=program,
                                     device=device_key, known_device=known, binds=binds))
        except ValueError:
            continue
        kept.append(c)
    return kept, samples


def predicted_order(model: CostModel, structure: Any, configs: Sequence[dict], spec: Any,
                    device_key: str = "", *, program: str = "", structure_hash: str = ""
                    ) -> tuple[list[tuple[dict, float]], int | None]:
    """(the ``configs`` the lowering accepts with their predicted seconds, fastest first; how
    many of them other devices measured where the model never trained on ``device_key``, else
    None) for ``tuner model predict``.  ``program`` (its stored name) and ``structure_hash``
    name the configs as the training rows do, so a device the model never trained on is
    ranked by its siblings' measurements of them (``costmodel._siblings``)."""
    configs, samples = _featurized(structure, configs, spec, device_key=device_key,
                                  program=program, structure_hash=structure_hash)
    pred = model.predict(samples) if samples else np.zeros(0)
    ranked = sorted(zip(configs, (float(p) for p in pred), strict=True), key=lambda x: x[1])
    return ranked, model.siblings_measured(samples)
