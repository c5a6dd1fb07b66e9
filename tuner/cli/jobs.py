"""``tuner launch``, ``tuner best``, ``tuner status`` and ``tuner db upgrade``: jobs and the
database."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from db import DEFAULT_URL
from kernels import OK, replayed_gpu

from ..api import InputError, parse_pairs
from ..formatting import SETTLE, config_text, ms
from ._console import Progress

if TYPE_CHECKING:
    import db
    from search import Program

    from ..pipeline import LaunchResult


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("launch", help="run a job file: search, verify, tune, store")
    p.add_argument("job", metavar="JOB.yaml", help="job file (see docs/job-file.md)")
    p.add_argument("--db", metavar="URL", help="database URL (overrides the job's database.url)")
    p.add_argument("--address", help="join a running Ray cluster (overrides cluster.address)")
    p.add_argument("--resume", action="store_true",
                   help="continue an earlier run of this job (an error if there was none); "
                        "the same job and database always continue where they stopped")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress, only the summary")
    p.add_argument("--no-train", action="store_true",
                   help="do not retrain the cost model at the end (docs/costmodel.md)")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("best", help="the best tuned kernel of a program, from the database")
    p.add_argument("program", metavar="PROGRAM", help="built-in name or program file")
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="the shapes it was tuned at (X=16x256) or a parameter (batch=8)")
    p.add_argument("--device", metavar="KEY",
                   help="a device key, or cpu / cuda for this machine's (default: any)")
    p.add_argument("--db", metavar="URL", help=f"database URL (default {DEFAULT_URL})")
    p.add_argument("--json", action="store_true", help="print the record as JSON")
    p.add_argument("--source", action="store_true", help="print the kernel's source")
    p.set_defaults(func=cmd_best)

    p = sub.add_parser("status", help="jobs, programs and best kernels in a database "
                                      "(follow a running launch with --watch)")
    p.add_argument("--db", metavar="URL", help=f"database URL (default {DEFAULT_URL})")
    p.add_argument("--json", action="store_true", help="print it as one JSON object")
    p.add_argument("--watch", type=float, metavar="SECONDS",
                   help="print it again every SECONDS until Ctrl-C")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("db", help="database maintenance")
    dbsub = p.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    q = dbsub.add_parser("upgrade", help="create the tuner tables or migrate them to the head")
    q.add_argument("--db", metavar="URL", help=f"database URL (default {DEFAULT_URL})")
    q.set_defaults(func=cmd_db_upgrade)


# ---------------------------------------------------------------- launch


def format_summary(result: LaunchResult) -> str:
    rows = [("program", "device", "best ms", "numpy ms", "speedup", "structures", "trials",
             "failures", "best kernel")]
    for r in result.reports:
        fails = ", ".join(f"{k} {v}" for k, v in sorted(r.statuses.items()) if k != OK)
        cfg = config_text(r.best_config)
        rows.append((r.program, r.device_key.split(":")[0],
                     ms(r.best_s, unit="") + ("?" if r.uncertain else ""),
                     ms(r.baseline_s, unit=""),
                     f"{r.speedup:.2f}x" if r.speedup else "-",
                     f"{r.structures_tuned}/{r.candidates or r.structures_found}",
                     f"{r.trials} ({r.new_trials} new)", fails or "none",
                     f"library (tuned {ms(r.tuned_s, unit='')} ms)" if r.library else
                     f"{(r.best_structure or '-')[:12]} {cfg}".strip()))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in result.reports:
        if r.uncertain:
            lines.append(f"UNCERTAIN best of {r.program} on {r.device_key}: {r.uncertain}; "
                         + SETTLE)
    for sampler in sorted({(r.device_key, r.sampler) for r in result.reports if r.sampler}):
        lines.append(f"sampler on {sampler[0]}: {sampler[1]}")
    for t in result.trained:
        if t.get("reason"):
            lines.append(f"cost model for {t['device_key']}: not retrained ({t['reason']})")
            continue
        if t.get("full_fit") is not None:
            done = (f"model {t['full_fit']} taught what was measured since it was fitted "
                    f"({t['new_rows']} new) in {t['seconds']} s")
        else:
            done = f"retrained on {t['rows']} measurements in {t['seconds']} s"
        lines.append(f"cost model {t['model_id']} for {t['device_key']}: " + (
            done + (f", held-out tau {t['held_out_tau']:.2f}" if t["held_out_tau"] is not None
                    else "") if t["trained"] else "up to date"))
    word = "resumed" if result.resumed else "new"
    lines.append(f"job {result.job_key} ({word}) in {result.elapsed_s:.1f} s -> {result.url}")
    return "\n".join(lines)


def cmd_launch(args: argparse.Namespace) -> int:
    from ..pipeline import JobRun, prepare

    # nothing is written before this passes
    job, url = prepare(args.job, args.db, args.resume, args.address)
    progress = Progress(enabled=not (args.quiet or args.json))
    try:
        result = JobRun(job, url, address=args.address, log=progress.log,
                        progress=progress, train=not args.no_train).run()
    except KeyboardInterrupt:
        progress.close()
        print(f"tuner launch: interrupted; everything measured so far is in {url}. "
              f"Continue with: tuner launch {args.job} --resume", file=sys.stderr)
        return 130
    finally:
        progress.close()
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        print(format_summary(result))
        names = " ".join(f"--set {k}={'x'.join(map(str, v))}"
                         for k, v in result.reports[0].shapes.items()) if result.reports else ""
        spec = _best_spec(job, result.reports[0].program) if result.reports else None
        if spec and replayed_gpu(result.reports[0].device_key) is None:
            print(f"query it later: tuner best {spec} {names}"
                  + (f" --db {url}" if args.db else ""))
    return 0


def _best_spec(job: Any, program: str) -> str | None:
    """What ``tuner best`` takes for the job's program ``program``: a built-in's name, a
    program file's path (relative to here when it is below), None for an inline program."""
    for entry in job.programs:
        if entry.program is None or entry.name != program:
            continue
        if entry.kind == "file":
            rel = os.path.relpath(entry.ref)
            return entry.ref if rel.startswith("..") else rel
        return program if entry.kind == "builtin" else None
    return program


# ---------------------------------------------------------------- best


def cmd_best(args: argparse.Namespace) -> int:
    import db

    from ..serving import best, launch_hint, resolve_program, tuned_best, tuned_elsewhere

    program = resolve_program(args.program, parse_pairs(args.set), url=args.db)
    with db.connect(args.db, migrate_schema=False) as database:
        record = best(program, device=args.device, database=database)
        if record is None and not args.set:  # tuned only at other shapes? (issue 10, item 6)
            program, record = _best_at_stored_shapes(args, program, database)
        if record is None:
            raise InputError(launch_hint(program.name, program.inputs, args.device,
                                         tuned_elsewhere(program, args.device, database)))
        timings = sum(m.status == OK for m in database.measurements(record.trial_id))
        tuned_s = tuned_best(database, record.program_hash, record.shapes_key, record.dtype,
                             record.device_key) if record.library else None
    if args.json:
        d = {k: getattr(record, k) for k in record.__dataclass_fields__ if k != "structure"}
        d["updated_at"] = record.updated_at.isoformat()
        d["speedup"] = record.speedup
        d["timings"] = timings
        d["program"] = program.name
        d["library"] = record.library
        if record.library:
            d["tuned_s"] = tuned_s
        if not args.source:
            d.pop("source")
        print(json.dumps(d, indent=2, default=str))
        return 0
    if args.source:
        print(record.source)
        return 0
    cfg = config_text(record.config)
    speed = f"{record.speedup:.2f}x over op-by-op" if record.speedup else "no baseline"
    shapes = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in program.inputs.items())
    if record.library:
        margin = (f"{tuned_s / record.time_s:.2f}x faster than the fastest tuned kernel "
                  f"({ms(tuned_s)})") if tuned_s else "no tuned kernel passed"
        print(f"{program.name} ({shapes}, {record.dtype}) on {record.device_key}\n"
              f"  the library wins: numpy op by op (BLAS for matmul) {ms(record.time_s)}"
              f"{f', median of {timings} timings' if timings > 1 else ''}, {margin}; "
              f"tuner.load returns the library path\n"
              f"  measured {record.updated_at:%Y-%m-%d %H:%M:%S} UTC; --source prints the "
              "graph it runs" + _uncertain_line(record))
        return 0
    print(f"{program.name} ({shapes}, {record.dtype}) on {record.device_key}\n"
          f"  best kernel: {ms(record.time_s)}"
          f"{f', median of {timings} timings' if timings > 1 else ''} ({speed}); structure "
          f"{record.structure_hash[:16]}, config {cfg or '(none)'}\n"
          f"  measured {record.updated_at:%Y-%m-%d %H:%M:%S} UTC; --source prints it"
          + _uncertain_line(record))
    return 0


def _uncertain_line(record: db.BestKernel) -> str:
    """The line ``tuner best`` adds for a best whose timings could not settle it."""
    if not record.uncertain:
        return ""
    return f"\n  UNCERTAIN: {record.uncertain}; another config may be faster: {SETTLE}"


def _best_at_stored_shapes(args: argparse.Namespace, program: Program, database: db.Database
                           ) -> tuple[Program, db.BestKernel | None]:
    """``tuner best NAME`` without ``--set`` when nothing is stored at the default shapes:
    the best kernel at the only shapes the database holds the program at (saying so on
    stderr), or an error listing the shapes it holds with the ``--set`` line of each."""
    from ..serving import bests_at_stored_shapes

    found = [(candidate, record, " ".join(f"--set {k}={v}" for k, v in sets.items()))
             for candidate, record, sets in bests_at_stored_shapes(args.program, program,
                                                                   database, args.device)]
    if len(found) == 1:
        candidate, record, line = found[0]
        print(f"tuner best: nothing stored for {program.name} at its default shapes; the "
              f"database holds it only at {line.replace('--set ', '')}: answering for those",
              file=sys.stderr)
        return candidate, record
    if found:
        db_arg = f" --db {args.db}" if args.db else ""
        lines = "\n".join(f"  tuner best {args.program} {line}{db_arg}" for _, _, line in found)
        raise InputError(f"nothing stored for {program.name} at its default shapes; the database"
                         f" holds it at {len(found)} other shapes, choose one:\n{lines}")
    return program, None


def cmd_status(args: argparse.Namespace) -> int:
    import signal
    import threading

    from ..serving.status import as_json, format_status, status

    if args.watch is not None and not args.watch > 0:
        raise InputError(f"--watch {args.watch:g}: give the seconds between updates, > 0")
    if args.watch is None:
        st = status(args.db)
        print(as_json(st) if args.json else format_status(st))
        return 0
    # Ctrl-C stops the watch wherever it lands. It sets a flag rather than raising: a
    # KeyboardInterrupt raised inside a finalizer (a database connection collected while
    # reading) is swallowed by Python, and the watch would go on. A second Ctrl-C raises.
    stop = threading.Event()

    def on_interrupt(signum: int, frame: object) -> None:
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        while not stop.is_set():
            st = status(args.db)
            text = as_json(st) if args.json else format_status(st)
            clear = "\033[2J\033[H" if sys.stdout.isatty() else ""
            print(f"{clear}{text}\n(every {args.watch:g} s; Ctrl-C to stop)", flush=True)
            stop.wait(args.watch)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, previous)
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    import db

    before = db.current_revision(args.db)
    after = db.upgrade(args.db)
    shown = db.normalize_url(args.db).render_as_string(hide_password=True)
    if before == after:
        print(f"{shown}: already at revision {after} (head)")
    else:
        print(f"{shown}: {before or 'empty'} -> {after} (head)")
    return 0
