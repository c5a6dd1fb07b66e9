"""``tuner codegen`` / ``tuner measure``, the cuda device's unavailable path, worker
environments, and the C++ dialect's fast paths (register-tiled matmuls, joined row loops)."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from support import build_cpu, one_line_error, run_main

from kernels import (
    DeviceUnavailable,
    IsolatedWorker,
    cuda_available,
    get_device,
    lower,
    measure_program,
    render,
    run_isolated,
)
from kernels.devices import launches
from search import handwritten, load_program, structural_hash, to_json, to_obj

SMALL_SOFTMAX = ["softmax_rows", "--set", "rows=64", "--set", "cols=128"]
GPU = cuda_available()[0]




# ---------------------------------------------------------------- codegen


def test_codegen_cpp_prints_kernels_and_entry_point(capsys):
    code, out, err = run_main(capsys, "codegen", *SMALL_SOFTMAX, "--target", "cpp")
    assert code == 0
    assert 'extern "C" void kernel(float** inputs, float** outputs)' in out
    assert "static void softmax_rows_k0(" in out and "#pragma omp" in out
    assert "hand-written structure of softmax_rows" in err and "g0=" in err


def test_codegen_cuda_prints_global_kernels_and_launches(capsys):
    code, out, _ = run_main(capsys, "codegen", "gqa", "--set", "Q=2x32x16", "--set", "K=2x16x64",
                        "--set", "V=2x64x16", "--config", "F=4", "--target", "cuda")
    assert code == 0
    assert re.search(r'extern "C" __global__ void __launch_bounds__\(\d+\) gqa_k0\(', out)
    assert "float* ws, unsigned int* bar" in out  # shared by the threads: not restrict
    assert re.search(r"//   gqa_k0<<<\d+, \d+>>>\(in_Q, in_K, in_V, out_\w+, ws, bar\)", out)


def test_codegen_triton_prints_tile_programs_with_the_triton_default(capsys):
    code, out, err = run_main(capsys, "codegen", "gated_mlp", "--target", "triton")
    assert code == 0, err
    assert "@triton.jit" in out and "tl.dot(" in out and "def launch(" in out
    assert "triton=1" in err and "g0=64" in err  # 64 tiles of 64 columns (128-byte rows)
    compile(out, "<triton>", "exec")  # the printed module is Python
    code, _, err = run_main(capsys, "codegen", "ntrans", "--target", "triton", "--config",
                            "split=2")
    assert code == 2 and "triton=1 cannot run" in one_line_error(err, "codegen")
    # 0 is a value of the knobs where it means off (it was refused as "not positive")
    code, out, err = run_main(capsys, "codegen", "gated_mlp", "--config", "triton=0",
                              "--config", "smem_kb=0")
    assert code == 0 and "__global__" in out and "@triton.jit" not in out, err
    code, _, err = run_main(capsys, "codegen", "gated_mlp", "--config", "g0=0")
    assert code == 2 and "g0=0" in one_line_error(err, "codegen")


def test_cuda_launch_list_matches_the_rendered_signatures():
    program = load_program("ntrans")
    plan = lower(handwritten(program), None, "A100", "nt")  # split: workspace + barrier
    source = render(plan, "cuda")
    listed = re.findall(r"//   (\w+)<<<(\d+), (\d+)>>>\(([^)]*)\)", source)
    got = launches(plan)
    assert [(ln.kernel, str(ln.blocks), str(ln.threads)) for ln in got] == \
        [(n, b, t) for n, b, t, _ in listed]
    names = {f"in:{b.io_index}": b.name for b in plan.inputs} | \
        {f"out:{b.io_index}": b.name for b in plan.outputs} | {"ws": "ws", "bar": "bar"}
    for ln, (_, _, _, args) in zip(got, listed, strict=True):
        assert [names[a] for a in ln.args] == [a.strip() for a in args.split(",")]
    assert plan.barriers >= 1 and plan.workspace_floats > 0


def _structure_files(tmp_path, program):
    """A µGraph JSON file and a search output with two ranked structures."""
    hand = handwritten(program)
    graph_file = tmp_path / "structure.json"
    graph_file.write_text(to_json(hand, indent=2))
    ref = program.build()  # a second, different structure: the reference graph itself
    search = tmp_path / "search.json"
    search.write_text(json.dumps({"program": program.name, "structures": [
        {"graph": to_obj(ref), "hash": structural_hash(ref)},
        {"graph": to_obj(hand), "hash": structural_hash(hand)}]}))
    return graph_file, search, structural_hash(hand), structural_hash(ref)


def test_codegen_structure_file_best_and_hash(capsys, tmp_path):
    program = load_program("softmax_rows", {"rows": 64, "cols": 128})
    graph_file, search, hand_hash, ref_hash = _structure_files(tmp_path, program)
    code, out, err = run_main(capsys, "codegen", *SMALL_SOFTMAX, "--structure", str(graph_file),
                          "--target", "cpp")
    assert code == 0 and f"structure {hand_hash[:12]} from {graph_file}" in err
    assert "graph-defined kernel" in out
    code, out, err = run_main(capsys, "codegen", *SMALL_SOFTMAX, "--structures", str(search),
                          "--target", "cpp")
    # best: the fused structure, listed second, beats the reference (a kernel per op) on
    # the roofline estimate
    assert code == 0 and f"best structure {hand_hash[:12]}" in err
    assert "graph-defined kernel" in out
    code, out, err = run_main(capsys, "codegen", *SMALL_SOFTMAX, "--structures", str(search),
                          "--structure", ref_hash[:10], "--target", "cpp")
    assert code == 0 and ref_hash[:12] in err
    assert "predefined" in out  # the reference graph: predefined ops, several kernels
    # a search made at other shapes is refused, not silently replaced by the reference
    code, _, err = run_main(capsys, "codegen", "softmax_rows", "--set", "rows=32", "--set",
                        "cols=128", "--structures", str(search), "--target", "cpp")
    assert code == 2 and "takes inputs of shapes [(64, 128)]" in one_line_error(err,
                                                                                   "codegen")


def test_best_is_the_reference_when_it_beats_every_searched_structure(capsys, tmp_path):
    from support import mha_structure

    from search import from_obj

    # mha's structure with the grid over V's columns: every block recomputes Q·K and exp
    slow = from_obj(mha_structure("columns", heads=4, rows=16, dim=64, seq=512))
    search = tmp_path / "search.json"
    search.write_text(json.dumps({"program": "mha", "structures": [
        {"graph": to_obj(slow), "hash": structural_hash(slow)}]}))
    shapes = ["--set", "Q=4x16x64", "--set", "K=4x64x512", "--set", "V=4x512x64"]
    code, out, err = run_main(capsys, "codegen", "mha", *shapes, "--structures", str(search),
                          "--target", "cpp")
    assert code == 0 and "the reference program (a kernel per op)" in err
    assert "predefined" in out


def test_codegen_rejects_bad_config_in_one_line(capsys):
    for bad, says in ((["--config", "g0=abc"], "positive integer"),
                      (["--config", "zz=4"], "not a symbol"),
                      (["--config", "g0=3"], "not divisible by 3"),
                      (["--config", "lanes=3", "--target", "cuda"], "power of two")):
        code, _, err = run_main(capsys, "codegen", *SMALL_SOFTMAX, *bad)
        assert code == 2 and says in one_line_error(err, "codegen"), bad


def test_corrupted_structure_files_exit_2(capsys, tmp_path):
    program = load_program("softmax_rows", {"rows": 64, "cols": 128})
    graph_file, search, _, _ = _structure_files(tmp_path, program)
    truncated = tmp_path / "truncated.json"
    truncated.write_text(graph_file.read_text()[:200])
    doc = json.loads(search.read_text())
    doc["structures"][1]["graph"]["ops"][1]["op"] = "frobnicate"
    bad_op = tmp_path / "bad_op.json"
    bad_op.write_text(json.dumps(doc))
    cases = [(["--structure", str(truncated)], "not valid JSON"),
             (["--structures", str(bad_op), "--structure", doc["structures"][1]["hash"][:8]],
              "unknown op 'frobnicate'"),
             (["--structures", str(search), "--structure", "abcdef12"], "no structure"),
             (["--structure", "abcdef12"], "--structures FILE")]
    for extra, says in cases:
        code, out, err = run_main(capsys, "codegen", *SMALL_SOFTMAX, *extra)
        assert code == 2 and out == "" and says in one_line_error(err, "codegen"), extra


def test_structure_found_at_other_shapes_is_refused(capsys, tmp_path):
    graph_file, _, _, _ = _structure_files(tmp_path, load_program("softmax_rows"))
    code, _, err = run_main(capsys, "codegen", *SMALL_SOFTMAX, "--structure", str(graph_file))
    assert code == 2 and "takes inputs of shapes [(4096, 1024)]" in one_line_error(err,
                                                                                     "codegen")


# ---------------------------------------------------------------- measure


def test_measure_json_reports_status_and_speedup(capsys):
    code, out, _ = run_main(capsys, "measure", *SMALL_SOFTMAX, "--json", "--budget", "0.2")
    doc = json.loads(out)
    assert code == 0 and doc["status"] == "ok"
    assert math.isfinite(doc["speedup"]) and doc["speedup"] > 0
    assert doc["kernel_s"] > 0 and doc["baseline_s"] > 0 and doc["max_error"] < 1e-4
    code, out, _ = run_main(capsys, "measure", *SMALL_SOFTMAX, "--budget", "0.1")
    assert code == 0 and re.search(r"^speedup\s+[\d.]+x$", out, re.M)
    assert re.search(r"^status\s+ok$", out, re.M)


@pytest.mark.skipif(GPU, reason="this machine has a GPU: the unavailable path cannot happen")
def test_measure_device_cuda_without_gpu_exits_2(capsys):
    code, out, err = run_main(capsys, "measure", *SMALL_SOFTMAX, "--device", "cuda")
    line = one_line_error(err, "measure")
    assert code == 2 and out == "" and "--device cuda: no usable GPU" in line


@pytest.mark.skipif(GPU, reason="this machine has a GPU: the unavailable path cannot happen")
def test_cuda_device_reports_itself_unavailable():
    program = load_program("softmax_rows", {"rows": 64, "cols": 128})
    for call in (lambda: get_device("cuda"), lambda: get_device("cuda:1"),
                 lambda: measure_program(program, device="cuda")):
        with pytest.raises(DeviceUnavailable) as info:
            call()
        assert "\n" not in str(info.value) and "unavailable" in str(info.value)
    # the worker-side entry point says so as a status, through the isolated worker
    x = np.ones((4, 4), np.float32)
    res = run_isolated({"call": "kernels.devices._cuda:worker_job", "args": {"plan": None},
                        "inputs": [x], "outputs": [(4, 4)], "timing": None}, 60)
    assert res.status == "runtime_error" and "unavailable" in res.message


# ---------------------------------------------------------------- worker environment

OMP_PROBE = """#include <omp.h>
extern "C" void kernel(float** inputs, float** outputs) {
  outputs[0][0] = (float)omp_get_max_threads();
}"""


def test_worker_and_job_environment_reach_openmp():
    with IsolatedWorker(env={"OMP_NUM_THREADS": "3"}) as worker:
        job = {"source": OMP_PROBE, "inputs": [], "outputs": [(1,)], "timing": None}
        assert worker.run(job, 60).payload["outputs"][0][0] == 3.0
        res = worker.run({**job, "env": {"OMP_NUM_THREADS": "1"}}, 60)
        assert res.payload["outputs"][0][0] == 1.0 and worker.starts == 2
        assert worker.run({**job, "env": {"OMP_NUM_THREADS": "1"}}, 60).ok
        assert worker.starts == 2  # same environment: the process is reused
        with pytest.raises(ValueError, match="job\\['env'\\]"):
            worker.run({**job, "env": {"OMP_NUM_THREADS": 1}}, 60)


# ---------------------------------------------------------------- C++ fast paths


# (tile with 32 vector registers (AVX-512), tile with 16 (AVX2, SSE): 6-row tiles, the last
# one shorter, wherever B's tile stays in cache)
@pytest.mark.parametrize("name, overrides, config, tiles", [
    ("gqa", {"Q": (2, 32, 16), "K": (2, 16, 64), "V": (2, 64, 16)}, None,
     ("mm_rows<4>", "mm_rows_n<6>(nr, ")),
    # 88 columns: a full register tile, a one-vector tile and a scalar tail (AVX-512)
    ("rmsnorm_matmul", {"X": (3, 64), "W": (64, 88)}, {"g0": 1, "F": 2},
     ("mm_rows<3>", "mm_rows<3>")),
    # B's tile (256 x 88) outgrows L1: more rows per pass over it (AVX-512); in L2 with all
    # of W cached: tiles of 6 rows and 2 (16 registers)
    ("rmsnorm_matmul", {"X": (8, 256), "W": (256, 88)}, {"g0": 1, "F": 1},
     ("mm_rows<8>", "mm_rows_n<6>(nr, ")),
    ("rmsnorm_matmul", {"X": (12, 256), "W": (256, 88)}, {"g0": 1, "F": 1},
     ("mm_rows<6>", "mm_rows<6>")),
    ("lora", {"X": (2, 32), "W": (32, 80), "A": (32, 8), "B": (8, 80)}, {"g0": 1, "F": 1},
     ("mm_rows<2>", "mm_rows<2>")),
])
def test_register_tiled_matmuls_match_the_reference(name, overrides, config, tiles):
    from kernels import cpu_simd, local_cpu_spec

    program = load_program(name, overrides)
    res = build_cpu(handwritten(program), config, name=name)
    assert tiles[cpu_simd(local_cpu_spec())[1] < 32] in res.source
    assert res.status == "ok", res.message


def test_softmax_rows_walk_rows_once_with_a_reciprocal():
    program = load_program("softmax_rows", {"rows": 96, "cols": 40})
    res = build_cpu(handwritten(program), name="sm")
    assert res.status == "ok", res.message
    assert "(one walk over the rows for the loops above)" in res.source
    assert "rcp_" in res.source and not re.search(r"\(v_\w+ / v_\w+\)", res.source)


def test_short_rows_of_a_big_input_are_prefetched_ahead():
    """Rows of 32 of an input of at least 8 L2 caches stream from memory: the schedule
    prefetches them; a smaller input (or a bigger L2) gets no prefetch."""
    from dataclasses import replace

    from kernels import local_cpu_spec

    program = load_program("softmax_rows", {"rows": 512, "cols": 32})  # a 64 KB input
    for l2, expect in ((4 << 10, True), (1 << 20, False)):
        spec = replace(local_cpu_spec(), l2_bytes=l2)
        plan = lower(handwritten(program), None, spec, "sm")
        assert any(lp.prefetch for k in plan.kernels for ph in k.phases for lp in ph.loops) \
            == expect
        res = get_device("cpu").check(plan, program.build())
        assert res.status == "ok", res.message
        assert ("__builtin_prefetch(in_X" in res.source) == expect, l2
