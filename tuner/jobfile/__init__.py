"""Job files: the schema of a validated job (``schema``) and the validator that builds one
from YAML with an error at the line (``validate``); docs/job-file.md is the reference."""

from .schema import (
    ClusterSpec,
    DatabaseSpec,
    JobError,
    JobSpec,
    ProgramEntry,
    SearchSpec,
    TuningSpec,
)
from .validate import load_job, parse_job

__all__ = ["ClusterSpec", "DatabaseSpec", "JobError", "JobSpec", "ProgramEntry",
           "SearchSpec", "TuningSpec", "load_job", "parse_job"]
