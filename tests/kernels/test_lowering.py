"""Lowering and rendering: AStitch levels, thread mapping, shared-memory planning, and generated
code checked against the float reference interpreter (C++ run here, CUDA compiled by nvcc).

CUDA cannot run on this machine, so its thread mapping is also exercised by ``ThreadedCpp``: the
C++ dialect with its hooks set to run each block as an OpenMP team of the plan's threads
(barriers for __syncthreads, an exchange array for the lane sums).  A thread that skipped a
barrier would hang the team, and a wrong stride would miss elements the NaN-filled outputs
expose, so the strided-loop discipline the CUDA text relies on is tested for real.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from support import build_cpu, check_plan, row_cut_structure, small_config

from kernels import IsolatedWorker, get_spec, nvcc_available, nvcc_check, render
from kernels.devices import CpuKernel, reference, tolerance
from kernels.lowering import (
    Buffer,
    Level,
    astitch_rule,
    blocks_per_wave,
    concretize,
    default_config,
    lower,
    plan_shared,
)
from kernels.rendering import CppDialect
from search import ShapeError, builtin_names, handwritten, load_program, small_instance
from verifier import FloatArith, run


@pytest.fixture(scope="module")
def worker():
    old = os.environ.get("OMP_WAIT_POLICY")
    os.environ["OMP_WAIT_POLICY"] = "passive"  # ThreadedCpp oversubscribes two cores
    with IsolatedWorker() as w:
        yield w
    if old is None:
        os.environ.pop("OMP_WAIT_POLICY", None)
    else:
        os.environ["OMP_WAIT_POLICY"] = old


def structure(name: str, **shapes: str):
    return handwritten(load_program(name, shapes) if shapes else small_instance(
        load_program(name)))


def softmax(rows: int, cols: int):
    return handwritten(load_program("softmax_rows", {"X": f"{rows}x{cols}"}))


# ---------------------------------------------------------------- C++ against the reference


@pytest.mark.parametrize("name", builtin_names())
def test_cpp_kernel_matches_float_reference(name, worker):
    g = structure(name)
    res = build_cpu(g, small_config(g), name=name, worker=worker)
    assert res.status == "ok", res.message  # within the tolerance of the program's dtype
    dtype = g.tensors[g.input_ids[0]].dtype
    # computed in float32; a half program's outputs are stored (rounded) in its own dtype
    assert [b.dtype for b in (*res.plan.inputs, *res.plan.outputs)] == \
        [dtype] * (len(res.plan.inputs) + len(res.plan.outputs))
    assert res.max_abs_err and max(res.max_abs_err) < (1e-4 if dtype == "float32" else 0.1)
    assert len(res.plan.kernels) == 1


@pytest.mark.parametrize("name", builtin_names())
def test_reference_program_runs_end_to_end_as_predefined_kernels(name, worker):
    """The program's own graph (matmul, exp, sum, rms_norm... as kernel ops) lowers to one
    kernel per op with Global tensors between them, and matches the interpreter."""
    program = small_instance(load_program(name))
    res = build_cpu(program.build(), name=f"{name}_ref", worker=worker)
    assert res.status == "ok", res.message
    ops = [op for op in program.build().ops if op.kind not in ("input", "output")]
    assert len(res.plan.kernels) == len(ops)
    between = [b for b in res.plan.globals.values() if b.role == "tensor"]
    assert all(b.level is Level.GLOBAL for b in between)


def test_default_config_kernels_match_reference(worker):
    for name in ("gqa", "ntrans", "lora"):
        res = build_cpu(structure(name), name=name, worker=worker)
        assert res.status == "ok", (name, res.message)


def test_wrong_kernel_is_reported_as_wrong_result(worker):
    g = structure("softmax_rows")
    bound, _, _ = concretize(g, {"g0": 2}, get_spec("cpu"))
    plan = lower(g, {"g0": 2}, "cpu", "sm")
    source = render(plan, "cpp")
    exp = "exp_f((v_t0 - m_v_t1))"  # shifted by its row max (kernels/rendering/_cshift.py)
    assert exp in source
    broken = source.replace(exp, "exp_f((v_t0 - m_v_t1) * 1.01f)")
    res = check_plan(plan, bound, source=broken, worker=worker)
    assert res.status == "wrong_result" and "out of tolerance" in res.message


def test_in_process_cpu_kernel_agrees(worker):
    g = structure("rmsnorm_residual")
    res = build_cpu(g, {"g0": 4}, worker=worker)
    assert res.ok
    k = CpuKernel(res.plan, res.artifact)
    x, r = (np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32)
            for _ in range(2))
    got = k(x, r)
    want = reference(g.bind({"g0": 4}), [x, r])
    rtol, atol = tolerance("float32")
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


# ---------------------------------------------------------------- stitching schemes


def test_softmax_row_sum_is_regional_and_exp_chain_local():
    plan = lower(softmax(64, 256), {"g0": 16}, "A100", "sm")
    (k,) = plan.kernels
    assert len(k.phases) == 1 and k.barrier == "none"
    assert k.buffers["b_t2"].level is Level.REGIONAL  # the row sum, broadcast to its row
    assert k.buffers["b_t1"].level is Level.REGIONAL  # exp tile, read again by the division
    assert set(k.buffers) <= {"b_t1", "b_t2", "red"}  # div result: Local, stored to output
    assert k.smem_bytes <= get_spec("A100").smem_per_block_default


def test_elementwise_chains_stay_local():
    """ntrans: add, mul, add between the two norms are one fused loop: no buffers for them."""
    (k,) = lower(structure("ntrans"), {"g0": 2}, "cpu", "nt").kernels
    assert not {"b_t4", "b_t5"} & set(k.buffers)
    assert {b.level for b in k.buffers.values()} == {Level.REGIONAL}


def test_split_rows_fall_back_to_global_with_barrier_or_kernel_split(worker):
    plan = lower(softmax(64, 30000), None, "H100", "sm")
    (k,) = plan.kernels
    assert k.mapping.scheme.startswith("split") and k.mapping.split >= 2
    assert k.buffers["p_t2"].level is Level.GLOBAL and k.buffers["p_t2"].role == "partial"
    assert k.buffers["b_t1"].level is Level.GLOBAL  # exp tile read after the barrier
    assert len(k.phases) == 2 and k.barrier == "grid" and plan.barriers == 1
    assert k.blocks <= get_spec("H100").sm_count * 2
    # the same scheme on this CPU, joined by a barrier and, forced past a wave, split in two
    g = softmax(4, 4096)
    joined = build_cpu(g, {"g0": 4, "split": 4}, worker=worker)
    assert joined.ok, joined.message
    assert joined.plan.kernels[0].barrier == "grid"
    apart = build_cpu(g, {"g0": 4, "split": 4, "vpack": 1}, worker=worker)
    assert apart.ok, apart.message
    assert len(apart.plan.kernels) == 2 and apart.plan.barriers == 0


def test_vertical_packing_keeps_a_barrier_kernel_within_one_wave():
    spec = get_spec("H100")
    plan = lower(softmax(4096, 1024), {"g0": 4096, "split": 4}, spec, "sm")
    (k,) = plan.kernels
    assert k.mapping.vpack > 1 and "vertical" in k.mapping.scheme
    assert k.items == 4096 * 4 and k.barrier == "grid"
    assert k.blocks <= blocks_per_wave(spec, k.mapping.threads) < k.items


def test_shared_memory_overflow_downgrades_the_largest_buffer(worker):
    spec = get_spec("A100")
    g = softmax(64, 8192)
    plan = lower(g, {"g0": 8, "block": 256, "lanes": 256, "split": 1}, spec, "sm")
    (k,) = plan.kernels
    assert k.buffers["b_t1"].level is Level.GLOBAL  # 8 x 8192 floats = 256 KiB > 48 KiB
    assert k.buffers["b_t2"].level is Level.REGIONAL  # the row sums still fit
    assert any("overflow" in n for n in k.notes)
    assert k.smem_bytes <= spec.smem_per_block_default
    bound, _, _ = concretize(g, {"g0": 8}, spec)
    res = check_plan(plan, bound, worker=worker)  # the A100 plan, printed in C++
    assert res.ok, res.message


def test_plan_shared_reuses_dead_buffers_and_downgrades_one_at_a_time():
    def buf(name, kib, live):
        return Buffer(name, (kib * 256,), Level.REGIONAL, "tile", live=live)

    a, b, c = buf("a", 8, (0, 1)), buf("b", 8, (2, 3)), buf("c", 4, (1, 2))
    peak, notes = plan_shared([a, b, c], 48 * 1024)
    assert a.offset == b.offset == 0 and c.offset == 8 * 1024 and peak == 12 * 1024
    assert not notes
    big, mid, small = buf("big", 30, (0, 3)), buf("mid", 20, (0, 3)), buf("small", 10, (0, 3))
    peak, notes = plan_shared([small, mid, big], 48 * 1024)
    assert big.level is Level.GLOBAL and mid.level is Level.REGIONAL
    assert small.level is Level.REGIONAL and peak == 30 * 1024 and len(notes) == 1


# qknorm_gqa's search winner (the shapes made small): its block graph normalises the V tile
# inside the for-loop before it normalises Q before the loop
QKNORM_WINNER = {"format": "tuner.mugraph/1", "ops": [
    {"op": "input", "shape": [2, 32, 16], "dtype": "float16", "name": "Q"},
    {"op": "input", "shape": [2, 16, 256], "dtype": "float16", "name": "K"},
    {"op": "input", "shape": [2, 256, 16], "dtype": "float16", "name": "V"},
    {"op": "graph_kernel", "in": [0, 1, 2], "block_graph": {
        "grid": ["g0", 1, 1], "forloop_range": "F", "block": [128, 1, 1], "ops": [
            {"op": "input", "index": 0, "imap": [1, -1, -1], "fmap": -1},
            {"op": "input", "index": 1, "imap": [-1, -1, -1], "fmap": 2},
            {"op": "input", "index": 2, "imap": [-1, -1, -1], "fmap": 1},
            {"op": "rms_norm", "in": [2]}, {"op": "rms_norm", "in": [0]},
            {"op": "matmul", "in": [4, 1]}, {"op": "exp", "in": [5]},
            {"op": "matmul", "in": [6, 3]}, {"op": "accum", "in": [7], "kind": "no_red"},
            {"op": "accum", "in": [6], "kind": "sum"}, {"op": "div", "in": [8, 9]},
            {"op": "output", "in": [10], "omap": [1, -1, -1]}]}},
    {"op": "output", "in": [3]}]}


@pytest.mark.parametrize("device", ["cpu", "H100"])
def test_shared_memory_is_reused_only_between_buffers_never_live_together(device, worker):
    """Loops run before the for-loop, then every iteration, then after it, whatever the op
    order: a tile made before the loop and read in every iteration is live across all of it."""
    from search import from_obj

    g = from_obj(QKNORM_WINNER)
    plan = lower(g, {"g0": 2, "F": 4}, device)
    (k,) = plan.kernels
    stages = [lp.stage for ph in k.phases for lp in ph.loops]
    assert stages == sorted(stages, key=["pre", "body", "post"].index)
    regional = [b for b in k.buffers.values() if b.level is Level.REGIONAL]
    for i, a in enumerate(regional):
        for b in regional[i + 1:]:
            if a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes:
                assert a.live[1] < b.live[0] or b.live[1] < a.live[0], (a, b)
    normed_q = next(b for b in regional if b.name == "b_t4")  # rms_norm(Q), made before
    body = [i for i, s in enumerate(stages) if s == "body"]
    assert normed_q.live[0] < body[0] and normed_q.live[1] >= body[-1]
    if device == "cpu":
        res = build_cpu(g, {"g0": 2, "F": 4}, name="qk", worker=worker)
        assert res.status == "ok", res.message


# ---------------------------------------------------------------- thread mapping


@pytest.mark.parametrize("device", ["H100", "A100"])
def test_astitch_rule_on_the_three_softmax_shapes(device):
    spec = get_spec(device)
    wide = astitch_rule(750000, 32, spec)
    assert wide.scheme == "horizontal" and wide.lanes == 32 and wide.rows_per_block == 30
    assert 750000 % wide.rows_per_block == 0 and wide.threads == 960
    long = astitch_rule(64, 30000, spec)
    assert long.scheme == "split" and long.split >= 2 and 30000 % long.split == 0
    assert 64 * long.split <= spec.sm_count * 2  # one wave of 1024-thread blocks
    mid = astitch_rule(4096, 1024, spec)
    assert mid.scheme == "row" and mid.rows_per_block == 1 and mid.threads == 256
    for shape, g0 in (((750000, 32), 25000), ((64, 30000), 64), ((4096, 1024), 4096)):
        cfg = default_config(softmax(*shape), spec)
        assert cfg["g0"] == g0, (shape, cfg)


def test_cpu_rule_packs_rows_and_splits_only_few_long_rows():
    spec = get_spec("cpu")
    assert astitch_rule(4096, 1024, spec).scheme == "horizontal"
    few = astitch_rule(1, 1 << 20, spec)
    assert spec.sm_count == 1 or few.scheme == "split"


# ---------------------------------------------------------------- CUDA


@pytest.mark.skipif(not nvcc_available(), reason="nvcc not on this machine")
@pytest.mark.parametrize("device", ["A100", "H100"])
def test_cuda_compiles_without_spills_within_shared_memory(device):
    spec = get_spec(device)
    plans = []
    for name in builtin_names():
        g = structure(name)
        plans.append(lower(g, small_config(g), spec, name))
    for shape in ((750000, 32), (64, 30000), (4096, 1024)):
        plans.append(lower(softmax(*shape), None, spec, f"softmax_{shape[0]}x{shape[1]}"))
    source = render(plans, "cuda")
    assert "__syncthreads" in source and "__shared__" in source and "blockIdx" in source
    assert "const half* __restrict__" in source  # float16 programs keep half in memory
    report = nvcc_check(source, spec.arch)
    for plan in plans:
        for k in plan.kernels:
            res = report.kernel(k.name)
            assert not res.spills, (k.name, res)
            assert res.smem_bytes == -(-k.smem_bytes // 4) * 4 <= spec.smem_per_block_default


@pytest.mark.skipif(not nvcc_available(), reason="nvcc not on this machine")
def test_cuda_reads_a_row_sum_kept_in_global_only_after_the_barrier(tmp_path):
    """Found on an H100: with the row sum in Global (smem_kb=0) and __restrict__ on the
    workspace, nvcc loaded the sum above the __syncthreads() after lane 0 stored it, and every
    softmax row read zero.  In the PTX, the load must follow the store and a bar.sync."""
    import re
    import subprocess

    from kernels.devices import find_nvcc

    config = {"g0": 4096, "split": 1, "block": 128, "lanes": 128, "smem_kb": 0}
    plan = lower(handwritten(load_program("softmax_rows")), config, "H100", "rowsum")
    assert plan.workspace_floats > 0
    source = render(plan, "cuda")
    assert "float* __restrict__ b_" not in source and "float* __restrict__ ws" not in source
    (tmp_path / "k.cu").write_text(source)
    subprocess.run([find_nvcc(), "-arch=sm_90", "-ptx", "k.cu", "-o", "k.ptx"], check=True,
                   cwd=tmp_path, capture_output=True)
    ptx = (tmp_path / "k.ptx").read_text().splitlines()
    # the row sum lives at ws + 4096 * 1024 floats: byte offset 16777216 from the block's base
    at = [i for i, line in enumerate(ptx) if re.search(r"\+16777216\]", line)]
    stores = [i for i in at if "st.global" in ptx[i]]
    loads = [i for i in at if "ld.global" in ptx[i]]
    assert stores and loads, "\n".join(ptx[i] for i in at)
    for load in loads:
        assert any(s < b < load for s in stores for b in range(len(ptx))
                   if "bar.sync" in ptx[b]), ptx[load]


# ---------------------------------------------------------------- readable output


def test_source_is_readable_and_has_the_entry_point():
    g = structure("softmax_rows")
    src = render(lower(g, {"g0": 2}, "cpu", "sm"), "cpp")
    assert 'extern "C" void kernel(float** inputs, float** outputs)' in src
    assert "#pragma omp parallel" in src and "#pragma omp for" in src
    for op in ("t1 = exp(t0)", "t2 = sum(t1, dim=1)", "t3 = div(t1, t2)", "output(t4"):
        assert f"// {op}" in src
    assert "b_t1" in src and "in_X" in src


def test_bad_configs_are_refused_with_the_fix():
    g = structure("gqa")
    with pytest.raises(ShapeError, match="missing"):
        lower(g, {"g0": 2}, "cpu")
    with pytest.raises(ShapeError, match="row-wise"):
        lower(g, {"g0": 2, "g1": 2, "F": 2, "split": 2}, "cpu")
    with pytest.raises(ValueError, match="divisor"):
        lower(structure("softmax_rows"), {"g0": 2, "split": 3}, "cpu")
    with pytest.raises(ShapeError, match="power of two"):
        lower(structure("softmax_rows"), {"g0": 2, "block": 96, "lanes": 24}, "A100")


# ---------------------------------------------------------------- the CUDA mapping, emulated


class ThreadedCpp(CppDialect):
    """Each block is an OpenMP team of the plan's thread count; see the module docstring."""

    name = "cpp-threads"

    def prelude(self, plans):
        return ["#include <omp.h>", *super().prelude(plans)]

    def threads(self, k):
        return k.mapping.threads

    def kernel_open(self, k, plan, params):
        sig = [f"{'const ' if plan.globals[p].role == 'input' else ''}"
               f"{self.ctype(plan.globals[p].dtype)}* {p}" for p in params] + ["float* ws"]
        size = max(64, -(-k.smem_bytes // 64) * 64)
        xch = -(-k.mapping.threads * 4 // 64) * 64
        return [f"static void {k.name}({', '.join(sig)}) {{",
                f"  float* const smem = static_cast<float*>(aligned_alloc(64, {size}));",
                f"  float* const xch = static_cast<float*>(aligned_alloc(64, {xch}));"]

    def kernel_close(self, k):
        return ["  free(smem);", "  free(xch);", "}"]

    def work_loop(self, k):
        t = k.mapping.threads
        return [f"for (int w = 0; w < {k.items}; ++w) {{", f"#pragma omp parallel num_threads({t})",
                "{", "const int tid = omp_get_thread_num();",
                f"if (omp_get_num_threads() != {t}) abort();"]

    def work_loop_close(self, k):
        return ["}", "}"]

    def block_sync(self):
        return ["#pragma omp barrier"]

    def grid_sync(self, k):
        return ["// grid barrier: the work items above all finished"]

    def col_pragma(self, lp, accs):
        return []

    def group_sum(self, var, lanes):
        if lanes == 1:
            return []
        first = f"(tid / {lanes}) * {lanes}"
        return ["#pragma omp barrier", f"xch[tid] = {var};", "#pragma omp barrier",
                f"{{ float t = 0.0f; for (int q = 0; q < {lanes}; ++q) t += xch[{first} + q]; "
                f"{var} = t; }}", "#pragma omp barrier"]

    def group_max(self, var, lanes):
        if lanes == 1:
            return []
        first = f"(tid / {lanes}) * {lanes}"
        return ["#pragma omp barrier", f"xch[tid] = {var};", "#pragma omp barrier",
                f"{{ float t = xch[{first}]; for (int q = 1; q < {lanes}; ++q) "
                f"t = fmaxf(t, xch[{first} + q]); {var} = t; }}", "#pragma omp barrier"]


EMULATED = [
    ("gqa", {}, {"g0": 2, "g1": 2, "F": 2, "block": 64}),
    ("mha", {}, {"g0": 2, "g1": 1, "F": 2, "block": 64}),  # a running max across loops
    ("lora", {}, {"g0": 2, "F": 2, "block": 64}),
    ("qknorm_gqa", {}, {"g0": 1, "g1": 2, "F": 4, "block": 32}),
    ("softmax_rows", {"X": "6x16"}, {"g0": 1, "block": 64, "lanes": 16}),  # 6 rows, 4 groups
    ("rmsnorm_residual", {"X": "6x48", "R": "6x48"}, {"g0": 3, "block": 64, "lanes": 32}),
    ("softmax_rows", {"X": "4x512"}, {"g0": 4, "block": 64, "lanes": 64, "split": 4}),
    ("ntrans", {"H": "4x256", "X": "4x256", "alpha": "4x256"},
     {"g0": 2, "block": 32, "lanes": 8, "split": 4, "vpack": 3}),
]


@pytest.mark.parametrize(("name", "shapes", "config"), EMULATED)
def test_gpu_thread_mapping_emulated_on_cpu(name, shapes, config, worker):
    g = structure(name, **shapes)
    spec = get_spec("H100")
    plan = lower(g, config, spec, name)
    assert all(k.mapping.threads == config["block"] for k in plan.kernels)
    bound, _, _ = concretize(g, config, spec)
    res = check_plan(plan, bound, source=ThreadedCpp().render(plan), worker=worker,
                     timeout_s=60)
    assert res.status == "ok", res.message
    assert math.isfinite(max(res.max_abs_err))


# ---------------------------------------------------------------- fused vs op by op


def test_measure_program_times_both_sides_on_the_same_inputs(worker):
    from kernels import format_table, measure_program

    program = load_program("softmax_rows", {"X": "64x256"})
    m = measure_program(program, config={"g0": 8}, worker=worker,
                        timing={"budget_s": 0.05, "min_repeats": 3})
    assert m.status == "ok", m.message
    assert m.kernel_s > 0 and m.baseline_s > 0
    assert m.speedup == pytest.approx(m.baseline_s / m.kernel_s)
    assert m.bytes_moved == 2 * 64 * 256 * 4 and m.achieved_gbs > 0 and m.copy_gbs > 0
    assert m.max_error < 1e-5 and m.config["g0"] == 8
    assert "| softmax_rows | ok |" in format_table([m])
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    (got,) = run(program.build(), [x], FloatArith())  # what the cpu's baseline job times
    assert got.dtype == np.float32  # op by op in float32, like an unfused framework
    np.testing.assert_allclose(got, reference(program.build(), [x])[0], rtol=1e-5)


def test_measure_covers_multi_kernel_plans(worker):
    from kernels import measure_program

    program = load_program("softmax_rows", {"X": "64x256"})
    m = measure_program(program, config={"g0": 8, "split": 2, "vpack": 1}, worker=worker,
                        timing={"budget_s": 0.05, "min_repeats": 3})
    assert m.status == "ok" and m.kernels == 2  # kernel split, still correct


def test_every_elementwise_op_of_the_table_has_a_rendering():
    from kernels.lowering import ROW_OPS
    from kernels.rendering import BINARY, UNARY
    from kernels.rendering._triton import BINARY as TRITON_BINARY
    from kernels.rendering._triton import UNARY as TRITON_UNARY
    from search import ELEMENTWISE_OPS, ROW_REDUCTIONS

    assert ELEMENTWISE_OPS <= set(UNARY) | set(BINARY) | {"mul_scalar", "add_scalar"}
    assert ELEMENTWISE_OPS <= set(TRITON_UNARY) | set(TRITON_BINARY) | {"mul_scalar",
                                                                         "add_scalar"}
    assert ROW_OPS == {"input", "output", "accum"} | ELEMENTWISE_OPS | ROW_REDUCTIONS


def test_the_config_space_offers_only_splits_the_row_a_block_gets_can_take():
    """A grid dim that cuts the row leaves each block ``64/g1`` columns, and ``split`` must
    divide those: the space's check had known only the whole row (64), so 30 of the 105
    configs of a RoPE region's structure passed it and were refused by the lowering, each a
    tuning trial spent (and a model sampler's crash).  Every config the space yields lowers."""
    from kernels import config_space
    from kernels.configspace import legal

    g = row_cut_structure()
    spec = get_spec("cpu")
    space = config_space(g, spec)
    assert 16 in space.params["split"] and 64 in space.params["g1"]
    assert space.check({"g0": 1, "g1": 1, "split": 16}) is None  # 64 columns a block
    why = space.check({"g0": 1, "g1": 8, "split": 16})  # 8 columns a block
    assert why is not None and "split=16" in why and "8" in why
    configs = list(space.configs())
    assert configs and all(legal(g, c, spec) is None for c in configs)
    assert len(configs) < len(space.params["g0"]) * len(space.params["g1"]) * \
        len(space.params["split"])
