"""Human-readable listing of a µGraph (what ``tuner show`` prints)."""

from __future__ import annotations

from .core import Graph
from .dims import fmt_shape
from .ops import BLOCK, KERNEL


def _label(graph: Graph, tid: int) -> str:
    return graph.tensors[tid].name or f"t{tid}"


def _attrs(op) -> str:
    shown = {k: v for k, v in op.attrs.items() if k not in ("block_graph", "shape", "dtype")}
    return ", ".join(f"{k}={list(v) if isinstance(v, tuple) else v}" for k, v in shown.items())


def _lines(graph: Graph, indent: str) -> list[str]:
    lines = []
    for op in graph.ops:
        args = ", ".join(_label(graph, t) for t in op.inputs)
        extra = _attrs(op)
        call = f"{op.kind}({', '.join(x for x in (args, extra) if x)})"
        if not op.outputs:
            lines.append(f"{indent}{call}")
            continue
        outs = ", ".join(_label(graph, t) for t in op.outputs)
        info = graph.tensors[op.outputs[0]]
        where = f" [{info.stage}]" if graph.level == BLOCK else ""
        shapes = " ".join(fmt_shape(graph.tensors[t].shape) for t in op.outputs)
        if op.kind == "input" and graph.level == KERNEL:
            call = f"input({extra})"
        lines.append(f"{indent}{outs} = {call}  : {shapes} {info.dtype}{where}")
        if op.kind == "graph_kernel":
            bg = op.attrs["block_graph"]  # a BlockGraph
            lines.append(f"{indent}  block graph: grid={list(bg.grid)} "
                         f"forloop_range={bg.forloop_range} block={list(bg.block)}")
            lines.extend(_lines(bg, indent + "    "))
    return lines


def format_graph(graph: Graph) -> str:
    """One line per op with shapes (a kernel graph's, or a block graph's alone); graph-defined
    kernels show their block graph indented.  ``KernelGraph``'s repr is this listing."""
    return "\n".join(_lines(graph, ""))
