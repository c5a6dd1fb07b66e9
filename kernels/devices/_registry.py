"""Which device a name means on this machine."""

from __future__ import annotations

from ._base import Device, DeviceUnavailable
from ._cpu import CpuDevice
from ._cuda import CudaDevice
from ._faults import drilled

DEVICE_KINDS = ("cpu", "cuda")  # what a job file may name (cuda:N picks a GPU)


def get_device(name: str = "cpu") -> Device:
    """``cpu``, ``cuda`` (GPU 0) or ``cuda:N``; raises ``DeviceUnavailable`` (one line: why)
    when it is not usable here and ``ValueError`` for a name that is no device."""
    kind, _, index = name.partition(":")
    if kind == "cpu" and not index:
        return drilled(CpuDevice())
    if kind == "cuda" and (not index or index.isdigit()):
        return drilled(CudaDevice(int(index or 0)))
    raise ValueError(f"unknown device {name!r}; use one of cpu, cuda, cuda:N")


__all__ = ["DEVICE_KINDS", "Device", "DeviceUnavailable", "get_device"]
