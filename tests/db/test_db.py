"""Tests of the db package: schema and migrations, idempotent writes, best-kernel rules,
transactions, Optuna coexistence, SQLite settings, and PostgreSQL variants.

PostgreSQL tests run when TUNER_TEST_POSTGRES_URL is set (``.ci/postgres.sh`` prints one);
each gets a fresh schema on that server, dropped afterwards.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

import db
from db import Base, ProgramRow

REPO = Path(__file__).resolve().parents[2]
PG_ENV = "TUNER_TEST_POSTGRES_URL"
SHAPES = {"x": [16, 1024], "w": [1024, 256]}


@pytest.fixture(params=["sqlite", "postgresql"])
def any_url(request: pytest.FixtureRequest) -> str:
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return request.getfixturevalue(name)


@pytest.fixture
def database(any_url: str):
    with db.connect(any_url) as database:
        yield database


def _chain(database: db.Database, config: dict | None = None, device: str = "cpu:test"):
    """program -> structure -> trial ids for one config."""
    pid = database.record_program("ph", SHAPES, "float32", "rms_matmul", {"ops": ["rms", "mm"]})
    sid = database.record_structure(
        pid, "sh1", {"kernels": 1}, {"tests": 3, "seed": 7, "verdict": "equivalent"}, 1, 4096
    )
    tid = database.record_trial(sid, device, config or {"grid": [4, 1], "forloop": 16})
    return pid, sid, tid


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


# -- schema and migrations -----------------------------------------------------------------


def test_new_database_is_created_at_head(any_url: str) -> None:
    assert db.current_revision(any_url) is None
    with db.connect(any_url) as database:
        assert database.current_revision() == db.head_revision()
        assert database.schema_diff() == []
    tables = _tables(any_url)
    assert {t.name for t in Base.metadata.sorted_tables} | {db.VERSION_TABLE} <= tables
    assert "alembic_version" not in tables  # that name belongs to Optuna


def test_migrations_produce_exactly_the_models_ddl(tmp_path: Path) -> None:
    migrated, created = tmp_path / "migrated.db", tmp_path / "created.db"
    db.upgrade(f"sqlite:///{migrated}")
    engine = sa.create_engine(f"sqlite:///{created}")
    Base.metadata.create_all(engine)
    engine.dispose()

    def clauses(sql: str) -> set[str]:
        """Column and constraint clauses of a CREATE TABLE, in any order."""
        body, parts, depth, start = sql[sql.index("(") + 1 : sql.rindex(")")], set(), 0, 0
        for i, ch in enumerate(body + ","):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if ch == "," and depth == 0:
                parts.add(" ".join(body[start:i].split()))
                start = i + 1
        return parts

    def ddl(path: Path) -> dict[str, set[str]]:
        with sqlite3.connect(path) as conn:
            rows = conn.execute("SELECT name, sql FROM sqlite_master WHERE name LIKE 'tuner_%'")
            return {n: clauses(s) for n, s in rows if n != db.VERSION_TABLE and s}

    assert ddl(migrated) == ddl(created)


def test_upgrade_is_idempotent_and_keeps_data(sqlite_url: str) -> None:
    assert db.upgrade(sqlite_url) == db.head_revision()
    with db.connect(sqlite_url) as database:
        _chain(database)
        before = database.row_counts()
    assert db.upgrade(sqlite_url) == db.head_revision()
    with db.connect(sqlite_url) as database:
        assert database.row_counts() == before
        assert database.upgrade() == db.head_revision()


def test_downgrade_to_base_then_upgrade(sqlite_url: str) -> None:
    with db.connect(sqlite_url) as database:
        assert database.downgrade("base") is None
        assert not any(
            t.startswith("tuner_") and t != db.VERSION_TABLE for t in _tables(sqlite_url)
        )
        assert database.upgrade() == db.head_revision()


def test_read_only_connect_never_creates_or_migrates(tmp_path: Path) -> None:
    path = tmp_path / "missing.db"
    with pytest.raises(db.SchemaError, match="tuner launch"):
        db.connect(f"sqlite:///{path}", migrate_schema=False)
    assert not path.exists()
    sqlite3.connect(path).close()  # an empty, non-tuner database
    with pytest.raises(db.SchemaError, match="tuner db upgrade"):
        db.connect(f"sqlite:///{path}", migrate_schema=False)
    db.upgrade(f"sqlite:///{path}")
    with db.connect(f"sqlite:///{path}", migrate_schema=False) as database:
        assert database.best_kernel("ph", SHAPES, "float32") is None


def test_database_from_a_newer_tuner_is_refused(sqlite_url: str) -> None:
    db.upgrade(sqlite_url)
    with sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as conn:
        conn.execute(f"UPDATE {db.VERSION_TABLE} SET version_num = '9999'")
    with pytest.raises(db.SchemaError, match="newer tuner"):
        db.connect(sqlite_url)
    with pytest.raises(db.SchemaError, match="'9999'"):
        db.connect(sqlite_url, migrate_schema=False)


def test_tuner_tables_without_version_table_are_refused(sqlite_url: str) -> None:
    engine = sa.create_engine(sqlite_url)
    Base.metadata.create_all(engine)
    engine.dispose()
    with pytest.raises(db.SchemaError, match="not created by tuner's migrations"):
        db.connect(sqlite_url)


# -- URLs, drivers and SQLite settings --------------------------------------------------------


def test_sqlite_settings(sqlite_url: str) -> None:
    with db.connect(sqlite_url) as database, database.engine.connect() as conn:
        pragma = {
            name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()
            for name in ("journal_mode", "busy_timeout", "foreign_keys")
        }
    assert pragma == {"journal_mode": "wal", "busy_timeout": 30000, "foreign_keys": 1}


def test_in_memory_sqlite_works() -> None:
    with db.connect("sqlite:///:memory:") as database:
        _, _, tid = _chain(database)
        assert database.measurements(tid) == []


def test_url_errors_name_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="invalid database URL"):
        db.connect("not a url")
    with pytest.raises(ValueError, match="use SQLite or PostgreSQL"):
        db.connect("mysql://u:p@localhost/x")
    with pytest.raises(db.DatabaseError, match="does not exist"):
        db.connect(f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}")
    monkeypatch.setitem(sys.modules, "psycopg", None)  # makes `import psycopg` fail
    with pytest.raises(db.MissingDriverError, match=r"pip install 'psycopg\[binary\]'"):
        db.connect("postgresql://u:p@localhost/x")


def test_normalize_url_defaults() -> None:
    assert db.normalize_url(None).render_as_string() == db.DEFAULT_URL
    for raw in ("postgresql://u@h/d", "postgres://u@h/d"):
        assert db.normalize_url(raw).drivername == "postgresql+psycopg"


# -- idempotent writes --------------------------------------------------------------------------


def test_every_write_twice_gives_one_row(database: db.Database) -> None:
    first = _chain(database)
    key = db.shapes_key(SHAPES)
    pid = database.record_program("ph", key, "float32", "rms_matmul", {"ops": ["rms", "mm"]})
    assert _chain(database) == first and pid == first[0]
    tid = first[2]
    m1 = database.record_measurement(tid, "ok", median_s=2e-3, samples=[2e-3, 2.1e-3], host="h")
    m2 = database.record_measurement(tid, "ok", median_s=9e-3, host="other")  # a retried write
    assert m1 == m2
    assert database.measurements(tid)[0].median_s == 2e-3  # the first write stays
    job = database.start_job("job-abc", "job.yaml")
    database.record_shard(job.id, "prog0/shard3", stats={"candidates": 12})
    database.record_shard(job.id, "prog0/shard3", stats={"candidates": 12})
    counts = database.row_counts()
    assert counts == {
        "tuner_programs": 1,
        "tuner_jobs": 1,
        "tuner_search_shards": 1,
        "tuner_structures": 1,
        "tuner_trials": 1,
        "tuner_measurements": 1,
        "tuner_best_kernels": 0,
    }
    m3 = database.record_measurement(tid, "timeout", attempt=1, message="hung")
    assert m3 != m1 and [m.attempt for m in database.measurements(tid)] == [0, 1]


def test_config_key_ignores_dict_order(database: db.Database) -> None:
    _, sid, tid = _chain(database, {"grid": [4, 1], "forloop": 16})
    assert database.record_trial(sid, "cpu:test", {"forloop": 16, "grid": [4, 1]}) == tid
    assert database.record_trial(sid, "cpu:test", {"forloop": 64, "grid": [4, 1]}) != tid
    assert database.record_trial(sid, "cuda:h100", {"forloop": 16, "grid": [4, 1]}) != tid


def test_bad_writes_are_refused_with_the_fix(database: db.Database) -> None:
    _, _, tid = _chain(database)
    with pytest.raises(ValueError, match="must be one of"):
        database.record_measurement(tid, "crashed")
    with pytest.raises(ValueError, match="needs median_s > 0"):
        database.record_measurement(tid, "ok")
    with pytest.raises(ValueError, match="differs from trial"):
        database.record_measurement(tid, "ok", median_s=1e-3, device_key="cuda:h100")
    with pytest.raises(ValueError, match="no trial with id"):
        database.record_measurement(10_000, "ok", median_s=1e-3)
    with pytest.raises(ValueError, match="refers to"):
        database.record_trial(10_000, "cpu:test", {"grid": [1]})
    with pytest.raises(ValueError, match="JSON-serializable"):
        database.record_trial(1, "cpu:test", {"grid": {1, 2}})
    assert database.row_counts()["tuner_measurements"] == 0


# -- best kernels ---------------------------------------------------------------------------


def test_best_is_replaced_only_by_a_strictly_faster_ok_kernel(database: db.Database) -> None:
    _, sid, t1 = _chain(database)
    t2 = database.record_trial(sid, "cpu:test", {"grid": [8, 1], "forloop": 16})
    t3 = database.record_trial(sid, "cpu:test", {"grid": [16, 1], "forloop": 16})
    m1 = database.record_measurement(t1, "ok", median_s=2e-3)
    m_same = database.record_measurement(t2, "ok", median_s=2e-3)
    m_wrong = database.record_measurement(t3, "wrong_result", median_s=1e-4, max_error=float("nan"))
    assert database.update_best(m1, "src1", baseline_s=6e-3)
    assert not database.update_best(m1, "src1", baseline_s=6e-3)  # retried: no change
    assert not database.update_best(m_same, "src-same")  # equal time is not faster
    assert not database.update_best(m_wrong, "src-wrong")  # never serve a failed kernel
    best = database.best_kernel("ph", SHAPES, "float32", "cpu:test")
    assert (best.source, best.trial_id, best.time_s) == ("src1", t1, 2e-3)
    assert best.speedup == pytest.approx(3.0)
    m_fast = database.record_measurement(t3, "ok", median_s=5e-4, attempt=1)
    assert database.update_best(m_fast, "src3")  # no baseline given: the old one is kept
    best = database.best_kernel("ph", db.shapes_key(SHAPES), "float32", "cpu:test")
    assert (best.source, best.trial_id, best.measurement_id) == ("src3", t3, m_fast)
    assert best.config == {"grid": [16, 1], "forloop": 16} and best.structure_hash == "sh1"
    assert best.baseline_s == 6e-3 and best.speedup == pytest.approx(12.0)
    assert database.history("ph", status="wrong_result")[0].max_error == float("inf")


def test_confirmed_best_is_the_median_of_its_timings_even_when_slower(
        database: db.Database) -> None:
    _, sid, lucky = _chain(database)
    steady = database.record_trial(sid, "cpu:test", {"grid": [8, 1], "forloop": 16})
    flaky = database.record_trial(sid, "cpu:test", {"grid": [16, 1], "forloop": 16})
    database.update_best(database.record_measurement(lucky, "ok", median_s=1e-3), "lucky",
                         baseline_s=6e-3)
    for attempt, t in enumerate((4e-3, 3e-3)):  # the lucky first timing was not repeated
        database.record_measurement(lucky, "ok", median_s=t, attempt=attempt + 1)
    for attempt, t in enumerate((2e-3, 2.2e-3, 1.9e-3)):
        database.record_measurement(steady, "ok", median_s=t, attempt=attempt)
    database.record_measurement(flaky, "ok", median_s=5e-4)
    database.record_measurement(flaky, "timeout", attempt=1)
    assert database.confirm_best(flaky, "flaky") is None  # a failed re-run: not eligible
    assert database.best_kernel("ph", SHAPES, "float32", "cpu:test").source == "lucky"
    assert database.confirm_best(lucky, "lucky") == pytest.approx(3e-3)
    best = database.best_kernel("ph", SHAPES, "float32", "cpu:test")
    assert (best.trial_id, best.time_s) == (lucky, pytest.approx(3e-3))  # slower, and true
    assert database.confirm_best(steady, "steady") == pytest.approx(2e-3)
    best = database.best_kernel("ph", SHAPES, "float32", "cpu:test")
    assert (best.source, best.time_s, best.baseline_s) == ("steady", pytest.approx(2e-3), 6e-3)
    with pytest.raises(ValueError, match="no measurements"):
        database.confirm_best(10_000, "x")


def test_best_per_device_and_fastest_over_devices(database: db.Database) -> None:
    _, sid, t_cpu = _chain(database)
    t_gpu = database.record_trial(sid, "cuda:h100", {"grid": [4, 1], "forloop": 16})
    database.update_best(database.record_measurement(t_cpu, "ok", median_s=3e-3), "cpu-src")
    database.update_best(database.record_measurement(t_gpu, "ok", median_s=1e-5), "gpu-src")
    assert database.best_kernel("ph", SHAPES, "float32", "cpu:test").source == "cpu-src"
    assert database.best_kernel("ph", SHAPES, "float32").device_key == "cuda:h100"
    kernels = database.best_kernels("ph", SHAPES, "float32")
    assert [k.device_key for k in kernels] == ["cuda:h100", "cpu:test"]


def test_lookup_of_unknown_returns_none(database: db.Database) -> None:
    _chain(database)
    assert database.best_kernel("ph", SHAPES, "float32", "cpu:test") is None  # nothing measured
    assert database.best_kernel("nope", SHAPES, "float32") is None
    assert database.best_kernel("ph", {"x": [1]}, "float32") is None
    assert database.history("nope") == []
    assert database.program_id("ph", SHAPES, "float16") is None


def test_history_filters(database: db.Database) -> None:
    _, sid, tid = _chain(database)
    database.record_measurement(tid, "ok", median_s=1e-3)
    gpu = database.record_trial(sid, "cuda:h100", {"grid": [1]}, "study-a", 4)
    database.record_measurement(gpu, "compile_error", message="nvcc: error")
    everything = database.history("ph")
    assert [h.status for h in everything] == ["ok", "compile_error"]
    only_gpu = database.history("ph", SHAPES, "float32", device_key="cuda:h100")
    assert [(h.study_name, h.trial_number, h.message) for h in only_gpu] == [
        ("study-a", 4, "nvcc: error")
    ]
    assert len(database.history("ph", limit=1)) == 1


# -- transactions, jobs and shards ------------------------------------------------------------


def test_session_rolls_back_everything_on_error(database: db.Database) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), database.session() as s:
        s.add(ProgramRow(program_hash="p1", shapes_key="[]", dtype="f32", name="a", graph_json="{}"))
        s.flush()  # the row reached the database inside the transaction
        raise Boom
    assert database.row_counts()["tuner_programs"] == 0
    with database.session() as s:
        s.add(ProgramRow(program_hash="p1", shapes_key="[]", dtype="f32", name="a", graph_json="{}"))
    assert database.row_counts()["tuner_programs"] == 1


def test_job_resume_and_sticky_finished_shards(database: db.Database) -> None:
    job = database.start_job("key-1", "jobs/a.yaml")
    assert not job.resumed and job.status == "running" and job.attempts == 1
    database.record_shard(job.id, "s0", "running")
    database.record_shard(job.id, "s1", "running")
    database.record_shard(job.id, "s0", "finished", {"kept": 3})
    database.record_shard(job.id, "s0", "running")  # a late duplicate never reopens it
    database.finish_job(job.id, "interrupted", {"search_s": 1.5})
    again = database.start_job("key-1", "jobs/moved.yaml")
    assert again.id == job.id and again.resumed and again.attempts == 2
    assert again.status == "running" and again.finished_at is None
    assert database.shard_done(job.id, "s0") and not database.shard_done(job.id, "s1")
    assert database.finished_shards(job.id) == {"s0"}
    done = database.finish_job(job.id, timings={"search_s": 2.0})
    assert done.status == "finished" and done.timings == {"search_s": 2.0}
    with pytest.raises(ValueError, match="must be one of"):
        database.finish_job(job.id, "running")


# -- concurrency and Optuna ------------------------------------------------------------------

_WRITER = """
import sys
import db
database = db.connect(sys.argv[1])
pid = database.record_program("ph", [[4]], "float32", "p", {})
sid = database.record_structure(pid, "s", {}, {}, 1)
for i in range(60):
    tid = database.record_trial(sid, "cpu", {"writer": sys.argv[2], "i": i})
    database.record_measurement(tid, "ok", median_s=1e-3 + i * 1e-6)
"""


def test_two_processes_write_one_sqlite_file(sqlite_url: str) -> None:
    db.upgrade(sqlite_url)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, sqlite_url, name], env=env, stderr=subprocess.PIPE
        )
        for name in ("a", "b")
    ]
    errors = [p.communicate(timeout=120)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    with db.connect(sqlite_url) as database:
        counts = database.row_counts()
    assert (counts["tuner_programs"], counts["tuner_trials"], counts["tuner_measurements"]) == (
        1,
        120,
        120,
    )


@pytest.mark.parametrize("optuna_first", [False, True], ids=["tuner-first", "optuna-first"])
def test_coexists_with_optuna_rdb_storage(any_url: str, optuna_first: bool) -> None:
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def run_optuna() -> None:
        storage = optuna.storages.RDBStorage(any_url)
        study = optuna.create_study(study_name="s1", storage=storage, load_if_exists=True)
        study.optimize(lambda t: (t.suggest_float("x", -1, 1) - 0.2) ** 2, n_trials=3)
        storage.engine.dispose()

    if optuna_first:
        run_optuna()
    with db.connect(any_url) as database:
        _chain(database)
    if not optuna_first:
        run_optuna()
    with db.connect(any_url, migrate_schema=False) as database:
        assert database.row_counts()["tuner_trials"] == 1
        assert database.current_revision() == db.head_revision()
    storage = optuna.storages.RDBStorage(any_url)
    assert len(optuna.load_study(study_name="s1", storage=storage).trials) == 3
    storage.engine.dispose()
    engine = sa.create_engine(db.normalize_url(any_url))
    with engine.connect() as conn:
        optuna_rev = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    engine.dispose()
    assert optuna_rev is not None and optuna_rev != db.head_revision()
    assert {"studies", "trials", "tuner_trials"} <= _tables(any_url)


def test_best_lookup_is_an_indexed_point_query(sqlite_url: str) -> None:
    from db import _queries  # a white-box test of the prepared statements

    params = {"program_hash": "h", "shapes_key": "[]", "dtype": "f", "device_key": "d"}
    with db.connect(sqlite_url) as database, database.engine.connect() as conn:
        for stmt in (_queries._BEST_ON_DEVICE, _queries._BEST_ANY_DEVICE):
            bound = stmt.params(**params).compile(
                database.engine, compile_kwargs={"literal_binds": True}
            )
            plan = [row[-1] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {bound}")]
            assert any(
                p.startswith("SEARCH tuner_best_kernels USING INDEX sqlite_autoindex") for p in plan
            ), plan
            assert not any(p.startswith("SCAN") for p in plan), plan
