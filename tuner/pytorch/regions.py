"""Split an ATen FX graph into the largest connected regions the op table expresses.

Greedy, in graph order: each node the table can write joins the region(s) of its operands when
the union is still *convex* (no path leaves it and comes back: the region must be able to run
as one call), still writes as one kernel graph (``emitter.emit_region``) and stays within
``max_ops`` compute ops (a region of more than the search takes whole is searched in pieces,
``search.partition``; one ATen op, such as a layer_norm, is a region even where it is
larger) and holds no costly contraction (``search.costly_contraction``: a matmul streaming a
weight whose result a later matmul contracts; the region ends before the second);
else it joins the largest one it can, else starts its own.  A
node that cannot be written gets a one-line reason for the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from search import ELEMENTWISE_OPS, costly_contraction

from .aten import FREE_OPS, HANDLERS, Unsupported, is_node, meta, op_name
from .emitter import Emitted, emit_region

# producers the table writes only together with their consumer (masked_fill with the softmax
# it feeds, layer_norm with the getitem taking its output)
_WITH_CONSUMER = {"_softmax.default": "masked_fill.Scalar", "getitem": "native_layer_norm.default"}


@dataclass
class Region:
    nodes: list  # FX nodes, in graph order
    emitted: Emitted


@dataclass
class Partition:
    regions: list[Region]
    reasons: dict  # FX node -> why it was not captured
    compute: list  # the graph's compute nodes (what the report counts)


def _dtype(nodes: Sequence[Any]) -> str:
    """The region's program dtype: its float inputs' common dtype, else float32."""
    members = set(nodes)
    dts = set()
    for n in nodes:
        for a in n.all_input_nodes:
            v = meta(a)
            if a not in members and hasattr(v, "dtype") and v.dtype.is_floating_point:
                dts.add(str(v.dtype).removeprefix("torch."))
    return dts.pop() if len(dts) == 1 else "float32"


def _convex(members: set, order: dict) -> bool:
    """No path from a member through a non-member back to a member."""
    last = max(order[n] for n in members)
    seen: set = set()
    stack = [u for n in members for u in n.users if u not in members]
    while stack:
        u = stack.pop()
        if u in seen or order.get(u, last + 1) > last:
            continue
        seen.add(u)
        for w in u.users:
            if w in members:
                return False
            stack.append(w)
    return True


def _computes(graph: Any) -> list:
    """The ops that compute on the graph's inputs: views, copies and getitem are free, and a
    constant the graph builds (a causal mask from ``ones``) is no part of the block's math."""
    live: set = set()
    out = []
    for n in graph.nodes:
        if n.op == "placeholder" or any(a in live for a in n.all_input_nodes):
            live.add(n)
            if n.op == "call_function" and op_name(n) not in FREE_OPS:
                out.append(n)
    return out


def partition(graph: Any, max_ops: int = 32) -> Partition:
    """Regions of ``graph`` (an ATen ``torch.fx.Graph``) and the reasons for the rest."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    region_of: dict = {}
    regions: dict[int, list] = {}
    emitted: dict[int, Emitted] = {}
    reasons: dict = {}
    next_id = 0
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        name = op_name(node)
        if name not in HANDLERS:
            reasons[node] = f"{name} has no µGraph translation"
            continue
        v = meta(node)
        if hasattr(v, "dtype") and not v.dtype.is_floating_point:
            reasons[node] = f"{name} computes {str(v.dtype).removeprefix('torch.')}"
            continue
        group = [node]
        src = node.args[0] if node.args else None
        if _WITH_CONSUMER.get(name) and is_node(src) and op_name(src) == _WITH_CONSUMER[name] \
                and src not in region_of:
            group.insert(0, src)
        cands = sorted({region_of[a] for g in group for a in g.all_input_nodes
                        if a in region_of}, key=lambda r: -len(regions[r]))
        options = [cands] if len(cands) > 1 else []
        options += [[r] for r in cands] + [[]]
        last_error = None
        for option in options:
            nodes = sorted({*group, *(n for r in option for n in regions[r])}, key=lambda n: order[n])
            if option and not _convex(set(nodes), order):
                continue
            try:
                em = emit_region(nodes, _dtype(nodes))
            except Unsupported as err:
                last_error = str(err)
                continue
            if em.ops > max_ops and option:  # one ATen op alone is never split
                last_error = f"the region would exceed {max_ops} ops"
                continue
            if option and costly_contraction(em.graph, row_reductions=False):
                # a weight streamed then contracted by a matmul (an MLP's gate / up, then
                # down; an output projection, then the gate / up after its norm): two
                # programs, each tuned with its own tiling, where one would be searched in
                # pieces sharing one config (a transformers Llama layer, hidden 1024, AMD
                # EPYC: the output projection to the MLP's end, 14 ops, took 2.7 ms as one
                # program).  A norm reducing the projection's rows stays with it (it ends
                # before the next matmul, where the cut then falls)
                last_error = "a weight streamed then contracted: cut between the two"
                continue
            for r in option:
                del regions[r], emitted[r]
            rid, next_id = next_id, next_id + 1
            regions[rid], emitted[rid] = nodes, em
            for n in nodes:
                region_of[n] = rid
                reasons.pop(n, None)
            break
        else:
            for g in group:
                reasons[g] = last_error or "not capturable"
    out = []
    for r in sorted(regions):
        em = emitted[r]
        if em.ops == 1 and all(op.kind in ELEMENTWISE_OPS for op in em.graph.ops
                               if op.kind not in ("input", "output")):
            for n in regions[r]:  # a lone pointwise op: a kernel call would only add a launch
                reasons[n] = "a lone pointwise op (Inductor fuses it with its neighbours)"
        elif em.ops > 0 and em.outputs:
            out.append(Region(regions[r], em))
    kept = {n for r in out for n in r.nodes}
    compute = _computes(graph)
    for n in compute:
        if n not in kept:
            reasons.setdefault(n, "a region without outputs")
    return Partition(out, {n: reasons[n] for n in compute if n not in kept}, compute)
