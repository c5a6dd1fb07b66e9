"""The one timing loop: warm-up, then samples until the median is stable or the budget is spent.

Every device times through ``measure``: the cpu around a ctypes kernel call, the cuda device
around asynchronous launches with a ``Clock`` of CUDA events, and both around the op-by-op
baseline, so the two sides of a speedup are always measured the same way.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np

# Standard error of a sample median is ~1.2533 * sigma / sqrt(n) for near-normal data. sigma is
# the larger of two robust estimates, 1.4826 * MAD and IQR / 1.349: MAD alone reads ~0 when just
# over half the samples agree, which on a busy machine hides a bimodal spread.
_MEDIAN_SE = 1.2533
_MAD_TO_SIGMA = 1.4826
_IQR_TO_SIGMA = 1 / 1.349


@dataclass(frozen=True)
class Timing:
    """Seconds per call. `rse` is the relative standard error of the median."""

    median_s: float
    iqr_s: float
    mad_s: float
    min_s: float
    mean_s: float
    rse: float
    samples_s: tuple[float, ...]
    calls_per_sample: int
    warmup: int
    stable: bool  # rse reached the target
    stop_reason: str  # "stable" | "budget" | "max_repeats"
    total_s: float  # wall time spent in measure(), warm-up included
    # CPU time of the timing thread over wall time while sampling (host clock only; None for
    # a device clock): well below 1 means the thread lost its core to other work mid-sample
    cpu_share: float | None = None

    def as_dict(self) -> dict:
        d = asdict(self)
        d["samples_s"] = list(self.samples_s)
        return d


class Clock(Protocol):
    """Times a batch of calls: ``start()`` before the first, ``stop()`` after the last returns
    the seconds between them.  Asynchronous devices must wait for their work in ``stop``."""

    def start(self) -> None: ...

    def stop(self) -> float: ...


class HostClock:
    """The host's monotonic clock, for calls that return when their work is done."""

    def __init__(self) -> None:
        self._t0 = 0

    def start(self) -> None:
        self._t0 = time.perf_counter_ns()

    def stop(self) -> float:
        return (time.perf_counter_ns() - self._t0) * 1e-9


def _stats(samples: list[float]) -> tuple[float, float, float, float]:
    """(median, MAD, IQR, relative standard error of the median)."""
    a = np.asarray(samples)
    med = float(np.median(a))
    mad = float(np.median(np.abs(a - med)))
    q25, q75 = np.percentile(a, [25, 75])
    iqr = float(q75 - q25)
    if med <= 0:
        return med, mad, iqr, math.inf
    sigma = max(_MAD_TO_SIGMA * mad, _IQR_TO_SIGMA * iqr)
    return med, mad, iqr, _MEDIAN_SE * sigma / math.sqrt(len(a)) / med


def measure(fn: Callable[[], object], *, warmup: int = 2, min_repeats: int = 7,
            max_repeats: int = 2000, target_rse: float = 0.02, budget_s: float = 1.0,
            min_sample_s: float = 1e-4, clock: Clock | None = None) -> Timing:
    """Time `fn()` and return per-call statistics.

    Calls shorter than `min_sample_s` are batched (several calls per sample) so the clock's
    resolution and the loop overhead do not dominate. Sampling stops when the median's relative
    standard error is <= `target_rse` (after `min_repeats` samples), at `max_repeats`, or when
    `budget_s` has been spent (after at least one sample). Warm-up is cut short when a single
    call already exceeds the budget.  ``clock`` times each batch (default: the host clock); the
    budget is always wall time.
    """
    if min_repeats < 1 or max_repeats < min_repeats:
        raise ValueError(f"measure: need 1 <= min_repeats <= max_repeats, got "
                         f"min_repeats={min_repeats}, max_repeats={max_repeats}")
    if warmup < 0 or budget_s <= 0 or target_rse <= 0:
        raise ValueError(f"measure: warmup={warmup} must be >= 0, budget_s={budget_s} and "
                         f"target_rse={target_rse} must be > 0")
    host = clock is None
    clock = clock if clock is not None else HostClock()
    wall = time.perf_counter_ns
    start = wall()
    fastest = math.inf
    done_warmup = 0
    for _ in range(warmup):
        clock.start()
        fn()
        dt = clock.stop()
        fastest = min(fastest, dt)
        done_warmup += 1
        if dt > budget_s:
            break
    per = 1
    if fastest < min_sample_s:
        per = max(1, math.ceil(min_sample_s / max(fastest, 1e-9)))

    samples: list[float] = []
    reason = "max_repeats"
    rse = math.inf
    cpu0, wall0 = time.thread_time_ns(), wall()
    while len(samples) < max_repeats:
        clock.start()
        for _ in range(per):
            fn()
        samples.append(clock.stop() / per)
        n = len(samples)
        if n >= min_repeats and (n <= 64 or n % 8 == 0):
            _, _, _, rse = _stats(samples)
            if rse <= target_rse:
                reason = "stable"
                break
        if (wall() - start) * 1e-9 >= budget_s:
            reason = "budget"
            break
    cpu_ns, wall_ns = time.thread_time_ns() - cpu0, wall() - wall0
    med, mad, iqr, rse = _stats(samples)
    a = np.asarray(samples)
    return Timing(
        median_s=med, iqr_s=iqr, mad_s=mad, min_s=float(a.min()),
        mean_s=float(a.mean()), rse=rse, samples_s=tuple(samples), calls_per_sample=per,
        warmup=done_warmup, stable=rse <= target_rse and len(samples) >= min_repeats,
        stop_reason=reason, total_s=(wall() - start) * 1e-9,
        cpu_share=min(1.0, cpu_ns / wall_ns) if host and wall_ns > 0 else None,
    )
