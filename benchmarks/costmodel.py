"""How well do the cost models rank configurations they have not measured?

    .venv/bin/python benchmarks/costmodel.py [--caches DIR] [--spaces convolution,dedispersion]
        [--splits device,random,fewshot] [--models roofline,gbdt,graphsage] [--steps 3000]
        [--sweep FILE.jsonl.gz ...] [--dataset FILE.jsonl.gz ...] [--together]
        [--dataset-splits program,device] [--program-folds K] [--gbdt-options JSON]
        [--shots 16] [--json OUT]

For every Kernel Tuner space (one kernel, six GPUs: ``../shared/data/kernel_tuner_caches``)
and every split, trains each model on the training rows of each fold and scores the held-out
rows (``costmodel.cross_validate``): mean Kendall tau and top-1 slowdown per space (one kernel
on one GPU), top-5 recall, MAPE.  ``--split device`` is leave-one-GPU-out, the issue's main
figure; ``random`` holds out 20% of rows.  ``--sweep`` adds our own measured kernels (files of
``benchmarks/sweep.py``) as one more dataset, split by program; ``--dataset`` a dataset file
(``tuner export dataset``: our CPU measurements), split by program (``--dataset-splits``;
``--together`` takes the files as one dataset, so ``device`` holds one CPU out and ranks its
configs from the other CPUs' measurements of the same programs).  ``fewshot``: per held-out
GPU, the default model (``--fewshot-model``, gbdt) trained on the other GPUs, zero-shot and
after ``--shots`` configs of the held-out GPU chosen and measured by the model-guided rule
(``benchmarks/strategies.py``: ``sampler: model``'s), scored on the rest of its space.  Ends
with one table of every figure.  Also prints training seconds and prediction throughput
(configs/s) per model, and the CPU it ran on.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from costmodel import (  # noqa: E402
    concat,
    cross_validate,
    kernel_tuner_samples,
    make_model,
    read_kernel_tuner,
    sweep_samples,
)

METRICS = ("kendall_tau", "top1_slowdown", "top5_recall", "mape")


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def datasets(args) -> dict[str, list]:
    out = {}
    for space in [s for s in args.spaces.split(",") if s]:
        files = sorted((Path(args.caches) / space).glob("*.json*"))
        if not files:
            sys.exit(f"error: no Kernel Tuner caches under {Path(args.caches) / space}")
        out[space] = concat(*(kernel_tuner_samples(read_kernel_tuner(f)) for f in files))
    for path in args.sweep:
        out[Path(path).name] = list(sweep_samples(path))
    if args.together and args.dataset:
        out[" + ".join(Path(p).name for p in args.dataset)] = concat(
            *(dataset_samples(p) for p in args.dataset))
    else:
        for path in args.dataset:
            out[Path(path).name] = dataset_samples(path)
    return out


def dataset_samples(path: str) -> list:
    """The ok measurements of a dataset file, through a scratch database (as a user's)."""
    import tempfile

    import db
    from costmodel import import_dataset, read_dataset, samples_from_rows

    with tempfile.TemporaryDirectory() as tmp, \
            db.connect(f"sqlite:///{tmp}/d.db") as database:
        import_dataset(database, read_dataset(path))
        return samples_from_rows(db.training_rows(database))


def fewshot(kernel: str, caches: Path, kind: str, shots: int, options: dict | None = None
            ) -> dict:
    """Per held-out GPU: zero-shot and few-shot metrics of ``kind`` trained on the others."""
    from strategies import Space, few_shot, model_for_target, target_samples

    from costmodel import evaluate

    spaces = [Space(p) for p in sorted((caches / kernel).glob("*.json*"))]
    rows = []
    for space in spaces:
        model = model_for_target(spaces, space, kind, **(options or {}))
        samples = target_samples(space)
        zero = evaluate(["g"] * len(samples), space.times, model.predict(samples))
        few = few_shot(space, model, samples, shots)
        rows.append({"gpu": space.raw.device, "zero_tau": zero["kendall_tau"],
                     "zero_top1": zero["top1_slowdown"], "few_tau": few["kendall_tau"],
                     "few_top1": few["top1_slowdown"], "best_after": few["best_after"]})
        print(f"  {kernel} {space.raw.device[:24]:<24} zero-shot tau {zero['kendall_tau']:.3f} "
              f"top1 {100 * zero['top1_slowdown']:5.1f}% | after {shots} shots tau "
              f"{few['kendall_tau']:.3f} top1 {100 * few['top1_slowdown']:5.1f}%, best found "
              f"{100 * few['best_after']:4.1f}% off", flush=True)
    mean = {k: float(sum(r[k] for r in rows) / len(rows)) for k in rows[0] if k != "gpu"}
    return {"dataset": kernel, "split": f"fewshot {shots}", "model": kind, "rows": rows,
            "mean": mean}


def throughput(samples, models, options: dict) -> dict:
    """Seconds to train on all rows and configs/s predicted, per model."""
    out = {}
    for kind in models:
        model = make_model(kind, **options.get(kind, {}))
        start = time.perf_counter()
        model.fit(samples)
        train_s = time.perf_counter() - start
        model.predict(samples[:64])  # the first call builds the network's kernels once
        start = time.perf_counter()
        model.predict(samples)
        out[kind] = {"rows": len(samples), "train_s": round(train_s, 2),
                     "predict_per_s": round(len(samples) / (time.perf_counter() - start))}
    return out


def show(name: str, split: str, result: dict) -> None:
    print(f"\n{name} — split {split}")
    print(f"  {'model':<10} " + " ".join(f"{m:>14}" for m in METRICS))
    for kind, mean in result["mean"].items():
        cells = ([f"{mean[m]:14.3f}" if m in mean else f"{'-':>14}" for m in METRICS]
                 if mean else [f"{'n/a':>14}"] * len(METRICS))
        print(f"  {kind:<10} " + " ".join(cells))
        if mean and "common_tau" in mean:
            print(f"  {'':<10} tau on the configs every device ran: {mean['common_tau']:.3f}")
    for kind, folds in result["folds"].items():
        row = ", ".join(f"{f['test']}: tau {f['kendall_tau']:.2f} top1 "
                        f"{100 * f['top1_slowdown']:.1f}%"
                        + (f" (common {f['common_tau']:.2f})" if "common_tau" in f else "")
                        for f in folds if f)
        if row:
            print(f"    {kind}: {row}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--caches", default=str(ROOT.parent / "shared/data/kernel_tuner_caches"))
    ap.add_argument("--spaces", default="convolution,dedispersion")
    ap.add_argument("--splits", default="device,random")
    ap.add_argument("--models", default="roofline,gbdt,graphsage")
    ap.add_argument("--steps", type=int, default=6000, help="GraphSAGE training steps")
    ap.add_argument("--sweep", nargs="*", default=[], help="benchmarks/sweep.py outputs")
    ap.add_argument("--dataset", nargs="*", default=[], help="dataset files (CPU)")
    ap.add_argument("--together", action="store_true",
                    help="the --dataset files as one dataset (e.g. two CPUs' files)")
    ap.add_argument("--dataset-splits", default="program",
                    help="splits of the --dataset data: program, device (leave one CPU out)")
    ap.add_argument("--shots", type=int, default=16)
    ap.add_argument("--fewshot-model", default="gbdt")
    ap.add_argument("--program-folds", type=int, default=None, metavar="K",
                    help="deal the held-out programs of a --sweep / --dataset into K folds "
                         "(default: one fold per program)")
    ap.add_argument("--gbdt-options", default="{}", metavar="JSON",
                    help='options of the gbdt model, e.g. \'{"shape_objective": "regression"}\' '
                         "(also the few-shot model's when it is gbdt)")
    ap.add_argument("--no-throughput", action="store_true")
    ap.add_argument("--json", help="write every figure to this file")
    args = ap.parse_args()
    models = args.models.split(",")
    options = {"graphsage": {"steps": args.steps}, "gbdt": json.loads(args.gbdt_options)}
    print(f"CPU: {cpu_name()}")
    report = {"cpu": cpu_name(), "results": [], "throughput": {}}
    bad = set(args.dataset_splits.split(",")) - {"program", "device"}
    if bad:
        ap.error(f"--dataset-splits: unknown {', '.join(sorted(bad))}; use program, device")
    data = datasets(args)
    dataset_names = set(data) - set(args.spaces.split(",")) - {Path(p).name for p in args.sweep}
    table = []
    for name, samples in data.items():
        splits = (args.splits.split(",") if name in args.spaces.split(",")
                  else args.dataset_splits.split(",") if name in dataset_names else ["program"])
        for split in splits:
            if split == "fewshot":
                res = fewshot(name, Path(args.caches), args.fewshot_model, args.shots,
                              options.get(args.fewshot_model, {}))
                report["results"].append(res)
                m = res["mean"]
                table.append((name, "leave one GPU out, zero-shot", args.fewshot_model,
                              {"kendall_tau": m["zero_tau"], "top1_slowdown": m["zero_top1"]}))
                table.append((name, f"leave one GPU out, {args.shots} shots", args.fewshot_model,
                              {"kendall_tau": m["few_tau"], "top1_slowdown": m["few_top1"]}))
                continue
            start = time.perf_counter()
            result = cross_validate(samples, split, models, options=options,
                                    k=args.program_folds if split == "program" else None)
            result["seconds"] = round(time.perf_counter() - start, 1)
            show(f"{name} ({len(samples)} rows)", split, result)
            report["results"].append({"dataset": name, **result})
            table += [(name, split, kind, mean) for kind, mean in result["mean"].items()]
        if args.no_throughput:
            continue
        report["throughput"][name] = throughput(samples, models, options)
        print(f"  train / predict on all {len(samples)} rows: "
              + "; ".join(f"{k} {v['train_s']} s, {v['predict_per_s']}/s"
                          for k, v in report["throughput"][name].items()))
    print(f"\n{'data':<34} {'split':<30} {'model':<10} {'tau':>7} {'top-1':>8} {'top-5':>6} "
          f"{'MAPE':>7}")
    for name, split, kind, m in table:
        cells = [f"{m[k]:7.3f}" if m and k in m else f"{'-':>7}" for k in ("kendall_tau",)]
        top1 = f"{100 * m['top1_slowdown']:7.1f}%" if m and "top1_slowdown" in m else \
            f"{'-':>8}"
        top5 = f"{m['top5_recall']:6.2f}" if m and "top5_recall" in m else f"{'-':>6}"
        mape = f"{m['mape']:7.3f}" if m and "mape" in m else f"{'-':>7}"
        print(f"{name[:34]:<34} {split[:30]:<30} {kind:<10} {cells[0]} {top1} {top5} {mape}")
    if len(data) > 1 and not args.no_throughput:  # the scale figure: every row at once
        everything = concat(*data.values())
        report["throughput"]["all"] = throughput(everything, models, options)
        print(f"\nall datasets, {len(everything)} rows: "
              + "; ".join(f"{k} trains in {v['train_s']} s, predicts {v['predict_per_s']}/s"
                          for k, v in report["throughput"]["all"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
