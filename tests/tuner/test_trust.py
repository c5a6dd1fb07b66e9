"""Trust under load: a launch while another process keeps every core busy re-times its
finalists interleaved, and either finds the best a quiet launch finds or stores it marked
uncertain, said by `tuner best` and `tuner status` (never silently)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support import run_cli, write_job

import db
import tuner
from tuner.pipeline.confirm import TIMINGS

SHAPES = {"rows": 64, "cols": 64}
SPIN = "import os, time\nend = time.time() + 900\nwhile time.time() < end and os.getppid() != 1:\n    pass\n"


def launch(job, url: str) -> dict:
    res = run_cli("launch", str(job), "--db", url, "--json", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    (rep,) = json.loads(res.stdout)["programs"]
    return rep


@pytest.mark.serial  # its "quiet" launch needs a quiet machine
def test_a_launch_beside_a_busy_sibling_retimes_and_says_when_its_best_is_uncertain(tmp_path):
    job = write_job(tmp_path, trials=4, structures=1)
    quiet_url = f"sqlite:///{tmp_path / 'quiet.db'}"
    busy_url = f"sqlite:///{tmp_path / 'busy.db'}"
    quiet = launch(job, quiet_url)
    quiet_best = tuner.best("softmax_rows", SHAPES, url=quiet_url)
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN])
                for _ in range(os.cpu_count() or 1)]  # every core kept busy
    try:
        busy = launch(job, busy_url)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    best = tuner.best("softmax_rows", SHAPES, url=busy_url)
    assert best is not None and quiet_best is not None
    # the finalists were re-timed, round by round: every finalist's attempt 1 before any 2
    with db.connect(busy_url, migrate_schema=False) as database:
        key = tuner.identity.program_key(tuner.load_program("softmax_rows", SHAPES))
        hist = [h for h in database.history(key.program_hash)
                if not h.structure_hash.startswith(db.LIBRARY_PREFIX)]
        reruns = sorted((m for t in {h.trial_id for h in hist if h.attempt > 0}
                         for m in database.measurements(t) if m.attempt > 0),
                        key=lambda m: (m.measured_at, m.id))
    assert busy["confirmed"] >= 2 and len(reruns) >= busy["confirmed"] * (TIMINGS - 1)
    attempts = [m.attempt for m in reruns]
    assert attempts == sorted(attempts), attempts  # interleaved rounds
    assert best.config == quiet_best.config or best.uncertain, (best, quiet_best)
    assert busy["uncertain"] == best.uncertain and quiet["best_s"] > 0
    if best.uncertain:  # said wherever the best is read
        res = run_cli("best", "softmax_rows", "--set", "rows=64", "--set", "cols=64",
                      "--db", busy_url)
        assert res.returncode == 0 and "UNCERTAIN" in res.stdout, res.stdout
        res = run_cli("status", "--db", busy_url)
        assert res.returncode == 0 and "uncertain best" in res.stdout, res.stdout


def test_tuner_load_serves_an_uncertain_best_with_a_warning(monkeypatch):
    """A best chosen by noise is served by tuner.load too: never silently. The record's
    ``uncertain`` is said as an UncertainBestWarning; a settled best loads without one."""
    import dataclasses
    import warnings

    import pytest

    from tuner.serving import cache

    def record(uncertain):
        return dataclasses.replace(_FAKE, uncertain=uncertain)

    served = object()
    monkeypatch.setattr(cache, "kernel_from_record", lambda rec, name: served)
    monkeypatch.setattr(cache, "best", lambda *a, **k: record("12 of 12 re-timings were noisy"))
    with pytest.warns(tuner.UncertainBestWarning, match="UNCERTAIN: 12 of 12 re-timings"):
        assert tuner.load("softmax_rows", SHAPES, url="sqlite:///unused.db") is served
    monkeypatch.setattr(cache, "best", lambda *a, **k: record(None))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuner.load("softmax_rows", SHAPES, url="sqlite:///unused.db") is served


_FAKE = db.BestKernel(program_hash="p", shapes_key="{}", dtype="float32",
                      device_key="cpu:AMD EPYC:2c", structure_id=1, structure_hash="s" * 16,
                      structure={}, trial_id=1, config={}, measurement_id=1, source="",
                      time_s=9.3e-3, baseline_s=None, updated_at=None)  # type: ignore[arg-type]
