"""Recorded spaces: a Kernel Tuner space tuned on the ``replay`` device through the launch.

A job entry ``{kernel_tuner: FILE.json.gz}`` with ``devices: [replay]`` runs no search: the
space is the cache's parameters (every value each one takes in the file), the study driver of
``tuner.pipeline.tune`` asks Optuna for configs, and each trial is answered from the file by a
``kernels.ReplayDevice`` held in a measurement slot that takes a GPU like ``cuda`` does (one
slot per GPU the Ray cluster declares, trials in parallel across them).  A config absent from
the file is an invalid trial (not stored, as a config that does not lower); one that failed
there is stored with its status (``compile_error`` / ``runtime_error``).  Only the trials the
study measured are stored, under the program and structure ``tuner import kernel-tuner`` uses
for the same file, on ``replay:<GPU>``; the best is the fastest stored ``ok`` (one recorded
timing per config: nothing is re-timed).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import db
from costmodel import KT_STATUS
from kernels import OK, RUNTIME_ERROR, ConfigSpace, DeviceSpec, ReplayDevice

from ..formatting import ms
from ..identity import space_identity
from ..samplers.factory import sampler_factory
from .base import ProgramPipeline
from .report import ProgramReport
from .tune import StudyRunner, StudyTask, study_name

if TYPE_CHECKING:
    from cluster import SlotPool
    from costmodel import KernelTunerSpace



def config_space_of(space: KernelTunerSpace) -> ConfigSpace:
    """Each parameter over the values it takes in the file, and the file's configs as the
    space's members (the product of those values holds 2-3x as many configs, which the GPU
    never ran: a sampler ranking the product drew its candidates mostly from them); the
    file's first config is the default (Kernel Tuner has no rule's default: the first trial
    is the file's first entry)."""
    return ConfigSpace.listed([{k: int(c[k]) for k in space.keys} for c in space.configs])


def replay_table(space: KernelTunerSpace, source: str) -> dict[str, dict]:
    """``db.config_hash(config)`` -> the recorded trial of each config in the file."""
    table: dict[str, dict] = {}
    for config, seconds, marker in zip(space.configs, space.times_s, space.failures,
                                       strict=True):
        cfg = {k: int(v) for k, v in config.items()}
        if math.isnan(seconds):
            table[db.config_hash(cfg)] = {
                "status": KT_STATUS.get(str(marker), RUNTIME_ERROR), "config": cfg,
                "message": f"Kernel Tuner recorded {marker} on {space.device}"}
        else:
            table[db.config_hash(cfg)] = {
                "status": OK, "config": cfg, "median_s": seconds, "samples": [seconds],
                "source": f"// {space.kernel} on {space.device}, replayed from the Kernel "
                          f"Tuner cache {source}\n// config {json.dumps(cfg, sort_keys=True)}\n"}
    return table


def replay_device(space: KernelTunerSpace, source: str) -> ReplayDevice:
    return ReplayDevice(replay_table(space, source), db.config_hash, space.device_key,
                        replay_spec(space.device))


def replay_spec(device: str) -> DeviceSpec:
    """The device table's row for the GPU, or its closest sibling's under its own name
    (``costmodel.device_profile``; the replay study never estimates: a Kernel Tuner space has
    no µGraph, and the spec is only carried along)."""
    from costmodel import spec_for_key
    from kernels import replay_key

    return spec_for_key(replay_key(device))


def replay_slots() -> tuple[int, dict[str, Any]]:
    """(slots, Ray resources of each): one per GPU of the Ray cluster, as ``cuda``; a Ray
    without GPUs (an embedded one on a CPU machine) gets one slot that reserves nothing."""
    import ray

    gpus = int(ray.cluster_resources().get("GPU", 0))
    return (gpus, {"num_cpus": 0, "num_gpus": 1}) if gpus else (1, {"num_cpus": 0})


class ReplayStudyRunner(StudyRunner):
    """The study driver without the roofline: the space has no µGraph to estimate."""

    def estimate_s(self, task: StudyTask, config: dict[str, int]) -> float | None:
        return None


class RecordedSpacePipeline(ProgramPipeline):
    """A Kernel Tuner space (``{kernel_tuner: FILE}``) tuned on the replay device."""

    def prepare(self, database: db.Database, job_id: int) -> None:
        from costmodel import KT_DTYPE

        space = self.entry.space
        self.program, self.phash = space_identity(space)
        self.shapes = {"problem_size": list(space.problem_size)}
        pid = database.record_program(self.phash, self.shapes, KT_DTYPE, space.kernel,
                                      self.program)
        self.structure_id = database.record_structure(
            pid, self.phash, self.program,
            {"layer": "replay", "verdict": "recorded",
             "note": f"Kernel Tuner cache {self.entry.ref}"}, 1)

    def devices(self, pools: dict[str, SlotPool]
                ) -> Generator[tuple[str, SlotPool], None, None]:
        """Its own pool: slots answering from the file, one per GPU of the cluster."""
        from cluster import SlotPool

        space = self.entry.space
        self.slots, resources = replay_slots()
        self.t0 = time.perf_counter()
        pool = SlotPool(replay_device(space, self.entry.ref), self.slots, resources=resources)
        try:
            self.ctx.log(f"{space.kernel}: Kernel Tuner space of {len(space.configs)} configs "
                         f"on {space.device}, replayed on {self.slots} slot(s) over "
                         f"{len({n for _, n in pool.placement()})} node(s)")
            yield "replay", pool
        finally:
            pool.close()

    def tune(self, database: db.Database, storage: Any, pool: SlotPool) -> ProgramReport:
        from costmodel import KT_DTYPE

        space, phash, program = self.entry.space, self.phash, self.program
        rep = ProgramReport(space.kernel, self.shapes, pool.key, structures_found=1,
                            candidates=1)
        tuning = self.ctx.job.tuning
        factory = sampler_factory(tuning.sampler, tuning.seed, database, pool.key,
                                  self.ctx.log_once)
        rep.sampler = factory.chosen
        runner = ReplayStudyRunner(database, storage, factory, pool,
                                   trials=tuning.trials_per_structure, seed=tuning.seed or 0,
                                   deadline=self.ctx.deadline(),
                                   timeout_s=tuning.trial_timeout_s,
                                   on_trial=self.ctx.trial_progress(space.kernel))
        task = StudyTask(space.kernel, self.structure_id, phash, None, program, program,
                         config_space_of(space), pool.key, pool.spec,
                         study_name(space.kernel, phash, db.shapes_key(self.shapes), phash,
                                    pool.key))
        rep.merge(runner.run(task, phash))
        rep.structures_tuned = 1
        best = database.best_kernel(phash, self.shapes, KT_DTYPE, pool.key)
        if best is not None:
            rep.best_s, rep.best_structure, rep.best_config = (best.time_s,
                                                               best.structure_hash, best.config)
        rep.tune_s = time.perf_counter() - self.t0
        return rep

    def report(self, device: str, pool: SlotPool, rep: ProgramReport
               ) -> tuple[str, dict[str, Any]]:
        fails = Counter({k: v for k, v in rep.statuses.items() if k != OK})
        self.ctx.log(f"{rep.program} on {pool.key}: {rep.trials} trial(s), best "
                     f"{ms(rep.best_s)}" + (f"; failed: {dict(fails)}" if fails else ""))
        return f"{rep.program}@{pool.key}", {"tune_s": round(rep.tune_s, 3),
                                             "slots": self.slots,
                                             "replaced_slots": pool.replaced}
