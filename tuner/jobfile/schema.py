"""The job file's schema: what a validated job is (the sections and their defaults).

``tuner.jobfile.validate`` builds these from the YAML; the launch, the dashboard and
``tuner.identity`` read them.  Nothing here reads a file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from db import DEFAULT_URL
from search import (
    BLOCK,
    COMPUTE_OPS,
    DEFAULT_BLOCK_OPS,
    DEFAULT_KERNEL_OPS,
    KERNEL,
    OPS,
    Limits,
    Program,
)

from ..samplers.registry import DEFAULT_SAMPLER, make_sampler

if TYPE_CHECKING:
    import optuna

TOP_KEYS = ("programs", "search", "tuning", "devices", "cluster", "database")
ENTRY_KEYS = ("name", "file", "program", "kernel_tuner", "set")
KERNEL_LEVEL_OPS = tuple(n for n in COMPUTE_OPS if KERNEL in OPS[n].levels)
BLOCK_LEVEL_OPS = tuple(n for n in OPS if BLOCK in OPS[n].levels
                        and n not in ("input", "output", "graph_kernel"))


class JobError(ValueError):
    """A job file is malformed: ``FILE:LINE: key.path: what is wrong; how to fix``."""

    def __init__(self, file: str, line: int | None, key: str, reason: str) -> None:
        self.file, self.line, self.key, self.reason = file, line, key, reason
        where = f"{file}:{line}" if line else file
        super().__init__(" ".join(f"{where}: {key}: {reason}".split()))


@dataclass(frozen=True)
class ProgramEntry:
    """One program of the job, overrides applied; ``line`` is its line in the job file."""

    program: Program | None  # None for a Kernel Tuner space (``space``)
    kind: str  # "builtin" | "file" | "inline" | "kernel_tuner"
    ref: str  # the built-in name, the resolved file path, or "inline"
    overrides: dict[str, Any]
    line: int
    space: Any = None  # costmodel.KernelTunerSpace of a ``kernel_tuner:`` entry

    @property
    def name(self) -> str:
        return self.space.kernel if self.program is None else self.program.name


@dataclass(frozen=True)
class SearchSpec:
    """The ``search`` section; defaults are search.enumerate.Limits'."""

    max_kernel_ops: int = Limits.max_kernel_ops
    max_block_ops: int = Limits.max_block_ops
    max_block_inputs: int | None = Limits.max_block_inputs  # None: max(3, program inputs)
    max_grid_dims: int = Limits.max_grid_dims
    block_ops: tuple[str, ...] = DEFAULT_BLOCK_OPS
    kernel_ops: tuple[str, ...] = DEFAULT_KERNEL_OPS
    time_limit_s: float | None = None  # None: search.default_time_limit of the program's ops
    partition_above: int | None = Limits.partition_above
    max_piece_ops: int = Limits.max_piece_ops

    def limits(self) -> Limits:
        return Limits(**asdict(self))


@dataclass(frozen=True)
class TuningSpec:
    """The ``tuning`` section: one Optuna study per (structure, device)."""

    trials_per_structure: int = 30
    structures: int = 3  # the best-ranked verified structures of each program that are tuned
    time_budget_s: float | None = None
    trial_timeout_s: float = 60.0  # a candidate running longer is stopped: status timeout
    confirm: int = 3  # the fastest configs per program × device timed twice more (0: none)
    sampler: str = DEFAULT_SAMPLER
    seed: int | None = None

    def make_sampler(self) -> optuna.samplers.BaseSampler:
        """A fresh Optuna sampler of the chosen kind (``tuner.samplers``; for ``model``, its
        fallback: the launch asks the registry for the model's own)."""
        return make_sampler(self.sampler, self.seed)


@dataclass(frozen=True)
class ClusterSpec:
    address: str | None = None  # None: start an embedded Ray
    workers: int = 1


@dataclass(frozen=True)
class DatabaseSpec:
    url: str = DEFAULT_URL


@dataclass(frozen=True)
class JobSpec:
    source: str
    programs: tuple[ProgramEntry, ...]
    search: SearchSpec = field(default_factory=SearchSpec)
    tuning: TuningSpec = field(default_factory=TuningSpec)
    devices: tuple[str, ...] = ("cpu",)
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    database: DatabaseSpec = field(default_factory=DatabaseSpec)
    # (key path, line) of each of ``devices`` in the job file; () where none were written
    # there (the default [cpu], or a job built in code)
    device_places: tuple[tuple[str, int], ...] = ()

    def device_error(self, i: int, reason: str) -> JobError:
        """The error of ``devices[i]``, checked after validation (e.g. a cuda device on a
        machine without a GPU), at its line like every other job-file error."""
        key, line = (self.device_places[i] if i < len(self.device_places)
                     else (f"devices[{i}]", None))
        return JobError(self.source, line, key, reason)
