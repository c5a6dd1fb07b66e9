"""NVRTC on a machine without a GPU: the CUDA-C source compiled as the cuda device compiles
it (CuPy's RawModule is NVRTC), so what NVRTC refuses is found by ``make test``.

nvcc includes ``<math.h>`` and the CUDA runtime headers on its own and NVRTC does not: on an
H100, 16 CUDA-C kernels that ``nvcc_check`` had passed failed there with "identifier INFINITY
is undefined".  libnvrtc comes from NVIDIA's ``nvidia-cuda-nvrtc`` wheel (the dev extra) or a
CUDA toolkit; the fp16 / bf16 headers from the toolkit.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import re
from functools import lru_cache
from pathlib import Path

from ._compile import CompileError, find_nvcc, normalize_arch

# What the cuda device hands NVRTC (CuPy's RawModule, kernels/devices/_cuda.py) besides the
# include directory of cuda_fp16.h / cuda_bf16.h; nvrtc_check passes the same.  The one place
# that knows them.
NVRTC_OPTIONS: tuple[str, ...] = ("--std=c++17",)
# What CuPy appends to every NVRTC compile after the caller's options (cupy.cuda.compiler).
_CUPY_APPENDS: tuple[str, ...] = ("-ftz=true",)
_NVRTC_HINT = ("install the NVRTC wheel (pip install 'nvidia-cuda-nvrtc>=13,<14', in the dev "
               "extra) or a CUDA toolkit with lib64/libnvrtc.so, or set CUDA_HOME")


def _cuda_roots() -> list[Path]:
    """CUDA toolkit roots, in the order CuPy's get_cuda_path looks: $CUDA_HOME / $CUDA_PATH,
    the folder above nvcc's, /usr/local/cuda."""
    nvcc = find_nvcc()
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
             str(Path(nvcc).resolve().parent.parent) if nvcc else None, "/usr/local/cuda"]
    out: list[Path] = []
    for r in roots:
        if r and Path(r).is_dir() and Path(r) not in out:
            out.append(Path(r))
    return out


def _nvidia_wheel_dirs() -> list[Path]:
    """The folders NVIDIA's pip wheels install into (site-packages/nvidia/<cu13|cuda_nvrtc|…>)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    roots = list(spec.submodule_search_locations or []) if spec else []
    return sorted({d for r in roots if Path(r).is_dir() for d in Path(r).iterdir() if d.is_dir()})


def _so_version(path: Path) -> tuple[int, ...]:
    """libnvrtc.so.13 -> (13,): the newest library first when several are installed."""
    tail = path.name.partition(".so")[2]
    return tuple(int(n) for n in re.findall(r"\d+", tail))


def find_nvrtc() -> str | None:
    """libnvrtc: from the nvidia-cuda-nvrtc wheel (nvidia/cu13/lib for CUDA 13,
    nvidia/cuda_nvrtc/lib for 12), else the CUDA toolkit's lib64, else the loader's search path
    (``ctypes.util.find_library``).  The wheel comes first: it is what ``make test`` installs,
    on machines whose toolkit (nvcc) ships without NVRTC."""
    found: list[Path] = []
    for d in _nvidia_wheel_dirs():
        found += sorted((d / "lib").glob("libnvrtc.so*"), key=_so_version, reverse=True)
    for root in _cuda_roots():
        found += sorted((root / "lib64").glob("libnvrtc.so*"), key=_so_version, reverse=True)
    for f in found:
        if f.is_file():
            return str(f)
    return ctypes.util.find_library("nvrtc")


@lru_cache(maxsize=1)
def _nvrtc() -> ctypes.CDLL | None:
    path = find_nvrtc()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    p, c = ctypes.POINTER, ctypes.c_char_p
    lib.nvrtcCreateProgram.argtypes = [p(ctypes.c_void_p), c, c, ctypes.c_int, p(c), p(c)]
    lib.nvrtcCompileProgram.argtypes = [ctypes.c_void_p, ctypes.c_int, p(c)]
    lib.nvrtcGetProgramLogSize.argtypes = [ctypes.c_void_p, p(ctypes.c_size_t)]
    lib.nvrtcGetProgramLog.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.nvrtcDestroyProgram.argtypes = [p(ctypes.c_void_p)]
    lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    lib.nvrtcVersion.argtypes = [p(ctypes.c_int), p(ctypes.c_int)]
    for fn in ("nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetProgramLogSize",
               "nvrtcGetProgramLog", "nvrtcDestroyProgram", "nvrtcVersion"):
        getattr(lib, fn).restype = ctypes.c_int
    return lib


def nvrtc_available() -> bool:
    return _nvrtc() is not None


def nvrtc_version() -> tuple[int, int] | None:
    """(major, minor) of the libnvrtc ``nvrtc_check`` uses; None where there is none."""
    lib = _nvrtc()
    if lib is None:
        return None
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    return major.value, minor.value


@lru_cache(maxsize=1)
def nvrtc_include_dir() -> str | None:
    """Where cuda_fp16.h / cuda_bf16.h are: NVRTC has no default include path, and the rendered
    CUDA includes both.  A wheel's include folder (nvidia-cuda-runtime's nvidia/cu13/include),
    else the toolkit's include (what the cuda device passes: CuPy's CUDA path + /include)."""
    dirs = [d / "include" for d in _nvidia_wheel_dirs()] + [r / "include" for r in _cuda_roots()]
    for d in dirs:
        if (d / "cuda_fp16.h").is_file() and (d / "cuda_bf16.h").is_file():
            return str(d)
    return None


def _nvrtc_arch(arch: str) -> str:
    """'sm_90' (or '90', '9.0', 'sm_90a') -> 'compute_90': NVRTC compiles to PTX, as CuPy does."""
    return "compute_" + normalize_arch(arch).removeprefix("sm_")


def nvrtc_check(source: str, arch: str = "sm_90",
                options: tuple[str, ...] | list[str] = NVRTC_OPTIONS) -> str:
    """Compile CUDA source to PTX with NVRTC as the cuda device does, and return NVRTC's log
    (warnings; usually empty).

    ``nvcc_check`` cannot stand in for this: nvcc includes cuda_runtime.h (and with it math.h)
    in every translation unit, NVRTC includes nothing, so a source that uses INFINITY or a libm
    name without its header compiles under nvcc and fails on the GPU machine (as 16 kernels did
    on an H100).  The options are the device's (``NVRTC_OPTIONS``), the include directory of
    cuda_fp16.h / cuda_bf16.h (``nvrtc_include_dir``), ``--gpu-architecture=compute_XX`` for
    ``arch``, and what CuPy appends (``-ftz=true``).  CuPy's own header folders (CCCL,
    cupy/) are not passed: the rendered CUDA includes none of them.  Raises ``CompileError``
    with the log when NVRTC rejects the source, and one saying how to install NVRTC where no
    libnvrtc is found.
    """
    if not isinstance(source, str) or not source.strip():
        raise ValueError("nvrtc_check: source must be a non-empty string of CUDA code")
    target = _nvrtc_arch(arch)
    lib = _nvrtc()
    if lib is None:
        raise CompileError(f"nvrtc_check: libnvrtc not found; {_NVRTC_HINT}")
    include = nvrtc_include_dir()
    opts = [*options, *((f"-I{include}",) if include else ()), f"--gpu-architecture={target}",
            *_CUPY_APPENDS]
    prog = ctypes.c_void_p()
    err = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernel.cu", 0, None,
                                 None)
    if err != 0:
        raise CompileError(f"nvrtc_check: nvrtcCreateProgram failed: "
                           f"{lib.nvrtcGetErrorString(err).decode()}")
    try:
        argv = (ctypes.c_char_p * len(opts))(*(o.encode() for o in opts))
        err = lib.nvrtcCompileProgram(prog, len(opts), argv)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(max(1, size.value))
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    if err != 0:
        what = lib.nvrtcGetErrorString(err).decode()
        hint = "" if include else (" (no cuda_fp16.h found: install the CUDA toolkit's headers "
                                   "or set CUDA_HOME)")
        raise CompileError(f"nvrtc_check: NVRTC failed for {target} ({what}){hint}", log)
    return log
