"""What a launch reports: one line per program × device, and the job's summary."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kernels import OK

if TYPE_CHECKING:
    from .tune import StudyOutcome


@dataclass
class ProgramReport:
    """One program's line of the summary table."""

    program: str
    shapes: dict[str, list[int]]
    device_key: str = ""
    best_s: float | None = None
    baseline_s: float | None = None
    structures_found: int = 0
    structures_tuned: int = 0
    # what could be tuned: the verified structures and the program as written (a kernel per
    # op); the summary's "tuned/candidates" (it showed tuned/found, "2/1" for a partitioned
    # program, its one joined structure and the program as written both tuned)
    candidates: int = 0
    trials: int = 0  # configs measured (this run and resumed ones)
    new_trials: int = 0
    statuses: Counter = field(default_factory=Counter)
    skipped: int = 0
    invalid: int = 0
    best_structure: str | None = None
    best_config: dict | None = None
    search_s: float = 0.0
    tune_s: float = 0.0
    shards_reused: int = 0
    confirmed: int = 0  # configs timed TIMINGS times (tuner.pipeline.confirm) to pick the best
    confirm_new: int = 0  # re-runs measured by this run
    best_first_s: float | None = None  # the fastest single first timing, for comparison
    library: bool = False  # the library path (numpy / CuPy op by op) beat every tuned kernel
    tuned_s: float | None = None  # the fastest tuned kernel's confirmed time, for comparison
    uncertain: str | None = None  # why the stored best may not be the fastest (None: it is)
    sampler: str = ""  # what tuned it and why (``tuner.samplers.factory``: auto's choice)

    @property
    def speedup(self) -> float | None:
        if self.best_s and self.baseline_s:
            return self.baseline_s / self.best_s
        return None

    def merge(self, outcome: StudyOutcome) -> None:
        """Count one study's trials in this line."""
        self.trials += outcome.measured
        self.new_trials += outcome.new
        self.statuses.update(outcome.statuses)
        self.skipped += outcome.skipped
        self.invalid += outcome.invalid

    def as_dict(self) -> dict:
        return {"program": self.program, "shapes": self.shapes, "device_key": self.device_key,
                "best_s": self.best_s, "baseline_s": self.baseline_s, "speedup": self.speedup,
                "structures_found": self.structures_found,
                "structures_tuned": self.structures_tuned, "candidates": self.candidates,
                "trials": self.trials,
                "new_trials": self.new_trials,
                "failures": {k: v for k, v in self.statuses.items() if k != OK},
                "skipped_by_roofline": self.skipped, "invalid_configs": self.invalid,
                "best_structure": self.best_structure, "best_config": self.best_config,
                "search_s": round(self.search_s, 3), "tune_s": round(self.tune_s, 3),
                "shards_reused": self.shards_reused, "confirmed": self.confirmed,
                "confirm_new": self.confirm_new, "best_first_s": self.best_first_s,
                "library": self.library, "tuned_s": self.tuned_s,
                "uncertain": self.uncertain, "sampler": self.sampler}


@dataclass
class LaunchResult:
    """A launch's summary: the job row it ran under and a report per program × device."""

    job_id: int
    job_key: str
    resumed: bool
    url: str
    reports: list[ProgramReport]
    elapsed_s: float
    trained: list[dict] = field(default_factory=list)  # the retrain at the end, per device

    def as_dict(self) -> dict:
        return {"job_id": self.job_id, "job_key": self.job_key, "resumed": self.resumed,
                "database": self.url, "elapsed_s": round(self.elapsed_s, 3),
                "programs": [r.as_dict() for r in self.reports], "trained": self.trained}
