"""``tuner search``: find and verify fused µGraph structures for a program."""

from __future__ import annotations

import argparse
import json
import time

from cluster import SearchResult, search_program
from search import DEFAULT_BLOCK_OPS, DEFAULT_KERNEL_OPS, Limits, load_program

from ..api import InputError, parse_pairs
from ..pipeline import search_notes
from ._console import Progress

# the progress line of `tuner search` (`tuner launch` leaves out the word "elapsed")
SEARCH_LINE = "states {states:,}  verified {verified}  elapsed {elapsed_s:.1f}s"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="search and verify fused µGraph structures")
    p.add_argument("program", metavar="PROGRAM", help="built-in name or program file")
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="override a parameter (batch=8) or an input shape (X=16x1024)")
    p.add_argument("--workers", type=int, default=1, help="Ray workers (default 1)")
    p.add_argument("--address", help="join a running Ray cluster instead of starting one")
    p.add_argument("--time-limit", type=float, metavar="S",
                   help="stop after S seconds (default: 30 s per compute op of the program)")
    p.add_argument("--max-kernel-ops", type=int, default=Limits.max_kernel_ops)
    p.add_argument("--max-block-ops", type=int, default=Limits.max_block_ops)
    p.add_argument("--max-block-inputs", type=int, default=Limits.max_block_inputs,
                   help="block inputs per graph-defined kernel (default: max(3, the "
                        "program's inputs))")
    p.add_argument("--max-grid-dims", type=int, default=Limits.max_grid_dims)
    p.add_argument("--block-ops", help="comma-separated block ops to explore "
                   f"(default: {','.join(DEFAULT_BLOCK_OPS)})")
    p.add_argument("--kernel-ops", help="comma-separated predefined kernel ops "
                   f"(default: {','.join(DEFAULT_KERNEL_OPS)})")
    p.add_argument("--partition-above", type=int, default=Limits.partition_above,
                   metavar="N", help="search a program of more than N ops (or with a weight "
                   "streamed then contracted, as in an MLP) in pieces, joined into one structure of "
                   f"several kernels (default {Limits.partition_above})")
    p.add_argument("--no-partition", action="store_true",
                   help="always search the program whole")
    p.add_argument("--max-piece-ops", type=int, default=Limits.max_piece_ops, metavar="N",
                   help=f"ops per piece (default {Limits.max_piece_ops})")
    p.add_argument("--no-prune", action="store_true",
                   help="turn abstract-expression pruning off (for checking the pruning)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", metavar="FILE", help="write the verified structures as JSON")
    p.set_defaults(func=cmd_search)


def _limits(args: argparse.Namespace) -> Limits:
    kw: dict = {"max_kernel_ops": args.max_kernel_ops, "max_block_ops": args.max_block_ops,
                "max_block_inputs": args.max_block_inputs,
                "max_grid_dims": args.max_grid_dims, "prune": not args.no_prune,
                "partition_above": None if args.no_partition else args.partition_above,
                "max_piece_ops": args.max_piece_ops}
    if args.block_ops:
        kw["block_ops"] = tuple(x.strip() for x in args.block_ops.split(",") if x.strip())
    if args.kernel_ops:
        kw["kernel_ops"] = tuple(x.strip() for x in args.kernel_ops.split(",") if x.strip())
    for name in ("max_kernel_ops", "max_block_ops", "max_block_inputs", "partition_above",
                 "max_piece_ops"):
        if kw[name] is not None and kw[name] < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1")
    try:
        return Limits(**kw)
    except ValueError as err:
        raise InputError(str(err)) from None


def write_results(path: str, result: SearchResult, program_inputs: dict) -> None:
    """The verified structures in a file the verifier and later stages read back."""
    doc = {"format": "tuner.search/1", "program": result.program,
           "inputs": {n: list(s) for n, s in program_inputs.items()},
           "summary": result.summary(), "structures": result.structures}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=1)
    import os

    os.replace(tmp, path)


def cmd_search(args: argparse.Namespace) -> int:
    if args.workers < 1:
        raise InputError("--workers must be at least 1")
    if args.time_limit is not None and args.time_limit <= 0:
        raise InputError("--time-limit must be positive")
    program = load_program(args.program, parse_pairs(args.set))
    limits = _limits(args)
    progress = Progress(enabled=not args.json, search_line=SEARCH_LINE)
    start = time.perf_counter()
    try:
        result = search_program(program, limits, workers=args.workers, address=args.address,
                                time_limit_s=args.time_limit,
                                on_progress=lambda info: progress.search("", info))
    finally:
        progress.close()
    if args.out:
        write_results(args.out, result, program.inputs)
    summary = result.summary()
    if args.json:
        print(json.dumps(summary, indent=1))
        return 0
    print(f"{program.name}: {summary['verified']} verified structure(s) in "
          f"{time.perf_counter() - start:.1f}s ({summary['states_explored']:,} states, "
          f"{summary['pruned']:,} pruned, {summary['checked']} checked)")
    for line in search_notes(program.name, result):
        print(line)
    if not result.structures:
        lim = summary["limits"]
        print(f"nothing found within the limits: max {lim['max_kernel_ops']} kernel ops, "
              f"{lim['max_block_ops']} block ops, {lim['max_block_inputs']} block inputs, "
              f"{lim['max_grid_dims']} grid dims"
              + (f", time limit {result.time_limit_s:.0f} s reached" if result.time_limit_hit
                 else "")
              + "; try raising them")
        return 0
    print(f"{'rank':>4}  {'hash':<12} {'kernels':>7} {'graph':>5} {'MB moved':>9} "
          f"{'tile elems':>10} {'ops':>4}")
    for i, s in enumerate(result.structures[:10]):
        print(f"{i + 1:>4}  {s['hash'][:12]} {s['num_kernels']:>7} "
              f"{s['num_graph_kernels']:>5} {s['bytes_moved'] / 1e6:>9.2f} "
              f"{s['tile_elements']:>10,} {s['block_ops']:>4}")
    if len(result.structures) > 10:
        print(f"      … {len(result.structures) - 10} more (--out FILE keeps them all)")
    return 0
