"""One contract for every device behind ``kernels.Device``: cpu, replay, cuda and the Triton
interpreter.

- a device that cannot run here says why in one line (``DeviceUnavailable``);
- ``run_trial`` answers with the same fields on every device: a status from ``STATUSES``, the
  config actually used (knobs filled in), a median time when ok, a message when not;
- the replay device answers a recorded trial exactly as it was recorded, a missing config as
  ``invalid``, and refuses to run a kernel;
- the cuda device's launches match the plan and its source on a stand-in CuPy that compiles
  with nvcc and records launches (where no GPU exists; tests/kernels/test_gpu.py runs the real one):
  every kernel a launch names exists, grids and blocks fit the GPU, every parameter is passed.
"""

from __future__ import annotations

import re
import subprocess
import types

import numpy as np
import pytest
from support import small_config

import db
from kernels import (
    DEVICE_KINDS,
    INVALID,
    TRIAL_STATUSES,
    DeviceUnavailable,
    ReplayDevice,
    cuda_available,
    device_kind,
    get_device,
    get_spec,
    lower,
    nvcc_available,
    parse_device_name,
    render,
    replay_key,
    replayed_gpu,
)
from kernels.devices import CudaKernel
from search import handwritten, load_program

TRIAL_FIELDS = {"status", "config", "message"}


@pytest.fixture(scope="module")
def softmax():
    program = load_program("softmax_rows", {"rows": 16, "cols": 64})
    structure = handwritten(program)
    return program.build(), structure, small_config(structure)


@pytest.fixture(scope="module")
def cpu_trial(softmax):
    reference, structure, config = softmax
    return get_device("cpu").run_trial(structure, reference, config)


def test_every_device_name_gives_a_device_or_one_line_why():
    for name in ("cpu", "cuda", "cuda:1"):
        try:
            device = get_device(name)
        except DeviceUnavailable as err:
            assert "\n" not in str(err) and str(err)
            continue
        assert device.key and device.spec.name and device.kind in ("cpu", "cuda")
    with pytest.raises(ValueError, match="unknown device"):
        get_device("tpu")
    with pytest.raises(ValueError, match="job file's device"):
        get_device("replay")  # a name of the grammar, but no device of this machine


def test_one_grammar_names_every_device():
    """What job files, the CLI and get_device accept: cpu, cuda, cuda:N, replay; nothing
    else (no cpu:N, no bare cuda:, no spaces or capitals: callers normalise first)."""
    assert [parse_device_name(n) for n in ("cpu", "cuda", "cuda:3", "replay")] == [
        ("cpu", None), ("cuda", None), ("cuda", 3), ("replay", None)]
    for bad in ("cpu:0", "cuda:", "cuda:x", "CUDA", " cpu", "replay:1", "tpu", ""):
        with pytest.raises(ValueError, match="unknown device"):
            parse_device_name(bad)
    assert set(DEVICE_KINDS) == {"cpu", "cuda"}
    assert [device_kind(k) for k in ("cuda:1", "cpu:AMD EPYC:16c", "replay:A100")] == [
        "cuda", "cpu", "replay"]
    assert replayed_gpu(replay_key("A100")) == "A100" and replayed_gpu("cuda:A100:sm_80") is None


def test_a_cpu_trial_has_every_field(cpu_trial, softmax):
    assert TRIAL_FIELDS <= set(cpu_trial) and cpu_trial["status"] in TRIAL_STATUSES
    assert cpu_trial["status"] == "ok" and cpu_trial["median_s"] > 0
    assert set(softmax[2]) <= set(cpu_trial["config"])  # the knobs the rule filled in, too


def test_an_illegal_config_is_a_trial_with_a_status_not_an_exception(softmax):
    reference, structure, config = softmax
    bad = {**config, next(iter(config)): 3}  # 3 divides no power-of-two dimension
    res = get_device("cpu").run_trial(structure, reference, bad)
    assert res["status"] in TRIAL_STATUSES and res["status"] != "ok" and res["message"]


def test_replay_answers_what_was_recorded_and_runs_nothing(cpu_trial, softmax):
    reference, structure, config = softmax
    device = ReplayDevice({db.config_hash(config): cpu_trial}, db.config_hash,
                          "replay:recorded", get_spec("H100"))
    again = device.run_trial(structure, reference, config)
    assert again["status"] == "ok" and again["median_s"] == cpu_trial["median_s"]
    missing = device.run_trial(structure, reference, {**config, "g0": 1024})
    assert TRIAL_FIELDS <= set(missing) and missing["status"] == INVALID
    assert "not in the replayed table" in missing["message"]
    with pytest.raises(DeviceUnavailable):
        device.load(None, "")


# ---------------------------------------------------------------- cuda, without a GPU


class _StandInCupy:
    """What CudaKernel uses of CuPy, on numpy: modules are compiled by nvcc for real, and
    every launch is recorded instead of run."""

    float32, uint32 = np.float32, np.uint32

    def __init__(self, tmp_path) -> None:
        self.launched: list[tuple[str, tuple, tuple, tuple]] = []
        self.tmp_path = tmp_path
        outer = self

        class RawModule:
            def __init__(self, code: str, options=()) -> None:
                path = outer.tmp_path / "module.cu"
                path.write_text(code)
                done = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "-cubin", "-o",
                                       str(outer.tmp_path / "module.cubin"), str(path)],
                                      capture_output=True, text=True)
                assert done.returncode == 0, done.stderr
                self.code = code

            def get_function(self, name: str):
                found = re.search(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?"
                                  + re.escape(name) + r"\s*\(([^)]*)\)", self.code)
                assert found, f"a launch names {name}, which the source does not define"
                params = [p for p in found.group(1).split(",") if p.strip()]

                def launch(grid, block, args):
                    assert len(args) == len(params), (name, len(args), params)
                    outer.launched.append((name, grid, block, args))

                return launch

        self.RawModule = RawModule
        self.cuda = types.SimpleNamespace(get_cuda_path=lambda: None)

    def zeros(self, n, dtype):
        return np.zeros(n, dtype)


@pytest.mark.skipif(not nvcc_available(), reason="nvcc is not installed here")
def test_cuda_launches_match_the_plan_on_a_stand_in_cupy(tmp_path, softmax):
    reference, structure, config = softmax
    spec = get_spec("H100")
    plan = lower(structure, config, spec)
    source = render(plan)
    cp = _StandInCupy(tmp_path)
    kernel = CudaKernel(cp, plan, source)
    inputs = [np.zeros(b.shape, np.float32) for b in plan.inputs]
    outputs = [np.zeros(b.shape, np.float32) for b in plan.outputs]
    kernel(inputs, outputs)
    assert [name for name, *_ in cp.launched] == [ln.kernel for ln in kernel.launches]
    for _, grid, block, args in cp.launched:
        assert 1 <= grid[0] <= 2 ** 31 - 1 and 1 <= block[0] <= 1024
        assert any(a is outputs[0] for a in args) or any(a is kernel.ws for a in args)
    # every input reaches some launch, and every output is written by one
    passed = [id(a) for *_, args in cp.launched for a in args]
    assert all(id(x) in passed for x in inputs) and all(id(y) in passed for y in outputs)


def test_cuda_here_is_either_usable_or_says_why(softmax):
    ok, reason = cuda_available()
    if ok:
        pytest.skip("a GPU is usable here: tests/kernels/test_gpu.py runs it")
    with pytest.raises(DeviceUnavailable) as err:
        get_device("cuda")
    assert reason in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------- the Triton interpreter


def test_the_triton_interpreter_keeps_the_trial_contract(softmax):
    """The Triton dialect's device on this CPU: the same run_trial fields, a checked kernel
    reported as not timed (the interpreter's speed says nothing of a GPU's), an illegal config
    a status, no baseline, and a one-line why where Triton or torch is missing."""
    try:
        from kernels import TritonInterpreter

        device = TritonInterpreter("H100")
    except DeviceUnavailable as err:
        assert "\n" not in str(err) and str(err)
        return
    reference, structure, config = softmax
    assert device.kind == "triton-interpret" and device.dialect == "triton"
    assert device.key == "triton-interpret:H100" and device.spec.name == "H100"
    res = device.run_trial(structure, reference, {**config, "split": 1})
    assert TRIAL_FIELDS <= set(res) and res["status"] in TRIAL_STATUSES
    assert res["status"] == "runtime_error" and "not timed" in res["message"]
    assert "@triton.jit" in res["source"] and res["config"]["triton"] == 1
    bad = device.run_trial(structure, reference, {**config, "split": 2})  # rows split: refused
    assert bad["status"] == INVALID and "triton=1 cannot run" in bad["message"]
    assert device.time_baseline(reference) is None
