"""What a tuner database holds, for watching a launch from another terminal or machine.

``status(url)`` reads only: the jobs launched against the database (status, attempts, the
per-program timings a finished run recorded) and, per program × shapes, the structures,
configs and timings stored so far and the best kernel of every device.  A launch commits each
measurement as it is taken, so ``tuner status --watch 5`` follows it live; on a Ray cluster
with a shared PostgreSQL database any machine can watch.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime

import db

from ..formatting import SETTLE, ms


@dataclass
class ProgramStatus:
    summary: db.ProgramSummary
    best: list[db.BestKernel] = field(default_factory=list)  # one per device, fastest first

    def as_dict(self) -> dict:
        s = asdict(self.summary)
        s["shapes"] = json.loads(s.pop("shapes_key"))
        s["best"] = [{"device_key": b.device_key, "time_s": b.time_s, "baseline_s": b.baseline_s,
                      "speedup": b.speedup, "structure_hash": b.structure_hash,
                      "config": b.config, "uncertain": b.uncertain} for b in self.best]
        return s


@dataclass
class Status:
    url: str
    jobs: list[db.JobRecord]
    programs: list[ProgramStatus]

    def as_dict(self) -> dict:
        return {"url": self.url, "jobs": [asdict(j) for j in self.jobs],
                "programs": [p.as_dict() for p in self.programs]}


def status(url: str | None = None, *, database: db.Database | None = None) -> Status:
    """Jobs and per-program progress of the database at ``url`` (default
    sqlite:///./tuner.db).  Raises db.DatabaseError when there is no tuner database there."""
    own = database is None
    database = database or db.connect(url, migrate_schema=False)
    try:
        programs = [ProgramStatus(p, database.best_kernels(
            p.program_hash, json.loads(p.shapes_key), p.dtype)) for p in database.programs()]
        shown = db.normalize_url(database.url).render_as_string(hide_password=True)
        return Status(shown, database.jobs(), programs)
    finally:
        if own:
            database.close()


def _when(t: datetime | None) -> str:
    return "-" if t is None else f"{t:%Y-%m-%d %H:%M:%S}"


def format_status(st: Status) -> str:
    """Two tables: jobs, newest first, then programs with each device's best kernel."""
    rows: list[tuple[str, ...]] = [
        ("job", "status", "attempts", "started (UTC)", "finished (UTC)", "file")]
    rows += [(j.job_key, j.status, str(j.attempts), _when(j.started_at), _when(j.finished_at),
              j.job_path) for j in st.jobs]
    out = [f"{st.url}: {len(st.jobs)} job(s), {len(st.programs)} program(s)", ""]
    out += _table(rows) if st.jobs else ["no job has run against this database"]
    rows = [("program", "shapes", "structures", "configs", "timings", "failed", "device",
             "best ms", "numpy ms", "speedup", "last timing (UTC)")]
    for p in st.programs:
        s = p.summary
        shapes = " ".join(f"{k}={'x'.join(map(str, v))}"
                          for k, v in json.loads(s.shapes_key).items())
        for i, b in enumerate(p.best or [None]):
            head = (s.name, shapes, str(s.structures), str(s.configs), str(s.timings),
                    str(s.failed)) if i == 0 else ("",) * 6
            rows.append((*head, "-" if b is None else b.device_key.split(":")[0],
                         ms(None if b is None else b.time_s, unit="")
                         + ("?" if b is not None and b.uncertain else ""),
                         ms(None if b is None else b.baseline_s, unit=""),
                         f"{b.speedup:.2f}x" if b and b.speedup else "-",
                         _when(s.last_measured_at) if i == 0 else ""))
    if st.programs:
        out += [""] + _table(rows)
    doubts = [(p.summary.name, b) for p in st.programs for b in p.best if b.uncertain]
    if doubts:
        out += ["", f"? uncertain best (its timings could not settle it; {SETTLE}):"]
        out += [f"  {name} on {b.device_key}: {b.uncertain}" for name, b in doubts]
    return "\n".join(out)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def as_json(st: Status) -> str:
    return json.dumps(st.as_dict(), indent=2, default=str)
