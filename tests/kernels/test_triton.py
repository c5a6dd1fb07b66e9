"""The Triton dialect proven without a GPU.

Two proofs a CPU-only machine (and CI) can give for the kernels the cuda device would run:

- correctness: every suite program's hand-written structure, lowered for the H100 with
  ``triton=1``, printed as Triton and run by Triton's interpreter (``TRITON_INTERPRET=1``,
  torch CPU tensors) through ``Device.check`` — the check every device uses: the program's
  float reference, inputs rounded to the stored dtype, that dtype's tolerance — at small
  shapes with several blocks and for-loop iterations, and at shapes where every matmul is a
  ``tl.dot`` of 16-or-more tiles;
- the machine code: the same kernels compiled for sm_90 and sm_80 at the paper's shapes
  (``triton.compile`` with the target named) and their SASS read with Triton's ``cuobjdump``:
  tensor-core instructions in every matmul kernel, 128-bit loads of the weights, no spills.

Real-scale attention logits (|Q·K| up to 30) in float16 and bfloat16 give no inf / NaN on the
Triton dialect (the running row max of kernels/lowering/_softmax.py) and on the cpu's C++.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from support import TRITON_PAPER_CONFIGS, small_config

from kernels import (
    IsolatedWorker,
    get_device,
    get_spec,
    legal,
    lower,
    render,
    triton_default_config,
)
from search import SUITE, handwritten, load_program, parse_program, small_instance

triton = pytest.importorskip("triton", reason="Triton is not installed (the cuda extra)")
pytest.importorskip("torch", reason="the Triton interpreter runs on torch CPU tensors")

from kernels.devices import TritonInterpreter, compile_plan, sass  # noqa: E402

PAPER_CONFIGS = TRITON_PAPER_CONFIGS
WEIGHT_BOUND = ("rmsnorm_matmul", "gated_mlp", "lora")
MATMUL_FREE = ("ntrans",)


@pytest.fixture(scope="module")
def worker():
    with IsolatedWorker() as w:
        yield w


@pytest.fixture(scope="module")
def interp():
    return TritonInterpreter("H100")


@pytest.mark.parametrize("cap", [16, 64])
@pytest.mark.parametrize("name", sorted(SUITE))
def test_handwritten_triton_kernels_match_the_program_under_the_interpreter(
        name, cap, interp, worker):
    program = small_instance(load_program(name), cap)
    structure = handwritten(program)
    # several blocks and for-loop iterations; then one block and one iteration, where every
    # matmul is a tl.dot of whole tiles; the Triton default only where both are refused
    ran = 0
    for config in (small_config(structure), {s: 1 for s in structure.symbols()},
                   triton_default_config(structure, get_spec("H100"))):
        why = legal(structure, {**config, "triton": 1}, "H100")
        if why is not None:  # tiles an H100 block cannot hold (mha's whole heads at 64)
            assert "shared memory" in why, why
            continue
        if ran == 2:
            break
        ran += 1
        res = interp.build(structure, config, reference=program.build(), name=f"t_{name}",
                           worker=worker)
        assert res.status == "ok", (name, cap, config, res.message)
        assert res.plan.dialect == "triton" and "@triton.jit" in res.source
    assert ran, (name, cap)


ATTENTION = """
name: gqa
dtype: {dtype}
inputs:
  Q: [2, 64, 64]
  K: [2, 64, 64]
  V: [2, 64, 64]
body: |
  E = exp(matmul(Q, K))
  O = matmul(E / sum(E, 2), V)
outputs: [O]
"""


def _attention(dtype: str):
    """gqa's body at small shapes, in ``dtype``."""
    return parse_program(ATTENTION.format(dtype=dtype), f"<attention {dtype}>")


def _real_scale_inputs(program, seed: int = 0) -> list[np.ndarray]:
    """Q, K ~ N(0, 1) with Q scaled so the largest |Q·K| is 30, V ~ N(0, 1)."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(program.inputs[n]).astype(np.float32) for n in "QKV")
    q *= 30.0 / np.abs(q @ k).max()
    return [q, k, v]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_real_scale_logits_give_no_inf_or_nan_on_triton(dtype, interp, worker):
    program = _attention(dtype)
    structure = handwritten(program)
    xs = _real_scale_inputs(program)
    assert 25 < np.abs(xs[0] @ xs[1]).max() <= 30.0001
    for config in ({"g0": 2, "g1": 2, "F": 4}, {"g0": 1, "g1": 1, "F": 1}):
        plan = interp.lower(structure, config, "logits")
        res = interp.check(plan, program.build(), inputs=xs, worker=worker)
        assert res.status == "ok", (dtype, config, res.message)
        assert all(np.isfinite(o).all() for o in res.outputs)
    assert "shifted by the running row max" in render(interp.lower(structure, {
        "g0": 2, "g1": 2, "F": 4}))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_real_scale_logits_give_no_inf_or_nan_on_the_cpu(dtype, worker):
    cpu = get_device("cpu")
    program = _attention(dtype)
    structure = handwritten(program)
    plan = cpu.lower(structure, small_config(structure), "logits")
    res = cpu.check(plan, program.build(), inputs=_real_scale_inputs(program), worker=worker)
    assert res.status == "ok", res.message
    assert all(np.isfinite(o).all() for o in res.outputs)


def test_max_subtraction_marks_only_normalised_exponentials():
    # attention: the exp is summed and multiplied into V, both accumulated, then divided
    attn = handwritten(load_program("gqa"))
    plan = lower(attn, {"g0": 2, "g1": 4, "F": 64}, "H100")
    lets = [st for lp in plan.kernels[0].phases[0].loops for st in lp.col
            if getattr(st, "op", "") == "exp"]
    assert lets and all(st.attrs.get("shift") for st in lets)
    scaled = [st for lp in plan.kernels[0].phases[0].loops for st in (*lp.col, *lp.row)
              if getattr(st, "scale", "")]
    assert len(scaled) == 2  # the row sum and the E·V accumulator
    # softmax_rows has no for-loop: nothing to carry, nothing marked
    rows = lower(handwritten(load_program("softmax_rows")), None, "H100")
    assert not any(getattr(st, "scale", "") for k in rows.kernels for ph in k.phases
                   for lp in ph.loops for st in (*lp.col, *lp.row))


def test_a_plan_the_triton_dialect_cannot_print_is_refused_with_the_reason():
    structure = handwritten(load_program("ntrans"))
    with pytest.raises(ValueError, match="triton=1 cannot run"):
        lower(structure, {"g0": 8, "triton": 1}, "H100")  # the AStitch rule splits rows
    with pytest.raises(ValueError, match="needs a GPU"):
        lower(structure, {"g0": 8, "triton": 1}, "cpu")


@pytest.mark.parametrize("name", sorted(SUITE))
def test_paper_shape_sass_uses_tensor_cores_wide_loads_and_no_spills(name):
    program = load_program(name)
    plan = lower(handwritten(program), {**PAPER_CONFIGS[name], "triton": 1, "stages": 3},
                 "H100", name)
    source = render(plan)
    for capability in (90, 80):
        for kernel_name, compiled in compile_plan(plan, source, capability).items():
            text = sass(compiled.asm["cubin"])
            where = f"{name} sm_{capability} {kernel_name}"
            assert not re.search(r"\b(STL|LDL)\b", text), f"{where}: spills to local memory"
            if name in MATMUL_FREE:
                continue
            mma = r"\bHGMMA\b|\bHMMA\b" if capability == 90 else r"\bHMMA\b"
            assert re.search(mma, text), f"{where}: no tensor-core instruction"
            if name in WEIGHT_BOUND:
                assert re.search(r"\bLDGSTS\S*\.128\b|\bLDG\S*\.128\b", text), \
                    f"{where}: the weights are not read with 128-bit loads"


def test_the_gpu_config_space_offers_both_dialects_and_tensor_core_tiles():
    from kernels import config_space

    structure = handwritten(load_program("rmsnorm_matmul"))
    space = config_space(structure, "H100")
    assert space.params["triton"] == (0, 1) and set(space.params["stages"]) == {2, 3, 4}
    assert space.default["triton"] == 0  # the AStitch default stays the first trial
    # 6144 columns in tiles of 16-256: 384, 192, 96, 48, 24 tiles are all offered
    assert {384, 192, 96, 48, 24} <= set(space.params["g0"])
    assert "triton" not in config_space(structure, "cpu").params
    # where rows may be split across blocks, a Triton config may not split them
    rows = config_space(handwritten(load_program("softmax_rows", {"rows": 64, "cols": 4096})),
                        "H100")
    assert 2 in rows.params["split"]
    assert "triton=1 cannot split" in rows.check({**rows.default, "triton": 1, "split": 2})
    assert rows.check({**rows.default, "triton": 0, "split": 2}) is None


def test_triton_configs_that_build_one_kernel_have_one_canonical_config():
    """The Triton dialect reads neither lanes nor smem_kb: configs differing only there print
    the same module, so the tuner hashes (and measures) them once; CUDA-C configs, where both
    change the plan, keep them, and CUDA C does not read the pipelining depth (stages)."""
    from kernels import config_space

    program = load_program("lora")
    structure = _searched_lora(program)
    space = config_space(structure, "H100")
    a = {**space.default, "g0": 512, "block": 512, "lanes": 32, "smem_kb": 0, "triton": 1,
         "stages": 4}
    b = {**a, "lanes": 2, "smem_kb": space.params["smem_kb"][-1]}
    assert render(lower(structure, a, "H100", "c")) == render(lower(structure, b, "H100", "c"))
    assert space.canonical(a) == space.canonical(b) and space.check(space.canonical(a)) is None
    cuda_c = {**a, "triton": 0, "stages": space.default["stages"]}
    assert space.canonical(cuda_c) == cuda_c
    assert space.canonical({**b, "triton": 0}) != space.canonical(cuda_c)
    deeper = {**cuda_c, "stages": 4}
    assert render(lower(structure, deeper, "H100", "c")) == render(
        lower(structure, cuda_c, "H100", "c"))
    assert space.canonical(deeper) == cuda_c


@pytest.mark.parametrize("name", ["rmsnorm_matmul", "gated_mlp", "gqa", "mha", "mqa"])
def test_the_triton_default_gives_tl_dot_tiles_that_fill_the_gpu(name):
    structure = handwritten(load_program(name))
    plan = lower(structure, {"triton": 1}, "H100", name)
    assert plan.dialect == "triton" and plan.config["stages"] == 3
    for k in plan.kernels:
        for lp in k.phases[0].loops:
            for d in (lp.rows, lp.cols):
                whole = d in {int(x) for s in load_program(name).inputs.values() for x in s}
                assert whole or d == 1 or (d >= 16 and d & (d - 1) == 0), (name, lp.shape)
    if name == "rmsnorm_matmul":  # a decode-sized weight stream: 64-column tiles (128-byte
        assert plan.config["g0"] == 96  # rows; the H100 ran them 1.7-1.9x faster than 16-column)


def test_the_estimate_knows_the_tensor_cores():
    from kernels import estimate

    # gated_mlp at a prefill's 1024 rows: 69 GFLOP against 0.1 GB, compute-bound
    structure = handwritten(load_program("gated_mlp", {"X": (1024, 4096)}))
    # 1024-row X tiles: 3 stages overflow smem; 1024 x 64 accumulators need 32 warps to stay
    # within TRITON_TILE_VALUES_PER_THREAD
    config = {"g0": 64, "F": 64, "stages": 2, "block": 1024}
    cuda_c = estimate(structure, {**config, "triton": 0}, "H100")
    triton_ = estimate(structure, {**config, "triton": 1}, "H100")
    assert cuda_c.flops == triton_.flops and cuda_c.bytes_moved == triton_.bytes_moved
    assert triton_.seconds < 0.5 * cuda_c.seconds


def _one_pass_attention(program):
    """The form the search finds for attention when a block holds the whole key sequence:
    E = exp(Q·K), P = E / sum(E), O = P·V, no for-loop."""
    from search import BlockGraph, KernelGraph

    g = KernelGraph()
    q_, k_, v_ = (g.new_input(program.inputs[n], program.dtype, n) for n in "QKV")
    bg = BlockGraph(("g0", "g1"), 1)
    q = bg.new_input(q_, imap=(0, 1), fmap=-1)
    k = bg.new_input(k_, imap=(0, -1), fmap=-1)
    v = bg.new_input(v_, imap=(0, -1), fmap=-1)
    e = bg.exp(bg.matmul(q, k))
    p = bg.div(e, bg.sum(e, 2))
    bg.new_output(bg.forloop_accum(bg.matmul(p, v)), omap=(0, 1))
    for out in g.graph_kernel(bg):
        g.mark_output(out)
    return g


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_one_pass_softmax_is_shifted_by_its_row_max_and_feeds_the_tensor_cores(
        dtype, interp, worker):
    program = _attention(dtype)
    structure = _one_pass_attention(program)
    xs = _real_scale_inputs(program)
    plan = interp.lower(structure, {"g0": 2, "g1": 4}, "one_pass")
    res = interp.check(plan, program.build(), inputs=xs, worker=worker)
    assert res.status == "ok", res.message
    assert all(np.isfinite(o).all() for o in res.outputs)
    # E / sum(E) lies in [0, 1]: P·V is a half-precision tl.dot, not a float32 one
    assert "shifted by its row max" in res.source and "ieee" not in res.source


def test_triton_tiles_that_overflow_shared_memory_are_refused_before_a_trial():
    """On an H100 a 16x512 @ 512x512 float16 for-loop step asked Triton for 1,081,472 bytes of
    shared memory and failed to compile; lower refuses it (an illegal config, not a trial),
    while the Triton default and the paper configs stay legal."""
    from kernels import get_spec, legal, triton_default_config

    program = load_program("rmsnorm_matmul", {"X": (16, 1024), "W": (1024, 1024)})
    structure = handwritten(program)
    huge = {"g0": 2, "F": 2, "triton": 1, "stages": 3}
    why = legal(structure, huge, "H100")
    assert why is not None and "1056 KiB of shared memory" in why and "227 KiB" in why, why
    assert legal(structure, {**huge, "triton": 0}, "H100") is None  # CUDA-C tiles differ
    assert legal(structure, triton_default_config(structure, get_spec("H100")), "H100") is None
    for name, config in TRITON_PAPER_CONFIGS.items():
        paper = handwritten(load_program(name))
        assert legal(paper, {**config, "triton": 1, "stages": 4}, "H100") is None, name


# The gqa structure a search found on 2026-11-27 (hash 06aedbff66): the for-loop walks Q's
# and K's head dim one column at a time, so the block accumulates a 256 x 4096 logits tile.
_GQA_06AEDBFF66 = {
    "format": "tuner.mugraph/1", "ops": [
        {"op": "input", "shape": [2, 256, 64], "dtype": "float16", "name": "Q"},
        {"op": "input", "shape": [2, 64, 4096], "dtype": "float16", "name": "K"},
        {"op": "input", "shape": [2, 4096, 64], "dtype": "float16", "name": "V"},
        {"op": "graph_kernel", "in": [0, 1, 2], "block_graph": {
            "grid": ["g0", "g1", 1], "forloop_range": "F", "block": [128, 1, 1], "ops": [
                {"op": "input", "index": 0, "imap": [0, -1, -1], "fmap": 2},
                {"op": "input", "index": 1, "imap": [0, -1, -1], "fmap": 1},
                {"op": "input", "index": 2, "imap": [0, 2, -1], "fmap": -1},
                {"op": "matmul", "in": [0, 1]}, {"op": "accum", "in": [3], "kind": "no_red"},
                {"op": "exp", "in": [4]}, {"op": "sum", "in": [5], "dim": 2},
                {"op": "matmul", "in": [5, 2]}, {"op": "div", "in": [7, 6]},
                {"op": "output", "in": [8], "omap": [0, 2, -1]}]}},
        {"op": "output", "in": [3]}]}


def test_triton_tiles_too_big_for_the_threads_registers_are_refused_and_not_defaulted():
    """On an H100 the Triton default of gqa's searched structure 06aedbff66 (g1 = 4: a 256 x
    4096 float32 accumulator over 128 threads, 8192 values a thread) did not finish its trial
    in 60 s; 512 and 128 a thread failed to compile.  Lowering refuses a tile of more than
    TRITON_TILE_VALUES_PER_THREAD values a thread (every config that ran right held <= 32),
    and the Triton default never picks one."""
    from kernels import get_spec, legal, triton_default_config
    from kernels.lowering import TRITON_TILE_VALUES_PER_THREAD
    from search import from_obj

    g = from_obj(_GQA_06AEDBFF66)
    why = legal(g, {"F": 64, "g0": 2, "g1": 4, "block": 128, "triton": 1, "stages": 3}, "H100")
    assert why is not None and "8192 a thread" in why, why
    assert TRITON_TILE_VALUES_PER_THREAD < 8192
    default = triton_default_config(g, get_spec("H100"))
    assert "a thread" not in (legal(g, default, "H100") or ""), default
    for name, config in TRITON_PAPER_CONFIGS.items():  # what ran on the GPU stays legal
        paper = handwritten(load_program(name))
        assert legal(paper, {**config, "triton": 1, "stages": 3}, "H100") is None, name
    # a prefill's 1024-row tiles: the default gives them the threads to stay within the limit
    prefill = handwritten(load_program("gated_mlp", {"X": (1024, 4096)}))
    default = triton_default_config(prefill, get_spec("H100"))
    assert default["block"] > 128 and legal(prefill, default, "H100") is None, default


def _searched_attention(program):
    """The gqa form a search found (structure 1c95b78b): each block holds all of Q's rows and
    a slice of V's columns, the for-loop walks K / V."""
    from search import BlockGraph, KernelGraph

    g = KernelGraph()
    q_, k_, v_ = (g.new_input(program.inputs[n], program.dtype, n) for n in "QKV")
    bg = BlockGraph(("g0", "g1"), "F")
    q = bg.new_input(q_, imap=(0, -1), fmap=-1)
    k = bg.new_input(k_, imap=(0, -1), fmap=2)
    v = bg.new_input(v_, imap=(0, 2), fmap=1)
    e = bg.exp(bg.matmul(q, k))
    num = bg.forloop_accum(bg.matmul(e, v))
    den = bg.forloop_accum(e, "sum")
    bg.new_output(bg.div(num, den), omap=(0, 2))
    for out in g.graph_kernel(bg):
        g.mark_output(out)
    return g


@pytest.mark.parametrize("form", ["searched", "handwritten"])
def test_a_for_loop_step_of_one_multiplies_e_by_v_as_an_outer_product(form, interp, worker):
    """With F = the key length each iteration's E·V is a (rows x 1) @ (1 x columns) matmul.
    On an H100 Triton 3.6 miscompiled its broadcast form, tl.sum over the (rows, 1, columns)
    product's axis of size 1: gqa's searched structure at F = 4096 gave wrong_result (15425 of
    32768 elements), and the outer product alone fixed it (the interpreter computes both
    right).  The dialect prints the outer product, and no tile is summed over an axis of 1."""
    program = load_program("gqa", {"Q": (2, 32, 16), "K": (2, 16, 32), "V": (2, 32, 16)})
    structure = (_searched_attention if form == "searched" else handwritten)(program)
    config = {"F": 32, "g0": 2, "g1": 2, "stages": 3}
    res = interp.build(structure, config, reference=program.build(), name="step1",
                       worker=worker)
    assert res.status == "ok", res.message
    assert "k = 1: an outer product" in res.source
    assert not _sums_over_k_of_one(res.source), _sums_over_k_of_one(res.source)
    # the searched structure at the shapes and config that failed on the H100
    paper = _searched_attention(load_program("gqa"))
    source = render(lower(paper, {"F": 4096, "g0": 2, "g1": 4, "triton": 1, "stages": 3,
                                  "lanes": 1, "block": 128, "smem_kb": 48}, "H100", "gqa"))
    assert "k = 1: an outer product" in source


def _sums_over_k_of_one(source: str) -> list[str]:
    """The lines that sum a matmul whose A operand is a column (k = 1) over an axis."""
    out = []
    for a in re.finditer(r"(v_t\d+)_a = .*", source):
        if "tl.arange(0, 1)[None, :]" in a.group(0):
            out += [ln for ln in re.findall(rf"{a.group(1)} = .*", source) if "tl.sum(" in ln]
    return out


def _searched_lora(program):
    """The lora form a search found (structure 8c9d2eac07): no for-loop, each block reads all
    of X and A and a slice of W's and B's columns, (X·A)·B + X·W."""
    from search import BlockGraph, KernelGraph

    g = KernelGraph()
    x_, w_, a_, b_ = (g.new_input(program.inputs[n], program.dtype, n) for n in "XWAB")
    bg = BlockGraph(("g0",), 1)
    x, w = bg.new_input(x_), bg.new_input(w_, imap=(1,))
    a, b = bg.new_input(a_), bg.new_input(b_, imap=(1,))
    xa = bg.forloop_accum(bg.matmul(x, a))
    bg.new_output(bg.add(bg.matmul(xa, b), bg.matmul(x, w)), omap=(1,))
    for out in g.graph_kernel(bg):
        g.mark_output(out)
    return g


@pytest.mark.parametrize("config", [
    {"g0": 512, "block": 512, "lanes": 32, "smem_kb": 0, "triton": 1, "stages": 4},
    {"g0": 4096, "block": 1024, "lanes": 2, "smem_kb": 0, "triton": 1, "stages": 2}])
def test_no_triton_program_reads_back_what_its_threads_stored(config):
    """With no shared memory (smem_kb = 0) lora's X·A and (X·A)·B went through workspace
    tiles, stored by one loop and loaded by the next.  On an H100 both configs gave
    wrong_result (37564 and 29189 of 65536 elements): Triton orders no global memory between
    threads, and its sm_90 code stored X·A from some warps (the 16 x 16 layout replicated over
    512 or 1024 threads) and loaded it back in all, nothing between; the interpreter (one
    thread) computes it right.  A Triton plan keeps such tiles in registers (smem_kb is a
    CUDA-C knob): no workspace, and no load in the PTX of an address stored before it."""
    plan = lower(_searched_lora(load_program("lora")), config, "H100", "lora_ws")
    assert plan.workspace_floats == 0
    assert lower(_searched_lora(load_program("lora")), {**config, "triton": 0}, "H100",
                 "lora_ws").workspace_floats > 0  # CUDA C: the tiles the bug went through
    ptx = compile_plan(plan, render(plan), 90)["lora_ws_k0"].asm["ptx"]
    stored: set[str] = set()  # address registers (each set once) stored so far
    for ln in ptx.splitlines():
        if m := re.search(r"st\.global\S* \[ (%rd\d+) \+ 0 \]", ln):
            stored.add(m.group(1))
        m = re.search(r"ld\.global\S* .*\[ (%rd\d+) \+ 0 \]", ln)
        assert not (m and m.group(1) in stored), f"read back: {ln.strip()}"


def test_a_tile_over_the_shared_memory_budget_stays_in_registers(interp, worker):
    """On an H100 qknorm_gqa's hand-written structure at g0=1 (both heads in one program) gave
    NaN in every output: its rms_norm(V) tile, (2, 64, 64) float32, was over the 48 KiB budget
    and downgraded to a workspace tile, stored and loaded back in every iteration.  Triton's
    pipeliner copies that load's first two iterations before the for-loop (TTGIR), so they
    read the previous call's workspace: build_kernel's launch on all-zero inputs left 0/0 there.
    The interpreter runs in program order and cannot show it.  A Triton tile stays a register
    tile at any budget; the CUDA-C dialect still downgrades it, and Triton refuses such plans."""
    from kernels.lowering import Level
    from kernels.lowering._lower import _choose_triton

    structure = handwritten(load_program("qknorm_gqa"))
    config = {"F": 64, "g0": 1, "g1": 16, "block": 128, "smem_kb": 48, "triton": 1,
              "stages": 3, "lanes": 32}
    plan = lower(structure, config, "H100", "qknorm_gqa")
    assert plan.workspace_floats == 0
    [ttgir] = [c.asm["ttgir"] for c in compile_plan(plan, render(plan), 90).values()]
    start = ttgir.index("scf.for")
    assert "tt.store" not in ttgir[start:ttgir.index("scf.yield", start)]
    cuda_c = lower(structure, {**config, "triton": 0}, "H100")
    assert [b.name for b in cuda_c.kernels[0].buffers.values()
            if b.level is Level.GLOBAL] == ["b_t4"]
    with pytest.raises(ValueError, match=r"stores and reloads the workspace tiles \['b_t4'\]"):
        _choose_triton(cuda_c)
    # smem_kb=0 puts every CUDA-C tile in the workspace; Triton keeps them all in registers
    small = small_instance(load_program("qknorm_gqa"), 16)
    plan = interp.lower(handwritten(small), {**small_config(handwritten(small)), "smem_kb": 0},
                        "qk0")
    assert plan.workspace_floats == 0
    res = interp.check(plan, small.build(), worker=worker)
    assert res.status == "ok", res.message


# ---------------------------------------------------------------- split-K

TWICE = '''

_launch_once = launch


def launch(inputs, outputs, ws):
    """Two calls on one workspace: the second call's outputs are the ones checked, and the
    workspace must be back to zero after each call."""
    for call in range(2):
        for o in outputs:
            o.fill_(float("nan"))
        _launch_once(inputs, outputs, ws)
        assert float(ws.abs().max()) == 0.0, f"the workspace is not zero after call {call}"
'''


def _splitk_configs(structure) -> list[dict[str, int]]:
    """The Triton default for the H100 with a for-loop of 4 steps (at dims capped at 64 the
    default walks K in one step, which nothing can split), on its own grid and on 2 blocks."""
    base = {**triton_default_config(structure, get_spec("H100")), "F": 4}
    return [base, {**base, "g0": 2}]


@pytest.mark.parametrize("launches", [1, 2])
@pytest.mark.parametrize("splitk", [2, 4])
@pytest.mark.parametrize("name", WEIGHT_BOUND)
def test_split_k_weight_streams_match_the_program_on_two_calls_in_a_row(
        name, splitk, launches, interp, worker):
    program = small_instance(load_program(name), 64)
    structure = handwritten(program)
    for config in _splitk_configs(structure):
        config = {**config, "splitk": splitk, "splitk_launches": launches}
        plan = interp.lower(structure, config, f"sk_{name}")
        k = plan.kernels[0]
        programs = [f"{k.name}_partial", f"{k.name}_epilogue"] if launches == 2 else [k.name]
        assert k.splitk == splitk and k.programs == programs
        slots = [b for b in k.buffers.values() if b.role.startswith("splitk")]
        assert slots and plan.workspace_floats >= sum(b.per_item * k.vblocks for b in slots)
        source = render(plan)
        assert f"{programs[0]}[({k.vblocks}, {splitk})]" in source
        assert "tl.atomic_add(" in source
        assert (f"if sk_ticket == {splitk - 1}:" in source) == (launches == 1)
        res = interp.check(plan, program.build(), worker=worker)
        assert res.status == "ok", (name, config, res.message)
        # the same kernel object (one workspace) called twice: right both times, and the
        # epilogue leaves the workspace zeroed for the next call
        res = interp.check(plan, program.build(), source=source + TWICE, worker=worker)
        assert res.status == "ok", (name, config, res.message)


def test_the_two_call_check_catches_a_workspace_left_dirty(interp, worker):
    program = small_instance(load_program("gated_mlp"), 64)
    structure = handwritten(program)
    plan = interp.lower(structure, {**_splitk_configs(structure)[1], "splitk": 2}, "dirty")
    source = render(plan)
    # the epilogue reads its slots without zeroing them
    dirty = re.sub(r"tl\.atomic_xchg\((\w+)\.to\(tl\.pointer_type\(tl\.int32\)\), "
                   r"tl\.zeros\([^)]*\), mask=(\w+), sem=\"relaxed\"\)\.to\([^)]*\)",
                   r"tl.load(\1, mask=\2, other=0.0)", source)
    assert dirty != source
    res = interp.check(plan, program.build(), source=dirty + TWICE, worker=worker)
    assert res.status != "ok" and "not zero" in res.message, res.message


def test_the_two_call_check_catches_a_program_finishing_before_the_last_sums(interp, worker):
    """Split-K in one launch: were the first program to take its ticket to finish the
    virtual block (instead of the last), the outputs would miss the other programs' sums."""
    program = small_instance(load_program("rmsnorm_matmul"), 64)
    structure = handwritten(program)
    plan = interp.lower(structure, {**_splitk_configs(structure)[1], "splitk": 2,
                                    "splitk_launches": 1}, "early")
    source = render(plan)
    assert interp.check(plan, program.build(), source=source + TWICE,
                        worker=worker).status == "ok"
    early = source.replace("if sk_ticket == 1:", "if sk_ticket == 0:")
    assert early != source
    res = interp.check(plan, program.build(), source=early + TWICE, worker=worker)
    assert res.status != "ok", res.message


def test_split_k_is_refused_where_the_loop_state_is_not_a_sum():
    gqa = handwritten(small_instance(load_program("gqa"), 64))
    config = {"g0": 2, "g1": 2, "F": 4, "triton": 1}
    assert legal(gqa, config, "H100") is None
    why = legal(gqa, {**config, "splitk": 2}, "H100")
    assert why is not None and "splitk=2 cannot split" in why and "running row max" in why, why
    mm = handwritten(small_instance(load_program("rmsnorm_matmul"), 64))
    base = {"g0": 2, "F": 4, "triton": 1}
    assert legal(mm, {**base, "splitk": 4}, "H100") is None
    assert "must divide the for-loop range 4" in legal(mm, {**base, "splitk": 8}, "H100")
    assert "needs the Triton dialect" in legal(mm, {**base, "triton": 0, "splitk": 2}, "H100")
    assert legal(mm, {**base, "splitk": 2}, "cpu") is not None
    # the default stays one program per virtual block, no workspace for partials
    plan = lower(mm, base, "H100")
    assert plan.kernels[0].splitk == 1 and plan.workspace_floats == 0
    assert "atomic_add" not in render(plan)


def test_paper_shape_split_k_sass_adds_floats_atomically_with_wide_loads_and_no_spills():
    program = load_program("rmsnorm_matmul")
    plan = lower(handwritten(program), {**PAPER_CONFIGS["rmsnorm_matmul"], "triton": 1,
                                        "stages": 3, "splitk": 4}, "H100", "rmsnorm_matmul")
    k = plan.kernels[0]
    assert k.splitk == 4 and k.forloop == 32
    source = render(plan)
    for capability in (90, 80):
        compiled = compile_plan(plan, source, capability)
        assert sorted(compiled) == sorted(k.programs)
        for program_name, c in compiled.items():
            text = sass(c.asm["cubin"])
            where = f"sm_{capability} {program_name}"
            assert not re.search(r"\b(STL|LDL)\b", text), f"{where}: spills to local memory"
        part = sass(compiled[f"{k.name}_partial"].asm["cubin"])
        where = f"sm_{capability} partial"
        # sm_90: REDG.E.ADD.F32x4 / REDG.E.ADD.F32; sm_80: RED.E.ADD.F32
        assert re.search(r"\b(RED|REDG|ATOM|ATOMG)\.E\.ADD\.F32", part), \
            f"{where}: no float atomic add"
        assert re.search(r"\bHMMA\b|\bHGMMA\b", part), f"{where}: no tensor-core instruction"
        assert re.search(r"\bLDGSTS\S*\.128\b|\bLDG\S*\.128\b", part), \
            f"{where}: the weights are not read with 128-bit loads"
        # the epilogue takes each sum and zeroes its slot in one atomic exchange: a load and
        # a store of zeros got different thread layouts and raced on an H100
        epilogue = sass(compiled[f"{k.name}_epilogue"].asm["cubin"])
        assert re.search(r"\bATOMG?\.E\.EXCH\b", epilogue), \
            f"sm_{capability} epilogue: the sums are not taken by an atomic exchange"


def test_paper_shape_split_k_in_one_launch_takes_its_ticket_after_a_barrier_with_release():
    """The last program finishes the virtual block: every thread's atomic adds, then a block
    barrier, then one thread's acquire-release ticket at GPU scope (CUTLASS's split-K
    semaphore), then the sums taken by atomic exchange; still tensor cores, 128-bit weight
    loads and no spills."""
    program = load_program("rmsnorm_matmul")
    plan = lower(handwritten(program), {**PAPER_CONFIGS["rmsnorm_matmul"], "triton": 1,
                                        "stages": 3, "splitk": 4, "splitk_launches": 1},
                 "H100", "rmsnorm_matmul")
    (k,) = plan.kernels
    assert k.programs == [k.name]
    source = render(plan)
    for capability in (90, 80):
        (compiled,) = compile_plan(plan, source, capability).values()
        text, ptx = sass(compiled.asm["cubin"]), compiled.asm["ptx"]
        where = f"sm_{capability}"
        assert not re.search(r"\b(STL|LDL)\b", text), f"{where}: spills to local memory"
        assert re.search(r"\bHMMA\b|\bHGMMA\b", text), f"{where}: no tensor-core instruction"
        assert re.search(r"\bLDGSTS\S*\.128\b|\bLDG\S*\.128\b", text), \
            f"{where}: the weights are not read with 128-bit loads"
        adds = [m.start() for m in re.finditer(r"\bred\.global\S*\.add\.f32", ptx)]
        ticket = re.search(r"atom\.global\.gpu\.acq_rel\.add\.u32", ptx)
        assert adds and ticket, f"{where}: no float atomic adds or no acquire-release ticket"
        assert max(adds) < ticket.start(), f"{where}: a partial sum is added after the ticket"
        assert "bar.sync" in ptx[max(adds):ticket.start()], \
            f"{where}: no block barrier between the partial sums and the ticket"
        assert re.search(r"\bATOMG?\.E\.EXCH\b", text[text.index("ATOMG.E.ADD"):]), \
            f"{where}: the sums are not taken by an atomic exchange after the ticket"


def test_the_gpu_config_space_offers_split_k_and_the_estimate_fills_the_gpu_with_it():
    from kernels import config_space, estimate
    from kernels.configspace import _fill

    structure = handwritten(load_program("rmsnorm_matmul"))
    space = config_space(structure, "H100")
    assert space.params["splitk"] == (1, 2, 4, 8, 16) and space.default["splitk"] == 1
    assert "splitk" not in config_space(structure, "cpu").params
    assert "splitk" not in config_space(handwritten(load_program("ntrans")), "H100").params
    # attention's loop carries a running max: lowering refuses every split, so none is offered
    assert "splitk" not in config_space(handwritten(load_program("gqa")), "H100").params
    triton_ = {**space.default, "g0": 96, "F": 32, "triton": 1}
    assert space.check({**triton_, "splitk": 4}) is None
    assert "needs triton=1" in space.check({**triton_, "triton": 0, "splitk": 4})
    assert "must divide the for-loop range F" in space.check({**triton_, "F": 4, "splitk": 8})
    spec = get_spec("H100")
    fills, ests = [], []
    for s in (1, 2, 4):
        config = {**triton_, "splitk": s}
        fills.append(_fill(lower(structure, config, spec), spec)[0])
        ests.append(estimate(structure, config, spec))
    assert fills[0] < fills[1] <= fills[2], fills  # 96 blocks of 132 SMs, then 192, 384
    assert [e.launches for e in ests] == [1, 1, 1]  # the last program finishes a block
    assert ests[0].bytes_moved < ests[1].bytes_moved < ests[2].bytes_moved  # the partials
    assert [estimate(structure, {**triton_, "splitk": s, "splitk_launches": 2}, spec).launches
            for s in (1, 2, 4)] == [1, 2, 2]  # an epilogue launch
    # splitk_launches: offered with split-K, read only where it splits; a config stored
    # before the knob existed keeps the two launches it was measured with
    assert space.params["splitk_launches"] == (1, 2) and space.default["splitk_launches"] == 1
    one = {**triton_, "splitk": 1}
    assert space.canonical({**one, "splitk_launches": 2}) == space.canonical(
        {**one, "splitk_launches": 1})
    old = {k: v for k, v in triton_.items() if k != "splitk_launches"} | {"splitk": 4}
    assert space.check(old) is None and space.canonical(old)["splitk_launches"] == 2
    assert lower(structure, old, spec).kernels[0].programs[-1].endswith("_epilogue")
    for s in (1, 4):  # a value the knob does not have is refused even where it is not read
        assert "must be 1" in legal(structure, {**triton_, "splitk": s, "splitk_launches": 3},
                                    spec)


def test_split_k_of_an_output_accumulated_in_place(interp, worker):
    """A float32 output that is the loop's accumulator itself (no Regional tile): its partial
    sums go through the workspace too, and the epilogue stores them."""
    from search import BlockGraph, KernelGraph

    program = parse_program("name: mm\ndtype: float32\ninputs:\n  X: [4, 64]\n  W: [64, 64]\n"
                            "body: |\n  O = matmul(X, W)\noutputs: [O]\n", "<mm>")
    g = KernelGraph()
    x_, w_ = (g.new_input(program.inputs[n], program.dtype, n) for n in "XW")
    bg = BlockGraph(("g0",), "F")
    x = bg.new_input(x_, imap=(-1,), fmap=1)
    w = bg.new_input(w_, imap=(1,), fmap=0)
    bg.new_output(bg.forloop_accum(bg.matmul(x, w)), omap=(1,))
    for out in g.graph_kernel(bg):
        g.mark_output(out)
    plan = interp.lower(g, {"g0": 2, "F": 4, "splitk": 4}, "mm")
    [slot] = [b for b in plan.kernels[0].buffers.values() if b.role == "splitk"]
    assert slot.carries.startswith("out_")  # the output's view, not a register tile
    res = interp.check(plan, program.build(), source=render(plan) + TWICE, worker=worker)
    assert res.status == "ok", res.message
