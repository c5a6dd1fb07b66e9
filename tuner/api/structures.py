"""Fused structures for one program: which one (``--structure``), its config, its plan.

``tuner codegen`` and ``tuner measure`` pick a structure the same way: ``best`` is the top
result of a search output (the hand-written structure when none is given), ``handwritten``
the expert's structure, a hex prefix looks a structure hash up in the search output, anything
else is a µGraph JSON file or a search output file.  A config binds the structure's symbols;
whatever it leaves out comes from the AStitch default (``kernels.default_config``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from search import GraphFormatError, KernelGraph, Program, from_obj, handwritten, structural_hash

from .programs import InputError

if TYPE_CHECKING:
    from kernels import DeviceSpec, KernelPlan

_HEX = re.compile(r"^[0-9a-fA-F]{4,64}$")


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


def check_inputs(program: Program, graph: KernelGraph, what: str) -> None:
    """``graph`` (named ``what`` in the error) takes ``program``'s input shapes."""
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
    if choice == "best" and structures:
        from kernels import rank_structures

        found = read_structures(structures)
        check_inputs(program, found[0].graph, structures)  # one search: one set of shapes
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
    check_inputs(program, top.graph, what)
    return top.graph, what


def resolve_config(structure: KernelGraph, config: Mapping[str, int] | None,
                   device: str | DeviceSpec) -> dict[str, int]:
    """The user's config completed from the AStitch default for ``device`` (with ``triton=1``:
    the Triton dialect's default).

    The default's mapping knobs were chosen for the default symbols, so they are kept only
    when the user's symbols agree with them."""
    from kernels import KNOBS, default_config, resolve_spec, triton_default_config

    spec = resolve_spec(device)
    given = dict(config or {})
    if not structure.symbols():
        return given
    rule = triton_default_config if given.get("triton") else default_config
    default = rule(structure, spec)
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


def lower_plan(structure: KernelGraph, config: Mapping[str, int], device: str | DeviceSpec,
           name: str) -> KernelPlan:
    """``kernels.lower`` with a config it refuses said as an ``InputError``."""
    from kernels import lower

    try:
        return lower(structure, config, device, name)
    except (ValueError, NotImplementedError) as err:  # ShapeError and config errors
        raise InputError(f"config {dict(config)}: {err}") from None
