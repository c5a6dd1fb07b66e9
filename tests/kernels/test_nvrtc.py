"""The CUDA we render compiles under NVRTC, the compiler the cuda device uses, without a GPU.

``nvcc_check`` is not enough: nvcc includes cuda_runtime.h (and math.h) in every translation
unit and NVRTC includes nothing, so on an H100 16 kernels that nvcc had compiled here failed
under NVRTC with "identifier INFINITY is undefined".  These tests compile, with NVRTC and the
cuda device's options (``kernels.devices.NVRTC_OPTIONS``), every suite program's hand-written
structure at the paper's shapes with the default H100 config, and the configs
tests/kernels/test_gpu.py builds on a GPU for softmax_rows (a grid barrier, multi-warp row sums,
the three storage dtypes) and for tiles moved to global memory.  libnvrtc comes from the
nvidia-cuda-nvrtc wheel (the dev extra), the headers from the CUDA toolkit; where either is
missing they skip, saying which.
"""

from __future__ import annotations

import ctypes
from dataclasses import replace

import pytest
from support import small_config

from kernels import CompileError, lower, nvrtc_available, nvrtc_check, render
from kernels.devices import NVRTC_OPTIONS, nvrtc_include_dir


def _why_not() -> str | None:
    """Why NVRTC cannot compile the rendered CUDA here: no libnvrtc, or no cuda_fp16.h (NVRTC
    has no default include path; the wheel ships only the library)."""
    if not nvrtc_available():
        return "libnvrtc not found (pip install 'nvidia-cuda-nvrtc>=13,<14', in the dev extra)"
    if nvrtc_include_dir() is None:
        return "cuda_fp16.h not found for NVRTC (install a CUDA toolkit or set CUDA_HOME)"
    return None


WHY_NOT = _why_not()
needs_nvrtc = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")

PROGRAMS = ["rmsnorm_matmul", "gated_mlp", "lora", "gqa", "qknorm_gqa", "mha", "mqa", "ntrans",
            "softmax_rows", "rmsnorm_residual"]


def _cuda(structure, config, name: str) -> str:
    """The source the cuda device would hand NVRTC for this structure on an H100."""
    return render(lower(structure, config, "H100", name), "cuda")


@needs_nvrtc
@pytest.mark.parametrize("name", PROGRAMS)
def test_handwritten_structures_compile_under_nvrtc(name):
    from search import handwritten, load_program

    source = _cuda(handwritten(load_program(name)), None, name)
    assert "__global__" in source
    nvrtc_check(source, "sm_90")


def _softmax(shapes=None, dtype=None):
    from search import load_program

    program = load_program("softmax_rows", shapes)
    return replace(program, dtype=dtype) if dtype else program


# the configs tests/kernels/test_gpu.py builds for softmax_rows, at its shapes, and what each
# must exercise in the source
GPU_TEST_CONFIGS = {
    "grid_barrier": ({"rows": 8, "cols": 4096}, None, {"split": 4}, "grid_barrier("),
    "multi_warp": ({"rows": 16, "cols": 2048}, None, {"lanes": 256, "split": 1},
                   "group_sum<256>"),
    "float16": ({"rows": 64, "cols": 256}, "float16", None, "__half"),
    "bfloat16": ({"rows": 64, "cols": 256}, "bfloat16", None, "__nv_bfloat16"),
}


@needs_nvrtc
@pytest.mark.parametrize("case", sorted(GPU_TEST_CONFIGS))
def test_softmax_rows_gpu_test_configs_compile_under_nvrtc(case):
    from search import handwritten

    shapes, dtype, config, marker = GPU_TEST_CONFIGS[case]
    source = _cuda(handwritten(_softmax(shapes, dtype)), config, case)
    assert marker in source, (case, marker)
    nvrtc_check(source, "sm_90")


@needs_nvrtc
@pytest.mark.parametrize("name", ["softmax_rows", "rmsnorm_residual", "ntrans"])
def test_tiles_in_global_memory_compile_under_nvrtc(name):
    """test_gpu.py's smem_kb=0 configs: every tile in the workspace."""
    from search import handwritten, load_program

    structure = handwritten(load_program(name))
    config = {**small_config(structure), "block": 256, "lanes": 128, "smem_kb": 0}
    plan = lower(structure, config, "H100", f"g_{name}")
    assert plan.workspace_floats > 0, plan.summary()
    nvrtc_check(render(plan, "cuda"), "sm_90")


@needs_nvrtc
def test_nvrtc_sees_what_nvcc_hides_and_reports_the_log():
    """NVRTC includes no math.h: INFINITY is undefined unless the source defines it (the bug
    nvcc_check never saw).  The log names the line; the cuda device's options are passed."""
    bare = 'extern "C" __global__ void k(float* x) { x[0] = -INFINITY; }'
    with pytest.raises(CompileError, match="NVRTC failed for compute_90") as e:
        nvrtc_check(bare, "sm_90")
    assert 'identifier "INFINITY" is undefined' in e.value.log
    assert "kernel.cu(1)" in e.value.log
    defined = "#define INFINITY __int_as_float(0x7f800000)\n" + bare
    assert nvrtc_check(defined, "90") == ""
    # the headers every rendered module includes are found
    assert nvrtc_include_dir() is not None
    nvrtc_check("#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n" + defined, "sm_80")
    # --std=c++17 is passed: an inline variable is C++17
    assert NVRTC_OPTIONS == ("--std=c++17",)
    nvrtc_check("inline constexpr int kN = 4;\n" + defined)
    with pytest.raises(CompileError):
        nvrtc_check("inline constexpr int kN = 4;\n" + defined, options=("--std=c++14",))


def test_without_libnvrtc_the_error_says_how_to_install(monkeypatch):
    from kernels.devices import _nvrtc

    monkeypatch.setattr(_nvrtc, "_nvrtc", lambda: None)
    assert not _nvrtc.nvrtc_available()
    with pytest.raises(CompileError, match="pip install 'nvidia-cuda-nvrtc"):
        nvrtc_check('extern "C" __global__ void k() {}')
    with pytest.raises(ValueError, match="non-empty"):
        nvrtc_check("  ")


@needs_nvrtc
def test_the_library_loaded_is_a_real_nvrtc():
    from kernels.devices import _nvrtc, find_nvrtc, nvrtc_version

    path = find_nvrtc()
    assert path is not None and "nvrtc" in path
    major, _ = nvrtc_version() or (0, 0)
    assert major >= 12
    assert isinstance(_nvrtc._nvrtc(), ctypes.CDLL)
