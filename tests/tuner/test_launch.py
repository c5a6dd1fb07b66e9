"""End to end: `tuner launch` on SQLite and PostgreSQL, kill and resume, faulty candidates,
`tuner best` / `tuner.load` from new processes, and optuna-dashboard reading the studies.

Each launch runs the real pipeline (embedded Ray, search, verification, Optuna, C++ kernels
built and timed in isolated workers) on small shapes, in a subprocess like a user's.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support import MALFORMED, TUNER, run_cli, write_job

import db
import tuner
from tuner.pipeline.confirm import TIMINGS
from verifier import DEFAULT_TESTS, equivalent

REPO = Path(__file__).resolve().parents[2]
def counts(url: str) -> dict[str, int]:
    with db.connect(url, migrate_schema=False) as database:
        return database.row_counts()


def history(url: str, library: bool = False) -> list:
    """The program's measurements; those of the library path (the baseline's timings, a
    candidate of every launch, tests/tuner/test_library.py) only with ``library``."""
    key = tuner.identity.program_key(tuner.load_program("softmax_rows", {"rows": 64, "cols": 64}))
    with db.connect(url, migrate_schema=False) as database:
        return [h for h in database.history(key.program_hash)
                if library or not h.structure_hash.startswith(db.LIBRARY_PREFIX)]


def check_consistent(url: str) -> db.BestKernel:
    """Every config measured once per structure and device by the studies (attempt 0), the
    fastest ones re-timed (attempts 1, 2) by the confirmation, and the best row is the
    confirmed config with the lowest median of its timings, at that median; returns the best."""
    rows = history(url)
    assert rows, "nothing was measured"
    firsts = [h for h in rows if h.attempt == 0]
    keys = [(h.structure_id, h.device_key, db.config_hash(h.config)) for h in firsts]
    assert len(keys) == len(set(keys)), "a config was measured twice"
    timings: dict[int, list] = {}
    for h in rows:
        timings.setdefault(h.trial_id, []).append(h)
    assert all(len({h.attempt for h in hs}) == len(hs) for hs in timings.values())
    confirmed = {t: statistics.median(h.median_s for h in hs) for t, hs in timings.items()
                 if len(hs) >= TIMINGS and all(h.status == "ok" for h in hs)}
    assert confirmed, "no config was confirmed"
    best = tuner.best("softmax_rows", {"rows": 64, "cols": 64}, url=url)
    assert best is not None
    assert best.trial_id in confirmed and best.time_s == pytest.approx(confirmed[best.trial_id])
    assert best.time_s == pytest.approx(min(confirmed.values()))
    # the re-timed configs are those with the fastest first timings (tuning.confirm: 3)
    fastest = sorted((h for h in firsts if h.status == "ok"), key=lambda h: h.median_s)
    assert all(len(timings[h.trial_id]) >= TIMINGS for h in fastest[:3])
    return best


def launch_ok(job: Path, url: str, *extra: str, env: dict | None = None) -> dict:
    res = run_cli("launch", str(job), "--db", url, "--json", *extra, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def check_job(url: str, tmp_path: Path) -> None:
    job = write_job(tmp_path, trials=4, structures=2)
    summary = launch_ok(job, url)
    (rep,) = summary["programs"]
    assert rep["structures_found"] >= 1 and rep["structures_tuned"] >= 1
    # candidates: the verified structures and the program as written, unless it is one of them
    assert rep["structures_found"] <= rep["candidates"] <= rep["structures_found"] + 1
    assert rep["structures_tuned"] <= rep["candidates"]
    assert rep["trials"] >= 2 and rep["best_s"] > 0 and rep["baseline_s"] > 0
    best = check_consistent(url)
    assert best.baseline_s is not None and best.speedup > 0
    # `tuner best` in a new process answers from the database
    res = run_cli("best", "softmax_rows", "--set", "rows=64", "--set", "cols=64", "--db", url,
                  "--json")
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["measurement_id"] == best.measurement_id and got["timings"] >= TIMINGS
    assert got["structure_hash"] == rep["best_structure"]
    # the stored kernel runs and computes softmax
    kernel = tuner.load("softmax_rows", {"rows": 64, "cols": 64}, url=url)
    x = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    (out,) = kernel(x)
    np.testing.assert_allclose(out, np.exp(x) / np.exp(x).sum(1, keepdims=True), rtol=1e-4)
    # `tuner status` reads the job and the program's progress back
    res = run_cli("status", "--db", url, "--json")
    assert res.returncode == 0, res.stderr
    st = json.loads(res.stdout)
    (job_row,) = st["jobs"]
    assert job_row["status"] == "finished" and job_row["job_key"] == summary["job_key"]
    (prog,) = st["programs"]
    rows = history(url, library=True)
    assert prog["name"] == "softmax_rows" and prog["shapes"] == {"X": [64, 64]}
    assert prog["timings"] == len(rows) and prog["failed"] == 0
    # the studies' configs and the library path's (config {})
    assert prog["configs"] == len({h.trial_id for h in rows}) == rep["trials"] + 1
    assert prog["best"][0]["time_s"] == best.time_s
    # a second launch of the same job measures nothing again and adds no rows
    before = counts(url)
    again = launch_ok(job, url)
    assert again["resumed"] and again["programs"][0]["new_trials"] == 0
    after = counts(url)
    assert after == before


def test_launch_sqlite_end_to_end(sqlite_url: str, tmp_path: Path) -> None:
    check_job(sqlite_url, tmp_path)
    # the program as written is stored beside the verified structures, as a candidate
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as conn:
        stored = [json.loads(v) for (v,) in conn.execute(
            "SELECT verification_json FROM tuner_structures")]
    verdicts = [v["verdict"] for v in stored]
    assert verdicts.count("reference") == 1 and "equivalent" in verdicts
    # each verified structure says how: the search's tests, at the small instance's shapes
    assert all(v["tests"] == DEFAULT_TESTS and v["instance"] == {"X": [16, 16]}
               for v in stored if v["verdict"] == "equivalent")
    # optuna-dashboard's own storage loader opens the database and sees the studies
    pytest.importorskip("optuna_dashboard")
    from optuna_dashboard._storage_url import get_storage

    storage = get_storage(sqlite_url)
    studies = storage.get_all_studies()
    assert studies and all(s.study_name.startswith("softmax_rows:") for s in studies)
    assert any(storage.get_all_trials(s._study_id) for s in studies)


def test_a_structure_is_stored_with_the_verification_the_search_ran() -> None:
    """The provenance stored with a structure is what the search did (no literals): running
    the check it describes (tests, instance shapes, symbol binding) verifies it again."""
    from search import handwritten
    from tuner.pipeline import VERIFY_TESTS, small_instance_shapes, structure_verification

    program = tuner.load_program("rmsnorm_matmul", {"X": (16, 256), "W": (256, 256)})
    structure = handwritten(program)
    found = structure_verification(structure, small_instance_shapes(program))
    assert found["tests"] == VERIFY_TESTS == DEFAULT_TESTS
    assert found["instance"] == {"X": [16, 16], "W": [16, 16]}
    assert found["symbols"] == {"F": 2, "g0": 2} and found["arithmetic"] == "field"
    small = tuner.load_program("rmsnorm_matmul", {k: tuple(s) for k, s in
                                                  found["instance"].items()}).build()
    bound = structure.replay([small.tensors[t].shape for t in small.input_ids],
                             found["symbols"])
    assert equivalent(small, bound, tests=found["tests"]).equivalent


def test_status_watch_repeats_until_interrupted(sqlite_url: str, tmp_path: Path) -> None:
    for bad, says in ((["--db", f"sqlite:///{tmp_path}/none.db"], "no database at"),
                      (["--db", sqlite_url, "--watch", "0"], "--watch 0")):
        res = run_cli("status", *bad)
        assert res.returncode == 2 and says in res.stderr and len(res.stderr.splitlines()) == 1
    assert not (tmp_path / "none.db").exists()
    assert run_cli("db", "upgrade", "--db", sqlite_url).returncode == 0
    proc = subprocess.Popen([*TUNER, "status", "--db", sqlite_url, "--watch", "0.2"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = 0
        deadline = time.time() + 60
        while seen < 2 and time.time() < deadline:
            line = proc.stdout.readline()
            seen += "(every 0.2 s; Ctrl-C to stop)" in line
        proc.send_signal(signal.SIGINT)
        # communicate, not wait: the watch may have filled the stdout pipe meanwhile, and a
        # process blocked writing to it would never exit (Popen.wait's documented deadlock)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert seen == 2
    finally:
        proc.kill()


def test_launch_postgresql_end_to_end(pg_url: str, tmp_path: Path) -> None:
    check_job(pg_url, tmp_path)


def test_a_spent_time_budget_still_times_each_structures_default(sqlite_url: str,
                                                                   tmp_path: Path) -> None:
    """Past the job's time budget every study still measures its first config, the AStitch
    default, once: no program is left with nothing but the library's timing because the
    programs before it used the budget up."""
    job = write_job(tmp_path, trials=4, structures=2)
    job.write_text(job.read_text().replace("  seed: 0\n", "  seed: 0\n  time_budget_s: 0.001\n")
                   .replace("  - name: softmax_rows\n    set: {rows: 64, cols: 64}\n",
                            "  - name: softmax_rows\n    set: {rows: 64, cols: 64}\n"
                            "  - name: rmsnorm_residual\n    set: {X: 16x64, R: 16x64}\n"))
    summary = launch_ok(job, sqlite_url)
    assert [p["program"] for p in summary["programs"]] == ["softmax_rows", "rmsnorm_residual"]
    for rep in summary["programs"]:
        assert rep["structures_tuned"] >= 1
        assert rep["new_trials"] == rep["structures_tuned"], rep  # one each, not four


def test_sigkill_then_resume(sqlite_url: str, tmp_path: Path) -> None:
    job = write_job(tmp_path, trials=8, structures=2)
    proc = subprocess.Popen([*TUNER, "launch", str(job), "--db", sqlite_url, "--quiet"],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    path = db.sqlite_file(db.normalize_url(sqlite_url))
    deadline = time.time() + 240
    measured = 0
    try:
        while time.time() < deadline and proc.poll() is None:
            time.sleep(0.2)
            try:
                with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1) as conn:
                    measured = conn.execute("SELECT count(*) FROM tuner_measurements").fetchone()[0]
            except sqlite3.Error:
                continue
            if measured >= 3:
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the launch and everything it started
        proc.wait()
    assert measured >= 3, f"the launch never got to tuning: {proc.stderr.read()[-2000:]}"
    kept = {h.measurement_id: (h.config, h.median_s, h.measured_at, h.attempt)
            for h in history(sqlite_url)}
    assert len(kept) >= 3
    with db.connect(sqlite_url, migrate_schema=False) as database:
        shards_before = database.row_counts()["tuner_search_shards"]
    summary = launch_ok(job, sqlite_url, "--resume")
    assert summary["resumed"]
    (rep,) = summary["programs"]
    assert rep["shards_reused"] == shards_before > 0
    rows = {h.measurement_id: h for h in history(sqlite_url)}
    for mid, (config, median, at, _) in kept.items():  # nothing measured was lost or redone
        assert (rows[mid].config, rows[mid].median_s, rows[mid].measured_at) == (config, median, at)

    def firsts(ms):  # study timings; the rest are the confirmation's re-runs
        return sum(1 for m in ms if m == 0)

    assert rep["new_trials"] == firsts(h.attempt for h in rows.values()) - \
        firsts(k[3] for k in kept.values())
    assert rep["trials"] == firsts(h.attempt for h in rows.values())
    assert rep["confirm_new"] == (len(rows) - len(kept)) - rep["new_trials"] > 0
    best = check_consistent(sqlite_url)
    assert best.structure_hash == rep["best_structure"]
    with db.connect(sqlite_url, migrate_schema=False) as database:
        record = database.job(summary["job_key"])
        assert record.status == "finished" and record.attempts == 2 and record.resumed
        assert record.timings["total_s"] > 0


_OPEN = """
import os, sys, time
from pathlib import Path
import db
from tuner.pipeline import optuna_storage
url, here = sys.argv[1], Path(sys.argv[2])
(here / f"ready-{os.getpid()}").touch()
while not (here / "go").exists():
    time.sleep(0.001)
with db.connect(url) as database:
    optuna_storage(database).engine.dispose()
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_launches_started_at_once_on_a_fresh_database_create_its_tables_in_turn(
        backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """What every `tuner launch` does first with its database (our migrations, then Optuna's
    storage), in four processes let go at the same instant on a fresh database.  Without the
    schema lock Optuna's set-up failed in one of them ("table studies already exists", a
    UNIQUE violation on its alembic_version) nearly every time, on both backends."""
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")
    procs = [subprocess.Popen([sys.executable, "-c", _OPEN, url, str(tmp_path)], cwd=REPO,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    try:
        deadline = time.time() + 120
        while len(list(tmp_path.glob("ready-*"))) < len(procs) and time.time() < deadline:
            time.sleep(0.01)
        (tmp_path / "go").touch()
        errors = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0] * len(procs), "\n".join(errors)[-3000:]
    assert db.current_revision(url) == db.head_revision()
    optuna = pytest.importorskip("optuna")
    storage = optuna.storages.RDBStorage(url)
    assert storage.get_current_version() == storage.get_head_version()
    storage.engine.dispose()


def test_resume_without_earlier_run_is_refused(sqlite_url: str, tmp_path: Path) -> None:
    res = run_cli("launch", str(write_job(tmp_path)), "--db", sqlite_url, "--resume")
    assert res.returncode == 2
    assert "--resume: no earlier run" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_crashing_and_hanging_candidates_are_stored(sqlite_url: str, tmp_path: Path) -> None:
    # the slot's 2nd, 3rd and 4th trials; three studies, so that they are all study trials
    # even when a study's roofline rule skips every config after its first (the confirmation
    # re-runs, which would count too, come after the studies)
    job = write_job(tmp_path, trials=5, structures=3, timeout=3)
    summary = launch_ok(job, sqlite_url, env={"TUNER_FAULT_TRIALS": "crash@2,hang@3,compile@4"})
    (rep,) = summary["programs"]
    assert rep["failures"] == {"runtime_error": 1, "timeout": 1, "compile_error": 1}
    statuses = {h.status: h for h in history(sqlite_url)}
    assert "SIGSEGV" in statuses["runtime_error"].message
    assert "did not finish within 3 s" in statuses["timeout"].message
    assert "g++ failed" in statuses["compile_error"].message
    best = check_consistent(sqlite_url)  # the job went on and found a passing kernel
    assert best.time_s > 0


def _db_files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.parent.glob(path.name + "*"))}


def test_malformed_jobs_exit_2_and_leave_the_database_unchanged(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tuner import cli

    path = tmp_path / "tuner.db"
    url = f"sqlite:///{path}"
    with db.connect(url) as database:  # a database with a job's worth of rows in it
        pid = database.record_program("h" * 64, {"X": [4, 4]}, "float32", "p", {"ops": []})
        sid = database.record_structure(pid, "s" * 64, {"ops": []}, {"verdict": "ok"}, 1)
        tid = database.record_trial(sid, "cpu:test", {"g0": 2})
        database.update_best(database.record_measurement(tid, "ok", median_s=1e-3), "src")
    before = _db_files(path)
    extra = [("programs: [lora]\n", ["--resume"], "--resume: no earlier run"),
             ("programs: [lora]\n", ["--db", "oracle://x/y"], "database URL")]
    cases = [(text, [], key) for text, _, key, _ in MALFORMED] + extra
    from kernels import cuda_available

    if not cuda_available()[0]:
        cases.append(("programs: [lora]\ndevices: [cuda]\n", [],
                      ".yaml:2: devices[0]: cuda: the cuda device is unavailable"))
    assert len(cases) >= 20
    for i, (text, flags, fragment) in enumerate(cases):
        job = tmp_path / f"bad{i}.yaml"
        job.write_text(text)
        db_flag = [] if "--db" in flags else ["--db", url]
        rc = cli.main(["launch", str(job), *db_flag, *flags])
        err = capsys.readouterr().err
        assert rc == 2, (text, err)
        assert len(err.strip().splitlines()) == 1, err
        assert fragment in err, (fragment, err)
        assert _db_files(path) == before, f"case {i} changed the database"


def test_db_upgrade_creates_then_reports_head(tmp_path: Path,
                                              capsys: pytest.CaptureFixture) -> None:
    from tuner import cli

    url = f"sqlite:///{tmp_path / 'new.db'}"
    assert cli.main(["db", "upgrade", "--db", url]) == 0
    first = capsys.readouterr().out
    assert "empty ->" in first and db.head_revision() in first
    assert db.current_revision(url) == db.head_revision()
    assert cli.main(["db", "upgrade", "--db", url]) == 0
    assert "already at revision" in capsys.readouterr().out
    # tuner best on the empty database: a clear answer, exit 2, the command to run
    assert cli.main(["best", "softmax_rows", "--db", url]) == 2
    err = capsys.readouterr().err
    assert "no tuned kernel for softmax_rows" in err and "tuner launch" in err


def test_a_cluster_without_gpus_is_refused_before_the_database(tmp_path: Path) -> None:
    """With --address the GPUs are the cluster's: JobRun.run joins Ray and runs this check
    before it opens the database; a cluster without GPUs is an input error (exit 2)."""
    from cluster import start_ray, stop_ray
    from tuner.jobfile import JobError, parse_job
    from tuner.pipeline import check_cluster_gpus

    started = start_ray(1)
    try:
        check_cluster_gpus(parse_job("programs: [lora]\ndevices: [cpu]\n", "cpu.yaml"))
        with pytest.raises(JobError, match=r"^gpu.yaml:4: devices\[1\]: cuda: the Ray cluster "
                           "has no GPU"):
            check_cluster_gpus(parse_job("programs: [lora]\ndevices:\n  - cpu\n  - cuda\n",
                                         "gpu.yaml"))
    finally:
        if started:
            stop_ray()


OMP_PROBE = """#include <omp.h>
extern "C" void kernel(float** inputs, float** outputs) {
  outputs[0][0] = (float)omp_get_max_threads();
}"""


def test_a_cpu_slot_times_with_the_drivers_threads() -> None:
    """Ray starts an actor that reserves no CPU with OMP_NUM_THREADS=1; the slot must time
    kernels and the numpy baseline with the cores the launching process would use."""
    import ray

    from cluster import SlotPool, TrialRequest, start_ray, stop_ray
    from kernels import run_isolated
    from search import load_program, to_obj

    want = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count())
    started = start_ray(1)
    pool = None
    try:
        pool = SlotPool("cpu")
        probe = {"source": OMP_PROBE, "inputs": [], "outputs": [(1,)], "timing": None}
        res = ray.get(pool.slots[0].__ray_call__.remote(
            lambda slot: run_isolated(probe, 60, slot.worker)))
        assert res.ok and res.payload["outputs"][0][0] == want
        reference = load_program("softmax_rows", {"rows": 64, "cols": 64}).build()
        pool.submit("baseline", TrialRequest(to_obj(reference), tag="b"))
        done = pool.next_done()
        assert done.tag == "b" and done.status == "ok" and done.baseline_s > 0
    finally:
        if pool is not None:
            pool.close()
        if started:
            stop_ray()
