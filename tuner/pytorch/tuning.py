"""Kernels for a compile's programs: what the database holds (``tune="cached"``), a search and
tuning here within a budget (``"now"``, the launch ``superoptimize`` runs), or a job file for
``tuner launch`` elsewhere (``"job"``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from search import Program

if TYPE_CHECKING:
    from .options import Options

DEFAULT_JOB = "tuner_job.yaml"


def _url(opts: Options) -> str:
    import db

    return opts.db or db.DEFAULT_URL


def lookup(programs: list[Program], opts: Options) -> dict[str, tuple[Any, str]]:
    """name → (the best stored kernel as a callable, "") or (None, why none); a kernel stored
    uncertain carries the reason as ``kernel.uncertain``."""
    from ..serving import best, kernel_from_record

    url = _url(opts)
    out: dict[str, tuple[Any, str]] = {}
    for p in programs:
        try:
            record = best(p, device=opts.device, url=url)
        except Exception as err:  # no database there yet, an old schema, ...
            out[p.name] = (None, f"database {url}: {' '.join(str(err).split())[:200]}")
            continue
        if record is None:
            out[p.name] = (None, f"no tuned kernel in {url} for {opts.device} "
                                 f"(tune={opts.tune!r})")
            continue
        if record.library:  # numpy op by op won the launch: PyTorch runs the ops better
            out[p.name] = (None, "the library path beat every tuned kernel here; PyTorch runs "
                                 "the ops")
            continue
        try:
            kernel: Any = kernel_from_record(record, p.name)
            # a best its launch could not settle (a loaded machine) is used, never silently:
            # the report says so (and the compile's race against PyTorch still judges it)
            kernel.uncertain = record.uncertain or ""
            out[p.name] = (kernel, "")
        except Exception as err:
            out[p.name] = (None, f"the stored kernel does not load: {str(err)[:200]}")
    return out


def tune_now(programs: list[Program], opts: Options) -> str:
    """Search and tune ``programs`` on this machine (one launch, within ``budget_s``) and
    store them; '' or why the launch failed."""
    import db

    from ..jobfile import ClusterSpec, DatabaseSpec, JobSpec, ProgramEntry, SearchSpec, TuningSpec
    from ..pipeline import JobRun

    url = _url(opts)
    db.normalize_url(url)
    entries = tuple(ProgramEntry(p, "inline", "inline", {}, i + 1) for i, p in enumerate(programs))
    job = JobSpec(source="torch:" + ",".join(p.name for p in programs), programs=entries,
                  search=SearchSpec(time_limit_s=opts.budget_s),
                  tuning=TuningSpec(trials_per_structure=opts.trials, structures=opts.structures,
                                    time_budget_s=opts.budget_s, seed=0),
                  devices=(opts.device,), cluster=ClusterSpec(workers=1),
                  database=DatabaseSpec(url))
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if opts.verbose else None
    try:
        JobRun(job, url, log=log).run()
    except Exception as err:
        return f"tuning failed: {' '.join(str(err).split())[:200]}"
    return ""


def program_text(p: Program) -> str:
    """``p`` in the program language (docs/ir.md), for a program file."""
    layouts = getattr(p, "layouts", {})  # inputs not stored row-major (the op table's layouts)
    shapes = "".join(f"  {n}: {_entry(s, layouts.get(n))}\n" for n, s in p.inputs.items())
    body = "".join(f"  {line}\n" for line in p.body.strip("\n").splitlines())
    return (f"name: {p.name}\ndtype: {p.dtype}\ninputs:\n{shapes}body: |\n{body}"
            f"outputs: [{', '.join(p.outputs)}]\n")


def _entry(shape: tuple[int, ...], layout: str | None) -> str:
    dims = f"[{', '.join(map(str, shape))}]"
    return f"{{shape: {dims}, layout: {layout}}}" if layout and layout != "row" else dims


def write_job(programs: list[Program], opts: Options) -> Path:
    """Add ``programs`` (as program files beside it) to the job file ``opts.job_file``,
    creating it; validated as ``tuner launch`` will read it."""
    from ..jobfile import load_job

    path = Path(opts.job_file or DEFAULT_JOB).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    job: dict[str, Any] = {}
    if path.exists():
        job = yaml.safe_load(path.read_text()) or {}
    entries = job.setdefault("programs", [])
    have = {e.get("file") for e in entries if isinstance(e, dict)}
    for p in programs:
        file = f"{p.name}.yaml"
        (path.parent / file).write_text(program_text(p))
        if file not in have:
            entries.append({"file": file})
    job.setdefault("search", {"time_limit_s": 300})
    job.setdefault("tuning", {"trials_per_structure": 30, "seed": 0})
    job.setdefault("devices", [opts.device])
    job.setdefault("database", {"url": _url(opts)})
    head = ("# Written by tuner.compile (tune='job'): the regions of PyTorch graphs with no tuned\n"
            "# kernel yet.  Run `tuner launch " + path.name + "` (on a bigger machine, then\n"
            "# bring the database back); the next compile with tune='cached' uses them.\n")
    path.write_text(head + yaml.safe_dump(job, sort_keys=False))
    load_job(path)  # raises JobError at the line if anything written is not launchable
    return path
