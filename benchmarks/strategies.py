"""Search strategies on real GPU spaces, side by side with Kernel Tuner's own.

    .venv/bin/python benchmarks/strategies.py [--caches DIR] [--spaces convolution,dedispersion]
        [--seeds 20] [--budget 200] [--ours random,tpe,model] [--model-options JSON]
        [--kt genetic_algorithm,pso,adaptive_tabu_greywolf] [--model gbdt] [--gpus A100,MI250X]
        [--json OUT]

TPE costs most of a row's time (Optuna's TPE re-reads every past trial at each ask: ~10-30 s a
seed on one core), so ``--ours random,model`` then ``--ours tpe --kt ''`` runs it apart; every
strategy's figures depend only on its seeds, not on what else ran.

Every Kernel Tuner cache (one kernel on one GPU, every configuration timed) is replayed: a
strategy proposes configurations, each new one costs one evaluation and is answered from the
file.  Configurations that failed on the GPU are left out of the space, as Kernel Tuner leaves
them out of its own.  Strategies:

- ``random``: uniform without replacement;
- ``tpe``: Optuna's multivariate TPE over the parameters (categorical), as ``tuner launch``;
- ``model``: the learned cost model trained on the *other five* GPUs of the same kernel
  (never on this one) ranks this GPU's space; the strategy measures the best-ranked
  configuration, then corrects the ranking with what it measured (the residual of measured
  configurations, spread to their neighbours by how many parameters they share) and repeats;
  after 4, 8 and 16 measurements it re-learns the GPU from them (``CostModel.adapt``) — the
  rule of ``sampler: model``, run by the sampler's own class (``GuidedRanking``,
  tuner/samplers/model.py), with a small noise added per seed to break ties;
- Kernel Tuner 1.5's strategies (``kernel_tuner.tune_cache``, its simulation mode on the
  un-gzipped file), seeded through ``random`` and ``numpy.random``.

Reported per space x GPU: evaluations until the best found is within 5% of the space's optimum,
median over seeds (``>B``: not within the budget B in at least half the seeds), and the
methodology score of Willemsen et al. (FGCS 2024) averaged over budgets 1..B:
P(t) = (f_s(t) - f_rand(t)) / (f_opt - f_rand(t)), f_s the median best-found over seeds after t
evaluations, f_rand the expected best of t random draws without replacement (exact), f_opt the
optimum: 0 is random search, 1 finds the optimum at once.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel import (  # noqa: E402
    concat,
    device_profile,
    expected_random_best,
    featurize_params,
    group_name,
    kernel_tuner_samples,
    make_model,
    read_kernel_tuner,
)
from tuner.samplers.model import ADAPT_AT, GuidedRanking  # noqa: E402

TARGET = 1.05


class Space:
    """The configurations of one cache that ran, as rows of parameter values."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.raw = read_kernel_tuner(path)
        keep = [i for i, t in enumerate(self.raw.times_s) if not math.isnan(t)]
        self.keys = self.raw.keys
        self.configs = [self.raw.configs[i] for i in keep]
        self.times = np.asarray([self.raw.times_s[i] for i in keep])
        self.index = {self.key(c): i for i, c in enumerate(self.configs)}
        self.best = float(self.times.min())
        # parameter values as small integers, for the neighbour correction
        self.codes = np.stack([np.unique([str(c[k]) for c in self.configs],
                                         return_inverse=True)[1] for k in self.keys], 1)

    def key(self, config: dict) -> tuple:
        return tuple(str(config[k]) for k in self.keys)

    def within(self, order: list[int]) -> int | None:
        """1-based evaluations until within TARGET of the optimum (None: never)."""
        for n, i in enumerate(order, 1):
            if self.times[i] <= TARGET * self.best:
                return n
        return None

    def curve(self, order: list[int], budget: int) -> np.ndarray:
        """Best time found after 1..budget evaluations."""
        best = np.minimum.accumulate(self.times[order[:budget]])
        if len(best) < budget:
            best = np.concatenate([best, np.full(budget - len(best), best[-1])])
        return best


# ---------------------------------------------------------------- strategies


def run_random(space: Space, seed: int, budget: int) -> list[int]:
    return list(np.random.default_rng(seed).permutation(len(space.configs))[:budget])


def run_tpe(space: Space, seed: int, budget: int) -> list[int]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    values = {k: sorted({str(c[k]) for c in space.configs}) for k in space.keys}
    dists = {k: optuna.distributions.CategoricalDistribution(v) for k, v in values.items()}
    sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True)
    study = optuna.create_study(sampler=sampler)
    order: list[int] = []
    seen: set[int] = set()
    for _ in range(20 * budget):
        if len(order) >= budget:
            break
        trial = study.ask(dists)
        i = space.index.get(tuple(trial.params[k] for k in space.keys))
        if i is None:  # outside the space (restricted, or failed on this GPU): not an evaluation
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        if i not in seen:
            seen.add(i)
            order.append(i)
        study.tell(trial, float(space.times[i]))
    return order


def target_samples(target: Space) -> list:
    """The target GPU's configs as the model sees them (its table row, or its sibling's)."""
    profile = device_profile(target.raw.device_key)
    return [featurize_params(c, target.keys, target.raw.problem_size, profile.spec,
                             group=group_name(target.raw.kernel, target.raw.device),
                             program=target.raw.kernel,
                             device=target.raw.device_key, known_device=profile.known)
            for c in target.configs]


def model_for_target(spaces: list[Space], target: Space, kind: str, **options):
    """A model trained on the other GPUs' spaces of the kernel (never on the target)."""
    train = concat(*(kernel_tuner_samples(s.raw) for s in spaces if s is not target))
    model = make_model(kind, **options)
    model.fit(train)
    return model


def memoize_raw(model) -> None:
    """Remember ``model``'s raw predictions per feature row, so that the 20 seeds of a row
    (and the re-predictions after each ``adapt``) do not ask LightGBM again for rows it has
    answered: the same numbers, row by row (a tree ensemble predicts each row on its own), at
    a fraction of the time (predicting the space was most of the model strategy's time)."""
    raw, memo = model._raw, {}

    def cached(samples):
        keys = [s.flat().tobytes() for s in samples]
        missing = list(dict.fromkeys(k for k in keys if k not in memo))
        if missing:
            first = {k: i for i, k in reversed(list(enumerate(keys)))}
            level, shape = raw([samples[first[k]] for k in missing])
            memo.update(zip(missing, zip(level.tolist(), shape.tolist(), strict=True),
                            strict=True))
        both = np.asarray([memo[k] for k in keys], np.float64).reshape(len(keys), 2)
        return both[:, 0], both[:, 1]

    model._raw = cached  # an instance attribute: copies of the model share the memo


def run_model(space: Space, model, samples: list, seed: int, budget: int,
              adapt: bool = True) -> list[int]:
    """The configs the rule of ``sampler: model`` measures on ``space``, in order: the
    sampler's own ``GuidedRanking`` (the device re-learned after 4, 8 and 16 measurements, or
    never where ``adapt`` is false), its ties broken by a noise drawn from ``seed``."""
    ranking = GuidedRanking(model, samples, space.codes, adapt_at=ADAPT_AT if adapt else (),
                            tie_break=seed)
    order: list[int] = []
    for _ in range(min(budget, len(samples))):
        i = ranking.next()
        assert i is not None  # fewer measurements than configs
        ranking.observe(i, space.times[i])
        order.append(i)
    return order


def few_shot(space: Space, model, samples: list, shots: int = 16) -> dict:
    """Ranking of the rest of the space after ``shots`` configs chosen and measured by the
    model-guided rule (seed 0): a fresh copy of the model adapted to all of them, its
    prediction corrected by the residuals of the measured ones, scored on the configs not
    measured (Kendall tau, top-1 slowdown)."""
    from costmodel import evaluate

    order = run_model(space, model, samples, 0, shots)
    ranking = GuidedRanking(model, samples, space.codes, adapt_at=())
    for i in order:
        ranking.observe(i, space.times[i])
    ranking.adapt()
    corrected = ranking.corrected()
    rest = np.setdiff1d(np.arange(len(corrected)), order)
    m = evaluate(["g"] * len(rest), space.times[rest], np.exp(corrected[rest]))
    best_seen = float(min(space.times[order]))
    return {"shots": shots, "kendall_tau": m["kendall_tau"],
            "top1_slowdown": m["top1_slowdown"],
            # what a tuner ends with: the best of the shots and the model's pick
            "best_after": min(best_seen, float(space.times[rest][np.argmin(
                corrected[rest])])) / space.best - 1}


def run_kernel_tuner(space: Space, strategy: str, seed: int, budget: int, plain: Path
                     ) -> list[int]:
    import kernel_tuner

    random.seed(seed)
    np.random.seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results, _ = kernel_tuner.tune_cache(str(plain), strategy=strategy,
                                             strategy_options={"max_fevals": budget},
                                             verbose=False, quiet=True)
    order: list[int] = []
    seen: set[int] = set()
    for r in results:
        i = space.index.get(space.key(r))
        if i is not None and i not in seen:
            seen.add(i)
            order.append(i)
    return order[:budget]


# ---------------------------------------------------------------- report


def summarize(space: Space, orders: list[list[int]], budget: int, f_rand: np.ndarray) -> dict:
    hits = [space.within(o) for o in orders]
    reached = sorted(h if h is not None else math.inf for h in hits)
    median = statistics.median(reached)
    f_s = np.median(np.stack([space.curve(o, budget) for o in orders]), 0)
    ok = f_rand > space.best * (1 + 1e-12)
    p = (f_s[ok] - f_rand[ok]) / (space.best - f_rand[ok])
    return {"evals_to_5pct": None if math.isinf(median) else median,
            "reached": sum(h is not None for h in hits), "seeds": len(orders),
            "score": float(np.mean(p)) if ok.any() else None,
            "hits": hits}  # per seed: evaluations to within 5% (None: not within budget)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--caches", default=str(ROOT.parent / "shared/data/kernel_tuner_caches"))
    ap.add_argument("--spaces", default="convolution,dedispersion")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--budget", type=int, default=200)
    ap.add_argument("--ours", default="random,tpe,model",
                    help="our strategies to run (random, tpe, model, model_no_adapt: the model "
                         "rule without adapt; '' for none)")
    ap.add_argument("--kt", default="genetic_algorithm,pso,adaptive_tabu_greywolf",
                    help="Kernel Tuner strategies ('' for none)")
    ap.add_argument("--model", default="gbdt", help="cost model kind for the model strategy")
    ap.add_argument("--model-options", default="{}", metavar="JSON",
                    help='its options, e.g. \'{"shape_objective": "regression"}\'')
    ap.add_argument("--gpus", default="", help="only these caches (file stems: A100,MI250X)")
    ap.add_argument("--json")
    args = ap.parse_args()
    try:
        options = json.loads(args.model_options)
        assert isinstance(options, dict)
    except (ValueError, AssertionError):
        print(f"strategies.py: --model-options {args.model_options!r}: give a JSON object, "
              'e.g. \'{"shape_objective": "regression"}\'', file=sys.stderr)
        sys.exit(2)
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                .splitlines() if ln.startswith("model name")), "unknown CPU")
    print(f"CPU: {cpu}; budget {args.budget} evaluations, {args.seeds} seeds; target: within "
          f"{round(100 * (TARGET - 1))}% of the optimum")
    kt = [s for s in args.kt.split(",") if s]
    ours = [s for s in args.ours.split(",") if s]
    unknown = set(ours) - {"random", "tpe", "model", "model_no_adapt"}
    if unknown:
        ap.error(f"--ours: unknown strategies {sorted(unknown)}")
    names = [*ours, *kt]
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="kt-plain-"))
    for kernel in args.spaces.split(","):
        spaces = [Space(p) for p in sorted((Path(args.caches) / kernel).glob("*.json*"))]
        only = {g for g in args.gpus.split(",") if g}
        for space in spaces:
            if only and space.path.name.split(".")[0] not in only:
                continue  # still among the others the model is trained on
            start = time.perf_counter()
            plain = tmp / f"{kernel}-{space.path.name.split('.')[0]}.json"
            plain.write_bytes(gzip.decompress(space.path.read_bytes()))
            model = samples = None
            if {"model", "model_no_adapt"} & set(names):
                model = model_for_target(spaces, space, args.model, **options)
                memoize_raw(model)
                samples = target_samples(space)
            f_rand = expected_random_best(space.times, args.budget)
            row = {"space": kernel, "gpu": space.raw.device, "configs": len(space.configs)}
            for name in names:
                orders = []
                for seed in range(args.seeds):
                    if name == "random":
                        orders.append(run_random(space, seed, args.budget))
                    elif name == "tpe":
                        orders.append(run_tpe(space, seed, args.budget))
                    elif name in ("model", "model_no_adapt"):
                        orders.append(run_model(space, model, samples, seed, args.budget,
                                                adapt=name == "model"))
                    else:
                        orders.append(run_kernel_tuner(space, name, seed, args.budget, plain))
                row[name] = summarize(space, orders, args.budget, f_rand)
            rows.append(row)
            cells = "  ".join(f"{n} {_fmt(row[n], args.budget)}" for n in names)
            print(f"{kernel:<13} {space.raw.device:<24} {len(space.configs):>6}  {cells}  "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)
            if args.json:  # after every row, so that a cut run keeps what it finished
                _write(args.json, cpu, args, rows, None, None)
    wins = None
    if "model" in names and kt and rows:
        wins = sum(all(_evals(r["model"]) < _evals(r[k]) for k in kt) for r in rows)
        ties = sum(all(_evals(r["model"]) <= _evals(r[k]) for k in kt) for r in rows) - wins
        print(f"\nmodel-guided needs fewer evaluations than every Kernel Tuner strategy on "
              f"{wins} of {len(rows)} space x GPU rows (and ties the best of them on {ties})")
    scores = {n: statistics.mean(v) if (v := [r[n]["score"] for r in rows
                                             if r[n]["score"] is not None]) else None
              for n in names}
    print("methodology score (mean over rows): "
          + ", ".join(f"{n} {'-' if v is None else f'{v:.3f}'}" for n, v in scores.items()))
    if args.json:
        _write(args.json, cpu, args, rows, wins, scores)


def _write(path: str, cpu: str, args, rows: list, wins, scores) -> None:
    Path(path).write_text(json.dumps({"cpu": cpu, "budget": args.budget, "seeds": args.seeds,
                                      "rows": rows, "wins": wins, "scores": scores}, indent=1))


def _evals(cell: dict) -> float:
    return math.inf if cell["evals_to_5pct"] is None else cell["evals_to_5pct"]


def _fmt(cell: dict, budget: int) -> str:
    e = cell["evals_to_5pct"]
    return f"{'>' + str(budget) if e is None else f'{e:g}'} (P {cell['score']:.2f})"


if __name__ == "__main__":
    main()
