"""Compilers: C++ to a cached shared library, and an nvcc/ptxas resource check for CUDA (the
NVRTC compile check is ``_nvrtc.py``).

Both cache on disk by a hash of everything that changes the output (source, flags, compiler
version, and for -march=native the CPU), because the tuner rebuilds the same candidate often and
a compile costs far more than a run. Cache writes go to a temp file then os.replace, so
concurrent workers sharing the cache never see a half-written library.
"""

from __future__ import annotations

import hashlib
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
