"""The fast measurement path and the noise detector: many configs of one structure compiled
into one library and checked and timed by one worker job, with a crashing or hanging kernel
still its own result; trials stored in one transaction; and the verdict on a noisy machine
(pure functions, on synthetic timing series)."""

from __future__ import annotations

import numpy as np
import pytest

import db
from cluster.runtime import LocalExecutor
from kernels import config_space
from kernels.devices import (
    CpuDevice,
    IsolatedWorker,
    close_call,
    combine_cpp,
    compile_cpp,
    loaded,
    timing_noise,
    verdict,
)
from search import run_search
from search.ir.suite import load_program


def _timing(samples, cpu_share=1.0):
    return {"samples_s": list(samples), "median_s": float(np.median(samples)),
            "cpu_share": cpu_share}


# ---------------------------------------------------------------- the noise detector


def test_a_steady_timing_is_not_noisy_a_spread_or_preempted_one_is():
    steady = _timing([1.00e-3, 1.01e-3, 0.99e-3, 1.00e-3, 1.02e-3, 1.00e-3])
    assert timing_noise(steady) is None
    spread = _timing([1.0e-3, 1.6e-3, 0.9e-3, 2.4e-3, 1.1e-3, 3.0e-3])
    assert "spread" in timing_noise(spread)
    preempted = _timing([1.00e-3] * 6, cpu_share=0.45)
    assert "45%" in timing_noise(preempted)
    assert timing_noise(None) is None and timing_noise(_timing([1e-3] * 6, None)) is None


def test_loaded_counts_other_runnable_threads_against_the_free_cores():
    assert loaded(0, 2) is None and loaded(0.4, 2) is None
    assert "2 other runnable" in loaded(2, 2)
    assert loaded(1, 2, threads=1) is None  # a one-thread kernel leaves a core free
    assert loaded(2, 2, threads=1) is not None


def test_verdict_separated_finalists_are_certain():
    v = verdict({"a": [1.0, 1.01, 0.99], "b": [1.3, 1.31, 1.29], "c": [2.0, 2.0, 2.1]})
    assert v.best == "a" and v.uncertain is None and v.median_s == 1.0


def test_verdict_a_runner_up_within_the_noise_is_uncertain():
    # each config's rounds vary by ~40% and the runner-up won the second: a 10% difference
    # of medians settles nothing
    v = verdict({"a": [1.0, 1.4, 0.95], "b": [1.1, 1.2, 1.05]})
    assert v.best == "a" and "runner-up" in v.uncertain


def test_verdict_rounds_that_vary_alike_still_separate_the_finalists():
    """The rounds are interleaved: a burst of load slows a whole round.  A runner-up never
    more than 5% faster than the best in any round is no close call, however much the rounds
    vary; in two rounds it could still be chance."""
    assert verdict({"a": [1.0, 1.4, 0.95], "b": [1.1, 1.5, 1.05]}).uncertain is None
    assert verdict({"a": [1.0, 1.3, 0.95], "b": [1.02, 1.26, 0.97]}).uncertain is None
    assert verdict({"a": [1.0, 1.4], "b": [1.1, 1.5]}).uncertain is not None


def test_verdict_words_a_moderate_spread_and_calls_an_enormous_one_noise():
    """A runner-up within a moderate spread is named with the spread; one within a spread of
    more than 2x (a launch under heavy load said 'within the 39833% its timings vary by') is
    said to be noise, the machine busy.  Uncertain both times, as before."""
    v = verdict({"a": [1.0, 1.4, 0.95], "b": [1.1, 1.2, 1.05]})  # rounds ~40% apart
    assert v.uncertain == "the runner-up is 10% slower, within the 45% its timings vary by"
    busy = verdict({"a": [1.0, 400.0, 0.9], "b": [1.1, 300.0, 1.05]})  # one round 400x
    assert busy.best == "a" and busy.uncertain == (
        "the runner-up is 10% slower, but its timings vary by more than 2x: the machine was "
        "busy and they rank nothing")
    assert "%" not in busy.uncertain.split("slower")[1]
    # at exactly 2x (a spread of 100%) the percentage is still shown
    assert close_call("x", 0.1, 1.0, "its") == "x is 10% slower, within the 100% its timings vary by"


def test_verdict_a_close_call_on_steady_timings_is_certain():
    v = verdict({"a": [1.00, 1.01, 1.00], "b": [1.02, 1.02, 1.03]})
    assert v.best == "a" and v.uncertain is None


def test_verdict_noisy_retimings_or_a_loaded_machine_make_it_uncertain():
    rounds = {"a": [1.0, 1.0, 1.0], "b": [3.0, 3.0, 3.0]}
    assert "2 of 6 re-timings were noisy" in verdict(rounds, noisy=2, timings=6).uncertain
    assert verdict(rounds, noisy=1, timings=6).uncertain is None
    assert "loaded" in verdict(rounds, load="3 other runnable thread(s)").uncertain
    with pytest.raises(ValueError, match="at least one timing"):
        verdict({"a": []})


# ---------------------------------------------------------------- batched builds


def _library(tmp_path, body: str):
    src = ('#include <stdlib.h>\n#include <unistd.h>\n'
           'extern "C" void kernel_0(float** in, float** out) { out[0][0] = in[0][0] * 2; }\n'
           + body +
           'extern "C" void kernel_2(float** in, float** out) { out[0][0] = in[0][0] * 2; }\n')
    return compile_cpp(src)


@pytest.mark.parametrize("fault,status", [
    ('extern "C" void kernel_1(float** in, float** out) { *(volatile int*)0 = 1; }\n',
     "runtime_error"),
    ('extern "C" void kernel_1(float** in, float** out) { for (;;) sleep(1); }\n',
     "timeout"),
    ('extern "C" void kernel_1(float** in, float** out) { out[0][0] = 7; }\n',
     "wrong_result"),
], ids=["crash", "hang", "wrong"])
def test_a_faulty_kernel_in_a_batch_is_its_own_result_and_the_rest_still_run(
        tmp_path, fault, status):
    lib = _library(tmp_path, fault)
    x = np.array([[3.0]], np.float32)
    with IsolatedWorker() as worker:
        res = worker.run_batch(lib, ["kernel_0", "kernel_1", "kernel_2"], [x],
                               [np.array([[6.0]], np.float32)], [(1, 1)], rtol=1e-4,
                               atol=1e-5, timing={"warmup": 0, "min_repeats": 3,
                                                  "budget_s": 0.05}, timeout_s=3)
        assert [r.status for r in res] == ["ok", status, "ok"], [r.message for r in res]
        assert res[0].payload["timing"]["median_s"] > 0 and res[2].payload["timing"]
        if status != "wrong_result":
            assert worker.starts == 2  # replaced once, after the faulty kernel
            assert "kernel_1" in res[1].message


def test_combine_cpp_refuses_sources_without_the_shared_prelude():
    with pytest.raises(ValueError, match="shared prelude"):
        combine_cpp(['#include <x>\n// ===== a\nextern "C" void kernel(float** i, '
                     'float** o) {}', "int x;"])


def test_run_trials_gives_what_run_trial_gives_for_every_config():
    program = load_program("softmax_rows", {"rows": 32, "cols": 64})
    ref = program.build()
    found = run_search(program, None, LocalExecutor(), time_limit_s=10)
    structure = found.verified[found.structures[0]["hash"]]
    device = CpuDevice()
    space = config_space(structure, device.spec)
    assert space.size > 6, space.params
    configs = list(space.configs())[::4][:6] + [{**space.default, "split": 3}]
    with IsolatedWorker() as worker:
        batch = device.run_trials(structure, ref, configs, worker=worker)
        single = [device.run_trial(structure, ref, c, worker=worker) for c in configs]
    assert batch[-1]["status"] == "invalid" and [b["status"] for b in batch].count("ok") >= 5
    assert len(batch) == len(configs)
    for b, s in zip(batch, single, strict=True):
        assert (b["status"], b["config"], b["source"]) == (s["status"], s["config"],
                                                           s["source"])
        if b["status"] == "ok":
            assert b["median_s"] > 0 and len(b["samples"]) >= 1 and "noise" in b
            assert b["max_error"] == pytest.approx(s["max_error"], abs=1e-6)
            assert set(b["phases"]) == {"prepare_s", "compile_s", "run_s"}


def test_record_trials_stores_a_batch_in_one_go_and_again_adds_nothing(tmp_path):
    database = db.connect(f"sqlite:///{tmp_path / 't.db'}")
    pid = database.record_program("p" * 8, {"X": [2]}, "float32", "p", {"g": 1})
    sid = database.record_structure(pid, "s" * 8, {"g": 1}, {"verdict": "reference"}, 1)
    results = [{"config": {"a": 1}, "status": "ok", "median_s": 1e-3, "spread_s": 1e-5,
                "samples": [1e-3, 1e-3], "max_error": 0.0, "host": "h"},
               {"config": {"a": 2}, "status": "compile_error", "message": "bad"},
               {"config": {"a": 3}, "status": "invalid", "message": "does not lower"}]
    ids = db.record_trials(database, sid, "cpu:test", results, study_name="s")
    assert ids[0] > 0 and ids[1] > 0 and ids[2] == -1
    assert db.record_trials(database, sid, "cpu:test", results) == ids
    rows = database.row_counts()
    assert rows["tuner_trials"] == 2 and rows["tuner_measurements"] == 2
    bad = [{"config": {"a": 4}, "status": "ok", "median_s": None}]
    with pytest.raises(ValueError, match="needs median_s"):
        db.record_trials(database, sid, "cpu:test", bad)
    database.close()


def test_a_kernel_that_writes_its_input_does_not_spoil_the_next_in_the_batch(tmp_path):
    lib = _library(tmp_path, 'extern "C" void kernel_1(float** in, float** out) '
                             '{ out[0][0] = in[0][0] * 2; in[0][0] = 100; }\n')
    with IsolatedWorker() as worker:
        res = worker.run_batch(lib, ["kernel_0", "kernel_1", "kernel_2"],
                               [np.array([[3.0]], np.float32)],
                               [np.array([[6.0]], np.float32)], [(1, 1)], rtol=1e-4,
                               atol=1e-5, timing=None)
    assert [r.status for r in res] == ["ok", "ok", "ok"], [r.message for r in res]
