"""``tuner import kernel-tuner`` and ``tuner model train | eval | predict | list``: the learned
cost model's loop through the database (docs/costmodel.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .api import InputError, parse_pairs


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import", help="import measurements made elsewhere into the database")
    isub = p.add_subparsers(dest="import_kind", metavar="KIND", required=True)
    q = isub.add_parser("kernel-tuner", help="Kernel Tuner cache files (.json or .json.gz): "
                                             "one measurement per configuration on "
                                             "replay:<GPU>; importing twice adds nothing")
    q.add_argument("files", nargs="+", metavar="FILE")
    q.add_argument("--db", metavar="URL", help="database URL (default sqlite:///./tuner.db)")
    q.add_argument("--json", action="store_true", help="print one JSON object per file")
    q.set_defaults(func=cmd_import_kernel_tuner)

    p = sub.add_parser("model", help="the learned cost model: train, evaluate, predict")
    msub = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    q = msub.add_parser("train", help="train on the database's measurements and store the "
                                      "model there (nothing to do without new measurements)")
    _common(q)
    q.add_argument("--kind", choices=("graphsage", "gbdt"), default="graphsage")
    q.add_argument("--steps", type=int, help="GraphSAGE training steps (default 6000)")
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
    q.add_argument("--db", metavar="URL", help="database URL (default sqlite:///./tuner.db)")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_list)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", metavar="URL", help="database URL (default sqlite:///./tuner.db)")
    p.add_argument("--device", metavar="KEY", help="only this device's measurements "
                   "(train, eval) / the device to predict for (predict; required there)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_import_kernel_tuner(args: argparse.Namespace) -> int:
    import costmodel
    import db

    for path in args.files:  # every file is read before anything is written
        try:
            costmodel.read_kernel_tuner(path)
        except costmodel.CacheFormatError as err:
            raise InputError(f"{err}; nothing was imported") from None
    with db.connect(args.db) as database:
        for path in args.files:
            out = costmodel.import_kernel_tuner(database, path)
            if args.json:
                print(json.dumps(out))
            else:
                print(f"{path}: {out['kernel']} on {out['device_key']}: {out['added']} of "
                      f"{out['configs']} configurations added ({out['ok']} ran)")
    return 0


def _options(args: argparse.Namespace) -> dict:
    if args.steps is not None and args.steps < 1:
        raise InputError(f"--steps {args.steps}: give the number of training steps, >= 1")
    return {"graphsage": {"steps": args.steps}} if args.steps else {}


def cmd_train(args: argparse.Namespace) -> int:
    import costmodel
    import db

    options = _options(args)  # bad options fail before the database is opened
    with db.connect(args.db) as database:
        try:
            out = costmodel.train(database, device_key=args.device, kind=args.kind,
                                  force=args.force, options=options.get(args.kind),
                                  progress=None if args.json else _say)
        except ValueError as err:
            raise InputError(str(err)) from None
    if args.json:
        print(json.dumps(out, indent=2))
    elif not out["trained"]:
        print(f"model {out['model_id']} ({out['kind']}, {out['device_key']}) is {out['reason']}")
    else:
        m = out["train_metrics"]
        print(f"model {out['model_id']} ({out['kind']}, device {out['device_key']}): trained on "
              f"{out['rows']} measurements of {out['programs']} programs in {out['seconds']} s;"
              f" on its own rows tau {m['kendall_tau']:.3f}, MAPE {m['mape']:.3f} "
              f"(`tuner model eval` for held-out figures)")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import costmodel
    import db

    options = _options(args)
    with db.connect(args.db, migrate_schema=False) as database:
        try:
            out = costmodel.evaluate_database(database, args.split, device_key=args.device,
                                              options=options,
                                              progress=None if args.json else _say)
        except ValueError as err:
            raise InputError(str(err)) from None
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"split {out['split']}, {out['rows']} measurements")
    print(f"  {'held out':<40} {'n':>7} {'tau':>7} {'top-1':>8} {'top-5':>7} {'MAPE':>7}")
    for f in out["folds"]:
        print(f"  {str(f['test'])[:40]:<40} {f['n']:>7} {f['kendall_tau']:>7.3f} "
              f"{100 * f['top1_slowdown']:>7.1f}% {f['top5_recall']:>7.2f} {f['mape']:>7.3f}")
    for name, m in [("mean graphsage", out["mean"]), *(
            (f"mean {k}", v) for k, v in out["baselines"].items())]:
        if not m:
            print(f"  {name:<40} (cannot predict these rows)")
            continue
        print(f"  {name:<40} {'':>7} {m.get('kendall_tau', float('nan')):>7.3f} "
              f"{100 * m.get('top1_slowdown', float('nan')):>7.1f}% "
              f"{m.get('top5_recall', float('nan')):>7.2f} {m.get('mape', float('nan')):>7.3f}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    import costmodel
    import db

    if not args.device:
        raise InputError("tuner model predict needs --device KEY (see `tuner status` for the "
                         "device keys in the database)")
    with db.connect(args.db, migrate_schema=False) as database:
        found = costmodel.model_for(database, args.device)
        if found is None:
            raise InputError(f"no trained model for device {args.device!r}: run "
                             f"`tuner model train` first")
        model, record = found
        try:
            rows = _ranked(database, model, args)
        except ValueError as err:  # a device the table does not know
            raise InputError(str(err)) from None
    rows = rows[:args.top]
    if args.json:
        print(json.dumps({"model_id": record.id, "kind": record.kind, "device": args.device,
                          "top": rows}, indent=2))
        return 0
    print(f"model {record.id} ({record.kind}) on {args.device}:")
    for r in rows:
        cfg = " ".join(f"{k}={v}" for k, v in sorted(r["config"].items()))
        print(f"  {r['predicted_s'] * 1e3:9.4f} ms  structure {r['structure'][:12]}  {cfg}")
    return 0


def _ranked(database: Any, model: Any, args: argparse.Namespace) -> list[dict]:
    """Every candidate config of the program's stored structures, predicted, fastest first."""
    import costmodel
    import db
    from kernels import config_space
    from search import from_obj

    from ._model_sampler import predicted_order

    spec = costmodel.spec_for_key(args.device)
    structures = _stored_structures(database, args)
    out = []
    for s in structures:
        obj = s.structure
        if isinstance(obj, dict) and "kernel_tuner" in obj:
            configs = db.structure_configs(database, s.id)
            kt = obj["kernel_tuner"]
            samples = [costmodel.featurize_params(c, kt["keys"], kt["problem_size"], spec,
                                                  group="p", program="p", device=args.device)
                       for c in configs]
            pred = model.predict(samples) if samples else []
            ranked = sorted(zip(configs, pred, strict=True), key=lambda x: x[1])
        else:
            graph = from_obj(obj)
            space = config_space(graph, spec)
            legal = [c for c in space.configs() if space.check(c) is None][:4096]
            ranked = predicted_order(model, graph, legal, spec)
        out += [{"structure": s.structure_hash, "config": c, "predicted_s": float(p)}
                for c, p in ranked]
    return sorted(out, key=lambda r: r["predicted_s"])


def _stored_structures(database: Any, args: argparse.Namespace) -> list:
    import costmodel
    from search import load_program

    from .identity import program_key

    imported = [p for p in database.programs() if p.name == args.program
                and p.dtype == costmodel.KT_DTYPE]
    if imported:
        return [s for p in imported for s in database.structures(p.program_id)]
    key = program_key(load_program(args.program, parse_pairs(args.set)))
    pid = database.program_id(key.program_hash, key.shapes, key.dtype)
    if pid is None:
        raise InputError(f"{args.program} at these shapes is not in the database: launch a "
                         "job with it first (or pass the shapes it was tuned at with --set)")
    return database.structures(pid)


def cmd_list(args: argparse.Namespace) -> int:
    import db

    with db.connect(args.db, migrate_schema=False) as database:
        found = db.models(database, with_weights=False)
    rows = [{"id": m.id, "kind": m.kind, "device_key": m.device_key, "created_at":
             m.created_at.isoformat(), **m.trained_on} for m in found]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no models: `tuner model train` makes one")
    for r in rows:
        print(f"{r['id']:>4}  {r['kind']:<10} {r['device_key']:<40} {r.get('rows', '?'):>7} rows  "
              f"{r['created_at'][:19]}")
    return 0
