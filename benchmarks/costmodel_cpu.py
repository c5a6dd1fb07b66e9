"""Why the CPU dataset's programs-held-out figures are what they are: measurements, no model
tuning.

    .venv/bin/python benchmarks/costmodel_cpu.py [--dataset FILE.jsonl.gz] [--folds 5]
        [--trees 300] [--leaves 63] [--parts collisions,variance,noise,curve,more,level,
        mape_parts] [--extra FILE.jsonl.gz] [--extra-counts 0,125,250,500,1000000] [--json OUT]

On the dataset file (``tuner export dataset``: our CPU measurements), through the same samples
``benchmarks/costmodel.py --dataset`` scores:

- ``collisions``: rows whose features (what the trees read, ``Sample.flat``) equal another
  config's of the same structure: the model cannot tell them apart, whatever it learns;
- ``variance``: the share of the log-time variance inside structures (what a ranking sees)
  against between them (what the level / MAPE must get right);
- ``noise_ceiling``: the Kendall tau of a perfect model of the true times against
  measurements carrying log-normal noise of a given sd (0.067: the repeat spread measured by
  ``benchmarks/measure_agreement.py``, old path against itself, IQR 0.960-1.092);
- ``by_spread``: held-out tau per structure, by its within-structure spread of log time;
- ``learning_curve``: held-out tau / MAPE of gbdt trained on 25%, 50%, 100% of each fold's
  training programs (the same folds as ``benchmarks/costmodel.py --program-folds K``);
- ``level``: the log-residual sd of the level (gbdt) and of the roofline on held-out programs,
  and the MAPE each gives;
- ``more``: with ``--extra FILE`` (a dataset file of other programs on the same CPU), the
  held-out figures of the *same* folds of ``--dataset``'s programs as the training programs
  grow by the first N of the extra file's programs (``--extra-counts``, a seeded order): the
  learning curve measured with new programs rather than extrapolated from fewer;
- ``mape_parts``: the held-out MAPE as predicted, with each structure's true mean log time
  given (what a perfect level leaves to the order), and with the truth's order and spread
  inside each structure (what the level alone costs).

``--parts`` picks some of them (default: all).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel import evaluate, folds, make_model  # noqa: E402

DEFAULT = ROOT / "benchmarks/data/dataset_intel-r-xeon-r-processor-family-6-model-167.jsonl.gz"


def _dataset_samples(path: str) -> list:
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_costmodel",
                                                  ROOT / "benchmarks/costmodel.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.dataset_samples(path)


def collisions(samples) -> dict:
    x = np.stack([s.flat() for s in samples])
    sets: dict = defaultdict(lambda: defaultdict(list))
    for i, s in enumerate(samples):
        sets[s.group][x[i].tobytes()].append(i)
    rows, sds, keys = 0, [], defaultdict(int)
    for by_features in sets.values():
        for idx in by_features.values():
            if len(idx) < 2:
                continue
            rows += len(idx) - 1
            sds.append(float(np.std(np.log([samples[i].seconds for i in idx]), ddof=1)))
            configs = [samples[i].config or {} for i in idx]
            for k in configs[0]:
                if len({c.get(k) for c in configs}) > 1:
                    keys[k] += 1
    return {"rows": rows, "of": len(samples), "sets": len(sds),
            "median_sd_log_t": float(np.median(sds)) if sds else 0.0,
            "mean_sd_log_t": float(np.mean(sds)) if sds else 0.0, "differing_keys": dict(keys)}


def variance(samples) -> dict:
    logt = np.log([s.seconds for s in samples])
    groups: dict = defaultdict(list)
    for i, s in enumerate(samples):
        groups[s.group].append(i)
    within = sum(float(((logt[g] - logt[g].mean()) ** 2).sum()) for g in groups.values())
    return {"total_var_log_t": float(logt.var()), "within_structure_share":
            within / len(logt) / float(logt.var()), "structures": len(groups),
            "median_within_sd": float(np.median([logt[g].std() for g in groups.values()
                                                  if len(g) > 1]))}


def noise_ceiling(samples, sds=(0.03, 0.067, 0.1)) -> dict:
    t = np.array([s.seconds for s in samples])
    rng = np.random.default_rng(1)
    return {str(sd): evaluate([s.group for s in samples], t,
                              t * np.exp(rng.normal(0, sd, len(t))))["kendall_tau"]
            for sd in sds}


def held_out(samples, k: int, options: dict, fraction: float = 1.0) -> tuple[dict, list]:
    """Mean metrics over the folds, and per structure (tau, rows, within sd)."""
    res, per = [], []
    for f, (_, train, test) in enumerate(folds(samples, "program", 0, k)):
        tr = [samples[i] for i in train]
        if fraction < 1:
            programs = sorted({s.program for s in tr})
            keep = set(np.random.default_rng(f).permutation(programs)[
                :max(2, int(fraction * len(programs)))])
            tr = [s for s in tr if s.program in keep]
        te = [samples[i] for i in test]
        model = make_model("gbdt", **options)
        model.fit(tr)
        pred, truth = model.predict(te), np.array([s.seconds for s in te])
        res.append(evaluate([s.group for s in te], truth, pred))
        rows: dict = defaultdict(list)
        for i, s in enumerate(te):
            rows[s.group].append(i)
        for idx in rows.values():
            if len(idx) > 1:
                m = evaluate(["g"] * len(idx), truth[idx], pred[idx])
                per.append((m["kendall_tau"], len(idx), float(np.log(truth[idx]).std())))
    mean = {m: float(np.mean([r[m] for r in res]))
            for m in ("kendall_tau", "top1_slowdown", "top5_recall", "mape")}
    return mean, per


def more_programs(samples, extra, k: int, options: dict, counts: list[int]) -> dict:
    """Held-out metrics on ``samples``' program folds, trained on each fold's training programs
    plus the first N programs of ``extra`` (those not in ``samples``), for N in ``counts``."""
    known = {s.program for s in samples}
    extra = [s for s in extra if s.program not in known]
    order = list(np.random.default_rng(0).permutation(sorted({s.program for s in extra})))
    splits = folds(samples, "program", 0, k)
    out: dict = {"extra_programs": len(order)}
    for n in counts:
        keep = set(order[:n])
        added = [s for s in extra if s.program in keep]
        res = []
        for _, train, test in splits:
            te = [samples[i] for i in test]
            model = make_model("gbdt", **options)
            model.fit([samples[i] for i in train] + added)
            res.append(evaluate([s.group for s in te], np.array([s.seconds for s in te]),
                                model.predict(te)))
        key = str(min(n, len(order)))
        out[key] = {"added_rows": len(added),
                    **{m: float(np.mean([r[m] for r in res]))
                       for m in ("kendall_tau", "top1_slowdown", "top5_recall", "mape")}}
        print(f"+{key} programs ({len(added)} rows):", out[key], flush=True)
    return out


def mape_parts(samples, k: int, options: dict) -> dict:
    """Held-out MAPE taken apart: as predicted; with each structure's mean log time given
    (the model's order and spread inside it: what a perfect level would leave); and with the
    truth's spread inside each structure around the predicted mean (a perfect order and
    spread: what the level alone costs)."""
    parts: dict[str, list] = {"as_predicted": [], "true_level": [], "true_shape": []}
    truths = []
    for _, train, test in folds(samples, "program", 0, k):
        te = [samples[i] for i in test]
        model = make_model("gbdt", **options)
        model.fit([samples[i] for i in train])
        lp = np.log(model.predict(te))
        lt = np.log([s.seconds for s in te])
        rows: dict = defaultdict(list)
        for i, s in enumerate(te):
            rows[s.group].append(i)
        level_true, shape_true = lp.copy(), lp.copy()
        for idx in rows.values():
            level_true[idx] = lp[idx] - lp[idx].mean() + lt[idx].mean()
            shape_true[idx] = lt[idx] - lt[idx].mean() + lp[idx].mean()
        for name, v in (("as_predicted", lp), ("true_level", level_true),
                        ("true_shape", shape_true)):
            parts[name].append(v)
        truths.append(lt)
    lt = np.concatenate(truths)
    return {name: float(np.mean(np.abs(np.exp(np.concatenate(v) - lt) - 1)))
            for name, v in parts.items()}


def level(samples, k: int, options: dict) -> dict:
    out: dict = {"gbdt_level": [], "roofline": [], "truth": []}
    for _, train, test in folds(samples, "program", 0, k):
        tr = [samples[i] for i in train]
        te = [samples[i] for i in test]
        model = make_model("gbdt", **options)
        model.fit(tr)
        out["gbdt_level"].append(np.exp(model._raw(te)[0]))
        roof = make_model("roofline")
        roof.fit(tr)
        out["roofline"].append(roof.predict(te))
        out["truth"].append(np.array([s.seconds for s in te]))
    t = np.concatenate(out.pop("truth"))
    res = {}
    for name, parts in out.items():
        p = np.concatenate(parts)
        e = np.log(p / t)
        res[name] = {"log_residual_sd": float(e.std()), "log_residual_mean": float(e.mean()),
                     "mape": float(np.mean(np.abs(p - t) / t))}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default=str(DEFAULT))
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--trees", type=int, default=300)
    ap.add_argument("--leaves", type=int, default=63)
    ap.add_argument("--parts", default="all", help="comma list of collisions, variance, "
                    "noise, curve, more, level, mape_parts (default: all; 'more' needs --extra)")
    ap.add_argument("--extra", help="a dataset file of other programs (part 'more')")
    ap.add_argument("--extra-counts", default="0,125,250,500,1000000",
                    help="extra programs added to each fold's training programs (part 'more')")
    ap.add_argument("--json")
    args = ap.parse_args()
    wanted = set(args.parts.split(","))
    known = {"all", "collisions", "variance", "noise", "curve", "more", "level", "mape_parts"}
    if wanted - known:
        ap.error(f"--parts: unknown {', '.join(sorted(wanted - known))}; use a comma list of "
                 f"{', '.join(sorted(known))}")

    if "more" in wanted and not args.extra:
        ap.error("--parts more needs --extra FILE (a dataset file of other programs)")
    try:
        counts = [int(n) for n in args.extra_counts.split(",")]
    except ValueError:
        ap.error(f"--extra-counts {args.extra_counts!r}: a comma list of whole numbers of "
                 "programs, e.g. 0,250,500")

    def run(part: str) -> bool:
        return "all" in wanted or part in wanted

    samples = _dataset_samples(args.dataset)
    options = {"trees": args.trees, "leaves": args.leaves}
    report: dict = {"dataset": Path(args.dataset).name, "rows": len(samples),
                    "programs": len({s.program for s in samples}), "folds": args.folds,
                    "gbdt": options}
    parts = {"collisions": lambda: collisions(samples), "variance": lambda: variance(samples),
             "noise": lambda: noise_ceiling(samples)}
    for part, measure in parts.items():
        if run(part):
            report[part] = measure()
            print(f"{part}:", report[part], flush=True)
    if run("curve"):
        curve = {}
        for fraction in (0.25, 0.5, 1.0):
            mean, per = held_out(samples, args.folds, options, fraction)
            curve[str(fraction)] = mean
            print(f"training programs x{fraction}: {mean}", flush=True)
            if fraction == 1.0:
                arr = np.array(per)
                report["by_spread"] = {
                    name: {"structures": int(mask.sum()),
                           "kendall_tau": float(arr[mask, 0].mean())}
                    for name, mask in (("sd<0.15", arr[:, 2] < 0.15),
                                       ("0.15<=sd<0.4", (arr[:, 2] >= 0.15) & (arr[:, 2] < 0.4)),
                                       ("sd>=0.4", arr[:, 2] >= 0.4))}
                print("held-out tau by within-structure spread:", report["by_spread"],
                      flush=True)
        report["learning_curve"] = curve
    if run("more") and args.extra:
        report["more_programs"] = more_programs(
            samples, _dataset_samples(args.extra), args.folds, options,
            counts)
    if run("level"):
        report["level"] = level(samples, args.folds, options)
        print("level on held-out programs:", report["level"], flush=True)
    if run("mape_parts"):
        report["mape_parts"] = mape_parts(samples, args.folds, options)
        print("held-out MAPE, as predicted / with each structure's true mean / with the true "
              "order and spread inside it:", report["mape_parts"], flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
