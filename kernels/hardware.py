"""The device table: the limits and speeds of each device, and the roofline they give.

Lowering reads the limits (shared memory, threads, resident blocks) to plan memory levels and
thread mappings; the tuner reads the speeds for a roofline prior.  Figures for GPUs are vendor
datasheet numbers (see docs/devices.md), a live GPU's limits come from its driver, and the local
CPU's row is built from what ``kernels.machine`` reads and measures.  Device names and keys are
``kernels.device_names``.
"""

from __future__ import annotations

import platform
import re
from dataclasses import asdict, dataclass, replace
from functools import lru_cache

from kernels.device_names import CPU, CUDA
from kernels.machine import (
    KiB,
    cache_root,
    cpu_cache_bytes,
    cpu_cores,
    cpu_info,
    cpu_model,
    cpu_vector_isa,
    cuda_available,
    measure_cpu_bandwidth,
)

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


# ---------------------------------------------------------------- the local CPU


@lru_cache(maxsize=4)
def _local_cpu_spec_cached(root: str, size_mb: int | None) -> DeviceSpec:
    bw = measure_cpu_bandwidth(size_mb)
    info = cpu_info()
    cores = cpu_cores()
    lanes, isa = cpu_vector_isa()
    try:
        ghz = float(info.get("cpu MHz", "0")) / 1000.0
    except ValueError:
        ghz = 0.0
    ghz = ghz or 2.0  # no clock reported: a conservative guess, documented in docs/devices.md
    # Two FMA pipes per core (2 FLOPs each) on every core: an upper bound, like the GPU peaks.
    peak = cores * ghz * 1e9 * lanes * 2 * 2
    l1, l2 = cpu_cache_bytes(1, 32 * KiB), cpu_cache_bytes(2, 1024 * KiB)
    return DeviceSpec(
        name=cpu_model(), kind="cpu", arch=f"{platform.machine()}-{isa}",
        mem_bandwidth_gbs=float(bw["copy_gbs"]),
        peak_fp16_tensor_flops=peak, peak_fp32_flops=peak,
        smem_per_block_default=l2 // 2, smem_per_block_optin=l2, smem_per_sm=l2,
        max_threads_per_block=1024, sm_count=cores, max_blocks_per_sm=1,
        max_threads_per_sm=1, registers_per_sm=(32 if isa == "avx512" else 16) * lanes,
        max_registers_per_thread=(32 if isa == "avx512" else 16) * lanes,
        launch_overhead_s=CPU_LAUNCH_OVERHEAD_S,
        l1_bytes=l1, l2_bytes=l2, llc_bytes=cpu_cache_bytes(3, 32 * KiB * KiB),
    )


def local_cpu_spec(size_mb: int | None = None) -> DeviceSpec:
    """Spec of this machine's CPU; the first call may spend ~1 s measuring bandwidth."""
    return _local_cpu_spec_cached(str(cache_root()), size_mb)


def cpu_simd(spec: DeviceSpec) -> tuple[int, int]:
    """(fp32 lanes per vector register, vector registers) of a cpu spec, from its ISA level:
    AVX-512 has 32 registers of 16 lanes, AVX2 / AVX and SSE 16 of 8 and of 4.  A matmul's
    register tile must fit in them (``kernels.lowering`` picks its rows by this)."""
    isa = spec.arch.rsplit("-", 1)[-1]
    return {"avx512": (16, 32), "avx2": (8, 16), "avx": (8, 16)}.get(isa, (4, 16))


def get_spec(name: str) -> DeviceSpec:
    """Spec by table name ('A100', 'H100', 'H200', 'cpu') or by a device key / CUDA name.

    A CUDA name matches the most specific row whose words all appear in it, so
    'NVIDIA H100 PCIe' gets the PCIe row and 'NVIDIA H100 80GB HBM3' the SXM one.
    """
    cpu, cuda = CPU, CUDA
    kind, sep, rest = name.partition(":")
    if name.lower() == cpu or (kind == cpu and sep):
        return local_cpu_spec()
    gpu_name = rest.split(":")[0] if kind == cuda and sep else name
    words = set(re.split(r"[\s_-]+", gpu_name.lower()))
    for short in sorted(GPU_SPECS, key=len, reverse=True):
        if set(short.lower().split()) <= words:
            spec = GPU_SPECS[short]
            return spec if gpu_name == short else replace(spec, name=gpu_name)
    raise KeyError(f"no device spec for {name!r}; known: {', '.join(GPU_SPECS)}, cpu "
                   "(add a row to GPU_SPECS in kernels/hardware.py)")


# ---------------------------------------------------------------- CUDA


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
