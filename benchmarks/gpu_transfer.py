"""How much of one GPU's ranking do the other GPUs' own measurements hold?

    .venv/bin/python benchmarks/gpu_transfer.py [--caches DIR] [--spaces convolution,dedispersion]
        [--json OUT]

Leave-one-GPU-out asks a model trained on five GPUs to rank the sixth.  Before blaming the
model, this measures what the data allows, with no model at all: for every held-out GPU, the
Kendall tau (and top-1 slowdown) of ranking its configurations by

* ``best other``: the measured times of the single other GPU that ranks it best, chosen
  *knowing the answer* (an oracle no model trained on the others can beat by copying one);
* ``mean others``: the mean of the other five GPUs' standardised log times;

* ``fitted blend``: the least-squares mix of the other five GPUs' standardised log times fitted
  on *all* of the held-out GPU's configurations (hindsight again): the most any reweighting of
  known GPUs' rankings — what a few shots can choose among — could give;

over the configurations that ran on all of them.  Also prints the GPU x GPU tau matrix.
A leave-one-GPU-out target above the ``best other`` column asks a model to know the held-out
GPU better than any measured GPU does.  ``--curve`` adds the learning curve on the held-out
GPU itself: N of its configurations drawn at random and measured, small gradient-boosted trees
on (the parameters, the other GPUs' standardised log times of the same configuration), Kendall
tau on the rest (mean of 3 draws): how many measurements of a new GPU a tau of 0.8 takes.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel import read_kernel_tuner  # noqa: E402


def _key(config: dict) -> tuple:
    return tuple(sorted(config.items()))


def _scores(order: np.ndarray, true: np.ndarray) -> tuple[float, float]:
    """(Kendall tau, top-1 slowdown) of ranking ``true`` times by ``order`` (lower first)."""
    tau = kendalltau(order, true).statistic
    return float(tau), float(true[int(np.argmin(order))] / true.min() - 1)


def transfer(files: list[Path], curve: list[int] | None = None) -> dict:
    spaces = [read_kernel_tuner(f) for f in files]
    gpus = [s.device for s in spaces]
    times = [{_key(c): t for c, t in zip(s.configs, s.times_s, strict=True) if not math.isnan(t)}
             for s in spaces]
    n = len(spaces)
    matrix = np.eye(n)
    for i in range(n):
        for j in range(i + 1, n):
            common = sorted(set(times[i]) & set(times[j]))
            tau = kendalltau([times[i][k] for k in common], [times[j][k] for k in common])
            matrix[i, j] = matrix[j, i] = tau.statistic
    rows = []
    for i in range(n):
        others = [j for j in range(n) if j != i]
        common = sorted(set(times[i]).intersection(*(set(times[j]) for j in others)))
        true = np.array([times[i][k] for k in common])
        logs = [np.log([times[j][k] for k in common]) for j in others]
        mean = np.mean([(x - x.mean()) / x.std() for x in logs], axis=0)
        best = max(others, key=lambda j: matrix[i, j])
        b_tau, b_top1 = _scores(np.array([times[best][k] for k in common]), true)
        m_tau, m_top1 = _scores(mean, true)
        zs = np.stack([(x - x.mean()) / x.std() for x in logs], 1)
        design = np.c_[zs, np.ones(len(common))]
        fit = design @ np.linalg.lstsq(design, np.log(true), rcond=None)[0]
        f_tau, f_top1 = _scores(fit, true)
        rows.append({"gpu": gpus[i], "configs": len(common), "best_other": gpus[best],
                     "best_other_tau": b_tau, "best_other_top1": b_top1,
                     "mean_others_tau": m_tau, "mean_others_top1": m_top1,
                     "fitted_blend_tau": f_tau, "fitted_blend_top1": f_top1})
        if curve:
            rows[-1]["curve"] = _curve(spaces[i], [times[j] for j in others], curve)
    keys = [k for k in rows[0] if k.endswith(("_tau", "_top1"))]
    mean = {k: float(np.mean([r[k] for r in rows])) for k in keys}
    if curve:
        mean["curve"] = {n: float(np.mean([r["curve"][n] for r in rows])) for n in curve}
    return {"gpus": gpus, "tau_matrix": matrix.round(3).tolist(), "held_out": rows, "mean": mean}


def _curve(space, others: list[dict], sizes: list[int], draws: int = 3) -> dict[int, float]:
    """Mean Kendall tau on the rest of ``space`` after N random configurations of it (each N
    of ``sizes``), learned by small trees on parameters + the other GPUs' standardised logs."""
    import lightgbm

    ran = [(c, t) for c, t in zip(space.configs, space.times_s, strict=True) if not math.isnan(t)]
    codes = np.stack([np.unique([str(c[k]) for c, _ in ran], return_inverse=True)[1]
                      for k in space.keys], 1)
    z = []
    for o in others:
        logs = np.log(list(o.values()))
        z.append([(math.log(o[_key(c)]) - logs.mean()) / logs.std() if _key(c) in o
                  else np.nan for c, _ in ran])
    x = np.c_[codes, np.asarray(z).T]
    y = np.log([t for _, t in ran])
    out = {}
    for n in sizes:
        if n > len(y) - 2:  # nothing left to rank
            print(f"--curve {n}: {space.device} has only {len(y)} configs that ran; give "
                  "fewer", file=sys.stderr)
            raise SystemExit(2)
        taus = []
        for seed in range(draws):
            idx = np.random.default_rng(seed).permutation(len(y))
            train, test = idx[:n], idx[n:]
            params = {"objective": "regression", "num_leaves": min(15, max(2, n // 4)),
                      "min_data_in_leaf": max(2, min(20, n // 8)), "learning_rate": 0.1,
                      "num_threads": 1, "verbose": -1, "seed": seed}
            trees = lightgbm.train(params, lightgbm.Dataset(x[train], y[train]),
                                   200 if n >= 64 else 50)
            taus.append(kendalltau(trees.predict(x[test]), y[test]).statistic)
        out[n] = float(np.mean(taus))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--caches", default=str(ROOT.parent / "shared" / "data" /
                                            "kernel_tuner_caches"))
    ap.add_argument("--spaces", default="convolution,dedispersion")
    ap.add_argument("--curve", default="", metavar="N,N,...",
                    help="learning curve on the held-out GPU at these numbers of its configs "
                         "(e.g. 16,64,256,1024)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args(argv)
    try:
        curve = [int(n) for n in args.curve.split(",") if n.strip()]
    except ValueError:
        print(f"--curve {args.curve!r}: give whole numbers of configs, e.g. 16,64,256",
              file=sys.stderr)
        return 2
    if any(n < 2 for n in curve):
        print(f"--curve {args.curve!r}: each number of configs must be at least 2",
              file=sys.stderr)
        return 2
    out = {}
    for space in args.spaces.split(","):
        files = sorted((Path(args.caches) / space).glob("*.json*"))
        if len(files) < 2:
            print(f"{space}: fewer than two caches under {args.caches}", file=sys.stderr)
            return 2
        res = out[space] = transfer(files, curve)
        short = [g.split()[-1][:10] for g in res["gpus"]]
        print(f"\n{space}: Kendall tau between GPUs (configurations that ran on both)")
        print(" " * 12 + "".join(f"{g:>11}" for g in short))
        for g, row in zip(short, res["tau_matrix"], strict=True):
            print(f"{g:>12}" + "".join(f"{v:>11.2f}" for v in row))
        print(f"\n{'held out':>28} | {'best other GPU (oracle)':>34} | {'mean of the others':>20}"
              f" | {'fitted blend (oracle)':>21}" + "".join(f" | {f'{n} shots':>9}"
                                                           for n in curve))
        for r in [*res["held_out"], {"gpu": "mean", "best_other": "", **res["mean"]}]:
            print(f"{r['gpu'][:28]:>28} | {r['best_other'][:16]:>16} tau {r['best_other_tau']:.2f}"
                  f" top1 {100 * r['best_other_top1']:5.1f}% | tau {r['mean_others_tau']:.2f} "
                  f"top1 {100 * r['mean_others_top1']:5.1f}% | tau {r['fitted_blend_tau']:.2f} "
                  f"top1 {100 * r['fitted_blend_top1']:5.1f}%"
                  + "".join(f" | tau {r['curve'][n]:.2f}" for n in curve))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
