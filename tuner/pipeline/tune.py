"""One Optuna study per verified structure × device, asked and told by the driver.

The driver is the only writer (as in Ray Tune): it asks Optuna for a config, sends it to a
measurement slot, stores the trial and its measurement, then tells Optuna.  The database is
written before Optuna is told, so a launch killed in between leaves a RUNNING Optuna trial whose
measurement is already stored: the resumed study tells it from the database; a RUNNING trial
with nothing stored is failed and its config enqueued again.  A config already measured for this
structure and device (a sampler proposing it twice, or a resumed study) is answered from the
database and never measured twice, so no row is ever duplicated.

The AStitch rule's config is enqueued as the first trial (then its one-parameter moves to the
ends of each range, ``warm_start``); once ``SKIP_AFTER`` configs are measured, a config whose
roofline lower bound is slower than the best measured time cannot win and is skipped
unmeasured.  The
bound is calibrated by the lowest measured/roofline ratio seen in the study: on a CPU a small
working set lives in cache and runs faster than the DRAM roofline, which would otherwise skip
configs that can win.
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

import db
from cluster import MeasurementPool, TrialRequest, TrialResult
from kernels import MEASUREMENT_STATUSES, OK, ConfigSpace, DeviceSpec, estimate
from search import KernelGraph

if TYPE_CHECKING:
    import optuna

MEASURED = MEASUREMENT_STATUSES
# configs a study measures before its roofline rule may skip any: calibrated by one timing
# faster than its estimate, the rule skipped every config whose estimate exceeded the
# default's, and a 5-trial study measured one config
SKIP_AFTER = 3


@dataclass
class StudyTask:
    """What the driver knows about one structure × device study."""

    program: str
    structure_id: int
    structure_hash: str
    structure: KernelGraph | None  # None: a replayed Kernel Tuner space (tuner.pipeline.recorded)
    structure_obj: dict
    reference_obj: dict
    space: ConfigSpace
    device_key: str
    spec: DeviceSpec  # the device's (for the roofline)
    study_name: str
    baseline_s: float | None = None


@dataclass
class StudyOutcome:
    study_name: str
    measured: int = 0  # configs measured in this study (this run and earlier ones)
    new: int = 0  # measured by this run
    best_s: float | None = None
    statuses: Counter = field(default_factory=Counter)
    skipped: int = 0  # roofline said it cannot win
    efficiency: float | None = None  # lowest measured / roofline seen (< 1: data in cache)
    invalid: int = 0


def _optuna() -> ModuleType:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def study_name(program: str, program_hash: str, shapes_key: str, structure_hash: str,
               device_key: str) -> str:
    """Stable across relaunches: the same program, shapes, structure and device resume."""
    return (f"{program}:{program_hash[:12]}:{db.config_hash(shapes_key)[:8]}:"
            f"{structure_hash[:12]}:{device_key}")


def warm_start(space: ConfigSpace, neighbours: bool = True) -> list[dict[str, int]]:
    """The first trials of a new study: the AStitch default (on a GPU also the Triton
    dialect's default, ``ConfigSpace.alternates``, first where the estimate says it is
    faster), then, with ``neighbours``, each with one parameter moved to either end of its
    range (legal ones only). The rule is usually right about most parameters and wrong about
    one; the ends show a sampler that knows nothing of the space which way each axis goes.
    ntrans (8x4096) on this cpu: the default g0=8, split=1 and the best g0=8, split=16 differ
    in one parameter, at its end.  A sampler that ranks the space (the cost model's) asks
    for the defaults only (``warm_neighbours``): the ends took 4-8 of a study's 10 trials."""
    starts = [dict(space.default), *(dict(a) for a in space.alternates)]
    if space.alternate_first:
        starts = starts[1:] + starts[:1]
    out = list(starts)
    if not neighbours:
        return out
    for name, choices in space.params.items():
        for value in (choices[-1], choices[0]):
            for start in starts:  # on a GPU the AStitch and the Triton default's moves
                config = {**start, name: value}
                if config not in out and space.check(config) is None:
                    out.append(config)
    return out


class Codec:
    """Configs <-> Optuna params.  Ordinal (default): each parameter is the index into its
    sorted choices, an integer Optuna's TPE models with kernels along the axis, so it learns
    that g0=32 behaves like g0=16 and 64; categorical treats every choice as unrelated."""

    def __init__(self, params: dict[str, tuple[int, ...]], ordinal: bool = True) -> None:
        self.params, self.ordinal = params, ordinal

    def distributions(self, optuna: ModuleType
                      ) -> dict[str, optuna.distributions.BaseDistribution]:
        d = optuna.distributions
        if self.ordinal:
            return {n: d.IntDistribution(0, len(c) - 1) for n, c in self.params.items()}
        return {n: d.CategoricalDistribution(list(c)) for n, c in self.params.items()}

    def encode(self, config: dict[str, int]) -> dict[str, int]:
        if not self.ordinal:
            return {n: int(config[n]) for n in self.params}
        return {n: self.params[n].index(int(config[n])) for n in self.params}

    def decode(self, params: dict[str, Any]) -> dict[str, int]:
        if not self.ordinal:
            return {n: int(params[n]) for n in self.params}
        return {n: int(self.params[n][int(params[n])]) for n in self.params}


class StudyRunner:
    """Runs studies on one device's slot pool against one database."""

    def __init__(self, database: db.Database, storage: Any, make_sampler: Callable[[], Any],
                 pool: MeasurementPool, *, trials: int, seed: int = 0,
                 deadline: float | None = None, timing: dict | None = None, timeout_s: float = 60.0,
                 on_trial: Callable[[StudyTask, TrialResult], None] | None = None,
                 ordinal: bool = True) -> None:
        self.db, self.storage, self.make_sampler, self.pool = database, storage, make_sampler, pool
        self.trials, self.seed, self.deadline = trials, seed, deadline
        self.timing, self.timeout_s, self.on_trial = timing, timeout_s, on_trial
        self._estimates: dict[int, float] = {}
        self.ordinal = ordinal

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.time() > self.deadline

    def run(self, task: StudyTask, program_hash: str) -> StudyOutcome:
        optuna = _optuna()
        codec = Codec(task.space.params, self.ordinal)
        dists = codec.distributions(optuna)
        sampler = self.make_sampler()
        if hasattr(sampler, "bind"):  # the cost model's sampler ranks this study's space
            sampler.bind(task, codec, dists)
        study = optuna.create_study(study_name=task.study_name, storage=self.storage,
                                    sampler=sampler, direction="minimize", load_if_exists=True)
        study.set_user_attr("device_key", task.device_key)
        study.set_user_attr("structure_hash", task.structure_hash)
        known = self._known(task, program_hash)
        out = StudyOutcome(task.study_name)
        self._recover(study, known, optuna, codec)
        if not study.trials:
            for config in warm_start(task.space, getattr(sampler, "warm_neighbours", True)):
                study.enqueue_trial(codec.encode(config))
        for status, median in known.values():
            out.statuses[status] += 1
            if status == OK and (out.best_s is None or median < out.best_s):
                out.best_s = median
        out.measured = len(known)
        if study.user_attrs.get("finished_for_trials", 0) >= self.trials:
            return out  # an earlier run completed this study: nothing to ask
        space_size = task.space.size
        inflight: dict[int, tuple[optuna.Trial, dict[str, int], str]] = {}
        asks = 0
        max_asks = 4 * self.trials + 20  # duplicates and skips do not measure; bound them
        while True:
            while (self.pool.idle and out.measured + len(inflight) < min(self.trials, space_size)
                   and asks < max_asks and (not self.past_deadline() or self._first(out, asks))):
                asks += 1
                trial = study.ask(dists)
                config = codec.decode(trial.params)
                trial.set_user_attr("config", config)
                self._propose(task, study, trial, config, known, inflight, out, optuna)
            if not inflight:
                break
            res = self.pool.next_done()
            trial, config, _ = inflight.pop(res.tag)
            self._store(task, trial, config, res, known, out, study, optuna)
        if not self.past_deadline():
            study.set_user_attr("finished_for_trials", self.trials)  # more trials reopen it
        return out

    @staticmethod
    def _first(out: StudyOutcome, asks: int) -> bool:
        """A study that has measured nothing yet still measures its first config (the AStitch
        default, enqueued first) after the job's time budget is spent: under load the budget
        went to the first programs of the quickstart, and the last was served the library
        without one timing of its own."""
        return asks == 0 and out.measured == 0

    # -- one proposal ---------------------------------------------------------------------

    def _propose(self, task: StudyTask, study: optuna.Study, trial: optuna.Trial,
                 config: dict[str, int], known: dict, inflight: dict, out: StudyOutcome,
                 optuna: ModuleType) -> None:
        config = task.space.canonical(config)  # one kernel, one hash: measured once
        chash = db.config_hash(config)
        if chash in known:  # measured before: answer from the database
            status, median = known[chash]
            trial.set_user_attr("cached", True)
            if status == OK:
                study.tell(trial, median)
            else:
                trial.set_user_attr("status", status)
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return
        if any(c == chash for _, _, c in inflight.values()):
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return
        why = task.space.check(config)
        est_s = None
        if why is None:
            try:
                est_s = self.estimate_s(task, config)
            except ValueError as err:  # ShapeError is a ValueError
                why = str(err)
        if why is not None:
            # told as pruned, not failed: TPE leaves failed trials out of its model and so
            # kept proposing the same illegal corner (131 of a RoPE structure's 140 asks, 9 of
            # its 25 legal configs measured); a pruned trial counts among its worst
            out.invalid += 1
            trial.set_user_attr("invalid", why[:500])
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            return
        if est_s is not None:
            bound = est_s * min(1.0, out.efficiency or 1.0)
            if (out.statuses[OK] >= SKIP_AFTER and out.best_s is not None
                    and bound > out.best_s):
                out.skipped += 1
                trial.set_user_attr("skipped",
                                    f"roofline {bound:.3g} s > best {out.best_s:.3g} s")
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                return
            trial.set_user_attr("roofline_s", est_s)
            self._estimates[trial.number] = est_s
        request = TrialRequest(task.reference_obj, task.structure_obj, config, trial.number,
                               self.seed, self.timing, self.timeout_s)
        inflight[trial.number] = (trial, config, chash)
        self.pool.submit("trial", request)

    def estimate_s(self, task: StudyTask, config: dict[str, int]) -> float | None:
        """The roofline time of ``config`` (None: no estimate, nothing skipped); a
        ``ValueError`` says the config is invalid."""
        return estimate(task.structure, config, task.spec).seconds

    # -- one result -----------------------------------------------------------------------

    def _store(self, task: StudyTask, trial: Any, config: dict, res: TrialResult, known: dict,
               out: StudyOutcome, study: Any, optuna: Any) -> None:
        status = res.status
        if status not in MEASURED:  # did not lower: nothing was built or measured
            out.invalid += 1
            trial.set_user_attr("invalid", str(res.message or "")[:500])
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return
        trial_id = self.db.record_trial(task.structure_id, task.device_key, config,
                                        task.study_name, trial.number)
        ok = status == OK
        mid = self.db.record_measurement(
            trial_id, status, median_s=res.median_s if ok else None,
            spread_s=res.spread_s if ok else None,
            samples=res.samples if ok else None, max_error=res.max_error,
            message=res.message or None, host=res.host)
        if ok and res.source:
            noise = res.get("noise")  # a single noisy timing: said until confirmed
            self.db.update_best(mid, res.source, task.baseline_s,
                                uncertain=f"one timing, noisy ({noise})" if noise else None)
        known[db.config_hash(config)] = (status, res.median_s)
        out.measured += 1
        out.new += 1
        out.statuses[status] += 1
        trial.set_user_attr("status", status)
        if ok:
            est = self._estimates.pop(trial.number, None)
            if est:  # calibrate the bound: small working sets beat the DRAM roofline
                ratio = res.median_s / est
                out.efficiency = ratio if out.efficiency is None else min(out.efficiency, ratio)
            if out.best_s is None or res.median_s < out.best_s:
                out.best_s = res.median_s
            study.tell(trial, res.median_s)
        else:
            trial.set_user_attr("message", str(res.message or "")[:500])
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        if self.on_trial:
            self.on_trial(task, res)

    # -- resume ---------------------------------------------------------------------------

    def _known(self, task: StudyTask, program_hash: str) -> dict[str, tuple[str, float | None]]:
        """Configs of this structure already measured on this device: hash → (status, s)."""
        out: dict[str, tuple[str, float | None]] = {}
        for h in self.db.history(program_hash, device_key=task.device_key):
            if h.structure_id == task.structure_id and h.attempt == 0:
                out[db.config_hash(h.config)] = (h.status, h.median_s)
        return out

    def _recover(self, study: optuna.Study, known: dict, optuna: ModuleType, codec: Codec
                 ) -> None:
        """Close trials a killed launch left RUNNING: told from the database when their
        measurement was stored, else failed and their config enqueued again."""
        for t in study.get_trials(deepcopy=False,
                                  states=(optuna.trial.TrialState.RUNNING,)):
            if set(t.params) != set(codec.params):  # killed inside ask(): no config yet
                study.tell(t.number, state=optuna.trial.TrialState.FAIL)
                continue
            chash = db.config_hash(codec.decode(t.params))
            if chash in known:
                status, median = known[chash]
                if status == OK:
                    study.tell(t.number, median)
                else:
                    study.tell(t.number, state=optuna.trial.TrialState.FAIL)
            else:  # asked, never stored: measure it again in this run
                study.tell(t.number, state=optuna.trial.TrialState.FAIL)
                study.enqueue_trial(dict(t.params))
