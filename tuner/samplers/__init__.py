"""Tuning samplers: the one registry the job file, the launch and the cost model's sampler
share (``registry``), a launch's factory (``factory``), and the cost model's sampler itself
(``model``, imported on use: it pulls in numpy, Optuna and the cost model)."""

from .registry import (
    AUTO_MIN_TAU,
    DEFAULT_SAMPLER,
    MIN_HELD_OUT,
    NOT_OFFERED,
    SAMPLERS,
    SamplerKind,
    make_sampler,
    unknown_sampler,
)

__all__ = ["AUTO_MIN_TAU", "DEFAULT_SAMPLER", "MIN_HELD_OUT", "NOT_OFFERED", "SAMPLERS",
           "SamplerKind", "make_sampler", "unknown_sampler"]
