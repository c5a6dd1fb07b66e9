"""``tuner import kernel-tuner | dataset``, ``tuner export dataset`` and ``tuner model train |
eval | predict | list``: the learned cost model's loop through the database
(docs/costmodel.md)."""

from __future__ import annotations

import argparse
import json
import math
import sys

from db import DEFAULT_URL

from ..api import models, parse_pairs


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="import measurements made elsewhere into the database")
    isub = p.add_subparsers(dest="import_kind", metavar="KIND", required=True)
    q = isub.add_parser("kernel-tuner", help="Kernel Tuner cache files (.json or .json.gz): "
                                             "one measurement per configuration on "
                                             "replay:<GPU>; importing twice adds nothing")
    q.add_argument("files", nargs="+", metavar="FILE")
    q.add_argument("--db", metavar="URL", help=f"database URL (default {DEFAULT_URL})")
    q.add_argument("--json", action="store_true", help="print one JSON object per file")
    q.set_defaults(func=cmd_import_kernel_tuner)

    q = isub.add_parser("dataset", help="dataset files (benchmarks/data/dataset_<cpu>.jsonl.gz, "
                                        "or a benchmarks/sweep.py file): every measurement "
                                        "in them; importing twice adds nothing")
    q.add_argument("files", nargs="+", metavar="FILE")
    q.add_argument("--db", metavar="URL", help=f"database URL (default {DEFAULT_URL})")
    q.add_argument("--json", action="store_true", help="print one JSON object per file")
    q.set_defaults(func=cmd_import_dataset)

    p = sub.add_parser("export", help="write the database's measurements to a file")
    esub = p.add_subparsers(dest="export_kind", metavar="KIND", required=True)
    q = esub.add_parser("dataset", help="append the measurements a dataset file lacks "
                                        "(created when there is none)")
    q.add_argument("file", nargs="?", metavar="FILE",
                   help="default benchmarks/data/dataset_<this cpu>.jsonl.gz")
    q.add_argument("--devices", default="cpu:", metavar="PREFIX",
                   help="devices whose key starts with this (default cpu:; '' for all)")
    q.add_argument("--db", metavar="URL", help=f"database URL (default {DEFAULT_URL})")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_export_dataset)

    p = sub.add_parser("model", help="the learned cost model: train, evaluate, predict")
    msub = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    q = msub.add_parser("train", help="train on the database's measurements and store the "
                                      "model there (nothing to do without new measurements)")
    _common(q)
    q.add_argument("--kind", choices=("gbdt", "graphsage"), default="gbdt",
                   help="gbdt (default: the better of the two on held-out programs, "
                        "docs/costmodel.md) or graphsage")
    q.add_argument("--steps", type=int,
                   help="GraphSAGE training steps (default 6000; with --kind graphsage)")
    q.add_argument("--force", action="store_true", help="train even when up to date")
    q.set_defaults(func=cmd_train)

    q = msub.add_parser("eval", help="score GraphSAGE and the baselines on held-out rows")
    _common(q)
    q.add_argument("--split", choices=("random", "program", "device"), required=True,
                   help="random 20%%, leave one program out, or leave one device out")
    q.add_argument("--steps", type=int, help="GraphSAGE training steps (default 6000)")
    q.set_defaults(func=cmd_eval)

    q = msub.add_parser("predict", help="the configs the stored model ranks fastest for a "
                                        "program's stored structures on a device")
    q.add_argument("program", metavar="PROGRAM", help="built-in name, program file, or the "
                   "kernel name of an imported Kernel Tuner space")
    q.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="the shapes (X=16x256) or a parameter (batch=8)")
    _common(q)
    q.add_argument("--top", type=int, default=5, metavar="K")
    q.set_defaults(func=cmd_predict)

    q = msub.add_parser("list", help="the stored models")
    q.add_argument("--db", metavar="URL", help=f"database URL (default {DEFAULT_URL})")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_list)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="URL", help=f"database URL (default {DEFAULT_URL})")
    p.add_argument("--device", metavar="KEY", help="only this device's measurements "
                   "(train, eval) / the device to predict for (predict; required there)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def _emit(args: argparse.Namespace, out: dict, line: str) -> None:
    """One result: its JSON object with ``--json``, else the sentence for a person."""
    print(json.dumps(out) if args.json else line)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_import_kernel_tuner(args: argparse.Namespace) -> int:
    for path, out in zip(args.files, models.import_kernel_tuner(args.db, args.files),
                         strict=True):
        _emit(args, out, f"{path}: {out['kernel']} on {out['device_key']}: {out['added']} of "
                         f"{out['configs']} configurations added ({out['ok']} ran)")
    return 0


def cmd_import_dataset(args: argparse.Namespace) -> int:
    for out in models.import_dataset(args.db, args.files):
        _emit(args, out, f"{out['file']}: {out['added']} of {out['measurements']} measurements "
                         f"added ({out['programs']} programs, {out['structures']} structures, "
                         f"devices {', '.join(out['devices'])})"
                         + (f"; {out['not_measured']} trials of configs the lowering refused "
                            "(status invalid: nothing measured) left out"
                            if out["not_measured"] else ""))
    return 0


def cmd_export_dataset(args: argparse.Namespace) -> int:
    out = models.export_dataset(args.db, args.file, args.devices or None)
    _emit(args, out, f"{out['file']}: {out['added']} measurements appended, {out['measurements']} "
                     f"in all, {out['bytes'] / 1e6:.2f} MB (budget {out['budget_bytes'] / 1e6:.0f} "
                     "MB)")
    return 0


def _tau(metrics: dict) -> str:
    """A stored Kendall tau, or why there is none (the figure is left out where undefined)."""
    from costmodel import TAU_UNDEFINED

    tau = metrics.get("kendall_tau")
    return f"undefined ({TAU_UNDEFINED})" if tau is None else f"{tau:.3f}"


def cmd_train(args: argparse.Namespace) -> int:
    out = models.train_model(args.db, device_key=args.device, kind=args.kind, force=args.force,
                             steps=args.steps, progress=None if args.json else _say)
    for note in out.get("unknown_devices", []):
        _say(note)
    if args.json:
        print(json.dumps(out, indent=2))
    elif not out["trained"]:
        print(f"model {out['model_id']} ({out['kind']}, {out['device_key']}) is {out['reason']}")
    else:
        m = out["train_metrics"]
        print(f"model {out['model_id']} ({out['kind']}, device {out['device_key']}): trained on "
              f"{out['rows']} measurements of {out['programs']} programs in {out['seconds']} s;"
              f" on its own rows tau {_tau(m)}, "
              f"MAPE {m['mape']:.3f} "
              f"(`tuner model eval` for held-out figures)")
        for device, h in out.get("held_out", {}).items():
            print(f"  held out 20% on {device}: tau {_tau(h)}, "
                  f"MAPE {h.get('mape', float('nan')):.3f} ({h['n']} rows)")
        for device, z in out.get("zero_shot", {}).items():
            first = z.get("first")
            top = "" if not first else (
                f"; their first {first['k']} within {100 * first['first_slowdown']:.1f}% of "
                f"the optimum, {first['k']} random draws within "
                f"{100 * first['random_slowdown']:.1f}%")
            print(f"  ranked by the other devices' measurements alone (a new device's order): "
                  f"{device}: tau {_tau(z)} ({z['configs']} configs{top})")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    out = models.evaluate_model(args.db, args.split, device_key=args.device, steps=args.steps,
                                progress=None if args.json else _say)
    for note in out.get("unknown_devices", []):
        _say(note)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"split {out['split']}, {out['rows']} measurements")
    print(f"  {'held out':<40} {'n':>7} {'tau':>7} {'top-1':>8} {'top-5':>7} {'MAPE':>7}")
    undefined = False
    for f in out["folds"]:
        print(f"  {str(f['test'])[:40]:<40} {f['n']:>7} {_metric_cells(f)}")
        undefined |= _missing(f.get("kendall_tau"))
    for name, m in [("mean graphsage", out["mean"]), *(
            (f"mean {k}", v) for k, v in out["baselines"].items())]:
        if not m:
            print(f"  {name:<40} (cannot predict these rows)")
            continue
        print(f"  {name:<40} {'':>7} {_metric_cells(m)}")
    if undefined:
        from costmodel import TAU_UNDEFINED

        print(f"  -: undefined ({TAU_UNDEFINED})")
    return 0


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _metric_cells(m: dict) -> str:
    """tau, top-1, top-5 and MAPE of one row of `tuner model eval`, '-' where undefined."""
    cells = []
    for key, width, show in (("kendall_tau", 7, "{:.3f}"), ("top1_slowdown", 8, "{:.1%}"),
                             ("top5_recall", 7, "{:.2f}"), ("mape", 7, "{:.3f}")):
        v = m.get(key)
        text = "-" if _missing(v) else show.format(v)
        cells.append(f"{text:>{width}}")
    return " ".join(cells)


def cmd_predict(args: argparse.Namespace) -> int:
    record, rows, measured = models.predict_configs(args.db, args.program,
                                                    parse_pairs(args.set), args.device)
    import costmodel

    note = costmodel.device_profile(args.device).note
    if note:
        _say(note)
    if measured is not None:  # as a launch's model sampler says it (docs/costmodel.md)
        _say(f"{args.device} is a device the cost model never trained on: {args.program}: "
             + models.siblings_said(measured, len(rows)))
    candidates = len(rows)
    rows = rows[:args.top]
    if args.json:
        print(json.dumps({"model_id": record.id, "kind": record.kind, "device": args.device,
                          "candidates": candidates, "siblings_measured": measured,
                          "top": rows}, indent=2))
        return 0
    print(f"model {record.id} ({record.kind}) on {args.device}:")
    for r in rows:
        cfg = " ".join(f"{k}={v}" for k, v in sorted(r["config"].items()))
        print(f"  {r['predicted_s'] * 1e3:9.4f} ms  structure {r['structure'][:12]}  {cfg}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    rows = models.list_models(args.db)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no models: `tuner model train` makes one")
    for r in rows:
        print(f"{r['id']:>4}  {r['kind']:<10} {r['device_key']:<40} {r.get('rows', '?'):>7} rows  "
              f"{r['created_at'][:19]}  {_figures(r)}")
    return 0


def _figures(row: dict) -> str:
    """A stored model's figures on one line, as ``sampler: auto`` reads them: its held-out
    tau (trusted from ``MIN_HELD_OUT`` configs), and the other devices' measurements'
    zero-shot tau, each over the devices it trained on."""
    from tuner.samplers import MIN_HELD_OUT

    out = []
    for name, key in (("held-out tau", "held_out"), ("siblings' zero-shot tau", "zero_shot")):
        found = [m for m in row.get(key, {}).values() if m.get("kendall_tau") is not None]
        taus = sorted(m["kendall_tau"] for m in found if m.get("n", MIN_HELD_OUT) >= MIN_HELD_OUT)
        if len(taus) == 1:
            out.append(f"{name} {taus[0]:.2f}")
        elif taus:
            out.append(f"{name} {taus[0]:.2f}-{taus[-1]:.2f} on {len(taus)} devices")
        if len(found) > len(taus):
            out.append(f"{len(found) - len(taus)} device(s) with under {MIN_HELD_OUT} held-out "
                       "configs (not trusted)")
    if row.get("full_fit") is not None:  # a launch's update (``costmodel.update``)
        learned = [d for d, m in row.get("held_out", {}).items() if "measured" in m]
        out.append(f"model {row['full_fit']} taught the launches' measurements since "
                   f"({row.get('updates', 1)} update(s); the held-out figures are its"
                   + (f", but on {len(learned)} CPU(s) it never trained on, how the updates "
                      "ranked each launch's rows before learning them)" if learned else ")"))
    return "; ".join(out) or "no held-out figure"
