"""``tuner launch``: a job file through search, verification, tuning and the database.

For each entry of the job, in order, its pipeline (``tuner.pipeline.base``): a µGraph program
is searched, its verified structures stored and tuned on each device
(``tuner.pipeline.ugraph``); a recorded Kernel Tuner space is tuned on the replay device
(``tuner.pipeline.recorded``).  A launch killed anywhere and started again with the same job
and database continues where it was; nothing measured is measured again.  The job file is
validated, the devices checked and the database URL parsed before anything is written.  At
its end the launch retrains the cost model of each device it measured on, within a small time
budget (``retrain``; ``--no-train`` skips it), so the next launch's ``sampler: auto`` starts
from what this one measured.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import db

from ..api import InputError
from ..identity import job_key
from ..jobfile import JobSpec, ProgramEntry, load_job
from .base import ProgramPipeline, ProgressSink, RunContext
from .devices import check_cluster_gpus, check_devices, make_pools
from .recorded import RecordedSpacePipeline
from .report import LaunchResult
from .ugraph import UGraphPipeline

if TYPE_CHECKING:
    import optuna

    from cluster import SlotPool

# the pipeline of each kind of job entry (``ProgramEntry.kind``)
PIPELINES: dict[str, type[ProgramPipeline]] = {
    "builtin": UGraphPipeline, "file": UGraphPipeline, "inline": UGraphPipeline,
    "kernel_tuner": RecordedSpacePipeline,
}


TRAIN_BUDGET_S = 30.0  # the retrain at the end of a launch: LightGBM stops boosting at this
MIN_TRAIN_ROWS = 5  # fewer ok measurements of a device: nothing to learn from yet


def pipeline_for(ctx: RunContext, entry: ProgramEntry) -> ProgramPipeline:
    """The pipeline that runs ``entry``."""
    return PIPELINES[entry.kind](ctx, entry)


def prepare(path: str | Path, db_url: str | None = None, resume: bool = False,
            address: str | None = None) -> tuple[JobSpec, str]:
    """Validate everything a launch needs without writing anything: (job, database URL)."""
    job = load_job(path)
    url = db_url or job.database.url
    try:
        db.normalize_url(url)
    except (ValueError, db.DatabaseError) as err:
        raise InputError(f"database URL {url!r}: {err}") from None
    check_devices(job, address or job.cluster.address)
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
                 progress: ProgressSink | None = None, train: bool = True,
                 train_budget_s: float = TRAIN_BUDGET_S) -> None:
        self.job, self.url = job, url
        self.train, self.train_budget_s = train, train_budget_s
        self.address = address or job.cluster.address
        self.ctx = RunContext(job, log or (lambda _msg: None), progress)

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
                check_cluster_gpus(self.job)
            executor = self.ctx.executor = make_executor(self.job.cluster.workers,
                                                         self.address)
            pools = make_pools(self.job.devices, self.ctx.log)
            return self._run_job(pools, start)
        finally:
            for pool in pools.values():
                pool.close()
            if executor is not None:
                executor.close()
            if started:
                stop_ray()

    def _run_job(self, pools: dict[str, SlotPool], start: float) -> LaunchResult:
        database = db.connect(self.url)
        record = database.start_job(job_key(self.job), self.job.source)
        how = f"resumed, attempt {record.attempts}" if record.resumed else "new"
        self.ctx.log(f"job {record.job_key} ({how}) -> {database!r}")
        status, reports, timings = "failed", [], {}
        trained: list[dict] = []
        try:
            storage = optuna_storage(database)
            for entry in self.job.programs:
                reports += pipeline_for(self.ctx, entry).run(database, record.id, storage,
                                                             pools, timings)
            status = "finished"
            if self.train:
                t0 = time.perf_counter()
                trained = retrain(database, sorted({r.device_key for r in reports}),
                                  self.train_budget_s, self.ctx.log)
                timings["train_s"] = round(time.perf_counter() - t0, 3)
            else:
                self.ctx.log("cost model: not retrained (--no-train)")
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
                            time.perf_counter() - start, trained)


def retrain(database: db.Database, device_keys: list[str], budget_s: float,
            log: Callable[[str], None]) -> list[dict]:
    """The launch's last step, per device it measured on: the LightGBM model a launch there
    uses, taught what was measured since it was trained (``costmodel.update``: a model
    trained on many rows, the CPU dataset's, is not fitted again), else one fitted on the
    device's measurements (incremental: none when nothing new was measured since the newest
    model), boosting stopped at the time budget, its held-out figure stored with it for the
    next launch's ``sampler: auto``.  A failure is said, never fatal: what the launch
    measured is stored already."""
    import costmodel

    out = []
    share = budget_s / max(1, len(device_keys))
    for key in device_keys:
        try:
            res = (costmodel.update(database, key, time_budget_s=share / 2)
                   or costmodel.train(database, device_key=key, kind="gbdt",
                                      options={"time_budget_s": share / 2},
                                      min_rows=MIN_TRAIN_ROWS))
        except Exception as err:  # noqa: BLE001 - said, never fatal (a LightGBM error too)
            why = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
            log(f"cost model: not retrained for {key}: {why}")
            out.append({"model_id": None, "device_key": key, "trained": False, "rows": None,
                        "seconds": None, "held_out_tau": None, "reason": why})
            continue
        tau = res.get("held_out", {}).get(key, {}).get("kendall_tau")
        if not res["trained"]:
            log(f"cost model {res['model_id']} for {key}: up to date (nothing new measured)")
        elif res.get("updated"):
            before = res["before"].get("kendall_tau")
            log(f"cost model {res['model_id']} (gbdt): model {res['full_fit']} taught the "
                f"{res['since_full_fit']} measurements since it was fitted, {res['new_rows']} "
                f"of them new on {key}, in {res['seconds']} s"
                + (f" (model {res['from']} had ranked those at tau {before:.2f}"
                   + ("; it had never trained on this device: how each update ranked the "
                      f"rows it was then taught, tau {tau:.2f}, is its held-out figure here)"
                      if res.get("new_device") and tau is not None else ")")
                   if before is not None else ""))
        else:
            log(f"cost model {res['model_id']} (gbdt) retrained for {key} on {res['rows']} "
                f"measurements in {res['seconds']} s"
                + (f"; held-out tau {tau:.2f}" if tau is not None else ""))
        out.append({k: res.get(k) for k in ("model_id", "trained", "rows", "seconds")}
                   | {"device_key": key, "model_device_key": res.get("device_key"),
                      "held_out_tau": tau, "updated_from": res.get("from"),
                      "full_fit": res.get("full_fit"), "new_rows": res.get("new_rows")})
    return out


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
           progress: ProgressSink | None = None, train: bool = True) -> LaunchResult:
    """Run the job file at ``path`` (see the module docstring); the Python face of
    ``tuner launch`` (``train`` False: ``--no-train``)."""
    job, url = prepare(path, db_url, resume, address)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    return JobRun(job, url, address=address, log=log, progress=progress, train=train).run()

