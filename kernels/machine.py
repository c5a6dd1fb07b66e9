"""This machine: what its CPU is, how fast it copies, whether a CUDA GPU is usable.

The local facts the device table (``kernels.hardware``) and the device keys
(``kernels.device_names``) are built from: the CPU's model, cores, ISA level and caches read from
/proc and sysfs, its copy bandwidth measured once and cached on disk (under ``cache_root``, where
every on-disk cache of the kernels package lives), and a probe of cupy for a GPU.
"""

from __future__ import annotations

import json
import os
import platform
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

import numpy as np

KiB = 1024


def cache_root() -> Path:
    """Root of every on-disk cache of the kernels package; TUNER_CACHE_DIR overrides it."""
    env = os.environ.get("TUNER_CACHE_DIR")
    root = Path(env).expanduser() if env else Path.home() / ".cache" / "tuner"
    root.mkdir(parents=True, exist_ok=True)
    return root


def write_json_atomic(path: Path, data: object) -> None:
    """Write JSON so a concurrent reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ---------------------------------------------------------------- the CPU


@lru_cache(maxsize=1)
def cpu_info() -> dict[str, str]:
    """First processor block of /proc/cpuinfo (empty off Linux)."""
    info: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.split("\n\n", 1)[0].splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            info[k.strip()] = v.strip()
    return info


def cpu_model() -> str:
    """CPU model name with whitespace collapsed and ':' removed (it separates key fields)."""
    info = cpu_info()
    model = info.get("model name") or platform.processor() or platform.machine() or "unknown"
    return re.sub(r"\s+", " ", model.replace(":", "-")).strip()


def cpu_name() -> str:
    """What names this CPU in a device key: its model name, and where that carries no model
    number (a hypervisor's generic name: Zen 3 and Zen 4 machines both report "AMD EPYC",
    yet one runs AVX2 code and the other AVX-512) the family and model the CPU reports."""
    model, info = cpu_model(), cpu_info()
    family, number = info.get("cpu family"), info.get("model")
    if re.search(r"\d", model) or not (family and number):
        return model
    return f"{model} (family {family} model {number})"


def cpu_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


MARCH_ENV = "TUNER_CPU_MARCH"  # e.g. x86-64-v3: build cpu kernels for that ISA, not -march=native
# what each x86-64 level may use (the psABI levels): v2 SSE4.2, v3 AVX2 + FMA, v4 AVX-512
MARCH_LANES = {"x86-64-v2": (4, "sse4"), "x86-64-v3": (8, "avx2"), "x86-64-v4": (16, "avx512")}


def cpu_march() -> str:
    """The -march cpu kernels are built for: ``native`` unless ``TUNER_CPU_MARCH`` names an ISA
    level, to measure the AVX2 or SSE code paths on a machine that has AVX-512."""
    march = os.environ.get(MARCH_ENV, "").strip() or "native"
    if march != "native" and march not in MARCH_LANES:
        raise ValueError(f"{MARCH_ENV}={march!r}: use one of native, {', '.join(MARCH_LANES)}")
    return march


def cpu_vector_isa() -> tuple[int, str]:
    """(fp32 lanes of one vector register, ISA name) cpu kernels are built for: the ``TUNER_CPU_MARCH``
    level's, or the widest this CPU's flags name."""
    march = cpu_march()
    if march != "native":
        return MARCH_LANES[march]
    flags = set(cpu_info().get("flags", "").split())
    if "avx512f" in flags:
        return 16, "avx512"
    if "avx2" in flags or "avx" in flags:
        return 8, "avx2" if "avx2" in flags else "avx"
    return 4, "sse"  # also the honest floor for non-x86 128-bit SIMD


def cpu_cache_bytes(level: int, default: int) -> int:
    """Size of the cpu0 cache at `level` (unified or data) from sysfs."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")):
        try:
            if int((idx / "level").read_text()) != level:
                continue
            if (idx / "type").read_text().strip() == "Instruction":
                continue
            size = (idx / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)", size)
        if m:
            return int(m.group(1)) * {"": 1, "K": KiB, "M": KiB**2, "G": KiB**3}[m.group(2)]
    return default


def measure_copy_bandwidth(nbytes: int, repeats: int, threads: int) -> float:
    """Best-of-`repeats` copy bandwidth in GB/s, counting bytes read + bytes written (STREAM)."""
    n = nbytes // 4
    src = np.ones(n, dtype=np.float32)
    dst = np.zeros_like(src)  # touch every page before timing
    parts = [slice(int(a), int(b)) for a, b in zip(
        np.linspace(0, n, threads + 1)[:-1], np.linspace(0, n, threads + 1)[1:], strict=True)]
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:  # numpy releases the GIL while copying
        for _ in range(repeats):
            t0 = time.perf_counter()
            if threads == 1:
                np.copyto(dst, src)
            else:
                list(pool.map(lambda s: np.copyto(dst[s], src[s]), parts))
            best = min(best, time.perf_counter() - t0)
    return 2 * n * 4 / best / 1e9


def measure_cpu_bandwidth(size_mb: int | None = None, repeats: int = 4,
                          refresh: bool = False) -> dict:
    """Copy bandwidth of this CPU (one thread and all cores), measured once and cached on disk.

    The array is at least 256 MB and at least the last-level cache, so the copy streams from
    DRAM rather than cache. The cache file is keyed by device key, so a shared home directory
    across different machines keeps each machine's own figure. A busy machine measures low:
    pass refresh=True (or delete the entry) to measure again when it is quiet.
    """
    key = f"cpu:{cpu_name()}:{cpu_cores()}c"  # the machine's, whatever ISA kernels target
    path = cache_root() / "cpu_bandwidth.json"
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    if not refresh and key in table and (size_mb is None or table[key]["size_mb"] == size_mb):
        return table[key]
    if size_mb is None:
        size_mb = max(256, cpu_cache_bytes(3, 0) // KiB**2)
    if size_mb <= 0:
        raise ValueError(f"measure_cpu_bandwidth: size_mb must be positive, got {size_mb}")
    nbytes = size_mb * KiB**2
    entry = {
        "size_mb": size_mb,
        "copy_1t_gbs": round(measure_copy_bandwidth(nbytes, repeats, 1), 2),
        "copy_gbs": round(measure_copy_bandwidth(nbytes, repeats, cpu_cores()), 2),
        "threads": cpu_cores(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        # Other processes lower the figure; the load says how much to trust it.
        "loadavg_1min": round(os.getloadavg()[0], 2),
    }
    try:  # re-read so a concurrent measurement of another key is not lost
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    table[key] = entry
    write_json_atomic(path, table)
    return entry


# ---------------------------------------------------------------- CUDA


def cuda_available() -> tuple[bool, str]:
    """(True, what was found) or (False, one-line reason); never raises."""
    try:
        import cupy
    except ImportError:
        return False, "cupy is not installed (pip install 'mugraph-tuner[cuda]')"
    except Exception as e:  # a broken install raises all sorts at import time
        return False, f"cupy failed to import: {type(e).__name__}: {e}".splitlines()[0]
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # CUDARuntimeError without a driver, etc.
        return False, f"cupy found no usable CUDA driver/GPU: {e}".splitlines()[0]
    if n == 0:
        return False, "cupy found no CUDA GPU"
    try:
        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    except Exception as e:
        return False, f"cupy could not query GPU 0: {e}".splitlines()[0]
    return True, f"{n} CUDA GPU(s), device 0: {name}"
