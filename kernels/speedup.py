"""Fused kernel vs the op-by-op baseline on one device, measured the same way in one run.

The baseline is the program's reference graph run op by op by the device's library: numpy in
float32 on a cpu (the interpreter over ``FloatArith`` keeps the dtype of its inputs, so every
op is one numpy call producing one temporary — what a framework without fusion does), CuPy in
the program's dtype on a GPU.  Both sides are timed by the one timing loop in the same isolated
worker, right after the kernel's numeric check, so the ratio compares like with like.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from search.ir import DTYPE_BYTES, KernelGraph, Program, handwritten

from .devices import (
    RUNTIME_ERROR,
    Device,
    IsolatedWorker,
    as_stored,
    get_device,
    input_layouts,
    random_inputs,
)

DEFAULT_TIMING = {"warmup": 2, "min_repeats": 7, "budget_s": 1.0, "target_rse": 0.02}


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
                    config: Mapping[str, int] | None = None, *, device: str | Device = "cpu",
                    seed: int = 0, timing: Mapping | None = None,
                    worker: IsolatedWorker | None = None) -> Measurement:
    """Build ``structure`` (default: the hand-written one) for ``device``, check it against
    the program's reference, time it and the op-by-op baseline on the same inputs."""
    dev = get_device(device) if isinstance(device, str) else device
    structure = structure if structure is not None else handwritten(program)
    timing = {**DEFAULT_TIMING, **(timing or {})}
    ref = program.build()
    inputs = as_stored(random_inputs(ref, seed), input_layouts(ref))
    res = dev.build(structure, config, reference=ref, name=program.name, seed=seed,
                    timing=dict(timing), worker=worker, inputs=inputs, baseline=ref)
    out = Measurement(program.name, res.status, res.message, kernels=len(res.plan.kernels),
                      config=dict(res.plan.config), device=dev.key)
    if res.max_abs_err:
        out.max_error = max(res.max_abs_err)
    if not res.ok or not res.timing or not res.baseline:
        if res.ok:
            out.status, out.message = RUNTIME_ERROR, "the kernel or the baseline was not timed"
        return out
    out.kernel_s, out.baseline_s = res.timing["median_s"], res.baseline["median_s"]
    out.speedup = out.baseline_s / out.kernel_s
    width = DTYPE_BYTES[res.plan.inputs[0].dtype] if res.plan.inputs else 4
    out.bytes_moved = width * (sum(x.size for x in inputs) + sum(
        int(np.prod(b.shape)) for b in res.plan.outputs))
    out.achieved_gbs = out.bytes_moved / out.kernel_s / 1e9
    out.copy_gbs = dev.spec.mem_bandwidth_gbs
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
