"""The one place that knows device limits and speeds.

Lowering reads the limits (shared memory, threads, resident blocks) to plan memory levels and
thread mappings; the tuner reads the speeds for a roofline prior; measurements are filed under a
device key so timings from different hardware never mix. Figures for GPUs are vendor datasheet
numbers (see docs/devices.md); the local CPU's copy bandwidth is measured once and cached.
"""

from __future__ import annotations

import json
import os
import platform
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

KiB = 1024
GPU_LAUNCH_OVERHEAD_S = 3e-6  # typical kernel launch + tail on a busy stream
CPU_LAUNCH_OVERHEAD_S = 5e-6  # opening and joining one OpenMP parallel region


@dataclass(frozen=True)
class DeviceSpec:
    """Limits and peak speeds of one device; bytes, FLOP/s and seconds throughout.

    For the CPU the GPU words map onto the C++ dialect: an "SM" is a core, a block runs on one
    thread, and "shared memory" is a block's tile buffer, sized to stay in the core's L2 cache.
    """

    name: str
    kind: str  # "cpu" | "cuda" | "hip" (an AMD GPU: a replayed device only, no runtime here)
    arch: str  # "sm_80", "sm_90", or the CPU's ISA level ("x86_64-avx512", ...)
    mem_bandwidth_gbs: float
    peak_fp16_tensor_flops: float  # dense, no sparsity; on a CPU the same as fp32
    peak_fp32_flops: float
    smem_per_block_default: int
    smem_per_block_optin: int
    smem_per_sm: int
    max_threads_per_block: int
    sm_count: int
    max_blocks_per_sm: int
    max_threads_per_sm: int
    registers_per_sm: int  # 32-bit registers; on a CPU the vector register file in 32-bit lanes
    max_registers_per_thread: int
    launch_overhead_s: float
    # caches (data or unified; bytes): the L1 of one SM / core, the L2 of one core (a CPU) or
    # of the chip (a GPU), and the last level (a CPU's L3; a GPU's L2)
    l1_bytes: int = 32 * KiB
    l2_bytes: int = 1024 * KiB
    llc_bytes: int = 32 * KiB * KiB

    def as_dict(self) -> dict:
        return asdict(self)


# Vendor datasheet figures: NVIDIA A100 (SXM4 80GB), H100 (SXM5 80GB), H200 (SXM 141GB) datasheets
# and the CUDA C++ Programming Guide's "Compute Capabilities" table for the per-SM limits; L1 is
# the combined L1 / shared memory of an SM (architecture whitepapers), L2 the chip's (A100 40 MB,
# H100 50 MB whitepapers; H200 as PyTorch read it on one, 60 MB).  A live GPU's limits and L2
# come from its driver (``cuda_device_spec``).
GPU_SPECS: dict[str, DeviceSpec] = {
    "A100": DeviceSpec(
        name="A100", kind="cuda", arch="sm_80",
        mem_bandwidth_gbs=2039.0,
        peak_fp16_tensor_flops=312e12, peak_fp32_flops=19.5e12,
        smem_per_block_default=48 * KiB, smem_per_block_optin=163 * KiB, smem_per_sm=164 * KiB,
        max_threads_per_block=1024, sm_count=108, max_blocks_per_sm=32,
        max_threads_per_sm=2048, registers_per_sm=65536, max_registers_per_thread=255,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        l1_bytes=192 * KiB, l2_bytes=40 * KiB * KiB, llc_bytes=40 * KiB * KiB,
    ),
    "H100": DeviceSpec(
        name="H100", kind="cuda", arch="sm_90",
        mem_bandwidth_gbs=3350.0,
        peak_fp16_tensor_flops=989.4e12, peak_fp32_flops=66.9e12,
        smem_per_block_default=48 * KiB, smem_per_block_optin=227 * KiB, smem_per_sm=228 * KiB,
        max_threads_per_block=1024, sm_count=132, max_blocks_per_sm=32,
        max_threads_per_sm=2048, registers_per_sm=65536, max_registers_per_thread=255,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        l1_bytes=256 * KiB, l2_bytes=50 * KiB * KiB, llc_bytes=50 * KiB * KiB,
    ),
    "H100 PCIe": DeviceSpec(
        name="H100 PCIe", kind="cuda", arch="sm_90",
        mem_bandwidth_gbs=2000.0,
        peak_fp16_tensor_flops=756e12, peak_fp32_flops=51.2e12,
        smem_per_block_default=48 * KiB, smem_per_block_optin=227 * KiB, smem_per_sm=228 * KiB,
        max_threads_per_block=1024, sm_count=114, max_blocks_per_sm=32,
        max_threads_per_sm=2048, registers_per_sm=65536, max_registers_per_thread=255,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        l1_bytes=256 * KiB, l2_bytes=50 * KiB * KiB, llc_bytes=50 * KiB * KiB,
    ),
    "H200": DeviceSpec(
        name="H200", kind="cuda", arch="sm_90",
        mem_bandwidth_gbs=4800.0,
        peak_fp16_tensor_flops=989.4e12, peak_fp32_flops=66.9e12,
        smem_per_block_default=48 * KiB, smem_per_block_optin=227 * KiB, smem_per_sm=228 * KiB,
        max_threads_per_block=1024, sm_count=132, max_blocks_per_sm=32,
        max_threads_per_sm=2048, registers_per_sm=65536, max_registers_per_thread=255,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        l1_bytes=256 * KiB, l2_bytes=60 * KiB * KiB, llc_bytes=60 * KiB * KiB,
    ),
    # GPUs whose Kernel Tuner timings we replay (../shared/data/kernel_tuner_caches): vendor
    # datasheet speeds; limits as their CUDA / ROCm generation has them. The MI250X row is one
    # of its two dies (GCDs), the unit a kernel runs on.
    "A100 PCIe": DeviceSpec(
        name="A100 PCIe", kind="cuda", arch="sm_80", mem_bandwidth_gbs=1555.0,
        peak_fp16_tensor_flops=312e12, peak_fp32_flops=19.5e12,
        smem_per_block_default=48 * KiB, smem_per_block_optin=163 * KiB, smem_per_sm=164 * KiB,
        max_threads_per_block=1024, sm_count=108, max_blocks_per_sm=32,
        max_threads_per_sm=2048, registers_per_sm=65536, max_registers_per_thread=255,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        l1_bytes=192 * KiB, l2_bytes=40 * KiB * KiB, llc_bytes=40 * KiB * KiB,
    ),
    "RTX A4000": DeviceSpec(
        name="RTX A4000", kind="cuda", arch="sm_86", mem_bandwidth_gbs=448.0,
        peak_fp16_tensor_flops=76.7e12, peak_fp32_flops=19.2e12,
        smem_per_block_default=48 * KiB, smem_per_block_optin=99 * KiB, smem_per_sm=100 * KiB,
        max_threads_per_block=1024, sm_count=48, max_blocks_per_sm=16,
        max_threads_per_sm=1536, registers_per_sm=65536, max_registers_per_thread=255,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        l1_bytes=128 * KiB, l2_bytes=4 * KiB * KiB, llc_bytes=4 * KiB * KiB,
    ),
    "RTX A6000": DeviceSpec(
        name="RTX A6000", kind="cuda", arch="sm_86", mem_bandwidth_gbs=768.0,
        peak_fp16_tensor_flops=154.8e12, peak_fp32_flops=38.7e12,
        smem_per_block_default=48 * KiB, smem_per_block_optin=99 * KiB, smem_per_sm=100 * KiB,
        max_threads_per_block=1024, sm_count=84, max_blocks_per_sm=16,
        max_threads_per_sm=1536, registers_per_sm=65536, max_registers_per_thread=255,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        l1_bytes=128 * KiB, l2_bytes=6 * KiB * KiB, llc_bytes=6 * KiB * KiB,
    ),
    "MI250X": DeviceSpec(
        name="MI250X", kind="hip", arch="gfx90a", mem_bandwidth_gbs=1638.0,
        peak_fp16_tensor_flops=191.5e12, peak_fp32_flops=23.95e12,
        smem_per_block_default=64 * KiB, smem_per_block_optin=64 * KiB, smem_per_sm=64 * KiB,
        max_threads_per_block=1024, sm_count=110, max_blocks_per_sm=32,
        max_threads_per_sm=2048, registers_per_sm=131072, max_registers_per_thread=512,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        l1_bytes=16 * KiB, l2_bytes=8 * KiB * KiB, llc_bytes=8 * KiB * KiB,
    ),
    "W6600": DeviceSpec(
        name="W6600", kind="hip", arch="gfx1032", mem_bandwidth_gbs=224.0,
        peak_fp16_tensor_flops=20.8e12, peak_fp32_flops=10.4e12,
        smem_per_block_default=64 * KiB, smem_per_block_optin=64 * KiB, smem_per_sm=128 * KiB,
        max_threads_per_block=1024, sm_count=28, max_blocks_per_sm=32,
        max_threads_per_sm=2048, registers_per_sm=131072, max_registers_per_thread=255,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        l1_bytes=16 * KiB, l2_bytes=2 * KiB * KiB, llc_bytes=32 * KiB * KiB,
    ),
    "W7800": DeviceSpec(
        name="W7800", kind="hip", arch="gfx1100", mem_bandwidth_gbs=576.0,
        peak_fp16_tensor_flops=90.5e12, peak_fp32_flops=45.2e12,
        smem_per_block_default=64 * KiB, smem_per_block_optin=64 * KiB, smem_per_sm=128 * KiB,
        max_threads_per_block=1024, sm_count=70, max_blocks_per_sm=32,
        max_threads_per_sm=2048, registers_per_sm=196608, max_registers_per_thread=255,
        launch_overhead_s=GPU_LAUNCH_OVERHEAD_S,
        l1_bytes=32 * KiB, l2_bytes=6 * KiB * KiB, llc_bytes=64 * KiB * KiB,
    ),
}


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


# ---------------------------------------------------------------- local CPU


@lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, str]:
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
    info = _cpuinfo()
    model = info.get("model name") or platform.processor() or platform.machine() or "unknown"
    return re.sub(r"\s+", " ", model.replace(":", "-")).strip()


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


def cpu_simd(spec: DeviceSpec) -> tuple[int, int]:
    """(fp32 lanes per vector register, vector registers) of a cpu spec, from its ISA level:
    AVX-512 has 32 registers of 16 lanes, AVX2 / AVX and SSE 16 of 8 and of 4.  A matmul's
    register tile must fit in them (``kernels.lowering`` picks its rows by this)."""
    isa = spec.arch.rsplit("-", 1)[-1]
    return {"avx512": (16, 32), "avx2": (8, 16), "avx": (8, 16)}.get(isa, (4, 16))


def _simd_lanes_fp32() -> tuple[int, str]:
    march = cpu_march()
    if march != "native":
        return MARCH_LANES[march]
    flags = set(_cpuinfo().get("flags", "").split())
    if "avx512f" in flags:
        return 16, "avx512"
    if "avx2" in flags or "avx" in flags:
        return 8, "avx2" if "avx2" in flags else "avx"
    return 4, "sse"  # also the honest floor for non-x86 128-bit SIMD


def _cache_bytes(level: int, default: int) -> int:
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


# Device names: what a job file, the CLI, the API and get_device accept.  ``cuda`` is GPU 0
# (in a job file: every GPU), ``cuda:N`` GPU number N; ``replay`` is a job file's device for
# recorded (Kernel Tuner) spaces, no hardware.  Device keys (below) name the hardware itself.
DEVICE_KINDS = ("cpu", "cuda")  # the kinds of a machine's devices (get_device's)
REPLAY = "replay"
DEVICE_NAME = re.compile(rf"{DEVICE_KINDS[0]}|{REPLAY}|{DEVICE_KINDS[1]}(?::(\d+))?")


def parse_device_name(text: str) -> tuple[str, int | None]:
    """``cpu`` -> ("cpu", None), ``cuda`` -> ("cuda", None), ``cuda:N`` -> ("cuda", N),
    ``replay`` -> ("replay", None); ``ValueError`` (naming the grammar) for anything else."""
    m = DEVICE_NAME.fullmatch(text)
    if m is None:
        raise ValueError(f"unknown device {text!r}; use one of cpu, cuda, cuda:N"
                         f" (or {REPLAY} in a job file)")
    return text.partition(":")[0], None if m.group(1) is None else int(m.group(1))


def device_kind(name_or_key: str) -> str:
    """The kind a device name (``cuda:1``) or device key (``cuda:NVIDIA H100:sm_90``,
    ``replay:A100``) names: its first word, checked against the kinds."""
    kind = name_or_key.partition(":")[0]
    if kind not in (*DEVICE_KINDS, REPLAY):
        raise ValueError(f"{name_or_key!r} names no device kind; kinds: "
                         f"{', '.join((*DEVICE_KINDS, REPLAY))}")
    return kind


def replay_key(gpu: str) -> str:
    """The device key of a recorded (Kernel Tuner) space timed on ``gpu``: ``replay:<gpu>``."""
    return f"{REPLAY}:{gpu}"


def replayed_gpu(key: str) -> str | None:
    """The GPU a ``replay:<GPU>`` device key names; None for any other key."""
    kind, sep, gpu = key.partition(":")
    return gpu if kind == REPLAY and sep else None


def device_key(kind: str = "cpu", index: int = 0) -> str:
    """Name the hardware: 'cpu:<model>:<cores>c' or 'cuda:<gpu name>:sm_<cc>'.

    Timings are only comparable under one key, so the key holds everything that changes them
    and nothing that does not (no hostname: two identical machines share measurements).
    """
    if kind == "cpu":
        march = cpu_march()  # kernels built for another ISA level are another device
        return f"cpu:{cpu_model()}:{cpu_cores()}c" + ("" if march == "native" else f":{march}")
    if kind == "cuda":
        ok, reason = cuda_available()
        if not ok:
            raise RuntimeError(f"device_key('cuda'): no CUDA device usable: {reason}")
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(index)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return f"cuda:{name.replace(':', '-')}:sm_{props['major']}{props['minor']}"
    raise ValueError(f"device_key: unknown device kind {kind!r}; use 'cpu' or 'cuda'")


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
    key = f"cpu:{cpu_model()}:{cpu_cores()}c"  # the machine's, whatever ISA kernels target
    path = cache_root() / "cpu_bandwidth.json"
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        table = {}
    if not refresh and key in table and (size_mb is None or table[key]["size_mb"] == size_mb):
        return table[key]
    if size_mb is None:
        size_mb = max(256, _cache_bytes(3, 0) // KiB**2)
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


@lru_cache(maxsize=4)
def _local_cpu_spec_cached(root: str, size_mb: int | None) -> DeviceSpec:
    bw = measure_cpu_bandwidth(size_mb)
    info = _cpuinfo()
    cores = cpu_cores()
    lanes, isa = _simd_lanes_fp32()
    try:
        ghz = float(info.get("cpu MHz", "0")) / 1000.0
    except ValueError:
        ghz = 0.0
    ghz = ghz or 2.0  # no clock reported: a conservative guess, documented in docs/devices.md
    # Two FMA pipes per core (2 FLOPs each) on every core: an upper bound, like the GPU peaks.
    peak = cores * ghz * 1e9 * lanes * 2 * 2
    l1, l2 = _cache_bytes(1, 32 * KiB), _cache_bytes(2, 1024 * KiB)
    return DeviceSpec(
        name=cpu_model(), kind="cpu", arch=f"{platform.machine()}-{isa}",
        mem_bandwidth_gbs=float(bw["copy_gbs"]),
        peak_fp16_tensor_flops=peak, peak_fp32_flops=peak,
        smem_per_block_default=l2 // 2, smem_per_block_optin=l2, smem_per_sm=l2,
        max_threads_per_block=1024, sm_count=cores, max_blocks_per_sm=1,
        max_threads_per_sm=1, registers_per_sm=(32 if isa == "avx512" else 16) * lanes,
        max_registers_per_thread=(32 if isa == "avx512" else 16) * lanes,
        launch_overhead_s=CPU_LAUNCH_OVERHEAD_S,
        l1_bytes=l1, l2_bytes=l2, llc_bytes=_cache_bytes(3, 32 * KiB * KiB),
    )


def local_cpu_spec(size_mb: int | None = None) -> DeviceSpec:
    """Spec of this machine's CPU; the first call may spend ~1 s measuring bandwidth."""
    return _local_cpu_spec_cached(str(cache_root()), size_mb)


def get_spec(name: str) -> DeviceSpec:
    """Spec by table name ('A100', 'H100', 'H200', 'cpu') or by a device key / CUDA name.

    A CUDA name matches the most specific row whose words all appear in it, so
    'NVIDIA H100 PCIe' gets the PCIe row and 'NVIDIA H100 80GB HBM3' the SXM one.
    """
    if name.lower() == "cpu" or name.startswith("cpu:"):
        return local_cpu_spec()
    gpu_name = name.split(":")[1] if name.startswith("cuda:") else name
    words = set(re.split(r"[\s_-]+", gpu_name.lower()))
    for short in sorted(GPU_SPECS, key=len, reverse=True):
        if set(short.lower().split()) <= words:
            spec = GPU_SPECS[short]
            return spec if gpu_name == short else replace(spec, name=gpu_name)
    raise KeyError(f"no device spec for {name!r}; known: {', '.join(GPU_SPECS)}, cpu "
                   "(add a row to GPU_SPECS in kernels/devices.py)")


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


def cuda_device_spec(index: int = 0) -> DeviceSpec:
    """Spec of a live GPU: speeds from the table row its name matches, limits from the driver.

    The driver is the authority on limits (a MIG slice has fewer SMs than the datasheet).
    """
    ok, reason = cuda_available()
    if not ok:
        raise RuntimeError(f"cuda_device_spec({index}): no CUDA device usable: {reason}")
    import cupy

    p = cupy.cuda.runtime.getDeviceProperties(index)
    name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
    base = get_spec(name)
    return replace(
        base, name=name, arch=f"sm_{p['major']}{p['minor']}",
        smem_per_block_default=p.get("sharedMemPerBlock", base.smem_per_block_default),
        smem_per_block_optin=p.get("sharedMemPerBlockOptin", base.smem_per_block_optin),
        smem_per_sm=p.get("sharedMemPerMultiprocessor", base.smem_per_sm),
        max_threads_per_block=p.get("maxThreadsPerBlock", base.max_threads_per_block),
        sm_count=p.get("multiProcessorCount", base.sm_count),
        max_blocks_per_sm=p.get("maxBlocksPerMultiProcessor", base.max_blocks_per_sm),
        max_threads_per_sm=p.get("maxThreadsPerMultiProcessor", base.max_threads_per_sm),
        registers_per_sm=p.get("regsPerMultiprocessor", base.registers_per_sm),
        l2_bytes=p.get("l2CacheSize", base.l2_bytes), llc_bytes=p.get("l2CacheSize", base.llc_bytes),
    )


# ---------------------------------------------------------------- roofline


def roofline(bytes_moved: float, flops: float, launches: int, spec: DeviceSpec,
             *, tensor_cores: bool = False) -> float:
    """Lower-bound seconds: max(memory time, compute time) + one launch overhead per launch.

    A prior for ranking, not a prediction: it assumes perfect overlap and peak speeds.
    """
    if bytes_moved < 0 or flops < 0 or launches < 0:
        raise ValueError(f"roofline: bytes_moved={bytes_moved}, flops={flops}, "
                         f"launches={launches} must all be >= 0")
    peak = spec.peak_fp16_tensor_flops if tensor_cores else spec.peak_fp32_flops
    mem_s = bytes_moved / (spec.mem_bandwidth_gbs * 1e9)
    return max(mem_s, flops / peak) + launches * spec.launch_overhead_s
