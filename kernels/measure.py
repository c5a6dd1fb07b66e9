"""Fused kernel vs the op-by-op baseline on the cpu, measured the same way in one run.

The baseline is the program's reference graph run op by op with numpy in float32: the
interpreter over ``FloatArith`` keeps the dtype of its inputs, so on float32 arrays every op is
one numpy call producing one float32 temporary — what a framework without fusion does.  Both
sides go through ``kernels.timing.measure`` (the fused kernel inside the isolated worker, right
after its numeric check), so the ratio compares like with like.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from kernels.devices import device_key, local_cpu_spec
from kernels.isolate import IsolatedWorker
from kernels.timing import measure
from search import KernelGraph
from search.handwritten import handwritten
from search.lang import Program
from verifier import FloatArith, run

from .build import build_cpu, random_inputs

DEFAULT_TIMING = {"warmup": 2, "min_repeats": 7, "budget_s": 1.0, "target_rse": 0.02}


THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")  # who sets cores


def thread_env() -> dict[str, str | None]:
    """This process's thread-count variables (None: unset, i.e. every core), to hand to a
    process that should time kernels as this one would run them."""
    return {k: os.environ.get(k) for k in THREAD_VARS}


def default_env() -> dict[str, str]:
    """The kernel worker's environment for timing: OpenMP's own waiting (threads spin a while
    at the end of a parallel region, as a deployed kernel's do) on a machine with room for the
    kernel's threads, ``OMP_WAIT_POLICY=passive`` on one crowded with other work, and nothing
    when the caller chose a policy.  Measured on this 2-core VM: on an idle machine passive
    waiting lost the second core to wake-up latency (lora 0.26-0.39 ms passive, 0.18 ms
    spinning); with 4 busy loops beside it spinning threads waited out whole scheduler slices
    (softmax_rows 64x30000: 19-32 ms spinning, 0.9 ms passive); with 1 or 2 busy loops
    spinning was still the faster (0.39-0.61 vs 0.78 ms)."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return {}
    cores = os.cpu_count() or 1
    try:
        threads = max(1, int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0]))
    except ValueError:
        threads = cores
    crowded = other_runnable() > cores - min(threads, cores) + 1
    return {"OMP_WAIT_POLICY": "passive"} if crowded else {}


def other_runnable(samples: int = 5, interval_s: float = 0.01) -> float:
    """Threads of other processes ready to run now (median of a few looks at the kernel's run
    queue in /proc/loadavg, less this process), or the 1-minute load average elsewhere."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - 1)
        except (OSError, ValueError, IndexError):
            return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        if i + 1 < samples:
            time.sleep(interval_s)
    return float(np.median(counts))


def baseline(graph: KernelGraph, inputs: Sequence[np.ndarray]) -> Callable[[], list]:
    """A zero-argument callable running ``graph`` op by op with numpy on float32 ``inputs``."""
    xs = [np.ascontiguousarray(x, np.float32) for x in inputs]
    arith = FloatArith()
    return lambda: run(graph, xs, arith)


@dataclass
class Measurement:
    """One program's fused-vs-baseline figures; times in seconds, bandwidth in GB/s."""

    program: str
    status: str
    message: str = ""
    kernel_s: float = float("nan")
    baseline_s: float = float("nan")
    speedup: float = float("nan")
    max_error: float = float("nan")
    bytes_moved: int = 0  # inputs read + outputs written once: the fused kernel's minimum
    achieved_gbs: float = float("nan")
    copy_gbs: float = float("nan")
    fraction_of_copy: float = float("nan")
    kernels: int = 0
    config: dict = field(default_factory=dict)
    device: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def measure_program(program: Program, structure: KernelGraph | None = None,
                    config: Mapping[str, int] | None = None, *, seed: int = 0,
                    timing: Mapping | None = None, worker: IsolatedWorker | None = None,
                    env: Mapping[str, str | None] | None = None) -> Measurement:
    """Build ``structure`` (default: the hand-written one) for the cpu, check it, time it and
    the op-by-op baseline on the same inputs.  ``env``: the worker's environment (default
    ``default_env()``)."""
    structure = structure if structure is not None else handwritten(program)
    timing = {**DEFAULT_TIMING, **(timing or {})}
    ref = program.build()
    inputs = random_inputs(ref, seed)
    res = build_cpu(structure, config, name=program.name, seed=seed, timing=dict(timing),
                    worker=worker, inputs=inputs,
                    env=default_env() if env is None else env)
    out = Measurement(program.name, res.status, res.message, kernels=len(res.plan.kernels),
                      config=dict(res.plan.config), device=device_key("cpu"))
    if res.max_abs_err:
        out.max_error = max(res.max_abs_err)
    if not res.ok or not res.timing:
        return out
    base = measure(baseline(ref, inputs), **timing)
    out.kernel_s, out.baseline_s = res.timing["median_s"], base.median_s
    out.speedup = out.baseline_s / out.kernel_s
    out.bytes_moved = 4 * (sum(x.size for x in inputs) + sum(
        int(np.prod(b.shape)) for b in res.plan.outputs))
    out.achieved_gbs = out.bytes_moved / out.kernel_s / 1e9
    out.copy_gbs = local_cpu_spec().mem_bandwidth_gbs
    out.fraction_of_copy = out.achieved_gbs / out.copy_gbs
    return out


def format_table(rows: Sequence[Measurement]) -> str:
    """A markdown table of measurements, for docs and the CLI."""
    head = ("| program | status | kernels | fused ms | numpy ms | speedup | GB/s | of copy | "
            "max err |\n|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for m in rows:
        lines.append(f"| {m.program} | {m.status} | {m.kernels} | {m.kernel_s * 1e3:.3f} | "
                     f"{m.baseline_s * 1e3:.3f} | {m.speedup:.2f} | {m.achieved_gbs:.1f} | "
                     f"{m.fraction_of_copy:.0%} | {m.max_error:.2e} |")
    return "\n".join(lines)
