"""Which job, program or space is this: the keys the launch files its rows under.

The launch, the serving API and the read-only dashboard all need to name a job or a program
the same way; this module holds those names so none of them stands on another (the dashboard
reads a job's plan without importing the launch).  Nothing here touches the database.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from search import KernelGraph, Program, structural_hash

if TYPE_CHECKING:
    from costmodel import KernelTunerSpace

    from .jobfile import JobSpec, ProgramEntry


@dataclass(frozen=True)
class ProgramKey:
    """What a best kernel is filed under: the reference's hash, its input shapes, dtype."""

    name: str
    program_hash: str
    shapes: dict[str, list[int]]
    dtype: str


def program_key(program: Program, reference: KernelGraph | None = None) -> ProgramKey:
    """The key of ``program`` (``reference``: its built graph, when the caller has it)."""
    reference = reference if reference is not None else program.build()
    shapes = {n: [int(d) for d in s] for n, s in program.inputs.items()}
    return ProgramKey(program.name, structural_hash(reference), shapes, program.dtype)


def space_identity(space: KernelTunerSpace) -> tuple[dict, str]:
    """The program object and hash ``costmodel.import_kernel_tuner`` files this space under,
    so an imported file and a replay launch of it are one program and one structure."""
    program = {"kernel_tuner": {"kernel": space.kernel, "keys": list(space.keys),
                                "problem_size": list(space.problem_size)}}
    return program, hashlib.sha256(json.dumps(program, sort_keys=True).encode()).hexdigest()


def entry_key(entry: ProgramEntry) -> list:
    """One job entry's part of the job key: a program by its key, a Kernel Tuner space by
    its identity and the GPU it replays."""
    if entry.program is None:  # a Kernel Tuner space (``entry.space``)
        return [entry.space.kernel, space_identity(entry.space)[1], entry.space.device_key]
    k = program_key(entry.program)
    return [k.name, k.program_hash, k.shapes]


def job_key(job: JobSpec) -> str:
    """Identifies a job across relaunches: its programs (by reference hash and shapes) and
    every setting that changes what is searched or tuned."""
    desc = {
        "programs": [entry_key(e) for e in job.programs],
        "search": repr(job.search), "tuning": repr(job.tuning), "devices": list(job.devices),
    }
    digest = hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]
    return f"{Path(job.source).stem}:{digest}"


__all__ = ["ProgramKey", "entry_key", "job_key", "program_key", "space_identity"]
