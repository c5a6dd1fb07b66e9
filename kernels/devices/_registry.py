"""Which device a name means on this machine."""

from __future__ import annotations

from kernels.device_names import parse_device_name

from ._base import Device, DeviceUnavailable
from ._cpu import CpuDevice
from ._cuda import CudaDevice
from ._faults import drilled


def get_device(name: str = "cpu") -> Device:
    """``cpu``, ``cuda`` (GPU 0) or ``cuda:N`` (the grammar: ``kernels.parse_device_name``);
    raises ``DeviceUnavailable`` (one line: why) when it is not usable here and
    ``ValueError`` for a name that is no device of this machine."""
    kind, index = parse_device_name(name)
    if kind == "cpu":
        return drilled(CpuDevice())
    if kind == "cuda":
        return drilled(CudaDevice(index or 0))
    raise ValueError(f"unknown device {name!r}: {kind} is a job file's device, not this "
                     "machine's; use one of cpu, cuda, cuda:N")


__all__ = ["Device", "DeviceUnavailable", "get_device"]
