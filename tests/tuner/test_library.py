"""The library path (numpy op by op on the reference graph, the launch's baseline) is a
candidate of every launch: where it beats every tuned kernel the best row says `library`,
`tuner best` says so and by how much, and `tuner.load` returns it with a kernel's calling
convention."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import run_cli

import db
import tuner
from kernels import LibraryKernel, library_kernel
from search.ir.suite import load_program

# A plain matmul.  On the development VM (AMD EPYC, AVX-512, loaded) the generated kernels
# beat numpy's OpenBLAS at every size tried (256x512x512: 0.8 vs 4.1 ms; 1024^3: 15 vs 43 ms),
# so the test makes every tuned candidate slow for real (the `slow` fault drill: a correct
# kernel that spins first, ~0.1 s), which makes the library the fastest on any machine.
# The matmul is small (numpy ~0.05 ms) so that even a loaded machine keeps a wide margin: at
# 256x512x512 numpy took 31 ms under load, as long as a slowed kernel.
SLOW_EVERY_TRIAL = ",".join(f"slow@{i}" for i in range(1, 41))
MATMUL = """
name: plain_matmul
dtype: float32
inputs:
  X: [64, 128]
  W: [128, 128]
body: |
  O = X @ W
outputs: [O]
"""

JOB = """
programs:
  - file: plain_matmul.yaml
search:
  time_limit_s: 60
tuning:
  trials_per_structure: 2
  structures: 1
  seed: 0
  trial_timeout_s: 60
devices: [cpu]
cluster:
  workers: 1
"""


def test_library_kernel_runs_the_reference_like_a_kernel() -> None:
    program = load_program("rmsnorm_matmul", {"X": "16x64", "W": "64x32"})
    kernel = library_kernel(program.build())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 64), dtype=np.float32)
    w = rng.standard_normal((64, 32), dtype=np.float32)
    want = (x / np.sqrt(np.mean(x * x, axis=1, keepdims=True))) @ w
    (out,) = kernel(x, w)  # a float16 program: float16 outputs, as its C++ kernels give
    assert out.dtype == np.float16 and out.shape == (16, 32)
    np.testing.assert_allclose(out.astype(np.float32), want, rtol=1e-3, atol=1e-3)
    buf = np.empty((16, 32), np.float32)  # out= arrays are filled, whatever their dtype
    (same,) = kernel(x, w, out=buf)
    assert same is buf
    np.testing.assert_allclose(buf, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="expected 2 inputs"):
        kernel(x)
    with pytest.raises(ValueError, match="input 1 has shape"):
        kernel(x, w.T)


def test_a_launch_where_blas_wins_serves_the_library(tmp_path: Path) -> None:
    (tmp_path / "plain_matmul.yaml").write_text(MATMUL)
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    url = f"sqlite:///{tmp_path / 'lib.db'}"
    slow = {"TUNER_FAULT_TRIALS": SLOW_EVERY_TRIAL}
    res = run_cli("launch", str(job), "--db", url, "--json", env=slow, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    (rep,) = json.loads(res.stdout)["programs"]
    assert rep["library"] is True, json.dumps(rep)
    assert rep["tuned_s"] is not None and rep["tuned_s"] > rep["best_s"]
    assert rep["best_structure"].startswith(db.LIBRARY_PREFIX)
    assert rep["speedup"] == pytest.approx(1.0)  # the library is the baseline
    program = load_program(str(tmp_path / "plain_matmul.yaml"))
    record = tuner.best(program, device="cpu", url=url)
    assert record is not None and record.library and record.config == {}
    assert record.time_s == pytest.approx(rep["best_s"])
    with db.connect(url, migrate_schema=False) as database:
        timings = database.measurements(record.trial_id)
        (structure,) = [s for s in database.structures(database.programs()[0].program_id)
                        if s.id == record.structure_id]
    # 3 timings on a quiet machine; a loaded one (another test process) adds rounds
    assert len(timings) >= 3 and all(m.status == "ok" for m in timings)
    assert structure.verification["verdict"] == "library"
    # `tuner best` says the library wins, and by how much
    res = run_cli("best", str(tmp_path / "plain_matmul.yaml"), "--db", url, timeout=600)
    assert res.returncode == 0, res.stderr
    assert "the library wins" in res.stdout and "faster than the fastest tuned kernel" \
        in res.stdout, res.stdout
    res = run_cli("best", str(tmp_path / "plain_matmul.yaml"), "--db", url, "--json", timeout=600)
    got = json.loads(res.stdout)
    assert got["library"] is True and got["tuned_s"] == pytest.approx(rep["tuned_s"])
    # `tuner.load` returns the library path, with a kernel's calling convention
    kernel = tuner.load(program, url=url)
    assert isinstance(kernel, LibraryKernel)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 128), dtype=np.float32)
    w = rng.standard_normal((128, 128), dtype=np.float32)
    (out,) = kernel(x, w)
    np.testing.assert_allclose(out, x @ w, rtol=1e-4, atol=1e-3)
    buf = np.zeros((64, 128), np.float32)
    kernel(x, w, out=buf)
    np.testing.assert_allclose(buf, x @ w, rtol=1e-4, atol=1e-3)
    # a relaunch re-times nothing of the library and keeps it the best
    before = len(timings)
    res = run_cli("launch", str(job), "--db", url, "--json", env=slow, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    (again,) = json.loads(res.stdout)["programs"]
    assert again["library"] is True
    with db.connect(url, migrate_schema=False) as database:
        assert len(database.measurements(record.trial_id)) == before
