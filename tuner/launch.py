"""``tuner launch``: a job file through search, verification, tuning and the database.

For each program of the job, in order: search (shards over Ray, each finished shard saved so a
relaunch skips it) → verified structures stored → the op-by-op baseline timed → for each of the
best-ranked structures and each device, an Optuna study (``tuner.tune``) whose trials run on
measurement slots and are stored as they finish.  A launch killed anywhere and started again
with the same job and database continues where it was; nothing measured is measured again.
The job file is validated, the devices checked and the database URL parsed before anything
is written.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import db
from search import KernelGraph, to_obj
from verifier import DEFAULT_TESTS

from ._console import Progress
from .api import InputError, small_instance
from .cached import tuned_best
from .confirm import TIMINGS
from .formatting import ms
from .identity import job_key, program_key
from .jobfile import JobSpec, ProgramEntry, load_job
from .tune import StudyOutcome, StudyRunner, StudyTask, study_name

if TYPE_CHECKING:
    import optuna

    from cluster import LocalExecutor, RayExecutor, SearchResult, SlotPool
    from search import Program

    Executor = LocalExecutor | RayExecutor

SHARD_KEY_LEN = 200
# random tests per structure in the search's finite-field check (passed to it, and stored)
VERIFY_TESTS = DEFAULT_TESTS
# what cluster.verify_structure binds every grid / for-loop symbol to at the small instance
VERIFY_SYMBOL = 2


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
    confirmed: int = 0  # configs timed TIMINGS times (tuner.confirm) to pick the best
    confirm_new: int = 0  # re-runs measured by this run
    best_first_s: float | None = None  # the fastest single first timing, for comparison
    library: bool = False  # the library path (numpy / CuPy op by op) beat every tuned kernel
    tuned_s: float | None = None  # the fastest tuned kernel's confirmed time, for comparison

    @property
    def speedup(self) -> float | None:
        if self.best_s and self.baseline_s:
            return self.baseline_s / self.best_s
        return None

    def as_dict(self) -> dict:
        return {"program": self.program, "shapes": self.shapes, "device_key": self.device_key,
                "best_s": self.best_s, "baseline_s": self.baseline_s, "speedup": self.speedup,
                "structures_found": self.structures_found,
                "structures_tuned": self.structures_tuned, "trials": self.trials,
                "new_trials": self.new_trials,
                "failures": {k: v for k, v in self.statuses.items() if k != "ok"},
                "skipped_by_roofline": self.skipped, "invalid_configs": self.invalid,
                "best_structure": self.best_structure, "best_config": self.best_config,
                "search_s": round(self.search_s, 3), "tune_s": round(self.tune_s, 3),
                "shards_reused": self.shards_reused, "confirmed": self.confirmed,
                "confirm_new": self.confirm_new, "best_first_s": self.best_first_s,
                "library": self.library, "tuned_s": self.tuned_s}


@dataclass
class LaunchResult:
    job_id: int
    job_key: str
    resumed: bool
    url: str
    reports: list[ProgramReport]
    elapsed_s: float

    def as_dict(self) -> dict:
        return {"job_id": self.job_id, "job_key": self.job_key, "resumed": self.resumed,
                "database": self.url, "elapsed_s": round(self.elapsed_s, 3),
                "programs": [r.as_dict() for r in self.reports]}


def check_devices(devices: tuple[str, ...], address: str | None = None) -> None:
    """Refuse a device this machine cannot measure on, before anything runs.  With a cluster
    ``address`` the GPUs are the cluster's: ``check_cluster_gpus`` runs once Ray is joined."""
    if address:
        return
    for i, device in enumerate(devices):
        if device.startswith("cuda"):
            from kernels import cuda_available

            ok, why = cuda_available()
            if not ok:
                raise InputError(f"devices[{i}]: {device}: the cuda device is unavailable "
                                 f"({why}); use 'devices: [cpu]' or run on a GPU machine")


def check_cluster_gpus(devices: tuple[str, ...]) -> None:
    """The joined Ray cluster must have a GPU for every cuda device of the job."""
    import ray

    gpus = int(ray.cluster_resources().get("GPU", 0))
    for i, device in enumerate(devices):
        if device.startswith("cuda") and gpus < 1:
            raise InputError(f"devices[{i}]: {device}: the Ray cluster has no GPU resource; "
                             "start its nodes with GPUs (ray start --num-gpus N) or use "
                             "'devices: [cpu]'")


def prepare(path: str | Path, db_url: str | None = None, resume: bool = False,
            address: str | None = None) -> tuple[JobSpec, str]:
    """Validate everything a launch needs without writing anything: (job, database URL)."""
    job = load_job(path)
    url = db_url or job.database.url
    try:
        db.normalize_url(url)
    except (ValueError, db.DatabaseError) as err:
        raise InputError(f"database URL {url!r}: {err}") from None
    check_devices(job.devices, address or job.cluster.address)
    if resume and not _has_job(url, job_key(job)):
        raise InputError(f"--resume: no earlier run of {path} in {url}; drop --resume to "
                         "start it")
    return job, url


def _has_job(url: str, key: str) -> bool:
    try:
        database = db.connect(url, migrate_schema=False)  # never creates or migrates
    except db.DatabaseError:
        return False
    with database:
        return database.job(key) is not None


class JobRun:
    """One run of a job; ``run()`` returns the summary.  See the module docstring."""

    def __init__(self, job: JobSpec, url: str, *, address: str | None = None,
                 log: Callable[[str], None] | None = None,
                 progress: Progress | None = None) -> None:
        self.job, self.url = job, url
        self.address = address or job.cluster.address
        self.log = log or (lambda _msg: None)
        self.progress = progress
        self.tune_deadline: float | None = None  # set when the first study starts

    def run(self) -> LaunchResult:
        """Start (or join) Ray and check the devices there, then, and only then, open the
        database: a cluster without the job's GPUs is refused before anything is written."""
        from cluster import ClusterJoinError, make_executor, start_ray, stop_ray

        start = time.perf_counter()
        try:
            started = start_ray(self.job.cluster.workers, self.address)
        except ClusterJoinError as err:
            raise InputError(str(err)) from None
        executor, pools = None, {}
        try:
            if self.address:
                check_cluster_gpus(self.job.devices)
            executor = make_executor(self.job.cluster.workers, self.address)
            pools = self._pools()
            return self._run_job(executor, pools, start)
        finally:
            for pool in pools.values():
                pool.close()
            if executor is not None:
                executor.close()
            if started:
                stop_ray()

    def _pools(self) -> dict[str, SlotPool]:
        from cluster import SlotPool, cpu_slot_nodes
        from kernels import device_key

        pools = {}
        for device in self.job.devices:
            if device == "replay":  # a pool per Kernel Tuner space (tuner.replay)
                continue
            if device == "cpu" and len(nodes := cpu_slot_nodes()) > 1:  # one per CPU node
                pool = SlotPool("cpu", pin=nodes, prefer_key=device_key("cpu"))
                for node, key in pool.left_out:
                    self.log(f"cpu: node {node[:12]} times as {key}, not {pool.key}: "
                             "it searches but does not time this job's cpu trials")
                self.log(f"cpu: {len(pool.slots)} measurement slot(s), one per CPU node")
                pools[device] = pool
                continue
            pools[device] = SlotPool("cpu" if device == "cpu" else "cuda", _slots(device))
        return pools

    def _run_job(self, executor: Executor, pools: dict[str, SlotPool], start: float
                 ) -> LaunchResult:
        database = db.connect(self.url)
        record = database.start_job(job_key(self.job), self.job.source)
        how = f"resumed, attempt {record.attempts}" if record.resumed else "new"
        self.log(f"job {record.job_key} ({how}) -> {database!r}")
        status, reports, timings = "failed", [], {}
        try:
            storage = optuna_storage(database)
            for entry in self.job.programs:
                if entry.space is not None:
                    from .replay import run_replay

                    reports += run_replay(self, database, entry, storage, timings,
                                          ProgramReport)
                    continue
                reports += self._program(database, record.id, entry, executor, pools, storage,
                                         timings)
            status = "finished"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            timings["total_s"] = round(time.perf_counter() - start, 3)
            try:
                database.finish_job(record.id, status, timings)
            finally:
                database.close()
        return LaunchResult(record.id, record.job_key, record.resumed, self.url, reports,
                            time.perf_counter() - start)

    # -- one program ----------------------------------------------------------------------

    def _program(self, database: db.Database, job_id: int, entry: ProgramEntry,
                 executor: Executor, pools: dict[str, SlotPool],
                 storage: optuna.storages.RDBStorage, timings: dict[str, Any]
                 ) -> list[ProgramReport]:
        from cluster import ShardResult, search_program
        from kernels import config_space, rank_structures

        from .confirm import confirm

        program = entry.program
        reference = program.build()
        key = program_key(program, reference)
        pid = database.record_program(key.program_hash, key.shapes, key.dtype, program.name,
                                      to_obj(reference))
        prefix = f"{key.program_hash[:16]}/"
        done = {}
        for stats in database.shard_results(job_id, prefix).values():
            res = ShardResult.from_json(stats)
            done[res.shard_id] = res

        def save(res: ShardResult) -> None:
            if res.complete:
                database.record_shard(job_id, _shard_key(prefix, res.shard_id), "finished",
                                      res.to_json())

        t0 = time.perf_counter()
        self.log(f"{program.name}: search ({len(done)} shards from an earlier run)")
        if hasattr(executor, "on_reissue"):  # a Ray executor: say which stragglers it copied
            executor.on_reissue = lambda sid, out_s, limit_s: self.log(
                f"{program.name}: shard {sid} out {out_s:.1f} s (limit {limit_s:.1f} s): "
                "re-issued to an idle worker, the first copy to finish wins")
        result = search_program(program, self.job.search.limits(), tests=VERIFY_TESTS,
                                executor=executor,
                                time_limit_s=self.job.search.time_limit_s, done=done,
                                on_shard=save, on_progress=self._search_progress(program.name))
        search_s = time.perf_counter() - t0
        stored = self._store_structures(database, pid, program, result, reference)
        self.log(f"{program.name}: {len(result.verified)} verified structure(s) in "
                 f"{search_s:.1f} s; tuning the best {min(len(stored), self.job.tuning.structures)}"
                 " by the roofline estimate of each device"
                 + (f" ({len(result.reissued)} straggling shard(s) re-issued)"
                    if result.reissued else ""))
        reports = []
        for device, pool in pools.items():
            rep = ProgramReport(program.name, key.shapes, pool.key,
                                structures_found=len(result.verified),
                                search_s=search_s, shards_reused=len(done))
            t1 = time.perf_counter()
            rep.baseline_s = self._baseline(pool, reference)
            runner = StudyRunner(database, storage, self._sampler_factory(database, pool.key),
                                 pool,
                                 trials=self.job.tuning.trials_per_structure,
                                 seed=self.job.tuning.seed or 0, deadline=self._deadline(),
                                 timeout_s=self.job.tuning.trial_timeout_s or 60.0,
                                 on_trial=self._trial_progress(program.name))
            order = rank_structures([g for _, _, g in stored], pool.spec)
            for sid, shash, graph in [stored[i] for i in order[:self.job.tuning.structures]]:
                task = StudyTask(program.name, sid, shash, graph, to_obj(graph),
                                 to_obj(reference), config_space(graph, pool.spec), pool.key,
                                 pool.spec, study_name(program.name, key.program_hash,
                                                       db.shapes_key(key.shapes), shash,
                                                       pool.key), rep.baseline_s)
                outcome = runner.run(task, key.program_hash)
                self._merge(rep, outcome)
                rep.structures_tuned += 1
            library = LibraryCandidate(database, pid, key, reference, pool)
            lib_s = library.time(rep.baseline_s, partial(self._baseline, pool, reference))
            rep.baseline_s = lib_s or rep.baseline_s  # the library's median of its timings
            conf = confirm(database, pool, key, pid, self.job.tuning.confirm,
                           to_obj(reference), rep.baseline_s, seed=self.job.tuning.seed or 0,
                           timeout_s=self.job.tuning.trial_timeout_s or 60.0,
                           past_deadline=runner.past_deadline)
            rep.confirmed, rep.confirm_new, rep.best_first_s = conf.candidates, conf.new, \
                conf.first_s
            rep.library = library.compete(program.name)
            best = database.best_kernel(key.program_hash, key.shapes, key.dtype, pool.key)
            if best is not None:
                rep.best_s, rep.best_structure = best.time_s, best.structure_hash
                rep.best_config = best.config
                rep.baseline_s = rep.baseline_s or best.baseline_s
                rep.tuned_s = library.tuned_s
            rep.tune_s = time.perf_counter() - t1
            timings[f"{program.name}@{device}"] = {"search_s": round(search_s, 3),
                                                   "tune_s": round(rep.tune_s, 3)}
            reports.append(rep)
            confirmed = f" (median of {conf.best_timings} timings; the fastest first timing " \
                f"{ms(conf.first_s)})" if conf.best_s is not None else ""
            if rep.library:
                self.log(f"{program.name} on {pool.key}: {rep.trials} trial(s); the library "
                         f"wins: numpy op by op {ms(rep.best_s)} (median of {TIMINGS} "
                         f"timings) vs the fastest tuned kernel {ms(rep.tuned_s)}")
            else:
                self.log(f"{program.name} on {pool.key}: {rep.trials} trial(s), best "
                         f"{ms(rep.best_s)}{confirmed} vs numpy {ms(rep.baseline_s)}")
        return reports

    def _store_structures(self, database: db.Database, pid: int, program: Program,
                          result: SearchResult, reference: KernelGraph
                          ) -> list[tuple[int, str, KernelGraph]]:
        """Store every verified structure, with how it was verified, and the reference
        program (a kernel per op, trivially equivalent: all there is when the search verified
        nothing); return them all, in the search's order, the reference last."""
        from search import structural_hash

        instance = small_instance_shapes(program)
        ranked = [(s["hash"], result.verified[s["hash"]], s,
                   structure_verification(result.verified[s["hash"]], instance))
                  for s in result.structures]
        h = structural_hash(reference)
        if h not in {r[0] for r in ranked}:
            # the program itself, a kernel per op, is a candidate too, ranked with the rest by
            # its estimate (lora's structures under three block inputs compute W + A·B, twice
            # the reference's multiply-adds)
            ranked.append((h, reference, {"num_kernels": len(reference.ops) - len(
                reference.input_ids) - len(reference.ops_of("output")), "bytes_moved": None},
                {"layer": "structure", "verdict": "reference",
                 "note": "the program as written, a kernel per op"}))
        out = []
        for h, graph, desc, verification in ranked:
            sid = database.record_structure(pid, h, to_obj(graph), verification,
                                            int(desc.get("num_kernels") or 0),
                                            desc.get("bytes_moved"))
            out.append((sid, h, graph))
        return out

    def _sampler_factory(self, database: db.Database, device_key: str) -> Callable[[], Any]:
        """The job's sampler; for ``sampler: model``, the cost model stored for this device
        (TPE, said in the log, where none is trained)."""
        tuning = self.job.tuning
        if tuning.sampler != "model":
            return tuning.make_sampler
        from costmodel import model_for

        from ._model_sampler import ModelSampler

        found = model_for(database, device_key)
        if found is None:
            self.log(f"sampler model: no trained cost model for {device_key} in the database "
                     "(`tuner model train`); tuning with TPE instead")
            return tuning.make_sampler
        model, record = found
        self.log(f"sampler model: cost model {record.id} ({record.kind}, trained on "
                 f"{record.trained_on.get('rows', '?')} measurements) ranks each space")
        return lambda: ModelSampler(model, seed=tuning.seed or 0)

    def _baseline(self, pool: SlotPool, reference: KernelGraph) -> float | None:
        pool.submit("baseline", {"reference": to_obj(reference), "tag": "baseline"})
        return pool.next_done().get("baseline_s")

    def _deadline(self) -> float | None:
        """The tuning budget is for the whole job: its clock starts at the first study."""
        budget = self.job.tuning.time_budget_s
        if budget is not None and self.tune_deadline is None:
            self.tune_deadline = time.time() + budget
        return self.tune_deadline

    @staticmethod
    def _merge(rep: ProgramReport, outcome: StudyOutcome) -> None:
        rep.trials += outcome.measured
        rep.new_trials += outcome.new
        rep.statuses.update(outcome.statuses)
        rep.skipped += outcome.skipped
        rep.invalid += outcome.invalid

    def _search_progress(self, name: str) -> Callable[[dict], None]:
        def report(info: dict) -> None:
            if self.progress is not None:
                self.progress.search(name, info)
        return report

    def _trial_progress(self, name: str) -> Callable[[StudyTask, dict], None]:
        def report(task: StudyTask, res: dict) -> None:
            if self.progress is not None:
                self.progress.trial(name, task.structure_hash, res)
        return report


class LibraryCandidate:
    """The library path (the reference graph op by op through numpy / CuPy, the baseline) as
    a candidate of the launch: a structure row (``db.LIBRARY_PREFIX`` + the program's hash,
    verdict ``library``) with one trial (config {}) whose measurements are the baseline's
    timings, ``TIMINGS`` of them like a confirmed kernel.  ``compete`` makes it the best row
    when its median beats every tuned kernel's (``tuner best`` and ``tuner.load`` say and
    serve so), so a launch never serves a kernel slower than the library."""

    def __init__(self, database: db.Database, program_id: int, key: Any,
                 reference: KernelGraph, pool: SlotPool) -> None:
        from kernels import LIBRARY

        self.database, self.key, self.reference, self.pool = database, key, reference, pool
        ops = len(reference.ops) - len(reference.input_ids) - len(reference.ops_of("output"))
        sid = database.record_structure(
            program_id, db.LIBRARY_PREFIX + key.program_hash, to_obj(reference),
            {"layer": "structure", "verdict": LIBRARY,
             "note": "the reference graph run op by op by the device's library (numpy/BLAS "
                     "on a cpu, CuPy on a GPU): the baseline, a candidate of every launch"},
            ops)
        self.trial_id = database.record_trial(sid, pool.key, {})
        self.median_s: float | None = None
        self.tuned_s: float | None = None

    def time(self, first_s: float | None, again: Callable[[], float | None]) -> float | None:
        """Store ``first_s`` (this run's baseline) and further timings (``again``) until the
        library has ``TIMINGS`` ok timings; their median, or None if it cannot be timed."""
        import statistics

        have = self.database.measurements(self.trial_id)
        attempt = 1 + max((m.attempt for m in have), default=-1)
        ok = [m.median_s for m in have if m.status == "ok"]
        while len(ok) < TIMINGS:
            seconds = first_s if first_s is not None else again()
            first_s = None
            if seconds is None:
                break
            self.database.record_measurement(self.trial_id, "ok", median_s=seconds,
                                             attempt=attempt)
            attempt += 1
            ok.append(seconds)
        self.median_s = statistics.median(ok) if ok else None
        return self.median_s

    def compete(self, name: str) -> bool:
        """Make the library the best row where it is faster than every tuned kernel (or
        nothing else passed); returns whether it is the best now."""
        from kernels import library_source

        if self.median_s is None:
            return False
        k = self.key
        tuned = tuned_best(self.database, k.program_hash, k.shapes, k.dtype, self.pool.key)
        self.tuned_s = tuned
        if tuned is not None and tuned <= self.median_s:
            best = self.database.best_kernel(k.program_hash, k.shapes, k.dtype, self.pool.key)
            if best is not None and best.baseline_s != self.median_s:  # speedup vs the median
                self.database.confirm_best(best.trial_id, best.source, self.median_s)
            return False
        self.database.confirm_best(self.trial_id, library_source(self.reference, name),
                                   self.median_s)
        return True


def small_instance_shapes(program: Program) -> dict[str, list[int]]:
    """The input shapes the search verifies ``program``'s structures at (its small
    instance: every dim capped, see ``search.suite.small_instance``)."""
    return {name: [int(d) for d in shape]
            for name, shape in small_instance(program).inputs.items()}


def structure_verification(structure: KernelGraph, instance: dict[str, list[int]],
                           tests: int = VERIFY_TESTS) -> dict[str, Any]:
    """How the search verified ``structure`` (stored with it): ``tests`` random tests in the
    finite field at the small ``instance`` with every grid / for-loop symbol bound to
    ``VERIFY_SYMBOL`` (``cluster.verify_structure``'s rule; ``SearchResult`` does not carry
    the binding, so it is derived here from the structure's symbols)."""
    return {"layer": "structure", "arithmetic": "field", "verdict": "equivalent",
            "tests": tests, "instance": instance,
            "symbols": {s: VERIFY_SYMBOL for s in sorted(structure.symbols())}}


def _slots(device: str) -> int:
    """Measurement slots for a device entry: one per GPU of the Ray cluster for ``cuda``,
    one for ``cuda:N`` (Ray picks the GPU) and one for ``cpu`` on one node (a cpu kernel uses
    every core of its node, so two slots there would time each other; a cluster of several
    CPU nodes gets one pinned slot on each, see ``_pools``)."""
    if device != "cuda":
        return 1
    import ray

    return max(1, int(ray.cluster_resources().get("GPU", 1)))


def _shard_key(prefix: str, shard_id: str) -> str:
    key = prefix + shard_id
    if len(key) > SHARD_KEY_LEN:
        key = prefix + "sha256:" + hashlib.sha256(shard_id.encode()).hexdigest()
    return key


def optuna_storage(database: db.Database) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage on the tuner database itself (optuna-dashboard reads it).

    Optuna creates its tables and stamps its version on first use, in steps that two launches
    started at once on a fresh database trip over ("table studies already exists"); under the
    database's schema lock they take turns."""
    import optuna

    url = database.url
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    with database.schema_lock():
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)


def launch(path: str | Path, *, db_url: str | None = None, address: str | None = None,
           resume: bool = False, log: Callable[[str], None] | None = None,
           progress: Progress | None = None) -> LaunchResult:
    """Run the job file at ``path`` (see the module docstring); the Python face of
    ``tuner launch``."""
    job, url = prepare(path, db_url, resume, address)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    return JobRun(job, url, address=address, log=log, progress=progress).run()
