"""The work prior (issue 20, item 4: the CPU dataset's held-out programs): a program larger
than any the model trained on gets a level from the work it does, where trees alone stop at
the slowest time they saw."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel import featurize, featurize_params, make_model, spec_for_key
from costmodel._work import MIN_ROWS, WorkPrior, work
from search import parse_program

SPEC = spec_for_key("cpu")
OPS = ("exp", "neg", "sqrt", "sigmoid")


def program(op: str, rows: int):
    text = (f"name: {op}_{rows}\ndtype: float32\ninputs:\n  X: [{rows}, 64]\n"
            f"body: 'O = {op}(X)'\noutputs: [O]\n")
    s = featurize(parse_program(text, "<test>").build(), {}, SPEC, group=f"{op}_{rows}",
                  program=f"{op}_{rows}", device="cpu")
    # a call costs 2 us, an exp-family element 2 ns, any other byte moved 0.1 ns
    w = work(s)
    assert w is not None
    s.seconds = 2e-6 + 2e-9 * float(s.graph[6] > 0) * rows * 64 + 1e-10 * rows * 64 * 8
    return s


def test_work_counts_a_graph_and_none_for_a_kernel_tuner_config() -> None:
    s = program("exp", 16)
    w = work(s)
    assert w is not None and w[0] == 1.0
    assert w[3] == pytest.approx(16 * 64 * 8, rel=1e-4)  # a call; bytes in + out
    kt = featurize_params({"block": 64}, ["block"], [4096], SPEC, group="k", program="k",
                          device="cpu")
    assert work(kt) is None


@pytest.mark.parametrize("rows", [256, 512])
def test_a_larger_program_than_any_trained_on_gets_its_level_from_its_work(rows) -> None:
    train = [program(op, r) for op in OPS for r in range(8, 8 + 4 * 16, 4)]
    assert len(train) >= MIN_ROWS
    big = [program(op, rows) for op in OPS]
    truth = np.array([s.seconds for s in big])
    prior = np.exp(WorkPrior().fit(train).log_prior(big))
    assert np.allclose(prior, truth, rtol=0.15)
    with_prior = make_model("gbdt", trees=60, leaves=7)
    with_prior.fit(train)
    assert np.allclose(with_prior.predict(big), truth, rtol=0.25)
    trees_alone = make_model("gbdt", trees=60, leaves=7, work_prior=False)
    trees_alone.fit(train)
    # the trees' leaves hold times they were trained on: at most the slowest of them
    assert (trees_alone.predict(big) < 0.5 * truth).all()


def test_a_device_without_rows_borrows_its_kinds_costs_and_a_gpu_none() -> None:
    prior = WorkPrior().fit([program(op, r) for op in OPS for r in range(8, 72, 4)])
    other_cpu = program("exp", 32)
    other_cpu.device = "cpu:Another CPU:8c"
    gpu = program("exp", 32)
    gpu.device = "cuda:NVIDIA H100 80GB HBM3"
    got = prior.log_prior([other_cpu, gpu])
    assert np.isfinite(got[0]) and np.isnan(got[1])
