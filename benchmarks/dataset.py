"""Fill a database with real CPU measurements of random programs: the cost model's own dataset.

    .venv/bin/python benchmarks/dataset.py [--db URL] [--count N] [--seed S] [--trials K]
        [--structures 3] [--minutes M] [--search-seconds 20] [--confirm 0] [--json] [--verbose]
        [--path fast|launch] [--out FILE|default] [--programs suite|NAME,...]

Program ``i`` is ``search.random_program(S + i)`` (1-8 ops of the op table, drawn only where
its float reference stays finite: ``verifier.well_conditioned``).  Each one is a job of its
own with the program inline (``dataset-s<seed>.yaml``), run by the same ``JobRun`` that
``tuner launch`` runs, on the cpu device: the search (``--search-seconds`` at most), the
best ``--structures`` by the roofline, an Optuna study of ``--trials`` per structure, the
library candidate, all stored exactly as a user's launch stores them.  One embedded Ray with
one worker serves every program.

``--path fast`` (the default) measures the same programs without a launch: the search runs
in this process, and each tuned structure's configs (the AStitch default, then ``--trials``
drawn at random from its space: unbiased rows for a cost model, where a study's sampler
crowds round its best) are measured as one batch (``Device.run_trials``: one translation
unit per compiler call, parallel compilers, one worker job per library; the same checks and
timing loop as a trial) and stored in one transaction (``db.record_trials``) as soon as the
batch is timed.  ``--path launch`` runs each program as a ``tuner launch`` job (below).

``--programs`` measures built-in programs at their default shapes instead of random ones:
``suite`` (the benchmark suite, ``search.SUITE``) or a comma list of names (``tuner list``);
``--seed`` then seeds only the configs drawn.  The dataset is meant to hold the suite beside
the random programs: the programs users tune.

Resumable: a program whose job is ``finished`` in that database is skipped; a killed run
loses at most the program in flight (its next run resumes that job: finished shards and
measured trials are not redone).  ``--minutes`` stops starting programs when spent and ends
the tuning of the one in flight at that moment.  Progress (programs done, measurements
stored, rate) goes to stderr; the summary (programs, structures, ok / failed measurements,
measurements per hour) to stdout, or one JSON object with ``--json``.  Bad arguments: one
line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import db  # noqa: E402
from search import random_program_doc  # noqa: E402
from tuner.identity import job_key  # noqa: E402
from tuner.jobfile import parse_job  # noqa: E402
from tuner.pipeline import JobRun  # noqa: E402
from verifier import well_conditioned  # noqa: E402


class ArgumentError(Exception):
    """A bad command line: printed as one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line too
        raise ArgumentError(message)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", default="sqlite:///./dataset.db", help="database URL")
    p.add_argument("--count", type=int, default=1000, help="programs to run (default 1000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first program")
    p.add_argument("--trials", type=int, default=20, help="trials per structure")
    p.add_argument("--structures", type=int, default=3, help="structures tuned per program")
    p.add_argument("--minutes", type=float, default=60.0,
                   help="wall-clock budget; no program starts after it (default 60)")
    p.add_argument("--search-seconds", type=float, default=20.0,
                   help="time limit of each program's search (default 20)")
    p.add_argument("--confirm", type=int, default=0,
                   help="configs re-timed per program (the launch's tuning.confirm; "
                        "0: every timing is a new config, the most training rows per hour)")
    p.add_argument("--path", choices=("fast", "launch"), default="fast",
                   help="fast: batched measurement in this process (default); launch: each "
                        "program a tuner launch job")
    p.add_argument("--out", metavar="FILE",
                   help="append this run's database rows that FILE lacks to the dataset file "
                        "at the end (costmodel.export_dataset; 'default': "
                        "benchmarks/data/dataset_<cpu>.jsonl.gz)")
    p.add_argument("--programs", metavar="suite|NAME,...",
                   help="built-in programs at their default shapes instead of random ones: "
                        "'suite' (search.SUITE) or a comma list of names")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--verbose", action="store_true", help="the launch's own log on stderr")
    args = p.parse_args(argv)
    for name, low in (("count", 1), ("trials", 1), ("structures", 1), ("seed", 0),
                      ("confirm", 0)):
        if getattr(args, name) < low:
            raise ArgumentError(f"--{name} {getattr(args, name)}: must be at least {low}")
    for name in ("minutes", "search_seconds"):
        if not getattr(args, name) > 0:
            raise ArgumentError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be "
                                "a positive number")
    if args.programs is not None:
        from search import SUITE, builtin_names

        names = list(SUITE) if args.programs == "suite" else \
            [n.strip() for n in args.programs.split(",") if n.strip()]
        unknown = [n for n in names if n not in builtin_names()]
        if unknown or not names:
            raise ArgumentError(f"--programs {args.programs!r}: unknown program(s) "
                                f"{', '.join(unknown) or '(none given)'}; use 'suite' or names "
                                f"of {', '.join(builtin_names())}")
        args.programs = names
    if args.out is not None and dataset_writer() is None:
        raise ArgumentError("--out: this checkout has no dataset file writer "
                            "(costmodel.export_dataset); store to --db and export later")
    try:
        db.normalize_url(args.db)
    except (ValueError, db.DatabaseError) as err:
        raise ArgumentError(f"--db {args.db!r}: {err}") from None
    return args


def dataset_writer():
    """``costmodel.export_dataset`` and ``costmodel.default_path`` where this checkout has
    them (the dataset file's one writer), else None."""
    import costmodel

    write, where = (getattr(costmodel, n, None) for n in ("export_dataset", "default_path"))
    return (write, where) if write and where else None


def export(args: argparse.Namespace) -> dict | None:
    """Append what the dataset file lacks of the database's cpu rows (``--out``)."""
    if args.out is None:
        return None
    write, where = dataset_writer()
    path = where(ROOT / "benchmarks" / "data") if args.out == "default" else Path(args.out)
    with db.connect(args.db) as database:
        out = write(database, path, device_prefix="cpu")
    return {"file": str(path), **(out if isinstance(out, dict) else {})}


def work(args: argparse.Namespace) -> list[tuple[str, int]]:
    """(program label, seed) of every program this run measures, in order: the random
    programs of ``--seed`` on, or the ``--programs`` named (seeded from ``--seed``)."""
    if args.programs:
        return [(name, args.seed + i) for i, name in enumerate(args.programs)]
    return [(f"random_{s}", s) for s in range(args.seed, args.seed + args.count)]


def job_source(seed: int, name: str | None = None) -> str:
    """The name a program's job is known by (its key's prefix): ``dataset-s<seed>.yaml`` for
    a random program, ``dataset-<name>.yaml`` for a built-in one."""
    return f"dataset-{name or f's{seed}'}.yaml"


def job_text(seed: int, args: argparse.Namespace, name: str | None = None) -> str:
    """The job file of random program ``seed``, or of built-in program ``name`` (its config
    draws seeded by ``seed``): what ``tuner launch`` would be given."""
    program = name if name else \
        {"program": random_program_doc(seed, accept=lambda p: well_conditioned(p.build()))}
    job = {"programs": [program],
           "search": {"time_limit_s": args.search_seconds},
           "tuning": {"trials_per_structure": args.trials, "structures": args.structures,
                      "confirm": args.confirm, "seed": seed, "trial_timeout_s": 30},
           "devices": ["cpu"], "cluster": {"workers": 1}, "database": {"url": args.db}}
    return yaml.safe_dump(job, sort_keys=False)


def compute_ops_of(job) -> list[str]:
    graph = job.programs[0].program.build()
    return [op.kind for op in graph.ops if op.kind not in ("input", "output")]


def finished_jobs(url: str) -> set[str]:
    """Keys of the jobs that finished in this database (none when it does not exist yet)."""
    try:
        database = db.connect(url, migrate_schema=False)
    except db.DatabaseError:
        return set()
    with database:
        return {j.job_key for j in database.jobs() if j.status == "finished"}


def measurement_counts(url: str) -> Counter:
    """First-attempt measurements of kernels (the library's timings left out) by status: what
    the cost model can learn from.  Counted in the database, so resumed work is not counted
    twice and a re-timing is not a new row."""
    from sqlalchemy import func, select

    try:
        database = db.connect(url, migrate_schema=False)
    except db.DatabaseError:
        return Counter()
    m, t, s = db.MeasurementRow, db.TrialRow, db.StructureRow
    stmt = (select(m.status, func.count()).join(t, m.trial_id == t.id)
            .join(s, t.structure_id == s.id)
            .where(m.attempt == 0, ~s.structure_hash.startswith(db.LIBRARY_PREFIX))
            .group_by(m.status))
    with database, database.session(write=False) as session:
        return Counter(dict(session.execute(stmt).all()))


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


class Tally:
    """What this run did, for the progress lines and the summary; measurements are the
    database's counts now minus those when the run started."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.start = time.perf_counter()
        self.programs = self.skipped = self.errors = 0
        self.found = self.tuned = 0
        self.before = measurement_counts(url)
        self.statuses: Counter = Counter()
        self.phases: Counter = Counter()  # seconds by phase (the fast path's)
        self.failures: list[dict] = []

    def add(self, reports: list) -> None:
        for rep in reports:
            self.found += rep.structures_found
            self.tuned += rep.structures_tuned
        self.count()

    def count(self) -> None:
        """One more program done: the measurements stored so far."""
        self.programs += 1
        self.statuses = measurement_counts(self.url) - self.before

    @property
    def new(self) -> int:
        return sum(self.statuses.values())

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.start

    def per_hour(self) -> float:
        return self.new / self.elapsed_s * 3600 if self.elapsed_s > 0 else 0.0

    def error(self, label: str, seed: int, err: Exception) -> None:
        """Count and keep a program's failure (a bug in the pipeline), and say it."""
        self.errors += 1
        self.failures.append({"program": label, "seed": seed, "error": f"{type(err).__name__}: {err}",
                              "where": traceback.format_exc().splitlines()[-3:]})
        print(self.line(label, f"ERROR {type(err).__name__}: {err}"), file=sys.stderr,
              flush=True)

    def line(self, label: str, what: str) -> str:
        return (f"[{self.elapsed_s / 60:5.1f} min] {label}: {what} | programs "
                f"{self.programs} (+{self.skipped} done before, {self.errors} errors)  "
                f"measurements {self.new} (ok {self.statuses['ok']})  "
                f"{self.per_hour():,.0f}/h")


def run(args: argparse.Namespace) -> dict:
    return run_fast(args) if args.path == "fast" else run_launch(args)


def sample_configs(space, n: int, seed: int) -> list[dict[str, int]]:
    """The AStitch default, then up to ``n - 1`` other legal configs drawn uniformly per
    parameter (never the whole space enumerated: some have millions of configs)."""
    import random

    from db import config_hash

    rng = random.Random(seed)
    out, seen = [dict(space.default)], {config_hash(space.default)}
    names = sorted(space.params)
    for _ in range(50 * n):
        if len(out) >= n:
            break
        config = {k: rng.choice(space.params[k]) for k in names}
        h = config_hash(config)
        if h not in seen and space.check(config) is None:
            seen.add(h)
            out.append(config)
    return out[:n]


def fast_program(seed: int, args: argparse.Namespace, database, device, worker,
                 deadline: float, phases: Counter, name: str | None = None
                 ) -> tuple[int, int, int]:
    """Program ``seed`` (or built-in ``name``) through search and batched measurement; (structures verified, tuned,
    configs measured now); the seconds of each phase are added to ``phases``.  A program
    already ``finished`` is not given here."""
    from cluster.runtime import LocalExecutor
    from kernels import config_space, rank_structures
    from search import run_search, to_obj
    from tuner.identity import program_key
    from tuner.pipeline.ugraph import (
        VERIFY_TESTS,
        small_instance_shapes,
        structure_verification,
    )

    source = job_source(seed, name)
    job = parse_job(job_text(seed, args, name), source, base_dir=ROOT)
    record = database.start_job(fast_key(job), source)
    program = job.programs[0].program
    reference = program.build()
    key = program_key(program, reference)
    program_id = database.record_program(key.program_hash, key.shapes, key.dtype,
                                         program.name, to_obj(reference))
    t0 = time.perf_counter()
    result = run_search(program, job.search.limits(), LocalExecutor(),
                        time_limit_s=args.search_seconds, tests=VERIFY_TESTS)
    phases["search_s"] += time.perf_counter() - t0
    instance = small_instance_shapes(program)
    graphs = {s["hash"]: result.verified[s["hash"]] for s in result.structures}
    stored = []
    for h, graph in graphs.items():
        stored.append((database.record_structure(
            program_id, h, to_obj(graph), structure_verification(graph, instance),
            int(next(s for s in result.structures if s["hash"] == h).get("num_kernels") or 0)),
            h, graph))
    from search import structural_hash

    ref_hash = structural_hash(reference)
    if ref_hash not in graphs:  # the program as written is a candidate too (as a launch)
        stored.append((database.record_structure(
            program_id, ref_hash, to_obj(reference),
            {"layer": "structure", "verdict": "reference",
             "note": "the program as written, a kernel per op"},
            len(reference.ops) - len(reference.input_ids) - len(reference.ops_of("output"))),
            ref_hash, reference))
    order = rank_structures([g for _, _, g in stored], device.spec)[:args.structures]
    measured = tuned = 0
    for k in order:
        if time.time() >= deadline:
            break
        sid, shash, graph = stored[k]
        done = {db.config_hash(h.config) for h in database.history(
            key.program_hash, device_key=device.key) if h.structure_id == sid}
        configs = [c for c in sample_configs(config_space(graph, device.spec), args.trials,
                                             seed)
                   if db.config_hash(c) not in done]
        results = device.run_trials(graph, reference, configs, seed=seed, worker=worker,
                                    timeout_s=30.0)
        for r in results[:1]:
            for name, sec in r["phases"].items():
                phases[name] += sec * len(results)
        t0 = time.perf_counter()
        ids = db.record_trials(database, sid, device.key, results,
                               study_name=f"dataset:{shash[:12]}")
        ok = [(r["median_s"], i) for r, i in zip(results, ids, strict=True)
              if r["status"] == "ok" and i >= 0]
        if ok:
            fastest = min(ok)[1]
            database.update_best(fastest, results[ids.index(fastest)]["source"], None)
        phases["database_s"] += time.perf_counter() - t0
        measured += sum(1 for i in ids if i >= 0)
        tuned += 1
    database.finish_job(record.id, "finished" if time.time() < deadline else "interrupted")
    return len(result.verified), tuned, measured


def fast_key(job) -> str:
    """The job key of a program measured by the fast path (not a launch's: another run)."""
    return f"{job_key(job)}:fast"


def run_fast(args: argparse.Namespace) -> dict:
    from kernels.devices import IsolatedWorker, get_device

    deadline = time.time() + args.minutes * 60
    with db.connect(args.db) as database:
        done = {j.job_key for j in database.jobs() if j.status == "finished"}
    tally = Tally(args.db)
    device = get_device("cpu")
    with IsolatedWorker() as worker, db.connect(args.db) as database:
        for label, seed in work(args):
            if time.time() >= deadline:
                break
            name = label if args.programs else None
            job = parse_job(job_text(seed, args, name), job_source(seed, name), base_dir=ROOT)
            if fast_key(job) in done:
                tally.skipped += 1
                continue
            try:
                found, tuned, measured = fast_program(seed, args, database, device, worker,
                                                      deadline, tally.phases, name)
            except KeyboardInterrupt:
                raise
            except Exception as err:  # a bug in the pipeline: record it, go on
                tally.error(label, seed, err)
                continue
            tally.found += found
            tally.tuned += tuned
            tally.count()
            print(tally.line(label, f"{len(compute_ops_of(job))} ops, {found} verified, "
                             f"{tuned} tuned, {measured} measured"), file=sys.stderr, flush=True)
    return summary(args, tally)


def run_launch(args: argparse.Namespace) -> dict:
    from cluster import start_ray, stop_ray

    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    deadline = time.time() + args.minutes * 60
    done = finished_jobs(args.db)
    tally = Tally(args.db)
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if args.verbose else None
    started = False
    try:
        for label, seed in work(args):
            if time.time() >= deadline:
                break
            name = label if args.programs else None
            source = job_source(seed, name)
            job = parse_job(job_text(seed, args, name), source, base_dir=ROOT)
            if job_key(job) in done:
                tally.skipped += 1
                continue
            started = started or start_ray(1)  # once, for every program of the run
            runner = JobRun(job, args.db, log=log)
            runner.ctx.tune_deadline = deadline  # the budget, without changing the job's key
            try:
                result = runner.run()
            except KeyboardInterrupt:
                raise
            except Exception as err:  # a bug in the pipeline: record it, go on
                tally.error(label, seed, err)
                continue
            if time.time() >= deadline:  # the budget cut its tuning: resume it next run
                with db.connect(args.db) as database:
                    database.finish_job(result.job_id, "interrupted")
            tally.add(result.reports)
            rep = result.reports[0]
            print(tally.line(label, f"{len(compute_ops_of(job))} ops, {rep.structures_found} "
                             f"verified, {rep.structures_tuned} tuned, {rep.new_trials} "
                             "measured"), file=sys.stderr, flush=True)
    finally:
        if started:
            stop_ray()
    return summary(args, tally)


def summary(args: argparse.Namespace, tally: Tally) -> dict:
    in_db = measurement_counts(args.db)
    failed = sum(n for s, n in tally.statuses.items() if s != "ok")
    return {"database": args.db, "cpu": cpu_name(), "cores": os.cpu_count(),
            "first_seed": args.seed, "named_programs": args.programs or [],
            "programs": tally.programs,
            "programs_done_before": tally.skipped, "program_errors": tally.errors,
            "structures_verified": tally.found, "structures_tuned": tally.tuned,
            "measurements": tally.new, "ok": tally.statuses["ok"], "failed": failed,
            "statuses": dict(tally.statuses), "elapsed_s": round(tally.elapsed_s, 1),
            "measurements_per_hour": round(tally.per_hour(), 1),
            "ok_rows_in_database": in_db["ok"], "errors": tally.failures,
            "seconds_per_measurement": {k: round(v / max(1, tally.new), 4)
                                        for k, v in sorted(tally.phases.items())}}


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except ArgumentError as err:
        print(f"dataset.py: error: {err}", file=sys.stderr)
        return 2
    out = run(args)
    out["dataset_file"] = export(args)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{out['programs']} program(s) in {out['elapsed_s'] / 60:.1f} min "
          f"({out['programs_done_before']} done before, {out['program_errors']} error(s)) "
          f"on {out['cpu']}")
    print(f"structures: {out['structures_verified']} verified, {out['structures_tuned']} tuned")
    print(f"measurements: {out['measurements']} ({out['ok']} ok, {out['failed']} failed: "
          f"{ {k: v for k, v in out['statuses'].items() if k != 'ok'} })")
    print(f"rate: {out['measurements_per_hour']:,.0f} measurements/hour; "
          f"ok rows in the database: {out['ok_rows_in_database']}")
    if out["dataset_file"]:
        print(f"dataset file: {out['dataset_file']}")
    if out["seconds_per_measurement"]:
        print("seconds per measurement: " + ", ".join(
            f"{k[:-2]} {v * 1e3:.0f} ms" for k, v in out["seconds_per_measurement"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
