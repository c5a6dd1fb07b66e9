"""Fault drills: a device that makes chosen trials of its own fail for real.

``TUNER_FAULT_TRIALS=crash@1,hang@3,compile@5`` makes the 1st trial of each device in this
process segfault (cpu) or fault on an illegal address (cuda), the 3rd never return and the 5th
fail to compile (``slow@N``: the Nth computes the right result, ~0.1 s late).  The faults are real kernels, so a drill exercises the whole isolation path
of a launch — worker replaced, trial stored with its status, tuning goes on — where a mock
could not.  ``get_device`` wraps a device in ``FaultDrill`` only when the variable is set.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from kernels.hardware import DeviceSpec
from kernels.lowering import KernelPlan
from search.ir import KernelGraph

from ._base import Device, Execution

FAULT_ENV = "TUNER_FAULT_TRIALS"
FAULTS = {  # statements put first in the first kernel's body
    "crash": "{ volatile float* p = nullptr; *p = 1.0f; }",  # SIGSEGV / illegal address
    "hang": "for (volatile int spin = 0; ; ) { (void)spin; }",  # never returns
    "compile": "this does not compile;",
    # correct but slow: 400M dependent steps first (~0.1 s; 20M, ~6 ms, lost to numpy on a
    # loaded machine), so the library path wins
    "slow": "for (volatile long spin = 0; spin < 400000000; spin = spin + 1) { }",
}
ENTRIES = ('extern "C" void kernel(', 'extern "C" __global__')


def parse_faults(text: str) -> dict[int, str]:
    """``crash@1,hang@3`` -> {1: "crash", 3: "hang"}; unknown kinds are refused."""
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        kind, _, at = item.partition("@")
        if kind not in FAULTS or not at.isdigit():
            raise ValueError(f"{FAULT_ENV}: {item!r} is not KIND@N with KIND one of "
                             f"{', '.join(FAULTS)} and N a trial number")
        out[int(at)] = kind
    return out


def inject(source: str, kind: str) -> str:
    """``source`` with the fault ``kind`` first in the body of its first entry point."""
    at = min((i for i in (source.find(e) for e in ENTRIES) if i >= 0), default=-1)
    if at < 0:
        raise ValueError("inject: no kernel entry point in the source")
    body = source.index("{", at) + 1
    return source[:body] + "\n  " + FAULTS[kind] + source[body:]


class FaultDrill(Device):
    """``inner`` with the faults of ``faults`` (trial number -> kind) in its own trials."""

    def __init__(self, inner: Device, faults: Mapping[int, str]) -> None:
        self.inner, self.faults = inner, dict(faults)
        self.kind, self.dialect = inner.kind, inner.dialect  # type: ignore[misc]
        self.trials = 0
        self._due: str | None = None

    @property
    def key(self) -> str:
        return self.inner.key

    @property
    def spec(self) -> DeviceSpec:
        return self.inner.spec

    def stored(self, plan: KernelPlan, inputs: Any) -> Any:
        return self.inner.stored(plan, inputs)

    def compute_dtype(self, plan: KernelPlan) -> str:
        return self.inner.compute_dtype(plan)

    def render(self, plan: KernelPlan) -> str:
        source = self.inner.render(plan)
        due, self._due = self._due, None
        return inject(source, due) if due else source

    def execute(self, *args: Any, **kwargs: Any) -> Execution:
        return self.inner.execute(*args, **kwargs)

    def time_baseline(self, *args: Any, **kwargs: Any) -> float | None:
        return self.inner.time_baseline(*args, **kwargs)

    def load(self, plan: KernelPlan, source: str) -> Callable[..., list]:
        return self.inner.load(plan, source)

    def run_trial(self, structure: KernelGraph, reference: KernelGraph,
                  config: Mapping[str, int], **kwargs: Any) -> dict[str, Any]:
        self.trials += 1
        self._due = self.faults.get(self.trials)
        return super().run_trial(structure, reference, config, **kwargs)


def drilled(device: Device) -> Device:
    """``device`` wrapped in a ``FaultDrill`` when ``TUNER_FAULT_TRIALS`` asks for one."""
    text = os.environ.get(FAULT_ENV, "")
    return FaultDrill(device, parse_faults(text)) if text.strip() else device
