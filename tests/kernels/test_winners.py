"""The search's winners, not hand-written structures, go through the whole kernels pipeline.

For every suite program plus softmax_rows and rmsnorm_residual, at CPU-friendly shapes
(``small_instance``), the best structure of ``cluster.search_program`` is lowered with the
AStitch default config, built as C++ and checked against the float reference, and its CUDA
rendering is compiled by nvcc for sm_80 and sm_90 (no spills, shared memory within the limit).
lora is searched twice: with four block inputs its winner is one graph kernel, with the
default three it is a predefined matmul plus a graph kernel, which must run end to end too.

Searches run once per module (``winners``).  qknorm_gqa's search takes minutes even at small
shapes on this 2-core machine, so it runs only with ``TUNER_SLOW_TESTS=1``.
"""

from __future__ import annotations

import os

import pytest
from support import build_cpu, small_config

from cluster import LocalExecutor, search_program
from kernels import default_config, get_spec, lower, nvcc_available, nvcc_check, render
from search import SUITE, KernelGraph, Limits, from_obj, load_program, small_instance

SLOW = {"qknorm_gqa"}  # searches measured well over 60 s at small shapes here
RUN_SLOW = os.environ.get("TUNER_SLOW_TESTS") == "1"

# case id -> (program, search limits, expected number of kernels in the winner)
CASES: dict[str, tuple[str, Limits | None, int]] = {
    **{name: (name, None, 1) for name in SUITE if name != "lora"},
    "lora_one_kernel": ("lora", None, 1),  # adaptive block inputs: 4 for lora's 4 tensors
    "lora_two_kernels": ("lora", Limits(max_block_inputs=3), 2),
    "softmax_rows": ("softmax_rows", None, 1),
    "rmsnorm_residual": ("rmsnorm_residual", None, 1),
}
PARAMS = [pytest.param(c, marks=pytest.mark.skipif(
    CASES[c][0] in SLOW and not RUN_SLOW,
    reason="search takes minutes at small shapes; set TUNER_SLOW_TESTS=1")) for c in CASES]


def kernel_ops(g: KernelGraph) -> list:
    return [op for op in g.ops if op.kind not in ("input", "output")]


@pytest.fixture(scope="module")
def searches():
    """Searches on demand, each case at most once per module: its ranked structures."""
    cache: dict[str, list[KernelGraph]] = {}
    executor = LocalExecutor()

    def get(case: str) -> list[KernelGraph]:
        if case not in cache:
            name, limits, _ = CASES[case]
            res = search_program(small_instance(load_program(name)), limits, executor=executor)
            assert res.best is not None, f"the search found no structure for {case}"
            cache[case] = [from_obj(s["graph"]) for s in res.structures]
        return cache[case]

    yield get
    executor.close()


@pytest.fixture(scope="module")
def winners(searches):
    """The search's own first structure per case."""
    return lambda case: searches(case)[0]


@pytest.fixture(scope="module")
def worker():
    from kernels import IsolatedWorker

    with IsolatedWorker() as w:
        yield w


@pytest.mark.parametrize("case", PARAMS)
def test_winner_builds_on_cpu_and_matches_reference(case, winners, worker):
    g = winners(case)
    assert len(kernel_ops(g)) == CASES[case][2], [op.kind for op in g.ops]
    cfg = default_config(g, get_spec("cpu"))
    res = build_cpu(g, cfg, name=f"w_{case}", worker=worker)
    assert res.status == "ok", (case, cfg, res.message)
    assert len(res.plan.kernels) >= len(kernel_ops(g))
    # a second binding with several blocks and for-loop iterations wherever the shapes allow
    small = small_config(g)
    res2 = build_cpu(g, small, name=f"w2_{case}", worker=worker)
    assert res2.status == "ok", (case, small, res2.message)


def test_lora_winner_without_four_inputs_is_predefined_matmul_plus_graph_kernel(winners):
    kinds = sorted(op.kind for op in kernel_ops(winners("lora_two_kernels")))
    assert kinds == ["graph_kernel", "matmul"], kinds


@pytest.mark.skipif(not nvcc_available(), reason="nvcc not on this machine")
@pytest.mark.parametrize("device", ["A100", "H100"])
def test_winners_cuda_compiles_without_spills_within_shared_memory(device, winners):
    spec = get_spec(device)
    cases = [c for c in CASES if CASES[c][0] not in SLOW or RUN_SLOW]
    plans = [lower(winners(c), default_config(winners(c), spec), spec, f"w_{c}") for c in cases]
    report = nvcc_check(render(plans, "cuda"), spec.arch)
    assert spec.arch in ("sm_80", "sm_90")
    for plan in plans:
        for k in plan.kernels:
            res = report.kernel(k.name)
            assert not res.spills, (k.name, res)
            assert res.smem_bytes == -(-k.smem_bytes // 4) * 4 <= spec.smem_per_block_default


@pytest.mark.parametrize("case", PARAMS)
def test_the_h100s_best_structure_runs_as_triton_under_the_interpreter(case, searches, worker):
    """What the cuda device would pick first on an H100 (``rank_structures`` over both
    dialects), printed in the Triton dialect and run by Triton's interpreter on this CPU."""
    pytest.importorskip("triton", reason="Triton is not installed (the cuda extra)")
    pytest.importorskip("torch", reason="the Triton interpreter runs on torch CPU tensors")
    from kernels import TritonInterpreter, rank_structures

    structures = searches(case)
    best = structures[rank_structures(structures, "H100")[0]]
    program = small_instance(load_program(CASES[case][0]))
    interp = TritonInterpreter("H100")
    for config in (small_config(best), {s: 1 for s in best.symbols()}):
        res = interp.build(best, {**config, "split": 1}, reference=program.build(),
                           name=f"wt_{case}", worker=worker)
        assert res.status == "ok", (case, config, res.message)
