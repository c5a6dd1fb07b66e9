"""How well predicted times rank and match measured ones, per group and overall.

Ranking is what a tuner needs from a model (which configs to measure), so the rank metrics
are computed per group (one structure, or one Kernel Tuner space, on one device) and averaged
over groups: Kendall's tau between predicted and measured times, the top-1 slowdown (the true
time of the config the model ranks first over the true best, minus one: what trusting the model
blindly costs) and the top-5 recall (how many of the 5 fastest the model puts in its top 5).
MAPE is over all rows, in seconds.  ``first_k`` asks what a tuner with a small budget asks:
how near the optimum the first k configs of the order come, against k random draws.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from scipy.special import gammaln
from scipy.stats import kendalltau

# Why rows have no Kendall tau (``evaluate`` gives NaN; stored metrics leave the figure out)
TAU_UNDEFINED = "no structure has two configs measured on one device to rank"


def group_metrics(true_s: np.ndarray, pred_s: np.ndarray) -> dict[str, float]:
    """Metrics of one group (at least 2 rows for tau)."""
    order = np.argsort(pred_s, kind="stable")
    best = float(np.min(true_s))
    k = min(5, len(true_s))
    true_top = set(np.argsort(true_s, kind="stable")[:k].tolist())
    out = {"top1_slowdown": float(true_s[order[0]] / best - 1.0),
           "top5_recall": len(true_top & set(order[:k].tolist())) / k}
    if len(true_s) > 1:
        tau = kendalltau(pred_s, true_s).statistic
        out["kendall_tau"] = float(tau) if not math.isnan(tau) else 0.0
    return out


def evaluate(groups: Sequence[str], true_s: Sequence[float] | np.ndarray,
             pred_s: Sequence[float] | np.ndarray) -> dict[str, float]:
    """``{"n", "groups", "kendall_tau", "top1_slowdown", "top5_recall", "mape"}``: rank
    metrics averaged over the groups, MAPE over all rows."""
    true, pred = np.asarray(true_s, np.float64), np.asarray(pred_s, np.float64)
    rows: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        rows[g].append(i)
    per = [group_metrics(true[idx], pred[idx]) for idx in rows.values()]
    out: dict[str, float] = {"n": int(len(true)), "groups": len(rows)}
    for key in ("kendall_tau", "top1_slowdown", "top5_recall"):
        vals = [p[key] for p in per if key in p]
        out[key] = float(np.mean(vals)) if vals else math.nan
    out["mape"] = float(np.mean(np.abs(pred - true) / true))
    return out


def expected_random_best(times: Sequence[float] | np.ndarray, budget: int) -> np.ndarray:
    """E[min of t draws without replacement], t = 1..budget (exact order statistics)."""
    x = np.sort(np.asarray(times, np.float64))
    n = len(x)
    out = np.empty(budget)
    for t in range(1, budget + 1):
        # P(the minimum is the i-th smallest) = C(n-i, t-1) / C(n, t), i = 1..n-t+1
        i = np.arange(1, n - t + 2, dtype=np.float64)
        logp = (gammaln(n - i + 1) - gammaln(t) - gammaln(n - i - t + 2)
                - (gammaln(n + 1) - gammaln(t + 1) - gammaln(n - t + 1)))
        out[t - 1] = float(np.sum(np.exp(logp) * x[: n - t + 1]))
    return out


def first_k(groups: Sequence[str], true_s: Sequence[float] | np.ndarray,
            pred_s: Sequence[float] | np.ndarray, k: int = 10) -> dict[str, float]:
    """How near its group's optimum the best of the order's first ``k`` configs comes
    (``first_slowdown``) and the best of ``k`` random draws does on average
    (``random_slowdown``), each the mean over the groups of more than ``k`` configs
    (``groups``; none: an empty dict, since with all configs measured both are 0)."""
    true, pred = np.asarray(true_s, np.float64), np.asarray(pred_s, np.float64)
    rows: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        rows[g].append(i)
    first, rand = [], []
    for idx in rows.values():
        if len(idx) <= k:
            continue
        t, order = true[idx], np.argsort(pred[idx], kind="stable")
        best = float(t.min())
        first.append(float(t[order[:k]].min()) / best - 1.0)
        rand.append(float(expected_random_best(t, k)[-1]) / best - 1.0)
    if not first:
        return {}
    return {"first_slowdown": float(np.mean(first)), "random_slowdown": float(np.mean(rand)),
            "groups": len(first), "k": k}
