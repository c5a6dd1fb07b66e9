"""The C++ dialect's CPU-only code paths: the polynomial exp, lane-partial sums of short rows
and output rows streamed with non-temporal stores, each checked against numpy / the float
reference (outputs are NaN-filled, so a column the streamed copy skipped is caught), and the
exp loops vectorised for every x86 ISA level we may run on."""

from __future__ import annotations

import ctypes
import platform
import re
import shutil
import subprocess
from dataclasses import replace

import numpy as np
import pytest
from support import build_cpu, check_plan

from kernels import IsolatedWorker, compile_cpp, local_cpu_spec, lower, render
from kernels.rendering import EXP_F
from search import handwritten, load_program
from search.ir.serialize import from_obj


@pytest.fixture(scope="module")
def worker():
    with IsolatedWorker() as w:
        yield w


def softmax(rows: int, cols: int):
    return handwritten(load_program("softmax_rows", {"X": f"{rows}x{cols}"}))


@pytest.fixture(scope="module")
def exp_f():
    """exp_f over an array, compiled with the kernels' flags inside an `omp simd` loop (the
    vectorised code is what kernels run)."""
    src = "\n".join(["#include <string.h>", EXP_F,
                     'extern "C" void exp_all(const float* x, float* y, int n) {',
                     "#pragma omp simd", "  for (int i = 0; i < n; ++i) y[i] = exp_f(x[i]);",
                     "}"])
    lib = ctypes.CDLL(str(compile_cpp(src)))
    fptr = ctypes.POINTER(ctypes.c_float)

    def run(x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, np.float32)
        y = np.empty_like(x)
        lib.exp_all(x.ctypes.data_as(fptr), y.ctypes.data_as(fptr), x.size)
        return y

    return run


def test_exp_f_is_within_a_few_ulp_and_handles_the_ends(exp_f):
    x = np.linspace(-86.9, 88.7, 2_000_003, dtype=np.float32)
    ref = np.exp(x.astype(np.float64))
    rel = np.abs(exp_f(x) - ref) / ref
    assert rel.max() < 4e-7  # ~3 ulp; the kernels' float32 tolerance is rtol 1e-4
    ends = np.array([np.nan, np.inf, -np.inf, 89.0, 88.8, 100.0, 1e30, -88.0, -100.0, -1e30,
                     0.0, -0.0], np.float32)
    y = exp_f(ends)
    assert np.isnan(y[0]) and np.all(np.isinf(y[1:2])) and y[2] == 0.0
    assert np.all(np.isposinf(y[3:7]))  # e^x above FLT_MAX
    assert np.all(y[7:10] < 2e-38) and np.all(y[7:10] >= 0.0)  # below e^-87: 0, never garbage
    assert y[10] == 1.0 and y[11] == 1.0


@pytest.mark.parametrize("cols", [32, 40, 200])
def test_short_rows_sum_lane_partials_and_match(cols, worker):
    res = build_cpu(softmax(64, cols), name="softmax_rows", worker=worker)
    assert res.status == "ok", res.message
    assert "p_s_v_t2[l] += v_t1;" in res.source  # lane partials, tail loop for 40 and 200
    wide = build_cpu(softmax(8, 1024), name="softmax_rows", worker=worker)
    assert wide.status == "ok", wide.message
    assert "p_s_" not in wide.source and "reduction(+:s_v_t2)" in wide.source


@pytest.mark.parametrize("rows, cols", [(64, 32), (48, 40), (8, 1000), (4, 20000)])
def test_streamed_output_rows_match_whatever_their_alignment(rows, cols, worker):
    """Rows of 40 or 1000 floats start off 64-byte lines, so the head and tail of the
    streamed copy are ordinary stores; 20000 exceeds the row buffer limit (no streaming).
    ``stream=1`` asks for streaming whatever the cache sizes."""
    from kernels.lowering import STREAM_ROW_MAX

    res = build_cpu(softmax(rows, cols), {"stream": 1}, name="softmax_rows", worker=worker)
    assert res.status == "ok", res.message
    streamed = cols <= STREAM_ROW_MAX
    assert ("stream_row(out_" in res.source) == streamed
    assert ("stream_fence();" in res.source) == streamed


def _colsum_then_two_norms(dtype: str):
    """X + rms_norm(rms_norm(sum(X, 0) * X)) in one block: the column sum is read at every
    row of the walk the two norms join, and shared memory reuses its space for the first
    norm's output (random_1104 of the dataset, wrong on every structure before the fix)."""
    ops = [{"op": "input", "index": 0, "imap": [-1, -1, -1], "fmap": -1},
           {"op": "sum", "in": [0], "dim": 0}, {"op": "accum", "in": [1], "kind": "no_red"},
           {"op": "mul", "in": [2, 0]}, {"op": "rms_norm", "in": [3]},
           {"op": "rms_norm", "in": [4]}, {"op": "add", "in": [5, 0]},
           {"op": "output", "in": [6], "omap": [-1, -1, -1]}]
    return from_obj({"format": "tuner.mugraph/1", "ops": [
        {"op": "input", "name": "X", "shape": [48, 12], "dtype": dtype},
        {"op": "graph_kernel", "in": [0], "block_graph": {
            "grid": [1, 1, 1], "block": [128, 1, 1], "forloop_range": 1, "ops": ops}},
        {"op": "output", "in": [1]}]})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_joined_walk_never_writes_over_a_tile_it_still_reads(dtype, worker):
    res = build_cpu(_colsum_then_two_norms(dtype), name="colsum_norms", worker=worker)
    assert res.status == "ok", res.message


def test_row_sums_added_over_rows_are_not_shifted_by_each_rows_max(worker):
    """sum(sum(exp(X), 1), 0) with a for-loop over the rows: each row's sum shifted by its own
    running max (softmax's rule) would be added to other rows' (random_4156 of the dataset:
    every config wrong before the fix)."""
    graph = from_obj({"format": "tuner.mugraph/1", "ops": [
        {"op": "input", "name": "X", "shape": [128, 16], "dtype": "float32"},
        {"op": "graph_kernel", "in": [0], "block_graph": {
            "grid": [1, 1, 1], "block": [128, 1, 1], "forloop_range": 8, "ops": [
                {"op": "input", "index": 0, "imap": [-1, -1, -1], "fmap": 0},
                {"op": "exp", "in": [0]}, {"op": "accum", "in": [1], "kind": "sum"},
                {"op": "sum", "in": [2], "dim": 0},
                {"op": "output", "in": [3], "omap": [-1, -1, -1]}]}},
        {"op": "output", "in": [1]}]})
    res = build_cpu(graph, name="exp_total", worker=worker)
    assert res.status == "ok", res.message


def test_a_split_row_sum_reads_again_what_its_next_phase_needs(worker):
    """tanh(X*W * sum(X*W, 1) * W) with the row sum split across work items: the per-row
    statements after the sum move past a grid barrier and need W's row value there too
    (random_4818 of the dataset: g++ "'v_t1' was not declared" for every split config)."""
    ops = [{"op": "input", "index": 0, "imap": [0, -1, -1], "fmap": -1},
           {"op": "input", "index": 1, "imap": [0, -1, -1], "fmap": -1},
           {"op": "accum", "in": [1], "kind": "no_red"}, {"op": "mul", "in": [2, 0]},
           {"op": "sum", "in": [3], "dim": 1}, {"op": "mul", "in": [4, 1]},
           {"op": "mul", "in": [3, 5]}, {"op": "tanh", "in": [6]},
           {"op": "output", "in": [7], "omap": [0, -1, -1]}]
    graph = from_obj({"format": "tuner.mugraph/1", "ops": [
        {"op": "input", "name": "X", "shape": [12, 128], "dtype": "float32"},
        {"op": "input", "name": "W", "shape": [12, 1], "dtype": "float32"},
        {"op": "graph_kernel", "in": [0, 1], "block_graph": {
            "grid": ["g0", 1, 1], "block": [128, 1, 1], "forloop_range": 1, "ops": ops}},
        {"op": "output", "in": [2]}]})
    res = build_cpu(graph, {"g0": 3, "split": 4}, name="split_row_sum", worker=worker)
    assert res.status == "ok", res.message


def test_small_kernels_do_not_stream(worker):
    res = build_cpu(softmax(64, 256), name="softmax_rows", worker=worker)
    assert res.status == "ok", res.message
    assert "stream_row" not in res.source


X86_LEVELS = ["x86-64-v2", "x86-64-v3", "x86-64-v4"]  # SSE4.2, AVX2 + FMA, AVX-512


@pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("objdump") is None,
                    reason="x86-64 with binutils' objdump only")
@pytest.mark.parametrize("march", X86_LEVELS)
@pytest.mark.parametrize("name", ["softmax_rows", "gated_mlp"])
def test_exp_loops_vectorise_on_every_x86_level(name, march, tmp_path):
    """The generated kernels' exp (softmax) and silu (gated_mlp) loops compile to packed
    arithmetic for SSE4.2, AVX2 and AVX-512 alike.  exp_f once ended with a NaN test that GCC
    turned into a branch (`jp`), and the whole loop stayed scalar without AVX-512 masks."""
    program = load_program(name, {"X": "64x256"} if name == "softmax_rows" else
                           {"X": "8x256", "W1": "256x256", "W2": "256x256"})
    source = render(lower(handwritten(program), None, "cpu", name), "cpp")
    (tmp_path / "k.cpp").write_text(source)
    subprocess.run(["g++", "-O3", f"-march={march}", "-fopenmp", "-fPIC", "-c", "k.cpp"],
                   cwd=tmp_path, check=True, capture_output=True)
    asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "k.o"], cwd=tmp_path,
                         check=True, capture_output=True, text=True).stdout
    ops = re.findall(r"^\s*[0-9a-f]+:\s+(\S+)", asm, re.M)
    packed = [op for op in ops if re.fullmatch(r"v?(mul|add|sub)ps|vfn?m(add|sub)\d+ps", op)]
    assert "jp" not in ops, f"{march}: a NaN branch in the loops"
    assert len(packed) >= 8, f"{march}: {len(packed)} packed float ops (the exp polynomial has 8)"


@pytest.mark.parametrize("isa, tile", [("avx2", "mm_rows_n<6>(nr, "), ("avx512", "mm_rows<4>(")])
def test_register_tiles_fit_the_isa_and_a_strided_b_is_packed(isa, tile):
    """With 16 vector registers (AVX2) attention's matmuls run in tiles of 6 rows, the last
    one shorter (40 rows = 6 x 6 + 4); with 32 (AVX-512) in tiles that divide the rows.  K's
    rows, 4 KB apart, are copied into one contiguous tile first.  Either way the kernel
    computes the program (this CPU runs it, whatever ISA the plan was made for)."""
    program = load_program("gqa", {"Q": "2x40x64", "K": "2x64x1024", "V": "2x1024x64"})
    spec = replace(local_cpu_spec(), arch=f"x86_64-{isa}")
    plan = lower(handwritten(program), {"F": 64, "g0": 2, "g1": 1}, spec, "gqa")
    source = render(plan, "cpp")
    assert tile in source and "pack_rows(pk_" in source
    res = check_plan(plan, program.build(), source=source)
    assert res.status == "ok", res.message


@pytest.mark.parametrize("steps", [1, 64])
def test_a_weight_stream_prefetches_b_rows_ahead_with_or_without_a_for_loop(steps):
    """A decode-sized matmul walking B's rows a page apart prefetches 16 rows ahead, whether
    its for-loop walks K in 64 steps or it takes all of K at once (without, gated_mlp's
    searched structures took 7.8-8.8 ms where the hand-written one took 3.4 on an AMD EPYC)."""
    spec = replace(local_cpu_spec(), arch="x86_64-avx512", l2_bytes=1 << 20,
                   llc_bytes=32 << 20)
    plan = lower(handwritten(load_program("gated_mlp")), {"F": steps, "g0": 8, "tile_rows": 8},
                 spec, "gm")
    calls = re.findall(r"mm_rows<\d+>\([^;]*\);", render(plan, "cpp"))
    assert len(calls) == 2, calls
    assert all(call.endswith(f", {4096 // steps}, 512, {call.split(', ')[-2]}, "
                             "r0 == 0 ? 65536 : 0);") for call in calls), calls


def _blocks(asm: str) -> list[list[str]]:
    """The instructions from each label of ``g++ -S`` output to the first jump after it (a
    loop body ends with its jump back)."""
    blocks = []
    for chunk in re.split(r"\n(?=\.L\d+:)", asm):
        lines = [line for line in chunk.splitlines() if line.startswith("\t")]
        jump = next((i for i, line in enumerate(lines) if line.startswith("\tj")), len(lines))
        blocks.append(lines[:jump + 1])
    return blocks


def _fmas(block: list[str]) -> int:
    return sum(bool(re.match(r"\tvfn?madd\w*ps", x)) for x in block)


def _loop_with_most_fmas(asm: str) -> list[str]:
    return max(_blocks(asm), key=_fmas)


@pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("g++") is None,
                    reason="x86-64 with g++ only")
@pytest.mark.parametrize("march, ct", [("x86-64-v3", 2), ("x86-64-v4", 4)])
@pytest.mark.parametrize("ctype", ["float", "tuner_f16"])
def test_a_transposed_b_tile_keeps_its_values_in_registers(march, ct, ctype, tmp_path):
    """The k loop of a Linear weight's register tile (``mm_tile_t``: B stored transposed,
    4 rows x TUNER_CT columns) loads each A and B vector once and keeps every accumulator in
    a register.  GCC 12 had kept the 16 AVX-512 accumulators on the stack (a load and a
    store around each FMA) and reloaded the operands at every FMA: a Llama MLP's gate and up
    projections ran 3x slower than with W row-major (AMD EPYC, 700 vs 230 us)."""
    from kernels.rendering._cpp_prelude import (
        HALF,
        LANE_SUM,
        MATMUL_REGISTER_TILES,
        MATMUL_TRANSPOSED_TILES,
    )

    rows = 4
    source = "\n".join([
        "#include <string.h>", HALF, MATMUL_REGISTER_TILES, LANE_SUM, MATMUL_TRANSPOSED_TILES,
        f'extern "C" void tile(const {ctype}* const* a, const {ctype}* b, long ldb, int kn, '
        "float* m) {",
        f"  mm_tile_t<{rows}, TUNER_CT>(a, b, ldb, kn, m, TUNER_CT, 0);", "}"])
    (tmp_path / "t.cpp").write_text(source)
    subprocess.run(["g++", "-O3", f"-march={march}", "-S", "t.cpp", "-o", "t.s"],
                   cwd=tmp_path, check=True, capture_output=True)
    loop = _loop_with_most_fmas((tmp_path / "t.s").read_text())
    fmas = [op for op in loop if re.match(r"\tvfn?madd\w*ps", op)]
    memory = [op for op in loop if "(" in op]
    assert len(fmas) == rows * ct, loop
    spills = [op for op in loop if "(%rsp)" in op and "mm" in op]  # vector registers
    assert not spills, f"{march}: accumulators on the stack: {spills}"
    assert len(memory) <= rows + ct, f"{march}: {len(memory)} loads for {rows} + {ct} vectors"


def _mm_rows_source(rows: int) -> str:
    from kernels.rendering._cpp_prelude import HALF, MATMUL_REGISTER_TILES

    return "\n".join([
        "#include <string.h>", HALF, MATMUL_REGISTER_TILES,
        'extern "C" void rows(const tuner_f16* const* a, int sa, const tuner_f16* b, int sb, '
        "int kn, int n, float* m) {",
        f"  mm_rows<{rows}>(a, sa, b, sb, kn, n, m, 0);", "}"])


@pytest.mark.parametrize("rows", [2, 8])
@pytest.mark.parametrize("sa", [1, 3])
@pytest.mark.parametrize("kn", [64, 1000])  # 8 x 1000 exceeds the float copy of A: read as is
def test_a_half_a_tile_matches_numpy_converted_once_or_read_as_is(rows, sa, kn):
    """A register-tiled matmul of half rows of A (a float16 X: gated_mlp, lora, gqa) converts
    them to float once per call, not once per column tile and k step; with few rows, or more
    of A than its stack copy holds, it reads the halves as stored.  Every path computes the
    product (columns not a multiple of the tile included)."""
    lib = ctypes.CDLL(str(compile_cpp(_mm_rows_source(rows))))
    rng = np.random.default_rng(kn + sa)
    n = 40
    a = rng.standard_normal((rows, kn * sa)).astype(np.float16)
    b = rng.standard_normal((kn, n)).astype(np.float16)
    m = np.full((rows, n), np.nan, np.float32)
    ptrs = (ctypes.c_void_p * rows)(*[a[q].ctypes.data for q in range(rows)])
    lib.rows(ptrs, sa, ctypes.c_void_p(b.ctypes.data), n, kn, n, ctypes.c_void_p(m.ctypes.data))
    want = a[:, ::sa].astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(m, want, rtol=1e-4, atol=1e-3 * np.sqrt(kn))


@pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("g++") is None,
                    reason="x86-64 with g++ only")
@pytest.mark.parametrize("march, cb", [("x86-64-v3", 2), ("x86-64-v4", 4)])
def test_a_half_a_is_not_converted_in_the_tiles_k_loop(march, cb, tmp_path):
    """The k loop of an 8-row tile over A's float copy converts only B's vectors (the loop
    over halves as stored, for a long A, is compiled beside it).  Converting an A scalar at
    every k step of every column tile (8 a step against B's 2 vectors) kept gated_mlp's AVX2
    tile issue-bound: 9.4 -> 8.0 ms on an AMD EPYC Zen 3, lora 0.79 -> 0.63, gqa 7.4 -> 6.1."""
    (tmp_path / "t.cpp").write_text(_mm_rows_source(8))
    subprocess.run(["g++", "-O3", f"-march={march}", "-S", "t.cpp", "-o", "t.s"],
                   cwd=tmp_path, check=True, capture_output=True)
    loops = [b for b in _blocks((tmp_path / "t.s").read_text()) if _fmas(b) == 8 * cb]
    assert loops, "no k loop of 8 x cb FMAs"
    converts = [sum(op.startswith("\tvcvtph2ps") for op in b) for b in loops]
    assert cb in converts, f"{march}: half conversions per k step {converts}, B has {cb} vectors"
