"""``tuner``: the command line, a thin layer over the Python API.

Exit codes: 0 success, 1 a negative answer (e.g. graphs not equivalent), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib import import_module

from .. import api

COMMAND_MODULES = ("tuner.cli.search", "tuner.cli.kernels", "tuner.cli.jobs",
                   "tuner.cli.model", "tuner.dashboard.cli")


def cmd_programs(args: argparse.Namespace) -> int:
    rows = api.list_programs()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        shapes = ", ".join(f"{n} {tuple(s)}" for n, s in r["inputs"].items())
        params = ", ".join(f"{k}={v}" for k, v in r["params"].items())
        print(f"{r['name']:<{width}}  {shapes}" + (f"   [params: {params}]" if params else ""))
        print(f"{'':<{width}}  {r['description']}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    graph = api.program_graph(args.program, api.parse_pairs(args.set), fused=args.fused,
                              config=(api.parse_config(args.config) or None))
    print(api.to_json(graph, indent=2) if args.json else api.format_graph(graph))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    verdict = api.verify_files(args.reference, args.candidate, tests=args.tests,
                               seed=args.seed, config=(api.parse_config(args.config) or None),
                               arithmetic=args.arithmetic)
    if args.json:
        print(json.dumps(verdict.as_dict(), indent=2))
    else:
        word = "EQUIVALENT" if verdict.equivalent else "NOT EQUIVALENT"
        print(f"{word}: {verdict.reason} ({verdict.arithmetic} arithmetic, seed {verdict.seed})")
    return 0 if verdict.equivalent else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tuner",
        description="Tuner: search, verify and tune fused kernels for tensor programs "
                    "(µGraphs). PROGRAM is a built-in name (see 'tuner programs') or a "
                    "program file (.yaml).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("programs", help="list the built-in programs with their shapes")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_programs)

    p = sub.add_parser("show", help="print a program's reference graph (or a fused structure)")
    p.add_argument("program", metavar="PROGRAM")
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="override a parameter (batch=8) or an input shape (X=16x1024)")
    p.add_argument("--fused", action="store_true",
                   help="show the hand-written fused structure instead of the reference")
    p.add_argument("--config", action="append", metavar="SYMBOL=N",
                   help="bind a grid / for-loop symbol of the fused structure (g0=4)")
    p.add_argument("--json", action="store_true", help="print canonical µGraph JSON")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("verify", help="check two µGraphs for equivalence (exit 0 yes, 1 no)")
    p.add_argument("reference", metavar="A", help="µGraph JSON file, program file or built-in")
    p.add_argument("candidate", metavar="B", help="µGraph JSON file, program file or built-in")
    p.add_argument("--tests", type=int, default=api.DEFAULT_TESTS,
                   help="number of random tests (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--config", action="append", metavar="SYMBOL=N",
                   help="bind a symbol of B before checking")
    p.add_argument("--arithmetic", choices=("field", "float"), default="field",
                   help="finite field (default, with a false-positive bound) or float64")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.set_defaults(func=cmd_verify)
    for module in COMMAND_MODULES:  # each command family registers its own subcommands
        import_module(module).register(sub)
    return parser


def _database_errors() -> tuple[type[Exception], ...]:
    """The database's user-fixable errors, without importing db for commands not using it."""
    db = sys.modules.get("db")
    return (db.DatabaseError,) if db is not None else ()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except (*api.INPUT_ERRORS, *_database_errors()) as err:
        print(f"tuner {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into head & co.
        sys.stderr.close()
        return 0
