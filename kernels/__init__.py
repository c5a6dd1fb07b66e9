"""Kernels: from a µGraph to a measured kernel, in three rooms.

- ``lowering/``: a structure + config → a ``KernelPlan`` for a device (AStitch memory levels,
  thread mapping, every decision that changes the code);
- ``rendering/``: a plan → CUDA or C++/OpenMP source (one printer, two dialects, syntax only),
  or Triton tile programs (the Triton dialect);
- ``devices/``: a plan + source → a built, checked and timed kernel (``cpu``, ``cuda``,
  ``replay`` behind one ``Device`` interface).

Beneath them: ``machine`` (this machine: its CPU, its copy bandwidth, whether a GPU is usable),
``device_names`` (the device-name grammar and device keys) and ``hardware`` (the device table:
limits, speeds, the roofline).  Above them: ``configspace`` (what a tuner may set, and roofline
estimates) and ``speedup`` (fused vs op by op).

Names resolve lazily: the isolated measurement worker imports this package on every start, and
should not pay for the IR and the verifier it does not use.
"""

from importlib import import_module

_EXPORTS = {
    # lowering
    "lower": "lowering", "concretize": "lowering", "KernelPlan": "lowering", "Level": "lowering",
    "default_config": "lowering", "triton_default_config": "lowering", "resolve_spec": "lowering", "astitch_rule": "lowering", "KNOBS": "lowering", "ZERO_OK": "lowering",
    # rendering
    "render": "rendering",
    # devices
    "Device": "devices", "DeviceUnavailable": "devices", "Execution": "devices",
    "get_device": "devices", "ReplayDevice": "devices", "IsolatedWorker": "devices",
    "RunResult": "devices", "run_isolated": "devices",
    "OK": "devices", "COMPILE_ERROR": "devices", "RUNTIME_ERROR": "devices", "TIMEOUT": "devices",
    "WRONG_RESULT": "devices", "INVALID": "devices", "NODE_LOST": "devices",
    "STATUSES": "devices", "TRIAL_STATUSES": "devices", "MEASUREMENT_STATUSES": "devices",
    "Timing": "devices", "measure": "devices", "compile_cpp": "devices",
    "timing_noise": "devices", "machine_load": "devices", "verdict": "devices", "TIE_LIMIT": "devices",
    "BUSY_SPREAD": "devices", "close_call": "devices",
    "CompileError": "devices", "nvcc_check": "devices", "nvcc_available": "devices",
    "nvrtc_check": "devices", "nvrtc_available": "devices",
    "random_inputs": "devices", "tolerance": "devices", "thread_env": "devices",
    "as_stored": "devices", "as_logical": "devices",
    "LibraryKernel": "devices", "library_kernel": "devices", "library_source": "devices",
    "LIBRARY": "devices", "TritonInterpreter": "devices",
    # the device table
    "DeviceSpec": "hardware", "GPU_SPECS": "hardware", "get_spec": "hardware",
    "local_cpu_spec": "hardware", "cpu_simd": "hardware", "cuda_device_spec": "hardware",
    "roofline": "hardware",
    # this machine
    "cuda_available": "machine", "cache_root": "machine",
    "measure_copy_bandwidth": "machine", "measure_cpu_bandwidth": "machine",
    # device names and keys
    "DEVICE_KINDS": "device_names", "DEVICE_NAME": "device_names", "REPLAY": "device_names",
    "parse_device_name": "device_names", "device_kind": "device_names",
    "device_key": "device_names", "replay_key": "device_names", "replayed_gpu": "device_names",
    # tuning helpers
    "ConfigSpace": "configspace", "config_space": "configspace", "estimate": "configspace",
    "rank_structures": "configspace", "legal": "configspace",
    "measure_program": "speedup", "Measurement": "speedup", "format_table": "speedup",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
