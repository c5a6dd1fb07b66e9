"""One database for many: two `tuner launch` runs of different jobs at once on one database
(PostgreSQL, and SQLite),
with a reader polling `tuner best` and `tuner status` during them (docs/cluster.md, issue 11).

Every process is a real one (subprocesses, embedded Ray, C++ kernels timed); only the shapes
are small.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from support import REPO, TUNER, write_job

import db
import tuner

JOB_B = """
programs:
  - name: rmsnorm_residual
    set: {X: 16x64, R: 16x64}
search: {time_limit_s: 120}
tuning: {trials_per_structure: 3, structures: 1, seed: 0, trial_timeout_s: 30}
devices: [cpu]
cluster: {workers: 1}
"""

PROGRAMS = {"softmax_rows": {"rows": 64, "cols": 64},
            "rmsnorm_residual": {"X": "16x64", "R": "16x64"}}

# Polls `tuner best` for both programs and `tuner status` (in this process, through the CLI's
# own entry point) until the stop file appears; prints one JSON line per poll: the exit codes,
# for any other than 0 or "nothing stored yet" (2 with the launch hint) the error, and how
# many jobs `tuner status` saw running.
_READER = """
import contextlib, io, json, sys, time
from pathlib import Path
from tuner.cli import main
url, stop, programs = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
while not stop.exists():
    codes, errors, running = [], [], None
    for argv in [["best", name, *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]
                 for name, sets in programs.items()] + [["status"]]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([*argv, "--db", url, "--json"])
            except BaseException as exc:  # noqa: BLE001 - any escape is what we look for
                code = repr(exc)
        codes.append(code)
        if argv == ["status"] and code == 0:
            running = sum(j["status"] == "running" for j in json.loads(out.getvalue())["jobs"])
        if code != 0 and not (code == 2 and "tuner launch" in err.getvalue()):
            errors.append(err.getvalue()[-500:] or str(code))
    print(json.dumps({"t": time.time(), "codes": codes, "errors": errors, "running": running}),
          flush=True)
    time.sleep(0.2)
"""


@pytest.mark.parametrize("backend", ["postgresql", "sqlite"])
def test_two_launches_and_a_reader_share_one_database(backend: str, tmp_path: Path,
                                                      request: pytest.FixtureRequest) -> None:
    """Both launches finish, each trial is stored once, one best row per program and device,
    and the reader, polling throughout, never sees an error.  SQLite too (WAL, a 30 s busy
    timeout, BEGIN IMMEDIATE): two launches on one file both work, nothing is refused.  Before
    the schema lock kept its file descriptor open (tests/db/test_sqlite_readers.py), the
    SQLite case lost every write after the launches' set-up while the reader polled."""
    url = request.getfixturevalue("pg_url" if backend == "postgresql" else "sqlite_url")
    db.upgrade(url)  # the reader starts before the launches; both find the schema
    job_a = write_job(tmp_path, trials=3, name="a.yaml")
    job_b = tmp_path / "b.yaml"
    job_b.write_text(JOB_B)
    stop = tmp_path / "stop"
    reader = subprocess.Popen([sys.executable, "-c", _READER, url, str(stop),
                               json.dumps(PROGRAMS)], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    launches = [subprocess.Popen([*TUNER, "launch", str(job), "--db", url, "--json",
                                  "--quiet"], cwd=REPO, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
                for job in (job_a, job_b)]
    try:
        outs = [p.communicate(timeout=300) for p in launches]
        ended = time.time()
    finally:
        stop.touch()
        for p in launches:
            p.kill()
        polls_out, polls_err = reader.communicate(timeout=60)
    assert [p.returncode for p in launches] == [0, 0], [e[-2000:] for _, e in outs]
    polls = [json.loads(line) for line in polls_out.splitlines()]
    assert reader.returncode == 0, polls_err[-2000:]
    assert [p["errors"] for p in polls if p["errors"]] == []
    during = [p for p in polls if p["t"] < ended and p["running"]]
    assert len(during) >= 3, f"the reader read {len(during)} times while a launch was writing"

    summaries = [json.loads(out) for out, _ in outs]
    with db.connect(url, migrate_schema=False) as database:
        jobs = {j.job_key: j.status for j in database.jobs()}
        assert jobs == {s["job_key"]: "finished" for s in summaries}
        for summary in summaries:
            (rep,) = summary["programs"]
            key = tuner.identity.program_key(tuner.load_program(rep["program"],
                                                              PROGRAMS[rep["program"]]))
            rows = [h for h in database.history(key.program_hash)
                    if not h.structure_hash.startswith(db.LIBRARY_PREFIX)]
            firsts = Counter((h.structure_id, h.device_key, db.config_hash(h.config))
                             for h in rows if h.attempt == 0)
            assert firsts and max(firsts.values()) == 1, "a trial was stored twice"
            assert sum(firsts.values()) == rep["trials"]  # every trial the launch counted
            attempts = Counter((h.trial_id, h.attempt) for h in rows)
            assert max(attempts.values()) == 1
            bests = database.best_kernels(key.program_hash, key.shapes, key.dtype)
            assert len(bests) == len({b.device_key for b in bests}) == 1
            assert bests[0].time_s == pytest.approx(rep["best_s"])
