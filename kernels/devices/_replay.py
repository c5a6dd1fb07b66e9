"""The ``replay`` device: trials answered from timings recorded elsewhere, nothing built.

Kernel Tuner's simulation mode as one more device: a table of earlier results (a Kernel Tuner
cache file of a real GPU, or our own database's trials) answers each config, so search
strategies and the cost model can be compared on real measurements on a machine without that
device, through the same slots, driver and database as a live one.  A config missing from the
table is an ``invalid`` trial; a failed one keeps its recorded status.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kernels.hardware import DeviceSpec
from kernels.lowering import KernelPlan
from search.ir import KernelGraph

from ._base import Device, DeviceUnavailable, Execution
from ._isolate import IsolatedWorker
from ._status import INVALID


class ReplayDevice(Device):
    """``table`` maps ``key_of(config)`` to a recorded trial (the dict ``run_trial``
    returns); ``key`` is the recorded device's key, ``spec`` its limits and speeds."""

    kind = "replay"
    dialect = None

    def __init__(self, table: Mapping[str, Mapping[str, Any]],
                 key_of: Callable[[Mapping[str, int]], str], key: str, spec: DeviceSpec,
                 baseline_s: float | None = None) -> None:
        self.table, self.key_of = table, key_of
        self._key, self._spec, self.baseline_s = key, spec, baseline_s

    @property
    def key(self) -> str:
        return self._key

    @property
    def spec(self) -> DeviceSpec:
        return self._spec

    def run_trial(self, structure: KernelGraph, reference: KernelGraph,
                  config: Mapping[str, int], *, seed: int = 0, timing: Mapping | None = None,
                  worker: IsolatedWorker | None = None, timeout_s: float = 60.0
                  ) -> dict[str, Any]:
        found = self.table.get(self.key_of(config))
        if found is None:
            return {"status": INVALID, "config": dict(config), "source": None,
                    "message": f"config {dict(config)} is not in the replayed table"}
        return {**found, "config": dict(found.get("config") or config)}

    def time_baseline(self, reference: KernelGraph, *, seed: int = 0,
                      timing: Mapping | None = None, worker: IsolatedWorker | None = None,
                      timeout_s: float = 600.0) -> float | None:
        return self.baseline_s

    def execute(self, plan: KernelPlan, source: str, inputs: list, want: Any, *,
                timing: dict | None, worker: IsolatedWorker | None, timeout_s: float,
                baseline: KernelGraph | None = None) -> Execution:
        raise DeviceUnavailable("the replay device answers recorded trials; it runs no kernel")

    def load(self, plan: KernelPlan, source: str) -> Callable[..., list]:
        raise DeviceUnavailable("the replay device answers recorded trials; it runs no kernel")
