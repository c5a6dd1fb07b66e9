"""Devices: where plans become kernels that are built, run, checked and timed.

One small interface (``Device``: ``lower``, ``render``, ``execute``, ``check``,
``time_baseline``, ``load``, ``run_trial``) with ``cpu``, ``cuda`` and ``replay`` behind it,
one timing loop (``measure`` with a ``Clock``), one numeric check against the program's float
reference, and the isolated worker every kernel runs in.  ``get_device("cpu" | "cuda" |
"cuda:N")`` gives this machine's device.

Names resolve lazily: the isolated worker imports this package on every start and should not
pay for lowering, the renderer and the verifier, which its jobs never touch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

_EXPORTS = {
    "Device": "_base", "DeviceUnavailable": "_base", "Execution": "_base",
    "TRIAL_TIMING": "_base", "field_check": "_base",
    "CpuDevice": "_cpu", "CpuKernel": "_cpu", "default_env": "_cpu", "thread_env": "_cpu",
    "CudaDevice": "_cuda", "CudaKernel": "_cuda", "KernelLaunch": "_cuda",
    "launches": "_cuda", "to_storage": "_storage", "from_storage": "_storage",
    "EventClock": "_cuda", "STORAGE": "_storage", "cupy_arith": "_cuda", "build_kernel": "_cuda",
    "ReplayDevice": "_replay",
    "TritonInterpreter": "_triton", "TritonKernel": "_triton", "compile_plan": "_triton",
    "sass": "_triton", "triton_available": "_triton", "launch_mode": "_triton",
    "LAUNCH_ENV": "_triton",
    "LibraryKernel": "_library", "library_kernel": "_library", "library_source": "_library",
    "LIBRARY": "_library",
    "FaultDrill": "_faults", "FAULT_ENV": "_faults",
    "Expected": "_check", "expected": "_check", "random_inputs": "_check",
    "input_roles": "_check", "input_layouts": "_check", "as_stored": "_check",
    "as_logical": "_check",
    "reference": "_check", "tolerance": "_check", "TOLERANCE": "_check",
    "rounding_slack": "_check",
    "compile_cpp": "_compile", "CompileError": "_compile", "nvcc_check": "_compile",
    "nvcc_available": "_compile", "find_nvcc": "_compile", "NvccReport": "_compile",
    "nvrtc_check": "_nvrtc", "nvrtc_available": "_nvrtc", "find_nvrtc": "_nvrtc",
    "nvrtc_version": "_nvrtc", "nvrtc_include_dir": "_nvrtc", "NVRTC_OPTIONS": "_nvrtc",
    "KernelResources": "_compile", "normalize_arch": "_compile", "DEFAULT_CPP_FLAGS": "_compile", "cpp_flags": "_compile",
    "IsolatedWorker": "_isolate", "RunResult": "_isolate", "run_isolated": "_isolate",
    "compare_outputs": "_worker", "judge_outputs": "_worker",
    "timing_noise": "_noise", "loaded": "_noise", "verdict": "_noise", "Verdict": "_noise",
    "TIE_LIMIT": "_noise", "BUSY_SPREAD": "_noise", "close_call": "_noise",
    "machine_load": "_cpu", "combine_cpp": "_batch",
    "measure": "_timing", "Timing": "_timing", "Clock": "_timing", "HostClock": "_timing",
    "get_device": "_registry",
    "OK": "_status", "COMPILE_ERROR": "_status", "RUNTIME_ERROR": "_status", "TIMEOUT": "_status",
    "WRONG_RESULT": "_status", "INVALID": "_status", "NODE_LOST": "_status",
    "STATUSES": "_status", "TRIAL_STATUSES": "_status", "MEASUREMENT_STATUSES": "_status",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from ._base import Device, DeviceUnavailable, Execution  # noqa: F401
    from ._registry import get_device  # noqa: F401


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kernels.devices' has no attribute {name!r}")
    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
