"""Lowering µGraphs to kernel plans, rendering CUDA / C++, devices, compiling and timing.

Names are resolved lazily: the isolated measurement worker imports this package on every
start, and should not pay for the IR and the verifier it does not use.
"""

from importlib import import_module

_EXPORTS = {
    "lower": "lower", "KernelPlan": "plan", "Level": "plan",
    "render": "render", "build_cpu": "build", "check_plan": "build", "CpuKernel": "build",
    "BuildResult": "build", "tolerance": "build",
    "default_config": "mapping", "astitch_rule": "mapping",
    "measure_program": "measure", "Measurement": "measure",
    "DeviceSpec": "devices", "GPU_SPECS": "devices", "get_spec": "devices",
    "local_cpu_spec": "devices", "cuda_device_spec": "devices", "device_key": "devices",
    "cuda_available": "devices", "roofline": "devices", "cache_root": "devices",
    "compile_cpp": "compile", "CompileError": "compile", "nvcc_check": "compile",
    "nvcc_available": "compile", "NvccReport": "compile", "KernelResources": "compile",
    "build_cuda": "cuda", "measure_program_cuda": "cuda", "CudaUnavailable": "cuda",
    "CudaKernel": "cuda", "launches": "cuda", "default_env": "measure",
    "run_isolated": "isolate", "IsolatedWorker": "isolate", "RunResult": "isolate",
    "STATUSES": "isolate", "measure": "timing", "Timing": "timing",
    "config_space": "space", "estimate": "space", "rank_structures": "space",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
