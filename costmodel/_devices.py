"""What the cost model knows of a device: the table's row, or what its data carries, or none.

There are hundreds of GPUs and ``kernels/hardware.py`` lists a handful, so a device the table
lacks is not an error here.  ``device_profile(key)`` gives

- the table's row (``kernels.get_spec``) where there is one: its speeds are features;
- otherwise the *closest known sibling*'s row under the device's own name — same vendor, the
  nearest architecture where the key names one (``sm_86``, ``gfx1100``), else the row whose
  name shares the most words — so lowering has limits to plan with, and the features carry a
  flag saying the speeds are a sibling's, not the device's.  The model learns the rest from
  the device's own measurements: a per-device offset of the level and, from a few measured
  configs, a per-device mix of the known devices' rankings (``CostModel.adapt``).

What is unknown is said in one line per device (``DeviceProfile.note``, ``unknown_devices``:
the CLI prints it, a launch logs it), never raised.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import lru_cache

from kernels import GPU_SPECS, DeviceSpec, get_spec, replayed_gpu

AMD_WORDS = {"amd", "radeon", "instinct", "gfx", "rocm"}


@dataclass(frozen=True)
class DeviceProfile:
    """A device as the cost model sees it: a spec to lower and featurize with, and whether
    its speeds are its own (``known``) or its sibling's (``sibling`` names the row)."""

    key: str
    spec: DeviceSpec
    known: bool
    sibling: str | None = None

    @property
    def note(self) -> str | None:
        """The one line saying what is unknown (None for a device the table knows)."""
        if self.known:
            return None
        return (f"device {self.key!r} is not in kernels/hardware.py's table: its speeds are "
                f"unknown; the cost model uses {self.sibling}'s row (closest known sibling) "
                "and learns the rest from this device's measurements")


def _arch_number(arch: str) -> tuple[str, int] | None:
    m = re.search(r"(sm_|gfx)(\d+)", arch)
    return (m.group(1), int(m.group(2))) if m else None


def sibling_spec(name: str, arch: str | None = None) -> DeviceSpec:
    """The table row closest to an unknown GPU ``name`` (see the module docstring)."""
    words = set(re.split(r"[\s_\-]+", name.lower()))
    amd = bool(words & AMD_WORDS) or (arch or "").startswith("gfx") or any(
        w.startswith(("mi", "w")) and w[1:].isdigit() for w in words)
    rows = [s for s in GPU_SPECS.values() if (s.kind == "hip") == amd]
    want = _arch_number(arch or "")
    if want:
        same = [s for s in rows if (a := _arch_number(s.arch)) and a[0] == want[0]]
        if same:
            return min(same, key=lambda s: (abs(_arch_number(s.arch)[1] - want[1]),  # type: ignore[index]
                                            -s.mem_bandwidth_gbs))
    # no architecture: the row sharing most name words; ties: the median bandwidth of the kind
    by_bw = sorted(rows, key=lambda s: s.mem_bandwidth_gbs)
    median = by_bw[len(by_bw) // 2]
    return max(rows, key=lambda s: (len(words & set(s.name.lower().split())),
                                    s is median, -abs(s.mem_bandwidth_gbs
                                                      - median.mem_bandwidth_gbs)))


@lru_cache(maxsize=256)
def device_profile(device_key: str) -> DeviceProfile:
    """The device of ``device_key`` (``replay:<GPU>``, ``cuda:<name>:sm_NN``, ``cpu:...``)."""
    name = replayed_gpu(device_key) or device_key
    try:
        return DeviceProfile(device_key, get_spec(name), True)
    except KeyError:
        pass
    parts = name.split(":")
    gpu = parts[1] if parts[0] == "cuda" and len(parts) > 1 else name
    arch = parts[2] if parts[0] == "cuda" and len(parts) > 2 else None
    sib = sibling_spec(gpu, arch)
    return DeviceProfile(device_key, replace(sib, name=gpu, arch=arch or sib.arch), False,
                         sib.name)


def spec_for_key(device_key: str) -> DeviceSpec:
    """The spec the cost model lowers and featurizes ``device_key``'s kernels with: the
    table's row, or its closest sibling's (never an error)."""
    return device_profile(device_key).spec


def unknown_devices(keys: Iterable[str]) -> list[str]:
    """The notes of the devices among ``keys`` the table does not know (one line each)."""
    return [p.note for k in sorted(keys) if (p := device_profile(k)).note]
