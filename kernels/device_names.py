"""Device names and device keys: the one grammar of what names a device.

A device name is what a job file, the CLI, the API and ``get_device`` accept: ``cpu``, ``cuda``
(GPU 0; in a job file: every GPU), ``cuda:N`` (GPU number N), and ``replay``, a job file's device
for recorded (Kernel Tuner) spaces, no hardware.  A device key names the hardware itself
(``cpu:<model>:<cores>c``, ``cuda:<gpu name>:sm_<cc>``, ``replay:<gpu>``): measurements are filed
under it so timings from different hardware never mix.
"""

from __future__ import annotations

import re

from kernels.machine import cpu_cores, cpu_march, cpu_name, cuda_available

CPU, CUDA = "cpu", "cuda"
DEVICE_KINDS = (CPU, CUDA)  # the kinds of a machine's devices (get_device's)
REPLAY = "replay"
# one alternative per kind: a new kind adds its own (and its branch in device_key)
DEVICE_NAME = re.compile(rf"{CPU}|{REPLAY}|{CUDA}(?::(\d+))?")


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
        return f"cpu:{cpu_name()}:{cpu_cores()}c" + ("" if march == "native" else f":{march}")
    if kind == "cuda":
        ok, reason = cuda_available()
        if not ok:
            raise RuntimeError(f"device_key('cuda'): no CUDA device usable: {reason}")
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(index)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        return f"cuda:{name.replace(':', '-')}:sm_{props['major']}{props['minor']}"
    raise ValueError(f"device_key: unknown device kind {kind!r}; use 'cpu' or 'cuda'")
