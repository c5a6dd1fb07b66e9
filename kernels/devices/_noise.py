"""Is a timing to be trusted?  The signals of a loaded or noisy machine, as pure functions.

A launch run while another process kept both cores of this 2-core VM busy stored, for a
GPT-2-style MLP, a best measured at 12.6 ms that runs 3.6 ms on a quiet machine, where a quiet
launch finds a config at 1.0 ms: every timing was slowed by a different amount, so the ranking
that chose the finalists was noise.  Three signals tell such timings apart:

- the spread of one timing's samples (``SPREAD_LIMIT``: interquartile range over median): a
  kernel timed on a core of its own repeats to a few percent;
- the timing thread's CPU time over wall time while sampling (``Timing.cpu_share``,
  ``CPU_SHARE_MIN``): below it, the thread was descheduled mid-sample;
- other runnable threads than ours on the machine (``loaded``: more than the cores left).

``timing_noise`` names the first two for one timing; ``verdict`` judges the finalists' re-
timings, interleaved round by round: the lowest median of its rounds wins, and the best is
*uncertain* when the re-timings were noisy or the machine loaded (the finalists themselves
were chosen by noisy timings), or when the runner-up is within the round-to-round spread of
the two and that spread exceeds ``TIE_LIMIT`` (a choice the timings cannot make) — unless
the runner-up ran at most ``TIE_LIMIT`` faster than the best in every round
(``_never_faster``).
``close_call`` words that last reason; past ``BUSY_SPREAD`` it says the timings are noise.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# IQR / median of one timing's samples.  Calibrated on the 2-core AMD EPYC VM, 2026-11-28
# (benchmarks/noise_calibration.py; benchmarks/data/noise_calibration_cpu-epyc.txt): of 40
# quiet timings of five suite kernels, a 10% limit called 38% noisy (more than NOISY_SHARE, so
# every quiet launch stored its best uncertain), 25% called 2%; of 40 timings beside one or
# two busy processes, the CPU-share rule with either limit caught every one of the 30 whose
# median was more than 20% off the kernel's quiet median
SPREAD_LIMIT = 0.25
CPU_SHARE_MIN = 0.80  # timing thread's CPU time / wall time while sampling
TIE_LIMIT = 0.05  # round-to-round spread of finalists that makes a close call uncertain
PAIRED_ROUNDS = 3  # rounds in which a runner-up never clearly faster is no close call
NOISY_SHARE = 0.25  # fraction of noisy re-timings that makes the best uncertain
# round-to-round spread past which timings rank nothing: (max - min) / median above 1 means
# the slowest round took more than twice the fastest (a busy machine, not the kernels)
BUSY_SPREAD = 1.0


def timing_noise(timing: Mapping[str, Any] | None) -> str | None:
    """Why one timing (``Timing.as_dict()``) is noisy, or None: samples spread beyond
    ``SPREAD_LIMIT`` or the timing thread given less than ``CPU_SHARE_MIN`` of the wall time."""
    if not timing:
        return None
    why = []
    samples = list(timing.get("samples_s") or [])
    med = float(timing.get("median_s") or 0.0)
    if len(samples) >= 4 and med > 0:
        q = statistics.quantiles(samples, n=4)
        spread = (q[2] - q[0]) / med
        if spread > SPREAD_LIMIT:
            why.append(f"samples spread {spread:.0%} of the median")
    share = timing.get("cpu_share")
    if share is not None and share < CPU_SHARE_MIN:
        why.append(f"the timing thread had {share:.0%} of the wall time")
    return "; ".join(why) or None


def loaded(other_runnable: float, cores: int, threads: int | None = None) -> str | None:
    """Why the machine is too busy to time on, or None: more threads of other processes
    ready to run than the cores the kernel's ``threads`` leave free (at least half a core
    taken from a kernel using every core)."""
    threads = min(threads or cores, cores)
    free = cores - threads
    if other_runnable > free + 0.5:
        return (f"{other_runnable:g} other runnable thread(s) on {cores} core(s) "
                f"({threads} used by the kernel)")
    return None


@dataclass(frozen=True)
class Verdict:
    """The finalists judged: ``best`` (a key of the rounds), its median, and ``uncertain``
    (why it may not be the fastest; None when the timings separate it)."""

    best: Hashable
    median_s: float
    uncertain: str | None
    medians: dict


def verdict(rounds: Mapping[Hashable, Sequence[float]], noisy: int = 0, timings: int = 0,
            load: str | None = None) -> Verdict:
    """Judge the finalists from the medians of their rounds (``rounds``: key -> one median
    per round, interleaved); ``noisy`` of ``timings`` re-timings had ``timing_noise``;
    ``load``: ``loaded``'s answer while re-timing."""
    if not rounds or not all(rounds.values()):
        raise ValueError("verdict: every finalist needs at least one timing")
    medians = {k: statistics.median(v) for k, v in rounds.items()}
    best = min(medians, key=lambda k: (medians[k], str(k)))
    why = []
    if load:
        why.append(f"the machine was loaded while re-timing ({load})")
    if timings and noisy / timings >= NOISY_SHARE:
        why.append(f"{noisy} of {timings} re-timings were noisy")
    w = medians[best]
    for k, m in sorted(medians.items(), key=lambda km: km[1]):
        if k == best:
            continue
        spread = max(_spread(rounds[best], w), _spread(rounds[k], m))
        if spread > TIE_LIMIT and m - w <= spread * w and not _never_faster(rounds[best],
                                                                            rounds[k]):
            why.append(close_call("the runner-up", m / w - 1, spread, "its"))
        break  # only the runner-up can be the better choice that noise hid
    return Verdict(best, w, "; ".join(why) or None, medians)


def _never_faster(best: Sequence[float], other: Sequence[float]) -> bool:
    """In each of at least ``PAIRED_ROUNDS`` rounds, ``other`` ran at most ``TIE_LIMIT``
    faster than ``best``: the rounds are interleaved, so a burst of load slows the finalists
    of a round alike, and a spread from round to round, however wide, is the machine's, not
    a doubt about which is faster.  (Of the 22 finalist sets of seven quiet launches on the
    2-core AMD EPYC VM, 2026-11-29, the spread alone called 16 close: in 10 of those the
    runner-up was never more than 5% faster in a round.)"""
    pairs = list(zip(best, other, strict=False))  # a deadline can cut one short
    return len(pairs) >= PAIRED_ROUNDS and all(b <= (1 + TIE_LIMIT) * o for b, o in pairs)


def close_call(other: str, slower: float, spread: float, whose: str) -> str:
    """Why ``other``, ``slower`` (a fraction) than the best, may be the faster: within the
    round-to-round ``spread`` of ``whose`` timings; past ``BUSY_SPREAD`` that the timings,
    more than 2x apart, say nothing about either (what to do: the caller's ``SETTLE``)."""
    if spread > BUSY_SPREAD:
        return (f"{other} is {slower:.0%} slower, but {whose} timings vary by more than "
                f"{1 + BUSY_SPREAD:g}x: the machine was busy and they rank nothing")
    return f"{other} is {slower:.0%} slower, within the {spread:.0%} {whose} timings vary by"


def _spread(values: Sequence[float], med: float) -> float:
    """Round-to-round spread of one finalist: (max - min) / its median (0 for one round)."""
    return (max(values) - min(values)) / med if len(values) > 1 and med > 0 else 0.0
