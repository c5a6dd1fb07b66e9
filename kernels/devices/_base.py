"""The device interface: build a plan, run it, check it, time it.

A ``Device`` is where kernels run, named by a device key (``kernels.device_names.device_key``).
Devices that compile kernels (``cpu``, ``cuda``) share one flow, ``Device.check``: render the
plan in the device's dialect, round random inputs to what the device stores, compute the
expected outputs from the *program's* reference (``_check``), then ``execute`` — the one step
each device implements — builds the kernel, runs it once in an isolated worker, compares, and
times it with the one timing loop.  ``run_trial`` is the tuner's unit of measurement on top of
that: lower a structure with a config, re-check the bound graph in the finite field, check and
time it; a device that answers from recorded timings (``replay``) overrides just that.

Every outcome comes back as a status (``STATUSES``), never as an exception, so a tuner can
record a bad candidate and go on.
"""

from __future__ import annotations

import math
import socket
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from kernels.hardware import DeviceSpec
from kernels.lowering import KernelPlan, concretize, lower
from kernels.rendering import TritonUnsupported, render
from search.ir import KernelGraph, ShapeError
from verifier import equivalent

from ._check import Expected, as_logical, as_stored, expected, random_inputs
from ._isolate import IsolatedWorker
from ._noise import timing_noise
from ._status import COMPILE_ERROR, INVALID, OK, RUNTIME_ERROR, WRONG_RESULT

TRIAL_TIMING = {"warmup": 1, "min_repeats": 5, "budget_s": 0.3, "target_rse": 0.03}
FIELD_CHECK_MAX_ELEMS = 1 << 18  # bound graphs larger than this skip the full-shape field check


class DeviceUnavailable(RuntimeError):
    """The device cannot be used here; the message is one line saying why."""


@dataclass
class Execution:
    """A kernel built, run once against the expected outputs and (optionally) timed.

    ``status`` is one of ``STATUSES``; ``timing`` and ``baseline`` are ``Timing.as_dict()``
    (the op-by-op reference timed in the same worker, when asked for)."""

    status: str
    message: str
    plan: KernelPlan
    source: str
    max_abs_err: list[float] = field(default_factory=list)
    outputs: list[np.ndarray] = field(default_factory=list)
    timing: dict | None = None
    baseline: dict | None = None
    artifact: str | None = None  # what was built (the cpu's shared library), when a file

    @property
    def ok(self) -> bool:
        return self.status == OK


class Device(ABC):
    """A place kernels are built, checked and timed (see the module docstring)."""

    kind: ClassVar[str]  # "cpu" | "cuda" | "replay" | "triton-interpret"
    dialect: ClassVar[str | None] = None  # the renderer's dialect (None: builds nothing)

    @property
    @abstractmethod
    def key(self) -> str:
        """The device key measurements are filed under."""

    @property
    @abstractmethod
    def spec(self) -> DeviceSpec:
        """Limits and speeds (lowering and the roofline read them)."""

    # ---------------------------------------------------------------- the four steps
    def lower(self, structure: KernelGraph, config: Mapping[str, int] | None = None,
              name: str = "prog") -> KernelPlan:
        """A structure bound with ``config`` (default: the AStitch rule) as this device's plan."""
        return lower(structure, config, self.spec, name)

    def render(self, plan: KernelPlan) -> str:
        if self.dialect is None:
            raise DeviceUnavailable(f"the {self.kind} device builds no kernels")
        return render(plan, self.dialect)

    def stored(self, plan: KernelPlan, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``inputs`` as the kernel will see them (rounded to its storage dtype), as float32."""
        return [np.ascontiguousarray(x, np.float32) for x in inputs]

    def compute_dtype(self, plan: KernelPlan) -> str:
        """The dtype the kernel computes in, which sets the tolerance of its check."""
        return "float32"

    @abstractmethod
    def execute(self, plan: KernelPlan, source: str, inputs: list[np.ndarray],
                want: Expected | None, *, timing: dict | None, worker: IsolatedWorker | None,
                timeout_s: float, baseline: KernelGraph | None = None) -> Execution:
        """Build ``source``, run it once on ``inputs`` in an isolated worker, compare with
        ``want``, then time it (``timing``: ``measure`` arguments, None: run once) and, given
        ``baseline``, time that graph op by op on the same inputs in the same worker."""

    # ---------------------------------------------------------------- the flow
    def check(self, plan: KernelPlan, reference: KernelGraph, *, source: str | None = None,
              inputs: Sequence[np.ndarray] | None = None, seed: int = 0,
              timing: dict | None = None, worker: IsolatedWorker | None = None,
              timeout_s: float = 60.0, baseline: KernelGraph | None = None) -> Execution:
        """Run ``plan`` against the float reference of ``reference`` (the program's graph at
        the plan's shapes) and time it; ``source`` replaces the rendering (any text with the
        same entry points).  ``inputs`` are the arrays the kernel takes: for an input of
        layout "transposed" that is the stored array, the contiguous transpose of its logical
        last two dims (``as_stored``); the reference reads them back at logical shapes."""
        if source is None:
            try:
                source = self.render(plan)
            except TritonUnsupported as err:  # a plan the chosen dialect cannot print
                return Execution(COMPILE_ERROR, f"the triton dialect cannot print this "
                                 f"plan: {err}", plan, "")
        layouts = [b.layout for b in plan.inputs]
        if inputs is None:  # drawn at logical shapes; a transposed input is passed stored
            inputs = as_stored(random_inputs(reference, seed), layouts)
        xs = self.stored(plan, inputs)
        want = expected(reference, as_logical(xs, layouts), self.compute_dtype(plan))
        return self.execute(plan, source, xs, want, timing=timing, worker=worker,
                            timeout_s=timeout_s, baseline=baseline)

    def build(self, structure: KernelGraph, config: Mapping[str, int] | None = None, *,
              reference: KernelGraph | None = None, name: str = "prog",
              **check: Any) -> Execution:
        """``lower`` then ``check``; the reference defaults to the bound structure itself
        (pass the program's graph, as the tuner does, to check against the program)."""
        bound, _, _ = concretize(structure, config, self.spec)
        plan = self.lower(structure, config, name)
        return self.check(plan, reference if reference is not None else bound, **check)

    @abstractmethod
    def time_baseline(self, reference: KernelGraph, *, seed: int = 0,
                      timing: Mapping | None = None, worker: IsolatedWorker | None = None,
                      timeout_s: float = 600.0) -> float | None:
        """Median seconds of ``reference`` run op by op by this device's library (numpy on a
        cpu, CuPy on a GPU): the baseline every speedup is against.  None: not measurable."""

    @abstractmethod
    def load(self, plan: KernelPlan, source: str) -> Callable[..., list]:
        """A checked kernel as a callable in this process (only for kernels that passed
        ``check``: a faulty one would take this process down)."""

    # ---------------------------------------------------------------- the tuner's trial
    def run_trial(self, structure: KernelGraph, reference: KernelGraph,
                  config: Mapping[str, int], *, seed: int = 0, timing: Mapping | None = None,
                  worker: IsolatedWorker | None = None, timeout_s: float = 60.0
                  ) -> dict[str, Any]:
        """Check and time ``structure`` bound by ``config``: the tuner's unit of measurement.

        Two verification layers belong to a config (architecture.md): the bound graph is
        re-checked against the reference in the finite field at the job's shapes (when small
        enough to interpret quickly), and the built kernel against the program's float
        reference.  Returns ``status`` (``STATUSES`` plus "invalid" for a config that does not
        lower), ``message``, ``median_s``/``spread_s``/``samples`` and ``noise`` (why the
        timing is noisy, or None: ``timing_noise``) when ok, ``max_error``,
        ``source``, ``config`` (with the knobs the rule filled in), ``kernels``, ``host``."""
        out: dict[str, Any] = {"status": INVALID, "message": "", "config": dict(config),
                               "host": socket.gethostname(), "source": None}
        timing = {**TRIAL_TIMING, **(timing or {})}
        t0 = time.perf_counter()
        try:
            bound, _, _ = concretize(structure, config, self.spec)
            plan = self.lower(structure, config, "trial")
        except (ShapeError, ValueError) as err:
            out["message"] = str(err)
            return out
        out["config"], out["kernels"] = dict(plan.config), len(plan.kernels)
        why = field_check(reference, bound)
        if why:
            out.update(status=WRONG_RESULT, message=why)
            return out
        res = self.check(plan, reference, seed=seed, timing=dict(timing), worker=worker,
                         timeout_s=timeout_s)
        out.update(status=res.status, message=res.message, source=res.source)
        if res.max_abs_err:
            out["max_error"] = max(res.max_abs_err)
        if res.ok and res.timing:
            tm = res.timing
            out.update(median_s=tm["median_s"], spread_s=tm["iqr_s"], samples=tm["samples_s"],
                       noise=timing_noise(tm))
        elif res.ok:
            out.update(status=RUNTIME_ERROR, message="the kernel ran but was not timed")
        out["wall_s"] = time.perf_counter() - t0
        return out

    def run_trials(self, structure: KernelGraph, reference: KernelGraph,
                   configs: Sequence[Mapping[str, int]], *, seed: int = 0,
                   timing: Mapping | None = None, worker: IsolatedWorker | None = None,
                   timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """``run_trial`` of each config, in order; a device that can build many kernels at
        once (the cpu: one compiler call and one worker job for many) overrides this."""
        return [self.run_trial(structure, reference, c, seed=seed, timing=timing,
                               worker=worker, timeout_s=timeout_s) for c in configs]


def field_check(reference: KernelGraph, bound: KernelGraph, tests: int = 2) -> str | None:
    """None when ``bound`` equals ``reference`` in the finite field at these shapes, else why.
    Skipped (None) when the inputs hold more than FIELD_CHECK_MAX_ELEMS elements."""
    elems = sum(math.prod(int(d) for d in bound.tensors[t].shape) for t in bound.input_ids)
    if elems > FIELD_CHECK_MAX_ELEMS:
        return None
    verdict = equivalent(reference, bound, tests=tests)
    if not verdict.equivalent:
        return f"the bound config is not equivalent in the finite field: {verdict.reason}"
    if verdict.output_map != sorted(verdict.output_map):
        return f"the bound config returns its outputs in another order ({verdict.output_map})"
    return None
