"""The backend's options, checked before anything is traced (docs/pytorch.md lists them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .report import Report

TUNE_MODES = ("cached", "now", "job")
FALLBACKS = ("inductor", "eager")


@dataclass
class Options:
    """``tuner.compile`` / ``torch.compile(options=...)`` options (see docs/pytorch.md)."""

    tune: str = "cached"
    db: str | None = None  # database URL; None: sqlite:///./tuner.db
    device: str = "cpu"
    budget_s: float = 120.0  # tune="now": search and tuning time per compile
    trials: int = 8
    structures: int = 3
    job_file: str | None = None  # tune="job": where the job goes (default ./tuner_job.yaml)
    fallback: str = "inductor"
    max_ops: int = 32  # the largest region handed to the search (searched in pieces)
    check: bool = True  # run each loaded kernel once against the float64 reference
    race: bool = True  # time each kernel against PyTorch's ops for its region; keep the faster
    verbose: bool = False
    report: Report = field(default_factory=Report)

    def __post_init__(self) -> None:
        if self.tune not in TUNE_MODES:
            raise ValueError(f"tuner backend: tune={self.tune!r}; use one of {TUNE_MODES}")
        if self.fallback not in FALLBACKS:
            raise ValueError(f"tuner backend: fallback={self.fallback!r}; use one of "
                             f"{FALLBACKS}")
        if self.device != "cpu":
            raise ValueError(f"tuner backend: device={self.device!r}; only 'cpu' kernels run "
                             "inside PyTorch graphs so far")
        if self.max_ops < 1 or self.budget_s <= 0:
            raise ValueError("tuner backend: max_ops and budget_s must be positive")


def make_options(options: dict[str, Any]) -> Options:
    """Options from keyword arguments (``torch.compile`` passes them as ``options=``)."""
    merged = {**(options.pop("options", None) or {}), **options}
    known = set(Options.__dataclass_fields__)
    unknown = sorted(set(merged) - known)
    if unknown:
        raise TypeError(f"tuner backend: unknown option(s) {unknown}; known: {sorted(known)}")
    return Options(**merged)


