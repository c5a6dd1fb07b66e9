"""Confirming the fastest configs: a study times each config once, so its fastest can be a
lucky run (on this shared VM one mha config took 0.78 ms once and 1.45 ms three times after).

After the studies of a program on a device, the ``confirm`` configs with the fastest first
timing (over every run of the program on that device, not only this one) are timed again,
interleaved: round 1 re-times each finalist once, then round 2, … (so a burst of load slows
every finalist of a round, not all the timings of one), until each has ``TIMINGS`` timings,
or ``MAX_TIMINGS`` when a round's timings were noisy, the machine loaded, or the rounds so far
cannot separate the two fastest (``verdict``'s close call).  The best kernel
becomes the config with the lowest median of its timings, and its stored time is that median
(``db.Database.confirm_best``), even when that is slower than a lucky first timing.  The
timings' verdict (``kernels.devices.verdict``: noisy re-timings, a loaded machine, a runner-up
within the noise) is stored with it as ``uncertain`` and shown wherever the best is, never
silently.  A config whose re-run fails is not eligible.  Re-runs are stored as measurements
with ``attempt`` 1, 2, … so a relaunch re-times nothing it already has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import db
from kernels import MEASUREMENT_STATUSES, OK, RUNTIME_ERROR, device_kind, machine_load, verdict

if TYPE_CHECKING:
    from cluster import SlotPool

    from ..identity import ProgramKey

TIMINGS = 3  # per confirmed config: the study's timing and two re-runs
MAX_TIMINGS = 5  # when the re-timings were noisy, the machine loaded or the call close


@dataclass
class ConfirmOutcome:
    candidates: int = 0  # configs confirmed
    new: int = 0  # re-runs measured by this run
    best_trial: int | None = None
    best_s: float | None = None  # the winner's median
    best_timings: int = 0  # of how many timings
    first_s: float | None = None  # the fastest single first timing among the candidates
    uncertain: str | None = None  # why the best may not be the fastest (None: it is)


def confirm(database: db.Database, pool: SlotPool, key: ProgramKey, program_id: int, top: int,
            reference_obj: dict, baseline_s: float | None, *, seed: int = 0,
            timeout_s: float = 60.0, past_deadline: Callable[[], bool] = lambda: False
            ) -> ConfirmOutcome:
    """Re-time the ``top`` fastest configs of the program ``key`` (``program_id`` its
    database row) on ``pool``'s device and make the lowest median the best
    kernel."""
    out = ConfirmOutcome()
    if top <= 0:
        return out
    trials: dict[int, list[db.HistoryEntry]] = {}
    for h in database.history(key.program_hash, key.shapes, key.dtype, pool.key):
        if not h.structure_hash.startswith(db.LIBRARY_PREFIX):  # no kernel to re-time
            trials.setdefault(h.trial_id, []).append(h)
    firsts = sorted(((next(h for h in hs if h.attempt == 0), hs) for hs in trials.values()
                     if any(h.attempt == 0 and h.status == OK for h in hs)),
                    key=lambda fh: (fh[0].median_s, fh[0].trial_id))[:top]
    if not firsts:
        return out
    structures = {s.id: s.structure for s in database.structures(program_id)}
    sources: dict[int, str] = {}
    out.candidates, out.first_s = len(firsts), firsts[0][0].median_s

    noise: dict = {"noisy": 0, "timings": 0, "load": None, "timed": False}

    def rerun(first: db.HistoryEntry, attempt: int) -> None:
        pool.submit("trial", {"tag": f"confirm:{first.trial_id}:{attempt}",
                              "structure": structures[first.structure_id],
                              "reference": reference_obj, "config": first.config,
                              "seed": seed, "timing": None, "timeout_s": timeout_s})
        res = pool.next_done()
        status = res["status"] if res["status"] in MEASUREMENT_STATUSES else RUNTIME_ERROR
        ok = status == OK
        database.record_measurement(
            first.trial_id, status, median_s=res.get("median_s") if ok else None,
            spread_s=res.get("spread_s") if ok else None,
            samples=res.get("samples") if ok else None, max_error=res.get("max_error"),
            message=res.get("message") or None, host=res.get("host"), attempt=attempt)
        if ok and res.get("source"):
            sources[first.trial_id] = res["source"]
        if ok:
            noise["timings"] += 1
            noise["noisy"] += bool(res.get("noise"))
            # timed here and now (a recorded timing, replayed, carries no noise verdict)
            noise["timed"] = noise["timed"] or res.get("noise", False) is not False
        out.new += 1

    done = {first.trial_id: {h.attempt for h in hs} for first, hs in firsts}
    rounds = TIMINGS
    attempt = 1
    while attempt < rounds and not past_deadline():
        for first, _ in firsts:  # one round: every finalist once, in turn
            if attempt not in done[first.trial_id] and not past_deadline():
                rerun(first, attempt)
        attempt += 1
        if rounds < MAX_TIMINGS and attempt == rounds and noise["timed"]:
            load = machine_load() if device_kind(pool.key) == "cpu" else None
            noise["load"] = noise["load"] or load
            # more rounds, medians of more timings, where these cannot be trusted or cannot
            # separate the two fastest (with the spread limit calibrated, quiet launches on
            # the 2-core VM stopped being called noisy, and their close calls got 3 rounds)
            so_far = _rounds(database, firsts)
            if load or noise["noisy"] or (len(so_far) > 1 and verdict(so_far).uncertain):
                rounds = MAX_TIMINGS
    medians = _rounds(database, firsts)
    if not medians:
        return out
    judged = verdict(medians, noise["noisy"], noise["timings"], noise["load"])
    winner = int(judged.best)
    source = sources.get(winner)
    if source is None:
        best = database.best_kernel(key.program_hash, key.shapes, key.dtype, pool.key)
        if best is not None and best.trial_id == winner:
            source = best.source
        elif not past_deadline():  # its source was not kept: one more timing brings it
            first = next(f for f, _ in firsts if f.trial_id == winner)
            rerun(first, 1 + max(m.attempt for m in database.measurements(winner)))
            source = sources.get(winner)
    if source is None:
        return out
    out.best_trial = winner
    out.uncertain = judged.uncertain
    if not noise["timed"]:  # nothing re-timed now: the verdict of the run that timed them
        stored = database.best_kernel(key.program_hash, key.shapes, key.dtype, pool.key)
        if stored is not None and stored.trial_id == winner:
            out.uncertain = stored.uncertain
    out.best_s = database.confirm_best(winner, source, baseline_s, uncertain=out.uncertain)
    out.best_timings = len(database.measurements(winner))
    return out


def _rounds(database: db.Database, firsts: list) -> dict[int, list[float]]:
    """Each finalist's medians so far, one per round (a finalist with a failed timing has
    none: it is not eligible)."""
    medians: dict[int, list[float]] = {}
    for first, _ in firsts:
        ms = database.measurements(first.trial_id)
        if ms and all(m.status == OK for m in ms):
            medians[first.trial_id] = [m.median_s for m in ms]
    return medians
