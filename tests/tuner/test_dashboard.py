"""`tuner dashboard` without a browser: pages and APIs over a database written through db's
own write helpers (Starlette's TestClient, in process), escaping, read-only, the password
masked, and `tuner best` answering for the only shapes a program is stored at.

The bind rules and the cluster page are in test_dashboard_cluster.py, every route driven with
generated input in test_dashboard_fuzz.py, the browser tests over a real launch in
test_dashboard_browser.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the dashboard needs: pip install -e '.[dashboard]'")
pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx")

import warnings  # noqa: E402

from sqlalchemy import select, text  # noqa: E402

with warnings.catch_warnings():  # Starlette 1.x would rather have httpx's fork httpx2
    warnings.filterwarnings("ignore", message=".*httpx2")
    from starlette.testclient import TestClient

import db  # noqa: E402
from search.ir.serialize import to_obj  # noqa: E402
from search.ir.suite import load_program  # noqa: E402
from tuner import api  # noqa: E402
from tuner.dashboard import create_app  # noqa: E402
from tuner.dashboard.reader import Reader  # noqa: E402
from tuner.dashboard.tables import studies_t  # noqa: E402
from tuner.identity import program_key  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
XSS = "<script>alert(1)</script>"
DEVICE = "cpu:test-cpu:2c"


def fill(url: str, shapes: list[dict] | None = None, xss: bool = True) -> dict:
    """softmax_rows at ``shapes`` with one structure, a few trials (one failing), the best
    kernel confirmed; a job linking them through its shard; an XSS-named program and job."""
    shapes = shapes or [{"rows": 64, "cols": 64}]
    ids: dict = {"trials": []}
    with db.connect(url) as database:
        job = database.start_job("job:" + XSS, f"/nowhere/{XSS}.yaml")
        ids["job"] = job.id
        for sets in shapes:
            program = load_program("softmax_rows", sets)
            key = program_key(program)
            ref = program.build()
            pid = database.record_program(key.program_hash, key.shapes, key.dtype,
                                          program.name, to_obj(ref))
            database.record_shard(job.id, f"{key.program_hash[:16]}/s0", "finished",
                                  {"stats": {"states": 37}, "verified": {"a": {}}})
            fused = api.program_graph("softmax_rows", sets, fused=True)
            sid = database.record_structure(pid, "f" * 16 + key.program_hash[:8],
                                            to_obj(fused), {"verdict": "equivalent",
                                                            "tests": 4}, 1)
            ids.setdefault("structures", []).append(sid)
            times = [3e-6, 2e-6, 2.5e-6, 1e-6, None]
            for n, t in enumerate(times):
                tid = database.record_trial(sid, DEVICE, {"g0": 2 ** n, "split": 1},
                                            study_name="s", trial_number=n)
                ids["trials"].append(tid)
                if t is None:
                    database.record_measurement(tid, "compile_error", median_s=None,
                                                spread_s=None, samples=None, max_error=None,
                                                message=f"error: {XSS} & more", host="h")
                    continue
                mid = database.record_measurement(tid, "ok", median_s=t, spread_s=t / 10,
                                                  samples=[t] * 3, max_error=1e-7,
                                                  message=None, host="h")
                database.update_best(mid, f"// source of trial {n}\nint main() {{}}",
                                     baseline_s=1e-5)
            ids.setdefault("programs", []).append(pid)
        if xss:
            pid = database.record_program("x" * 64, {"X": [1]}, "float32", XSS, {"ops": []})
            ids["xss_program"] = pid
        database.finish_job(job.id, "finished", {"total_s": 1.0})
    return ids


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> tuple[str, dict]:
    url = f"sqlite:///{tmp_path_factory.mktemp('dash') / 'tuner.db'}"
    return url, fill(url)


@pytest.fixture(scope="module")
def client(filled) -> TestClient:
    with TestClient(create_app(filled[0])) as c:
        yield c


def test_every_page_and_api_answers(client, filled):
    _, ids = filled
    trial = ids["trials"][3]  # the fastest: the best kernel
    for path in ["/", "/api/jobs", f"/jobs/{ids['job']}", f"/api/jobs/{ids['job']}",
                 f"/programs/{ids['programs'][0]}", f"/kernels/{trial}",
                 f"/api/kernels/{trial}", "/failures", "/api/failures", "/cluster",
                 "/api/cluster", "/healthz", "/static/dashboard.js",
                 "/static/chart.umd.min.js", "/pygments.css"]:
        r = client.get(path)
        assert r.status_code == 200, (path, r.text[:500])
        assert "default-src 'self'" in r.headers["content-security-policy"]
    assert client.get("/jobs/999").status_code == 404
    assert client.get("/kernels/nope").status_code == 404


def test_job_progress_and_program_rows(client, filled):
    _, ids = filled
    data = client.get(f"/api/jobs/{ids['job']}").json()
    job = data["job"]
    assert job["status"] == "finished" and job["programs_done"] == job["programs_total"] == 1
    assert job["trials"] == 5 and not job["plan_known"]  # its job file is not there
    (prog,) = data["programs"]
    assert prog["name"] == "softmax_rows" and prog["search_states"] == 37
    (dev,) = prog["devices"]
    assert dev["trials"] == 5 and dev["statuses"] == {"ok": 4, "compile_error": 1}
    assert dev["best"]["time_s"] == pytest.approx(1e-6)
    assert dev["best"]["speedup"] == pytest.approx(10)
    assert dev["failed_text"] == "compile_error 1"
    page = client.get(f"/jobs/{ids['job']}").text
    assert '/failures?program=softmax_rows&amp;device=cpu%3Atest-cpu%3A2c' in page
    # drawn by the server only: the row says where its charts' series is, the numbers are
    # written here (the script formats nothing)
    assert (f'data-chart-series="/api/programs/{prog["id"]}/series?device=cpu%3Atest-cpu%3A2c"'
            in page)
    assert '<td class="num">0.001</td>' in page and '<td class="num">10.00x</td>' in page


def test_jobs_page_names_each_jobs_programs(client, filled, tmp_path):
    """Each job's programs by name, linked, in its order; with the job file still there,
    the ones it has not reached yet too."""
    _, ids = filled
    (job,) = [j for j in client.get("/api/jobs").json()["jobs"] if j["id"] == ids["job"]]
    assert job["programs"] == [{"id": ids["programs"][0], "name": "softmax_rows",
                                "shapes_text": "X=64x64"}]
    assert f'<a href="/programs/{ids["programs"][0]}" title="X=64x64">softmax_rows</a>' \
        in client.get("/").text
    from tuner.identity import job_key
    from tuner.jobfile import load_job

    path = tmp_path / "two.yaml"
    path.write_text("programs:\n  - name: softmax_rows\n    set: {rows: 16, cols: 32}\n"
                    "  - name: rmsnorm_residual\n    set: {X: 16x32, R: 16x32}\n"
                    "devices: [cpu]\n")
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    fill(url, [{"rows": 16, "cols": 32}], xss=False)
    with db.connect(url) as database:
        database.finish_job(database.start_job(job_key(load_job(str(path))), str(path)).id,
                            "interrupted")
    with TestClient(create_app(url)) as c:
        planned = c.get("/api/jobs").json()["jobs"][0]
        page = c.get("/").text
    assert planned["plan_known"]
    assert [(p["name"], p["id"] is None) for p in planned["programs"]] == [
        ("softmax_rows", False), ("rmsnorm_residual", True)]
    assert 'title="X=16x32 R=16x32: not reached yet">rmsnorm_residual</span>' in page


def test_the_dashboard_stands_on_nothing_of_the_launch(tmp_path):
    """Serving pages and reading a job's plan from its job file import neither the launch
    pipeline nor Ray: the dashboard reads, it does not stand on what writes."""
    job = tmp_path / "j.yaml"
    job.write_text("programs:\n  - name: softmax_rows\n    set: {rows: 16, cols: 32}\n"
                   "devices: [cpu]\n")
    code = f"""if True:
        import sys
        from tuner.dashboard import app, progress
        from tuner.identity import job_key
        from tuner.jobfile import load_job
        assert progress.job_plan({str(job)!r}, job_key(load_job({str(job)!r}))) is not None
        print(sorted(m for m in sys.modules
                     if m.split(".")[0] in ("ray", "cluster")
                     or m.startswith(("tuner.pipeline", "tuner.launch"))))"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[]"


def test_series_keeps_only_the_improvements(client, filled):
    _, ids = filled
    s = client.get(f"/api/programs/{ids['programs'][0]}/series",
                   params={"device": DEVICE}).json()
    assert s["trials"] == 5 and s["ok"] == 4
    assert [(b["trial"], b["s"]) for b in s["best"]] == [(1, 3e-6), (2, 2e-6), (4, 1e-6)]
    assert len(s["scatter"]) == 4 and s["scatter"][0]["config"] == {"g0": 1, "split": 1}


def test_totals_stay_exact_as_measurements_arrive(tmp_path):
    """The dashboard counts new measurements incrementally (a low-water mark trailing the
    newest id by WINDOW); after several rounds of arrivals it agrees with a fresh count."""
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    ids = fill(url, xss=False)
    live = Reader(url, window=2)
    pid = ids["programs"][0]
    for round_ in range(3):
        with db.connect(url) as database:
            for n in range(4):
                tid = database.record_trial(ids["structures"][0], DEVICE,
                                            {"g0": 100 + 10 * round_ + n, "split": 2})
                ok = n % 3 != 0
                database.record_measurement(tid, "ok" if ok else "timeout",
                                            median_s=(5 - n) * 1e-6 if ok else None,
                                            spread_s=None, samples=None, max_error=None,
                                            message=None if ok else "slow", host="h")
        live_rows = [p.as_dict() for p in live.programs()]
        live_series = live.series(pid, DEVICE)
    fresh = Reader(url)
    assert live_rows == [p.as_dict() for p in fresh.programs()]
    assert live_series == fresh.series(pid, DEVICE)
    (dev,) = live_rows[0]["devices"]
    assert dev["trials"] == 5 + 12 and dev["statuses"] == {"ok": 4 + 6, "compile_error": 1,
                                                           "timeout": 6}
    live.close()
    fresh.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_optuna_states_follow_running_trials(tmp_path, request, backend):
    """Skipped (PRUNED) and failed Optuna trials counted incrementally, a RUNNING one
    counted when it finishes, in agreement with a fresh count (Optuna's own tables read
    through its own models, on both backends)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = (f"sqlite:///{tmp_path / 'tuner.db'}" if backend == "sqlite"
           else request.getfixturevalue("pg_url"))
    ids = fill(url, xss=False)
    study = optuna.create_study(study_name="s", storage=url)  # fill's trials name study "s"
    live = Reader(url, window=2)
    pid = ids["programs"][0]

    def states(reader):
        return reader.programs(ids=[pid])[0].devices[DEVICE].optuna

    held = []
    for _round in range(3):
        for n in range(4):
            t = study.ask()
            if n == 0:
                held.append(t)  # still running
            elif n == 1:
                study.tell(t, state=optuna.trial.TrialState.PRUNED)
            elif n == 2:
                study.tell(t, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(t, 1.0)
        assert states(live) == states(Reader(url))
    assert states(live) == {"RUNNING": 3, "PRUNED": 3, "FAIL": 3, "COMPLETE": 3}
    for t in held:
        study.tell(t, state=optuna.trial.TrialState.PRUNED)
    assert states(live) == states(Reader(url)) == {"PRUNED": 6, "FAIL": 3, "COMPLETE": 3}
    assert live.programs(ids=[pid])[0].devices[DEVICE].skipped == 6
    # a kernel page links its study in optuna-dashboard, when told where that runs
    with TestClient(create_app(url, optuna_dashboard="http://127.0.0.1:8080/")) as c:
        page = c.get(f"/kernels/{ids['trials'][0]}").text
    with db.connect(url, migrate_schema=False) as database, database.engine.connect() as conn:
        study_id = conn.execute(select(studies_t.c.study_id)
                                .where(studies_t.c.study_name == "s")).scalar_one()
    assert f'href="http://127.0.0.1:8080/dashboard/studies/{study_id}"' in page


def test_kernel_page_draws_the_graph_and_shows_the_source(client, filled):
    _, ids = filled
    page = client.get(f"/kernels/{ids['trials'][3]}").text
    assert page.count("<svg") == 2  # the kernel graph and the block graph
    assert "source of trial 3" in page and "equivalent" in page
    # a trial that is not a best kernel: its source is rendered now by kernels
    page = client.get(f"/kernels/{ids['trials'][0]}").text
    assert "rendered now for cpu" in page and "#include" in page


def test_names_from_the_database_are_escaped(client, filled):
    _, ids = filled
    for path in ["/", f"/jobs/{ids['job']}", f"/programs/{ids['xss_program']}", "/failures"]:
        page = client.get(path).text
        assert XSS not in page, path
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in client.get("/").text
    assert "&lt;script&gt;" in client.get("/failures").text


def test_failures_filter(client):
    data = client.get("/api/failures").json()
    assert data["counts"] == {"compile_error": 1}
    (row,) = data["rows"]
    assert row["program"] == "softmax_rows" and XSS in row["message"]
    assert client.get("/api/failures", params={"status": "timeout"}).json()["rows"] == []
    assert client.get("/api/failures", params={"q": "& more"}).json()["rows"]
    assert client.get("/api/failures", params={"q": "%"}).json()["rows"] == []  # literal


def test_read_only(client, filled):
    for method in ("post", "put", "delete", "patch"):
        assert getattr(client, method)("/api/jobs").status_code == 405
    reader: Reader = client.app.state.reader
    with pytest.raises(Exception, match="readonly|read-only|attempt to write"):
        with reader.engine.connect() as conn:
            conn.execute(text("DELETE FROM tuner_jobs"))
            conn.commit()
    with db.connect(filled[0], migrate_schema=False) as database:
        assert database.row_counts()["tuner_jobs"] == 1


def test_password_never_shown(filled):
    from tuner.dashboard.tables import read_only_engine

    pg = "postgresql+psycopg://tuner:sekrit-pw@dbhost:5432/tuner"
    reader = Reader(pg, engine=read_only_engine(filled[0]))  # shown as pg, read from sqlite
    with TestClient(create_app(reader=reader)) as c:
        for page in ("/", "/jobs/1", "/failures", "/cluster", "/api/jobs"):
            body = c.get(page).text
            assert "sekrit-pw" not in body, page
        assert "tuner:***@dbhost" in c.get("/").text
    # a database that cannot be reached: the error says so, without the password
    res = subprocess.run([sys.executable, "-m", "tuner.cli", "dashboard", "--db",
                          "postgresql+psycopg://tuner:sekrit-pw@127.0.0.1:1/tuner"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert res.returncode == 2, res.stderr
    assert "sekrit" not in res.stderr + res.stdout and "tuner:***@127.0.0.1" in res.stderr


def test_optuna_dashboard_link_must_be_http(tmp_path):
    res = subprocess.run([sys.executable, "-m", "tuner.cli", "dashboard", "--db",
                          f"sqlite:///{tmp_path / 'x.db'}", "--optuna-dashboard",
                          "javascript:alert(1)"], capture_output=True, text=True, cwd=REPO,
                         timeout=60)
    assert res.returncode == 2 and "http://" in res.stderr


def test_missing_database_is_refused_in_words(tmp_path):
    res = subprocess.run([sys.executable, "-m", "tuner.cli", "dashboard", "--db",
                          f"sqlite:///{tmp_path / 'none.db'}"], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert res.returncode == 2 and "no database" in res.stderr
    assert not (tmp_path / "none.db").exists()


def _best(*args: str, url: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tuner.cli", "best", *args, "--db", url],
                          capture_output=True, text=True, cwd=REPO, timeout=60)


def test_tuner_best_answers_for_the_only_shapes_stored(tmp_path):
    url = f"sqlite:///{tmp_path / 'one.db'}"
    fill(url, [{"rows": 16, "cols": 32}], xss=False)
    res = _best("softmax_rows", "--json", url=url)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["time_s"] == pytest.approx(1e-6)
    assert "only at X=16x32" in res.stderr
    url2 = f"sqlite:///{tmp_path / 'two.db'}"
    fill(url2, [{"rows": 16, "cols": 32}, {"rows": 8, "cols": 64}], xss=False)
    res = _best("softmax_rows", url=url2)
    assert res.returncode == 2
    assert f"tuner best softmax_rows --set X=16x32 --db {url2}" in res.stderr
    assert f"tuner best softmax_rows --set X=8x64 --db {url2}" in res.stderr
    # the line it prints answers
    res = _best("softmax_rows", "--set", "X=8x64", url=url2)
    assert res.returncode == 0 and "X 8x64" in res.stdout


def test_postgresql_pages_totals_and_read_only(pg_url):
    ids = fill(pg_url)
    with TestClient(create_app(pg_url)) as c:
        for path in ["/", f"/jobs/{ids['job']}", f"/kernels/{ids['trials'][3]}", "/failures"]:
            r = c.get(path)
            assert r.status_code == 200, (path, r.text[:500])
            assert XSS not in r.text
        data = c.get(f"/api/jobs/{ids['job']}").json()
        (dev,) = data["programs"][0]["devices"]
        assert dev["statuses"] == {"ok": 4, "compile_error": 1}
        s = c.get(f"/api/programs/{ids['programs'][0]}/series",
                  params={"device": DEVICE}).json()
        assert [b["s"] for b in s["best"]] == [3e-6, 2e-6, 1e-6]
        reader: Reader = c.app.state.reader
        with pytest.raises(Exception, match="read-only"):
            with reader.engine.connect() as conn:
                conn.execute(text("DELETE FROM tuner_jobs"))
                conn.commit()


def test_predicted_vs_measured_needs_a_model_then_shows_its_predictions(tmp_path):
    """Without a stored cost model the API says how to make one; with one, every ok first
    timing of the program x device gets the model's prediction beside it."""
    import costmodel

    url = f"sqlite:///{tmp_path / 'pred.db'}"
    ids = fill(url, xss=False)
    pid = ids["programs"][0]
    path = f"/api/programs/{pid}/predicted?device={DEVICE}"
    with TestClient(create_app(url)) as c:
        r = c.get(path).json()
        assert r["model"] is None and "tuner model train" in r["reason"]
        assert r["note"] == r["reason"]  # the chart's caption, written by the server
        assert c.get(f"/api/programs/{pid}/predicted").status_code == 400
    with db.connect(url) as database:
        trained = costmodel.train(database, device_key=DEVICE, kind="gbdt",
                                  options={"trees": 20})
    with TestClient(create_app(url)) as c:
        r = c.get(path).json()
    assert r["model"]["id"] == trained["model_id"] and r["model"]["kind"] == "gbdt"
    assert sorted(p["measured"] for p in r["points"]) == [1e-6, 2e-6, 2.5e-6, 3e-6]
    assert all(p["predicted"] > 0 for p in r["points"]) and r["kendall_tau"] is not None
    assert r["note"].startswith(f"model {trained['model_id']} (gbdt) · Kendall tau ")
