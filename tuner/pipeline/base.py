"""One pipeline interface for every kind of program a job lists.

A launch runs each entry of the job through a ``ProgramPipeline``: ``prepare`` records the
program and finds what there is to tune (the µGraph search's verified structures, or the
recorded Kernel Tuner space), then for each device the entry runs on ``tune`` measures it and
returns the device's ``ProgramReport``, and ``report`` says it (a log line and the job's
timings).  Two implementations: ``tuner.pipeline.ugraph`` (programs) and
``tuner.pipeline.recorded`` (recorded spaces).  The pipelines see the run only through a
``RunContext``: the job, the log and progress, and the shared tuning deadline.
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import optuna

    import db
    from cluster import SlotPool

    from ..jobfile import JobSpec, ProgramEntry
    from .report import ProgramReport
    from .tune import StudyTask


class ProgressSink(Protocol):
    """What a launch tells about its progress (``tuner.cli``'s console display is one)."""

    def search(self, program: str, info: dict[str, Any]) -> None: ...

    def trial(self, program: str, structure_hash: str, res: dict[str, Any]) -> None: ...


@dataclass
class RunContext:
    """What a pipeline may use of the run: the job, where to log, the tuning clock."""

    job: JobSpec
    log: Callable[[str], None]
    progress: ProgressSink | None = None
    tune_deadline: float | None = None  # set when the first study starts
    executor: Any = None  # the search's executor (cluster.LocalExecutor / RayExecutor)
    said: set[str] = field(default_factory=set)

    def log_once(self, line: str) -> None:
        """``log``, but a line said before in this run is not said again (each program's
        studies on a device choose their sampler alike: one line, not one per program)."""
        if line not in self.said:
            self.said.add(line)
            self.log(line)

    def deadline(self) -> float | None:
        """The tuning budget is for the whole job: its clock starts at the first study."""
        budget = self.job.tuning.time_budget_s
        if budget is not None and self.tune_deadline is None:
            self.tune_deadline = time.time() + budget
        return self.tune_deadline

    def search_progress(self, name: str) -> Callable[[dict], None]:
        def report(info: dict) -> None:
            if self.progress is not None:
                self.progress.search(name, info)
        return report

    def trial_progress(self, name: str) -> Callable[[StudyTask, dict], None]:
        def report(task: StudyTask, res: dict) -> None:
            if self.progress is not None:
                self.progress.trial(name, task.structure_hash, res)
        return report


class ProgramPipeline(ABC):
    """One job entry through the launch (see the module docstring)."""

    def __init__(self, ctx: RunContext, entry: ProgramEntry) -> None:
        self.ctx, self.entry = ctx, entry

    @abstractmethod
    def prepare(self, database: db.Database, job_id: int) -> None:
        """Record the program and find what there is to tune."""

    @abstractmethod
    def devices(self, pools: dict[str, SlotPool]) -> Generator[tuple[str, SlotPool], None, None]:
        """(device entry, measurement pool) of each device this entry runs on; a pool the
        pipeline opens itself it closes when the iteration ends."""

    @abstractmethod
    def tune(self, database: db.Database, storage: optuna.storages.RDBStorage,
             pool: SlotPool) -> ProgramReport:
        """Tune on one device; its line of the summary."""

    @abstractmethod
    def report(self, device: str, pool: SlotPool, rep: ProgramReport
               ) -> tuple[str, dict[str, Any]]:
        """Say ``rep`` in the log; (key, entry) of the job's timings."""

    def run(self, database: db.Database, job_id: int, storage: optuna.storages.RDBStorage,
            pools: dict[str, SlotPool], timings: dict[str, Any]) -> list[ProgramReport]:
        """The steps in order; the reports of every device."""
        self.prepare(database, job_id)
        reports = []
        with contextlib.closing(self.devices(pools)) as devices:
            for device, pool in devices:
                rep = self.tune(database, storage, pool)
                key, timing = self.report(device, pool, rep)
                timings[key] = timing
                reports.append(rep)
        return reports
