"""How far along a job is: its programs, which are done, trials measured of those planned,
elapsed time and an estimate of the time left.

The database links a job to its programs through its search shards (keys ``HASH16/shard``);
the job file, when it is still where the launch read it and unchanged (its job key matches),
adds the programs not reached yet and the plan (devices, structures and trials per structure,
time budget).  Without the file the totals are what the database shows so far.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from datetime import datetime, timezone

import db

from .reader import Reader
from .tables import FINISHED, RUNNING
from .views import ProgramProgress, iso, shapes_text


@dataclass(frozen=True)
class Plan:
    programs: list[tuple[str, str, dict]]  # (name, program_hash, shapes) in the job's order
    keys: list[tuple[str, str]]  # (program_hash, shapes key) of each, as db files them
    devices: int
    structures: int
    trials_per_structure: int
    time_budget_s: float | None


_plans: dict[tuple[str, float, str], Plan | None] = {}
_plans_lock = threading.Lock()


def job_plan(job_path: str, job_key: str) -> Plan | None:
    """The plan of the job file at ``job_path`` if it is still the file that job ran."""
    try:
        mtime = os.stat(job_path).st_mtime
    except OSError:
        return None
    key = (job_path, mtime, job_key)
    with _plans_lock:
        if key in _plans:
            return _plans[key]
    plan = None
    try:
        from ..identity import job_key as key_of
        from ..identity import program_key
        from ..jobfile import load_job

        job = load_job(job_path)
        programs = [e.program for e in job.programs if e.program is not None]
        # a recorded space's entry has no program to key here: that job's totals are what
        # the database shows, as for a job file that is gone
        if key_of(job) == job_key and len(programs) == len(job.programs):
            keys = [program_key(p) for p in programs]
            plan = Plan([(k.name, k.program_hash, k.shapes) for k in keys],
                        [(k.program_hash, db.shapes_key(k.shapes)) for k in keys], len(job.devices),
                        job.tuning.structures, job.tuning.trials_per_structure,
                        job.tuning.time_budget_s)
    except Exception:  # a file that no longer loads is no plan, not a broken page
        plan = None
    with _plans_lock:
        _plans[key] = plan
    return plan


def job_progress(reader: Reader, job: dict, prefixes: list[str],
                 now: datetime | None = None, optuna: bool = False,
                 every_program: list[ProgramProgress] | None = None
                 ) -> tuple[dict, list[ProgramProgress]]:
    """(progress of ``job``, its programs in the job's order); ``every_program``: all
    program rows, read once for many jobs."""
    now = now or datetime.now(timezone.utc)
    plan = job_plan(job["job_path"], job["job_key"])
    hashes = list(prefixes)
    if plan is not None:
        hashes += [h[:16] for _, h, _ in plan.programs if h[:16] not in hashes]
    if every_program is not None:
        searched = set(hashes)
        rows = [r for r in every_program if r.program_hash[:16] in searched]
    else:
        rows = reader.programs(hashes=hashes, optuna=optuna)
    waiting: list[dict] = []
    if plan is not None:  # the job's own shapes, in its order
        wanted = {key: i for i, key in enumerate(plan.keys)}
        rows = [r for r in rows if _key(r) in wanted]
        rows.sort(key=lambda r: wanted[_key(r)])
        have = {_key(r) for r in rows}
        waiting = [{"name": n, "shapes_text": shapes_text(s)}
                   for (n, _, s), key in zip(plan.programs, plan.keys, strict=True)
                   if key not in have]
    else:
        order = {p: i for i, p in enumerate(prefixes)}
        rows.sort(key=lambda r: (order.get(r.program_hash[:16], len(order)), r.id))
    total = len(plan.programs) if plan is not None else len(rows)
    # reached by this job: it searched there (shards), or the program was first recorded
    # after the job started (a launch records each program as it reaches it); the trials of
    # a program tuned by an earlier job do not count
    started_at = job["started_at"]
    started = {r.program_hash[:16] for r in rows
               if r.created_at and started_at and r.created_at >= started_at} | set(prefixes)
    position = [i for i, r in enumerate(rows) if r.program_hash[:16] in started]
    finished = job["status"] == FINISHED
    done = total if finished else max(0, len(position) - 1) if position else 0
    current = None
    if job["status"] == RUNNING and position:
        current = rows[position[-1]].name
    trials = sum(r.trials for r in rows)
    planned = None
    if plan is not None:
        per_program = []
        for i in range(total):
            row = rows[i] if i < len(rows) else None
            tuned = min(plan.structures, row.structures) if row and row.structures else \
                plan.structures
            per_program.append(tuned * plan.trials_per_structure * plan.devices)
        planned = max(trials, sum(per_program))
    finished_at = job["finished_at"]
    end = finished_at if finished_at is not None and job["status"] != RUNNING else now
    elapsed = max(0.0, (end - started_at).total_seconds()) if started_at else None
    eta = None
    if job["status"] == RUNNING and planned and trials and elapsed:
        eta = elapsed * (planned - trials) / trials
        firsts = [d.first_at for r in rows for d in r.devices.values()
                  if d.first_at and d.first_at >= started_at]
        if plan is not None and plan.time_budget_s and firsts:
            left = plan.time_budget_s - (now - min(firsts)).total_seconds()
            eta = min(eta, max(0.0, left))
    last = max((d.last_at for r in rows for d in r.devices.values() if d.last_at),
               default=None)
    return {
        "id": job["id"], "job_key": job["job_key"], "job_path": job["job_path"],
        "status": job["status"], "attempts": job["attempts"],
        "started_at": iso(started_at), "finished_at": iso(finished_at),
        "programs_done": done, "programs_total": total, "current": current,
        "trials": trials, "trials_planned": planned, "elapsed_s": elapsed, "eta_s": eta,
        "last_measured_at": iso(last), "plan_known": plan is not None,
        "waiting": waiting,
        "programs": [{"id": r.id, "name": r.name, "shapes_text": r.shapes_text} for r in rows]
        + [{"id": None, **w} for w in waiting],  # its programs by name, in its order
    }, rows


def _key(row: ProgramProgress) -> tuple[str, str]:
    return row.program_hash, db.shapes_key(row.shapes)


def all_jobs(reader: Reader, now: datetime | None = None) -> list[dict]:
    jobs = reader.jobs()
    if not jobs:
        return []
    prefixes = reader.job_program_hashes([j["id"] for j in jobs])
    every = reader.programs(optuna=False)
    return [job_progress(reader, j, prefixes.get(j["id"], []), now, every_program=every)[0]
            for j in jobs]
