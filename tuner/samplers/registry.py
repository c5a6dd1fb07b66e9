"""The one table of tuning samplers: what a job file may name, and how each is made.

The job file's validator checks ``tuning.sampler`` against ``SAMPLERS``; ``TuningSpec`` and
the launch create samplers through ``make_sampler`` (``tuner.samplers.factory``
for a launch's studies); the cost model's
sampler (``tuner.samplers.model``) is the ``model`` row.  Config spaces are small sets of
discrete choices, so only samplers that handle categorical parameters without extra packages
are offered; ``grid`` tries every config once.  Optuna is imported only when a sampler is made.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna


@dataclass(frozen=True)
class SamplerKind:
    """One sampler a job file may name."""

    name: str
    summary: str
    optuna_class: str  # the Optuna sampler made for it (``model``: its fallback)
    seeded: bool = True  # the same seed proposes the same configs in the same space
    model: bool = False  # ranks by the cost model stored for the device, where one is trained
    auto: bool = False  # the model only where its held-out tau on the device clears AUTO_MIN_TAU


SAMPLERS: dict[str, SamplerKind] = {k.name: k for k in (
    SamplerKind("tpe", "Optuna's TPE, multivariate, after 5 startup trials", "TPESampler"),
    SamplerKind("random", "uniform over the space", "RandomSampler"),
    SamplerKind("grid", "every config once", "BruteForceSampler"),
    # the learned cost model's ranking (tuner/samplers/model.py); a device without a trained
    # model falls back to TPE, and the launch says so
    SamplerKind("model", "the stored cost model's ranking, corrected by each measurement",
                "TPESampler", model=True),
    # the default: ``model`` where the stored model has shown it ranks this device's configs
    # (held-out Kendall tau >= AUTO_MIN_TAU, measured when it was trained), TPE otherwise
    SamplerKind("auto", "the cost model where it has proven itself on the device, TPE "
                "otherwise (the default)", "TPESampler", model=True, auto=True),
)}
# a held-out tau measured on fewer configs is not trusted (its standard error is over 0.25:
# 0.41 on the 4 a 20-trial launch's retrain holds out)
MIN_HELD_OUT = 10
DEFAULT_SAMPLER = "auto"
# a model ranks a device well enough to tune with when its held-out tau there is at least
# this: 3 of 4 pairs of configs in the right order (benchmarks/strategies.py: model-guided
# tuning beat Kernel Tuner's strategies on GPUs where the ranking held at this level)
AUTO_MIN_TAU = 0.5

# names a user may try that are not offered, and why
NOT_OFFERED = {
    "cmaes": "CMA-ES needs continuous parameters and the cmaes package",
    "gp": "the Gaussian-process sampler needs torch and scipy",
    "qmc": "the quasi-Monte-Carlo sampler needs scipy and numeric parameters",
    "bruteforce": "it is called grid here",
}


def unknown_sampler(name: str) -> str | None:
    """Why ``name`` is not a sampler (None: it is one), as the job file's error says it."""
    if name in SAMPLERS:
        return None
    hint = NOT_OFFERED.get(name)
    return (f"unknown sampler {name!r}" + (f" ({hint})" if hint else "")
            + "; use one of " + ", ".join(SAMPLERS))


def make_sampler(name: str, seed: int | None = None) -> optuna.samplers.BaseSampler:
    """A fresh Optuna sampler of kind ``name`` (``model``, ``auto``: their TPE fallback)."""
    import optuna

    kind = SAMPLERS[name]
    with warnings.catch_warnings():  # BruteForceSampler is flagged experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if kind.optuna_class == "TPESampler":
            # joint model of the parameters (grid sizes and loop steps interact) after 5
            # startup trials, the AStitch default among them: on replayed exhaustive cpu
            # tables this reached 5% of the best in fewer trials than the default TPE
            # (median 7% vs 11% of the space on rmsnorm_matmul, 10% vs 13% on lora)
            return optuna.samplers.TPESampler(seed=seed, multivariate=True,
                                              n_startup_trials=5)
        return getattr(optuna.samplers, kind.optuna_class)(seed=seed)
