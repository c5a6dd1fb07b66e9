"""Compilers: C++ to a cached shared library, an nvcc/ptxas resource check for CUDA, and an
NVRTC compile check with the cuda device's own options.

The first two cache on disk by a hash of everything that changes the output (source, flags, compiler
version, and for -march=native the CPU), because the tuner rebuilds the same candidate often and
a compile costs far more than a run. Cache writes go to a temp file then os.replace, so
concurrent workers sharing the cache never see a half-written library.  The NVRTC check caches
nothing: it runs in-process in a fraction of a second.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from kernels.device_names import device_key
from kernels.machine import cache_root, cpu_march, write_json_atomic

DEFAULT_CPP_FLAGS: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")


def cpp_flags() -> tuple[str, ...]:
    """The flags cpu kernels are built with: ``DEFAULT_CPP_FLAGS`` for this machine's ISA, or
    for the level ``TUNER_CPU_MARCH`` names (``kernels.machine.cpu_march``)."""
    march = cpu_march()
    return tuple(f"-march={march}" if f == "-march=native" else f for f in DEFAULT_CPP_FLAGS)


class CompileError(Exception):
    """A compiler rejected the source; `log` holds its full stderr."""

    def __init__(self, message: str, log: str = ""):
        super().__init__(message)
        self.message = message
        self.log = log

    def __str__(self) -> str:
        tail = "\n".join(self.log.strip().splitlines()[-30:])
        return f"{self.message}\n{tail}" if tail else self.message


def _run(cmd: list[str], timeout_s: float, what: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError as e:
        raise CompileError(f"{what}: compiler {cmd[0]!r} not found on PATH") from e
    except subprocess.TimeoutExpired as e:
        raise CompileError(f"{what}: {cmd[0]} took longer than {timeout_s:.0f} s",
                           (e.stderr or b"").decode(errors="replace")
                           if isinstance(e.stderr, bytes) else (e.stderr or "")) from e


@lru_cache(maxsize=8)
def compiler_version(compiler: str) -> str:
    """First line of `<compiler> --version`; part of every cache key."""
    out = _run([compiler, "--version"], 30, "compiler_version")
    if out.returncode != 0:
        raise CompileError(f"{compiler} --version failed", out.stderr)
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    # nvcc prints its release on the last line; gcc/clang on the first.
    return lines[-1] if "nvcc" in compiler else (lines[0] if lines else "")


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


# ---------------------------------------------------------------- C++ -> .so


def compile_cpp(source: str, *, flags: tuple[str, ...] | list[str] | None = None,
                compiler: str = "g++", timeout_s: float = 300.0) -> Path:
    """Compile C++ source into a shared library and return its path (cached by content).

    The source is kept next to the library (<hash>.cpp) so a failing kernel can be read later.
    """
    if not isinstance(source, str) or not source.strip():
        raise ValueError("compile_cpp: source must be a non-empty string of C++ code")
    flags = tuple(flags) if flags is not None else cpp_flags()
    machine = device_key("cpu") if any(f.startswith("-march=native") for f in flags) else ""
    key = _digest(source, " ".join(flags), compiler_version(compiler), machine)
    out_dir = cache_root() / "cpp"
    lib = out_dir / f"{key}.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tuner-cc-") as tmp:
        src = Path(tmp) / "kernel.cpp"
        src.write_text(source)
        # Temp output inside the cache dir so os.replace is a same-filesystem rename.
        fd, tmp_lib = tempfile.mkstemp(prefix=f"{key}.", suffix=".so.tmp", dir=out_dir)
        os.close(fd)
        try:
            res = _run([compiler, *flags, str(src), "-o", tmp_lib], timeout_s, "compile_cpp")
            if res.returncode != 0:
                raise CompileError(f"compile_cpp: {compiler} failed (exit {res.returncode})",
                                   res.stderr.replace(str(src), "kernel.cpp"))
            os.replace(tmp_lib, lib)
        finally:
            Path(tmp_lib).unlink(missing_ok=True)
    keep = out_dir / f"{key}.cpp"
    if not keep.exists():
        fd, tmp_src = tempfile.mkstemp(prefix=f"{key}.", suffix=".cpp.tmp", dir=out_dir)
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp_src, keep)
    return lib


# ---------------------------------------------------------------- nvcc / ptxas


@dataclass(frozen=True)
class KernelResources:
    """What ptxas reports for one __global__ function (bytes unless named otherwise)."""

    name: str  # as ptxas prints it (mangled unless extern "C")
    demangled: str
    registers: int
    spill_stores: int
    spill_loads: int
    smem_bytes: int  # static __shared__ only; dynamic shared memory is chosen at launch
    stack_bytes: int
    barriers: int

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


@dataclass(frozen=True)
class NvccReport:
    arch: str
    kernels: dict[str, KernelResources]
    seconds: float  # wall time of the nvcc run that produced this report
    cached: bool
    log: str = field(repr=False, default="")

    def kernel(self, name: str) -> KernelResources:
        """Look a kernel up by mangled name, demangled name, or bare function name."""
        for k in self.kernels.values():
            bare = re.sub(r"<.*>", "", k.demangled.split("(")[0]).split()[-1]
            if name in (k.name, k.demangled, bare, bare.split("::")[-1]):
                return k
        raise KeyError(f"no kernel {name!r} in nvcc report for {self.arch}; "
                       f"found: {', '.join(self.kernels) or 'none'}")

    @property
    def any_spills(self) -> bool:
        return any(k.spills for k in self.kernels.values())


def find_nvcc() -> str | None:
    """nvcc on PATH, else under $CUDA_HOME or /usr/local/cuda."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    return None


def nvcc_available() -> bool:
    return find_nvcc() is not None


def normalize_arch(arch: str) -> str:
    """'sm_90', 'sm90', '90', '9.0' -> 'sm_90' (also 'sm_90a')."""
    m = re.fullmatch(r"(?:sm_?)?(\d)\.?(\d)([a-z]?)", str(arch).strip().lower())
    if not m:
        raise ValueError(f"nvcc_check: arch {arch!r} not understood; use e.g. 'sm_80' or 'sm_90'")
    return f"sm_{m.group(1)}{m.group(2)}{m.group(3)}"


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_PROPS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_PROPS_FOR = re.compile(r"Function properties for (\S+)")


def parse_ptxas(log: str) -> dict[str, dict]:
    """Per-entry-function resources from `ptxas -v` output (CUDA 11-13 format).

    Stack/spill lines follow a "Function properties for NAME" line; those of non-inlined
    device functions are skipped, only entry functions (kernels) are reported.
    """
    kernels: dict[str, dict] = {}
    current: dict | None = None
    props_for: str | None = None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = kernels.setdefault(m.group(1), {
                "name": m.group(1), "registers": 0, "spill_stores": 0, "spill_loads": 0,
                "smem_bytes": 0, "stack_bytes": 0, "barriers": 0})
            continue
        m = _PROPS_FOR.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = _PROPS.search(line)
        if m:
            if current is not None and props_for == current["name"]:
                current["stack_bytes"], current["spill_stores"], current["spill_loads"] = map(
                    int, m.groups())
            continue
        m = _USED.search(line)
        if m and current is not None:
            current["registers"] = int(m.group(1))
            b = re.search(r"used (\d+) barriers", line)
            s = re.search(r"(\d+) bytes smem", line)
            current["barriers"] = int(b.group(1)) if b else 0
            current["smem_bytes"] = int(s.group(1)) if s else 0
            current = None  # the "Used" line closes an entry's block
    return kernels


def _demangle(names: list[str]) -> dict[str, str]:
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    try:
        out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True,
                             timeout=30).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return {n: n for n in names}
    return dict(zip(names, out, strict=False)) if len(out) == len(names) else {n: n for n in names}


def nvcc_check(source: str, arch: str, *, flags: tuple[str, ...] | list[str] = (),
               timeout_s: float = 300.0) -> NvccReport:
    """Compile CUDA source to a cubin for `arch` and report registers, spills and static smem.

    Only device code is compiled (--cubin): it is what ptxas reports on, and it skips the host
    compiler, which makes the check ~4x faster than `-c`. Results are cached by content.
    """
    if not isinstance(source, str) or not source.strip():
        raise ValueError("nvcc_check: source must be a non-empty string of CUDA code")
    arch = normalize_arch(arch)
    nvcc = find_nvcc()
    if nvcc is None:
        raise CompileError("nvcc_check: nvcc not found (install the CUDA toolkit or set "
                           "CUDA_HOME)")
    flags = tuple(flags)
    key = _digest(source, arch, " ".join(flags), compiler_version(nvcc))
    path = cache_root() / "nvcc" / f"{key}.json"
    if path.exists():
        try:
            data = json.loads(path.read_text())
            kernels = {n: KernelResources(**k) for n, k in data["kernels"].items()}
            return NvccReport(arch, kernels, data["seconds"], True, data["log"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable cache entry: recompile and overwrite it
    with tempfile.TemporaryDirectory(prefix="tuner-nvcc-") as tmp:
        src = Path(tmp) / "kernel.cu"
        src.write_text(source)
        cmd = [nvcc, f"-arch={arch}", "-Xptxas", "-v", "--cubin", *flags, str(src),
               "-o", str(Path(tmp) / "kernel.cubin")]
        t0 = time.perf_counter()
        res = _run(cmd, timeout_s, "nvcc_check")
        seconds = time.perf_counter() - t0
    log = (res.stdout + res.stderr).replace(str(src), "kernel.cu")
    if res.returncode != 0:
        raise CompileError(f"nvcc_check: nvcc failed for {arch} (exit {res.returncode})", log)
    raw = parse_ptxas(log)
    names = _demangle(list(raw))
    kernels = {n: KernelResources(demangled=names[n], **k) for n, k in raw.items()}
    write_json_atomic(path, {"kernels": {n: asdict(k) for n, k in kernels.items()},
                             "seconds": seconds, "log": log, "arch": arch})
    return NvccReport(arch, kernels, seconds, False, log)


# ---------------------------------------------------------------- NVRTC

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
