"""How ``TritonKernel`` launches on a GPU (``jit`` or the opt-in ``direct``), checked without
one: the mode is read from ``launch=`` or ``$TUNER_TRITON_LAUNCH`` and an unknown value is
refused; the launches derived from a plan are the ones its printed module makes; and the
direct path's argument plumbing runs against a stand-in for CuPy and Triton's compiled kernel
(the real launch is ``tests/kernels/test_gpu.py`` and ``benchmarks/launch_overhead.py``)."""

from __future__ import annotations

import types

import pytest

from kernels import get_spec, lower, render, triton_default_config
from kernels.devices import LAUNCH_ENV, TritonKernel, launch_mode
from kernels.rendering import triton_launches
from search import SUITE, handwritten, load_program

pytest.importorskip("triton", reason="Triton is not installed (the cuda extra)")


def test_the_launch_mode_defaults_to_direct_and_reads_the_environment(monkeypatch):
    monkeypatch.delenv(LAUNCH_ENV, raising=False)
    assert launch_mode() == "direct"
    monkeypatch.setenv(LAUNCH_ENV, " JIT ")
    assert launch_mode() == "jit"
    assert launch_mode("direct") == "direct"  # the argument wins over the environment
    monkeypatch.setenv(LAUNCH_ENV, "")
    assert launch_mode() == "direct"


def test_an_unknown_launch_mode_is_refused_with_the_choices(monkeypatch):
    monkeypatch.setenv(LAUNCH_ENV, "dlpak")
    with pytest.raises(ValueError, match=r"TUNER_TRITON_LAUNCH='dlpak'.*jit, direct"):
        launch_mode()
    with pytest.raises(ValueError, match=r"launch='fast'"):
        launch_mode("fast")


def _triton_plan(name: str):
    structure = handwritten(load_program(name))
    spec = get_spec("H100")
    return lower(structure, triton_default_config(structure, spec), spec, name)


@pytest.mark.parametrize("name", sorted(SUITE))
def test_a_plan_launches_each_kernel_once_on_its_grid_with_the_workspace_last(name):
    plan = _triton_plan(name)
    launches = triton_launches(plan)
    assert [ln.kernel for ln in launches] == [k.name for k in plan.kernels]
    for ln, k in zip(launches, plan.kernels, strict=True):
        assert ln.grid == (k.vblocks,)
        assert ln.args[-1] == len(plan.inputs) + len(plan.outputs)  # ws last
        assert dict(ln.options)["num_warps"] == max(1, k.mapping.threads // 32)


def test_a_split_k_kernel_launches_its_partials_then_its_epilogue():
    structure = handwritten(load_program("rmsnorm_matmul"))
    spec = get_spec("H100")
    plan = lower(structure, {**triton_default_config(structure, spec), "splitk": 4}, spec, "s")
    (k,) = plan.kernels
    partial, epilogue = triton_launches(plan)
    assert (partial.kernel, epilogue.kernel) == tuple(k.programs)
    assert partial.grid == (k.vblocks, 4) and epilogue.grid == (k.vblocks,)
    source = render(plan, "triton")
    assert source.index(partial.line) < source.index(epilogue.line)
    # with its last program finishing each virtual block: one launch of every program
    plan = lower(structure, {**triton_default_config(structure, spec), "splitk": 4,
                             "splitk_launches": 1}, spec, "s")
    (k,) = plan.kernels
    (joined,) = triton_launches(plan)
    assert joined.kernel == k.name == k.programs[0] and joined.grid == (k.vblocks, 4)


class _Array:
    """What the direct path reads of a CuPy array: ``.data.ptr``."""

    def __init__(self, ptr: int) -> None:
        self.data = types.SimpleNamespace(ptr=ptr)


class _Cupy:
    float32 = "float32"

    def __init__(self) -> None:
        self.device = 0
        self.cuda = types.SimpleNamespace(
            runtime=types.SimpleNamespace(getDevice=lambda: self.device),
            get_current_stream=lambda: types.SimpleNamespace(ptr=7))

    def zeros(self, n, dtype):
        return _Array(0x9000)


class _Compiled:
    def __init__(self, calls: list) -> None:
        self.function, self.packed_metadata = "fn", ("meta",)
        self.run = lambda *a: calls.append(("run", a))


class _Jit:
    """``kernel[grid](*args, **options)`` returning a stand-in CompiledKernel."""

    def __init__(self, calls: list, compiled) -> None:
        self.calls, self.compiled = calls, compiled

    def __getitem__(self, grid):
        def launch(*args, **options):
            self.calls.append(("jit", grid, [a.data_ptr() for a in args], options))
            return self.compiled
        return launch


def _direct_kernel(monkeypatch, compiled_factory=_Compiled):
    monkeypatch.setenv(LAUNCH_ENV, "direct")
    plan = _triton_plan("lora")
    kernel = TritonKernel(plan, render(plan, "triton"), cupy=_Cupy())
    assert kernel.launch_mode == "direct"
    calls: list = []
    (ln,) = kernel.launches
    kernel.module = types.SimpleNamespace(
        **{ln.kernel: _Jit(calls, compiled_factory(calls))},
        launch=lambda i, o, ws: calls.append(("module", [x.data_ptr() for x in i + o + [ws]])))
    return kernel, plan, calls


def test_direct_launches_through_triton_once_then_calls_the_launcher(monkeypatch):
    kernel, plan, calls = _direct_kernel(monkeypatch)
    (ln,) = kernel.launches
    xs = [_Array(0x1000 * (i + 1)) for i in range(len(plan.inputs))]
    outs = [_Array(0x8000)]
    ptrs = [x.data.ptr for x in xs] + [0x8000, 0x9000]
    kernel(xs, outs)
    assert calls == [("jit", ln.grid, [ptrs[i] for i in ln.args], dict(ln.options))]
    assert ln.options == (("num_warps", 4), ("num_stages", 3))
    calls.clear()
    kernel(xs, outs)
    assert calls == [("run", (*ln.grid, 1, 1, 7, "fn", ("meta",), None, None, None,
                              *[ptrs[i] for i in ln.args]))]
    calls.clear()
    kernel([_Array(0x1004), *xs[1:]], outs)  # misaligned: Triton's own dispatch this call
    assert [c[0] for c in calls] == ["module"]
    calls.clear()
    kernel.cp.device = 1  # another device: the kept kernel is not loaded there
    kernel(xs, outs)
    assert [c[0] for c in calls] == ["module"]


def test_direct_refuses_a_triton_whose_launch_returns_no_compiled_kernel(monkeypatch):
    kernel, plan, _ = _direct_kernel(monkeypatch, lambda calls: None)
    with pytest.raises(RuntimeError, match="launch with jit"):
        kernel([_Array(0x1000)] * len(plan.inputs), [_Array(0x8000)])


def test_direct_refuses_a_module_whose_launcher_differs_from_the_plan(monkeypatch):
    monkeypatch.setenv(LAUNCH_ENV, "direct")
    plan = _triton_plan("lora")
    source = render(plan, "triton").replace("num_warps=4", "num_warps=8")
    with pytest.raises(ValueError, match="does not make the call"):
        TritonKernel(plan, source, cupy=_Cupy())


def test_an_unknown_mode_fails_at_construction_and_the_interpreter_ignores_the_variable(
        monkeypatch):
    plan = _triton_plan("ntrans")
    source = render(plan, "triton")
    monkeypatch.setenv(LAUNCH_ENV, "graph")
    with pytest.raises(ValueError, match="unknown Triton launch mode"):
        TritonKernel(plan, source, cupy=_Cupy())
    pytest.importorskip("torch", reason="the interpreter's workspace is a torch tensor")
    assert TritonKernel(plan, source, interpret=True).launch_mode == "jit"
