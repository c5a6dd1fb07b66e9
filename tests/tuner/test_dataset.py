"""benchmarks/dataset.py: random programs launched on the cpu, stored like a user's launch,
resumable, and a bad argument refused in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support import REPO

import db

SCRIPT = [sys.executable, str(REPO / "benchmarks" / "dataset.py")]


def dataset(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*SCRIPT, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO)


@pytest.mark.parametrize("args,fragment", [
    (["--count", "0"], "--count 0: must be at least 1"),
    (["--minutes", "-1"], "--minutes -1.0: must be a positive number"),
    (["--db", "mysql://u@h/x"], "unsupported database"),
    (["--trials", "many"], "invalid int value"),
    (["--bogus"], "unrecognized arguments"),
    (["--programs", "gated_mlp,nope"], "--programs 'gated_mlp,nope': unknown program(s) nope"),
])
def test_bad_arguments_are_one_line_and_exit_2(args, fragment, tmp_path):
    res = dataset(*args)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dataset.py: error: "), res.stderr
    assert fragment in lines[0]
    assert res.stdout == ""


def test_a_small_run_stores_measurements_and_a_second_run_skips_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'ds.db'}"
    args = ["--db", url, "--count", "1", "--seed", "2", "--trials", "2", "--structures", "1",
            "--search-seconds", "5", "--minutes", "5", "--json"]
    res = dataset(*args)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["programs"] == 1 and out["program_errors"] == 0, out
    assert out["structures_tuned"] == 1 and out["structures_verified"] >= 1
    assert out["ok"] >= 1 and out["measurements"] == out["ok"] + out["failed"]
    assert out["ok_rows_in_database"] == out["ok"]
    assert "random_2" in res.stderr and "measurements" in res.stderr  # progress on stderr
    with db.connect(url, migrate_schema=False) as database:
        (job,) = database.jobs()
        assert job.status == "finished" and job.job_key.startswith("dataset-s2:")
        rows = db.training_rows(database)
    assert len(rows) == out["ok"] and {r.program for r in rows} == {"random_2"}

    again = json.loads(dataset(*args).stdout)
    assert again["programs"] == 0 and again["programs_done_before"] == 1
    assert again["measurements"] == 0 and again["ok_rows_in_database"] == out["ok"]


def test_named_programs_are_measured_at_their_default_shapes(tmp_path):
    url = f"sqlite:///{tmp_path / 'ds.db'}"
    res = dataset("--db", url, "--programs", "softmax_rows", "--trials", "2", "--structures", "1",
                  "--search-seconds", "5", "--minutes", "5", "--json")
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["programs"] == 1 and out["ok"] >= 1, out
    assert "softmax_rows" in res.stderr
    with db.connect(url, migrate_schema=False) as database:
        (job,) = database.jobs()
        assert job.job_key.startswith("dataset-softmax_rows:")
        rows = db.training_rows(database)
    assert {r.program for r in rows} == {"softmax_rows"}
