"""The library path as a candidate of every launch, so none serves a kernel slower than it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import db
from kernels import OK
from search import KernelGraph, to_obj

from ..serving.cache import tuned_best
from .confirm import TIMINGS

if TYPE_CHECKING:
    from cluster import SlotPool

    from ..identity import ProgramKey


class LibraryCandidate:
    """The library path (the reference graph op by op through numpy / CuPy, the baseline) as
    a candidate of the launch: a structure row (``db.LIBRARY_PREFIX`` + the program's hash,
    verdict ``library``) with one trial (config {}) whose measurements are the baseline's
    timings, ``TIMINGS`` of them like a confirmed kernel.  ``compete`` makes it the best row
    when its median beats every tuned kernel's (``tuner best`` and ``tuner.load`` say and
    serve so), so a launch never serves a kernel slower than the library."""

    def __init__(self, database: db.Database, program_id: int, key: ProgramKey,
                 reference: KernelGraph, pool: SlotPool) -> None:
        from kernels import LIBRARY

        self.database, self.key, self.reference, self.pool = database, key, reference, pool
        ops = len(reference.ops) - len(reference.input_ids) - len(reference.ops_of("output"))
        sid = database.record_structure(
            program_id, db.LIBRARY_PREFIX + key.program_hash, to_obj(reference),
            {"layer": "structure", "verdict": LIBRARY,
             "note": "the reference graph run op by op by the device's library (numpy/BLAS "
                     "on a cpu, CuPy on a GPU): the baseline, a candidate of every launch"},
            ops)
        self.trial_id = database.record_trial(sid, pool.key, {})
        self.median_s: float | None = None
        self.tuned_s: float | None = None

    def time(self, first_s: float | None, again: Callable[[], float | None]) -> float | None:
        """Store ``first_s`` (this run's baseline) and further timings (``again``) until the
        library has ``TIMINGS`` ok timings; their median, or None if it cannot be timed."""
        import statistics

        have = self.database.measurements(self.trial_id)
        attempt = 1 + max((m.attempt for m in have), default=-1)
        ok = [m.median_s for m in have if m.status == OK]
        while len(ok) < TIMINGS:
            seconds = first_s if first_s is not None else again()
            first_s = None
            if seconds is None:
                break
            self.database.record_measurement(self.trial_id, OK, median_s=seconds,
                                             attempt=attempt)
            attempt += 1
            ok.append(seconds)
        self.median_s = statistics.median(ok) if ok else None
        return self.median_s

    def compete(self, name: str) -> bool:
        """Make the library the best row where it is faster than every tuned kernel (or
        nothing else passed); returns whether it is the best now."""
        from kernels import library_source

        if self.median_s is None:
            return False
        k = self.key
        tuned = tuned_best(self.database, k.program_hash, k.shapes, k.dtype, self.pool.key)
        self.tuned_s = tuned
        best = self.database.best_kernel(k.program_hash, k.shapes, k.dtype, self.pool.key)
        if tuned is not None and tuned <= self.median_s:
            if best is not None and best.baseline_s != self.median_s:  # speedup vs the median
                self.database.confirm_best(best.trial_id, best.source, self.median_s,
                                           uncertain=best.uncertain)
            return False
        self.database.confirm_best(self.trial_id, library_source(self.reference, name),
                                   self.median_s, uncertain=self._doubt(best, tuned))
        return True

    def _doubt(self, best: db.BestKernel | None, tuned: float | None) -> str | None:
        """Why the library's win may be the noise's (None: the timings settle it): the tuned
        kernels' own verdict (their finalists were chosen and re-timed on a loaded or noisy
        machine, so the fastest kernel may be faster than it timed), or the fastest tuned
        kernel within the round-to-round spread of the two (beyond ``TIE_LIMIT``).  A library
        row already the best keeps the reasons it was stored with."""
        from kernels import TIE_LIMIT, close_call

        why = [w for w in (best.uncertain or "").split("; ") if w] if best is not None else []
        if best is not None and not best.library and why:
            why = [f"the tuned kernels' timings could not settle them ({best.uncertain})"]
        lib = [m.median_s for m in self.database.measurements(self.trial_id)
               if m.status == OK and m.median_s]
        kern = [m.median_s for m in self.database.measurements(best.trial_id)
                if m.status == OK and m.median_s] if best is not None and not best.library \
            else []
        if tuned is not None and self.median_s:
            spread = max(_spread(lib), _spread(kern))
            if spread > TIE_LIMIT and tuned - self.median_s <= spread * self.median_s:
                tie = close_call("the fastest tuned kernel", tuned / self.median_s - 1,
                                 spread, "their")
                why = [w for w in why if not w.startswith("the fastest tuned kernel is ")]
                why.append(tie)
        return "; ".join(why) or None


def _spread(values: list[float]) -> float:
    """Round-to-round spread of one candidate's timings: (max - min) / median."""
    import statistics

    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med > 0 else 0.0
