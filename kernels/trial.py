"""One tuning trial: a verified structure bound by one config, checked and timed on a device.

The tuner's unit of measurement.  It runs the two verification layers that belong to a config
(architecture.md): the bound graph is re-checked against the reference in the finite field at
the job's shapes (when they are small enough to interpret quickly), and the built kernel is run
on random inputs against the float reference of the *program* — not of the bound structure, so
a config can never be wrong in the same way as its structure.  Every outcome, passing or not,
comes back as a plain dict that the driver stores; nothing here raises for a bad candidate.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

from kernels.isolate import IsolatedWorker
from search import KernelGraph, ShapeError

from .build import check_plan, random_inputs
from .lower import concretize, lower, resolve_spec
from .measure import baseline, default_env
from .render import render
from .timing import measure

TRIAL_TIMING = {"warmup": 1, "min_repeats": 5, "budget_s": 0.3, "target_rse": 0.03}
FIELD_CHECK_MAX_ELEMS = 1 << 18  # bound graphs larger than this skip the full-shape field check


FAULT_ENV = "TUNER_FAULT_TRIALS"
_FAULTS = {  # statements put first in the kernel's entry point
    "crash": "{ volatile float* p = nullptr; *p = 1.0f; }",  # SIGSEGV
    "hang": "for (volatile int spin = 0; ; ) { (void)spin; }",  # never returns
    "compile": "this does not compile;",
}
_trials_run = 0


def _inject_fault(source: str) -> str:
    """Fault injection for the tuner's tests, off unless ``TUNER_FAULT_TRIALS`` is set: e.g.
    ``crash@1,hang@3`` makes this process's 1st trial segfault and its 3rd never return, so
    the tests exercise the real isolation path of a launch (a kernel, not a mock)."""
    global _trials_run
    _trials_run += 1
    spec = os.environ.get(FAULT_ENV, "")
    for item in filter(None, (x.strip() for x in spec.split(","))):
        kind, _, at = item.partition("@")
        if kind in _FAULTS and at.isdigit() and int(at) == _trials_run:
            head, brace, tail = source.partition('extern "C" void kernel(')
            body_at = tail.index("{") + 1
            return head + brace + tail[:body_at] + "\n  " + _FAULTS[kind] + tail[body_at:]
    return source


def field_check(reference: KernelGraph, bound: KernelGraph, tests: int = 2) -> str | None:
    """None when ``bound`` equals ``reference`` in the finite field at these shapes, else why.
    Skipped (None) when the inputs hold more than FIELD_CHECK_MAX_ELEMS elements."""
    from verifier import equivalent

    elems = sum(math.prod(int(d) for d in bound.tensors[t].shape) for t in bound.input_ids)
    if elems > FIELD_CHECK_MAX_ELEMS:
        return None
    verdict = equivalent(reference, bound, tests=tests)
    if not verdict.equivalent:
        return f"the bound config is not equivalent in the finite field: {verdict.reason}"
    if verdict.output_map != sorted(verdict.output_map):
        return f"the bound config returns its outputs in another order ({verdict.output_map})"
    return None


def run_trial(structure: KernelGraph, reference: KernelGraph, config: Mapping[str, int],
              device: str = "cpu", *, seed: int = 0, timing: Mapping | None = None,
              worker: IsolatedWorker | None = None, timeout_s: float = 60.0) -> dict[str, Any]:
    """Check and time ``structure`` bound by ``config`` on ``device`` ("cpu" or "cuda").

    Returns ``status`` (kernels.isolate.STATUSES, plus "invalid" for a config that does not
    lower), ``message``, ``median_s``/``spread_s``/``samples`` when ok, ``max_error``,
    ``source`` (the rendered kernel), ``config`` (with the knobs the rule filled in),
    ``kernels`` and ``host``.
    """
    out: dict[str, Any] = {"status": "invalid", "message": "", "config": dict(config),
                           "host": socket.gethostname(), "source": None}
    timing = {**TRIAL_TIMING, **(timing or {})}
    t0 = time.perf_counter()
    try:
        spec = resolve_spec("cpu") if device == "cpu" else None
        if device != "cpu":
            from .cuda import cuda_device_spec, require_cuda
            require_cuda()
            spec = cuda_device_spec()
        bound, _, _ = concretize(structure, config, spec)
        plan = lower(structure, config, spec, "trial")
    except (ShapeError, ValueError) as err:
        out["message"] = str(err)
        return out
    except RuntimeError as err:  # CudaUnavailable
        out.update(status="runtime_error", message=str(err))
        return out
    out["config"], out["kernels"] = dict(plan.config), len(plan.kernels)
    why = field_check(reference, bound)
    if why:
        out.update(status="wrong_result", message=why)
        return out
    inputs = random_inputs(reference, seed)
    if device == "cpu":
        res = check_plan(plan, reference, source=_inject_fault(render(plan, "cpp")),
                         seed=seed, timing=dict(timing), worker=worker,
                         timeout_s=timeout_s, inputs=inputs, env=default_env())
    else:
        from .cuda import build_cuda
        res = build_cuda(structure, config, seed=seed, timing=dict(timing), worker=worker,
                         timeout_s=timeout_s, inputs=inputs)
    out.update(status=res.status, message=res.message, source=res.source)
    if res.max_abs_err:
        out["max_error"] = max(res.max_abs_err)
    if res.ok and res.timing:
        tm = res.timing
        out.update(median_s=tm["median_s"], spread_s=tm["iqr_s"], samples=tm["samples_s"])
    elif res.ok:
        out.update(status="runtime_error", message="the kernel ran but was not timed")
    out["wall_s"] = time.perf_counter() - t0
    return out


def baseline_job(inputs: list, expected: list, args: dict) -> dict:
    """``time_baseline`` as an isolated-worker call job (``args``: reference as canonical
    JSON, seed, timing), so numpy's threads follow the worker's environment."""
    from search.serialize import from_obj

    seconds = time_baseline(from_obj(args["reference"]), seed=args.get("seed", 0),
                            timing=args.get("baseline_timing"))
    return {"status": "ok", "message": "", "baseline_s": seconds}


def time_baseline(reference: KernelGraph, *, seed: int = 0, timing: Mapping | None = None
                  ) -> float:
    """Median seconds of ``reference`` run op by op with numpy on float32 inputs (the cpu
    baseline every speedup is against)."""
    timing = {**TRIAL_TIMING, **(timing or {})}
    return measure(baseline(reference, random_inputs(reference, seed)), **timing).median_s
