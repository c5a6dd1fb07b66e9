"""Honest evaluation: the same splits for every model, folds that hold out whole programs or
whole devices, and the metrics of ``_metrics`` per fold and averaged.

- ``random``: rows shuffled, 20% held out (configs of a structure seen in training: the
  easiest case, what seed 001 calls its random split);
- ``program``: leave one program (structure family, Kernel Tuner kernel) out — the paper's
  "dissimilar" split;
- ``device``: leave one device out: can timings on other hardware rank this one's configs?
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ._features import Sample
from ._kinds import MIN_FIT_ROWS, make_model
from ._metrics import evaluate
from ._siblings import _config_key

SPLITS = ("random", "program", "device")


def folds(samples: Sequence[Sample], split: str, seed: int = 0, k: int | None = None
          ) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """``[(name of the held-out part, train indices, test indices)]`` for ``split``; with
    ``k`` (program or device split), the programs / devices are dealt into ``k`` folds in a
    seeded order instead of one fold each (148 programs: 148 fits of each model otherwise).
    A fold with fewer than ``MIN_FIT_ROWS`` rows to train on, or none to test, is refused."""
    out = _folds(samples, split, seed, k)
    for name, train, test in out:
        if len(train) < MIN_FIT_ROWS or not len(test):
            raise ValueError(f"--split {split}: fold {name!r} would train on {len(train)} and "
                             f"test on {len(test)} of {len(samples)} ok measurement(s); a "
                             f"model needs {MIN_FIT_ROWS} to train on and a fold one to test "
                             "on: measure more (launch a job) first")
    return out


def _folds(samples: Sequence[Sample], split: str, seed: int, k: int | None
           ) -> list[tuple[str, np.ndarray, np.ndarray]]:
    n = len(samples)
    if split == "random":
        order = np.random.default_rng(seed).permutation(n)
        cut = int(0.8 * n)
        return [("random 20%", np.sort(order[:cut]), np.sort(order[cut:]))]
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    key = (lambda s: s.program) if split == "program" else (lambda s: s.device)
    values = sorted({key(s) for s in samples})
    if len(values) < 2:
        raise ValueError(f"--split {split} needs samples of at least two {split}s; "
                         f"these have {values}")
    if k is not None and 2 <= k < len(values):
        order = np.random.default_rng(seed).permutation(len(values))
        fold_of = {values[j]: n % k for n, j in enumerate(order)}
        parts = np.asarray([fold_of[key(s)] for s in samples])
        return [(f"{split}s fold {f + 1}/{k}", np.flatnonzero(parts != f),
                 np.flatnonzero(parts == f)) for f in range(k)]
    out = []
    for v in values:
        test = np.asarray([i for i, s in enumerate(samples) if key(s) == v])
        train = np.asarray([i for i, s in enumerate(samples) if key(s) != v])
        out.append((v, train, test))
    return out


def cross_validate(samples: Sequence[Sample], split: str, kinds: Sequence[str] = (
        "roofline", "gbdt", "graphsage"), *, seed: int = 0, options: dict | None = None,
        progress: Callable[[str], None] | None = None, k: int | None = None) -> dict:
    """Train every model kind on each fold's training rows, score it on the held-out rows.

    Returns ``{"split", "folds": {kind: [fold metrics + "test"]}, "mean": {kind: metrics}}``;
    a model that cannot predict a fold (the roofline on Kernel Tuner spaces) is null there.
    The device split adds ``common_tau``: the tau on the held-out configs every device ran
    (``benchmarks/gpu_transfer.py``'s set, the same predictions)."""
    result: dict = {"split": split, "folds": {k: [] for k in kinds}, "mean": {}}
    common = _common_configs(samples) if split == "device" else set()
    for name, train, test in folds(samples, split, seed, k):
        tr = [samples[i] for i in train]
        te = [samples[i] for i in test]
        truth = [s.seconds for s in te]
        for kind in kinds:
            model = make_model(kind, **(options or {}).get(kind, {}))
            if progress:
                progress(f"{split} fold {name!r}: {kind} on {len(tr)} rows, test {len(te)}")
            model.fit(tr, progress=progress, seed=seed)
            pred = model.predict(te)
            if not np.all(np.isfinite(pred)):
                result["folds"][kind].append(None)
                continue
            metrics = {"test": name, **evaluate([s.group for s in te], truth, pred)}
            on = [i for i, s in enumerate(te) if _config_key(s) in common]
            if on:
                metrics["common_tau"] = evaluate([te[i].group for i in on],
                                                 [truth[i] for i in on], pred[on])["kendall_tau"]
            result["folds"][kind].append(metrics)
    for kind, rows in result["folds"].items():
        rows = [r for r in rows if r is not None]
        result["mean"][kind] = _mean(rows) if rows else None
    return result


def _common_configs(samples: Sequence[Sample]) -> set:
    """The (program, config) keys every device of ``samples`` measured."""
    ran: dict = {}
    for s in samples:
        key = _config_key(s)
        if key is not None and s.seconds > 0 and math.isfinite(s.seconds):
            ran.setdefault(key, set()).add(s.device)
    devices = {s.device for s in samples}
    return {k for k, d in ran.items() if d == devices}


def _mean(rows: list[dict]) -> dict[str, float]:
    """Each metric averaged over the folds where it is defined: a held-out program whose
    structures each have one measured config (a program tuned as written has a one-config
    space on a cpu) has no order to rank, so its tau is nan and leaves the average, as a
    one-row group leaves a fold's (``_metrics.evaluate``); the metric is dropped only when no
    fold defines it."""
    out = {}
    for k in ("kendall_tau", "top1_slowdown", "top5_recall", "mape", "common_tau"):
        vals = [r[k] for r in rows if k in r and not (isinstance(r[k], float)
                                                        and math.isnan(r[k]))]
        if vals:
            out[k] = float(np.mean(vals))
    return out
