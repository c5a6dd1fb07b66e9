"""The launch pipeline: a job file through search, verification, tuning and the database.

``launch`` / ``JobRun`` run a job (``run``); each entry goes through its ``ProgramPipeline``
(``base``): ``UGraphPipeline`` for µGraph programs (``ugraph``: search, then tuning, the
library candidate and confirmation on each device), ``RecordedSpacePipeline`` for recorded
Kernel Tuner spaces (``recorded``).  The studies are ``tune``'s, the re-timing ``confirm``'s.
"""

from .base import ProgramPipeline, ProgressSink, RunContext
from .devices import check_cluster_gpus, check_devices
from .library import LibraryCandidate
from .recorded import RecordedSpacePipeline
from .report import LaunchResult, ProgramReport
from .run import PIPELINES, JobRun, launch, optuna_storage, pipeline_for, prepare
from .ugraph import (
    VERIFY_SYMBOL,
    VERIFY_TESTS,
    UGraphPipeline,
    search_notes,
    small_instance_shapes,
    structure_verification,
)

__all__ = ["PIPELINES", "VERIFY_SYMBOL", "VERIFY_TESTS", "JobRun", "LaunchResult",
           "LibraryCandidate", "ProgramPipeline", "ProgramReport", "ProgressSink",
           "RecordedSpacePipeline", "RunContext", "UGraphPipeline", "check_cluster_gpus",
           "check_devices", "launch", "optuna_storage", "pipeline_for", "prepare", "search_notes",
           "small_instance_shapes", "structure_verification"]
