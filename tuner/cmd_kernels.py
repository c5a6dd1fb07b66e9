"""``tuner codegen`` and ``tuner measure``: a fused structure's source, and its speed.

Both commands pick a structure the same way (``--structure``): ``best`` is the top result of a
search output given with ``--structures FILE`` (the hand-written structure when none is
given), ``handwritten`` the expert's structure, a hex prefix looks a structure hash up in the
search output, anything else is a µGraph JSON file or a search output file.  A config binds
the structure's symbols; whatever it leaves out comes from the AStitch default
(``kernels.default_config``), and the config actually used is reported on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from search import (
    GraphFormatError,
    KernelGraph,
    Program,
    from_obj,
    handwritten,
    load_program,
    structural_hash,
)

from .api import InputError, parse_config, parse_pairs
from .formatting import ms

if TYPE_CHECKING:
    from kernels import DeviceSpec, KernelPlan

GPUS = ("H100", "A100", "H200")
_HEX = re.compile(r"^[0-9a-fA-F]{4,64}$")


# Bad input raises tuner.api.InputError: the CLI prints it as one line and exits 2.


# ---------------------------------------------------------------- structures


@dataclass(frozen=True)
class FoundStructure:
    """A structure of a search output (or a µGraph file) and its structural hash."""

    graph: KernelGraph
    hash: str


def read_structures(path: str) -> list[FoundStructure]:
    """The ranked structures of a search output file, or the one graph of a µGraph JSON file
    (best first)."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise FileNotFoundError(f"{path}: cannot read: {err.strerror}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise GraphFormatError(f"{path}: not valid JSON: {err}") from None
    if isinstance(doc, dict) and "structures" in doc:
        entries = doc["structures"]
        if not isinstance(entries, list) or not entries:
            raise GraphFormatError(f"{path}: 'structures' must be a non-empty list of "
                                   "{'graph': µGraph object, 'hash': str}")
        out = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict) or "graph" not in entry:
                raise GraphFormatError(f"{path}: structures[{i}] must be an object with a "
                                       "'graph' (canonical µGraph JSON object)")
            try:
                graph = from_obj(entry["graph"])
            except GraphFormatError as err:
                raise GraphFormatError(f"{path}: structures[{i}].graph: {err}") from None
            out.append(FoundStructure(graph, str(entry.get("hash") or structural_hash(graph))))
        return out
    try:
        graph = from_obj(doc)
    except GraphFormatError as err:
        raise GraphFormatError(f"{path}: {err} (expected a µGraph JSON file or a search output "
                               "with a 'structures' list)") from None
    return [FoundStructure(graph, structural_hash(graph))]


def _check_inputs(program: Program, graph: KernelGraph, what: str) -> None:
    want = [tuple(s) for s in program.inputs.values()]
    got = [tuple(graph.tensors[t].shape) for t in graph.input_ids]
    if want != got:
        raise InputError(f"{what} takes inputs of shapes {got} but program {program.name} has "
                         f"{want}; use a structure found at these shapes (or drop --set)")


def resolve_structure(program: Program, choice: str = "best", structures: str | None = None,
                      device: str | DeviceSpec = "cpu") -> tuple[KernelGraph, str]:
    """(structure, a phrase saying which one) for ``--structure choice``; ``best`` is the
    structure of ``structures`` (or the reference program) with the fastest roofline estimate
    on ``device``."""
    def hand() -> KernelGraph:
        try:
            return handwritten(program)
        except KeyError as err:
            raise InputError(f"{err.args[0]}; give --structure FILE or --structures FILE") \
                from None

    if choice == "handwritten" or (choice == "best" and not structures):
        return hand(), f"hand-written structure of {program.name}"
    if choice == "best":
        from kernels import rank_structures

        found = read_structures(structures)
        _check_inputs(program, found[0].graph, structures)  # one search: one set of shapes
        graphs = [s.graph for s in found] + [program.build()]
        first = rank_structures(graphs, device)[0]
        if first == len(found):
            return graphs[first], (f"the reference program (a kernel per op): its roofline "
                                   f"estimate beats every structure of {structures}")
        top = found[first]
        what = f"best structure {top.hash[:12]} of {structures} (roofline estimate)"
    elif Path(choice).exists():
        top = read_structures(choice)[0]
        what = f"structure {top.hash[:12]} from {choice}"
    elif _HEX.match(choice):
        if not structures:
            raise InputError(f"--structure {choice}: a hash prefix is looked up in a search "
                             "output; give it with --structures FILE")
        found = [s for s in read_structures(structures)
                 if s.hash.lower().startswith(choice.lower())]
        if len(found) != 1:
            known = ", ".join(s.hash[:12] for s in read_structures(structures)[:8])
            raise InputError(f"--structure {choice}: {'no' if not found else len(found)} "
                             f"structure(s) in {structures} with that hash prefix; have {known}")
        top = found[0]
        what = f"structure {top.hash[:12]} of {structures}"
    else:
        raise InputError(f"--structure {choice}: not best, handwritten, a hash prefix or an "
                         "existing file")
    _check_inputs(program, top.graph, what)
    return top.graph, what


def resolve_config(structure: KernelGraph, config: Mapping[str, int] | None,
                   device: str | DeviceSpec) -> dict[str, int]:
    """The user's config completed from the AStitch default for ``device``.

    The default's mapping knobs were chosen for the default symbols, so they are kept only
    when the user's symbols agree with them."""
    from kernels import KNOBS, default_config, resolve_spec

    spec = resolve_spec(device)
    given = dict(config or {})
    if not structure.symbols():
        return given
    default = default_config(structure, spec)
    unknown = sorted(set(given) - structure.symbols() - set(KNOBS))
    if unknown:
        raise InputError(f"--config {', '.join(unknown)}: not a symbol of this structure "
                         f"({', '.join(sorted(structure.symbols()))}) nor a knob "
                         f"({', '.join(KNOBS)})")
    symbols = {k: v for k, v in given.items() if k not in KNOBS}
    merged = {k: v for k, v in default.items() if k not in KNOBS}
    if any(merged[k] != v for k, v in symbols.items()):
        merged.update(symbols)
    else:
        merged.update({k: v for k, v in default.items() if k in KNOBS})
    merged.update(given)
    return merged


def _lower(structure: KernelGraph, config: Mapping[str, int], device: str | DeviceSpec,
           name: str) -> KernelPlan:
    from kernels import lower

    try:
        return lower(structure, config, device, name)
    except (ValueError, NotImplementedError) as err:  # ShapeError and config errors
        raise InputError(f"config {dict(config)}: {err}") from None


def _prepare(args: argparse.Namespace, device: str | DeviceSpec
             ) -> tuple[Program, KernelGraph, dict[str, int], KernelPlan]:
    """(program, structure, config, plan); says on stderr which structure and config."""
    program = load_program(args.program, parse_pairs(args.set, "--set"))
    structure, what = resolve_structure(program, args.structure, args.structures, device)
    config = resolve_config(structure, parse_config(args.config), device)
    plan = _lower(structure, config, device, program.name)  # config errors: exit 2
    print(f"# {what}; config {' '.join(f'{k}={v}' for k, v in config.items()) or '(none)'}",
          file=sys.stderr)
    return program, structure, config, plan


# ---------------------------------------------------------------- commands


def cmd_codegen(args: argparse.Namespace) -> int:
    from kernels import render

    device = "cpu" if args.target == "cpp" else args.gpu
    _, _, _, plan = _prepare(args, device)
    print(render(plan, args.target), end="")
    if args.plan:
        print(plan.summary(), file=sys.stderr)
    return 0


def cmd_measure(args: argparse.Namespace) -> int:
    from kernels import cuda_available, cuda_device_spec, measure_program

    timing = {"budget_s": args.budget}
    if args.device == "cuda":
        ok, reason = cuda_available()
        if not ok:
            raise InputError(f"--device cuda: no usable GPU ({reason}); use --device cpu")
    program, structure, config, _ = _prepare(
        args, cuda_device_spec() if args.device == "cuda" else "cpu")
    m = measure_program(program, structure, config, device=args.device, timing=timing)
    if args.json:
        print(json.dumps(m.as_dict(), indent=2))
    else:
        rows = [("program", m.program), ("device", m.device), ("status", m.status),
                ("kernel", ms(m.kernel_s, spec=".4g")), ("baseline", ms(m.baseline_s, spec=".4g")
                                                   + " (reference op by op)"),
                ("speedup", "-" if math.isnan(m.speedup) else f"{m.speedup:.2f}x"),
                ("max error", "-" if math.isnan(m.max_error) else f"{m.max_error:.3g}"),
                ("bandwidth", "-" if math.isnan(m.achieved_gbs) else
                 f"{m.achieved_gbs:.1f} GB/s ({m.fraction_of_copy:.0%} of "
                 f"{m.copy_gbs:.1f} GB/s)"),
                ("kernels", str(m.kernels))]
        for key, value in rows:
            print(f"{key:<10} {value}")
        if m.message:
            print(f"message    {m.message}")
    return 0 if m.status == "ok" else 1


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("program", metavar="PROGRAM", help="built-in name or program file")
    p.add_argument("--set", action="append", metavar="NAME=VALUE",
                   help="override a parameter (batch=8) or an input shape (X=16x1024)")
    p.add_argument("--structure", default="best", metavar="best|handwritten|HASH|FILE",
                   help="which fused structure (default best: the structure of --structures, "
                        "or the program as written, with the fastest roofline estimate on the "
                        "device; without --structures the hand-written one)")
    p.add_argument("--structures", metavar="FILE",
                   help="a search output (JSON with a 'structures' list) for best / HASH")
    p.add_argument("--config", action="append", metavar="K=V",
                   help="bind a symbol (g0=64) or a mapping knob (block, lanes, split, vpack); "
                        "the rest comes from the AStitch default")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``codegen`` and ``measure`` to the ``tuner`` subcommands."""
    p = sub.add_parser("codegen", help="print the CUDA or C++ source of a fused structure")
    _common(p)
    p.add_argument("--target", choices=("cuda", "cpp"), default="cuda",
                   help="CUDA (default) or C++/OpenMP for the local CPU")
    p.add_argument("--gpu", choices=GPUS, default="H100",
                   help="GPU whose limits shape the CUDA plan (default %(default)s)")
    p.add_argument("--plan", action="store_true", help="also print the plan summary on stderr")
    p.set_defaults(func=cmd_codegen)

    p = sub.add_parser("measure", help="time a fused kernel against the op-by-op baseline")
    _common(p)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--budget", type=float, default=1.0, metavar="SECONDS",
                   help="timing budget per side (default %(default)s s)")
    p.add_argument("--json", action="store_true", help="print the measurement as JSON")
    p.set_defaults(func=cmd_measure)
