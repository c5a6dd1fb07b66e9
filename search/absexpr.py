"""Abstract-expression pruning: is this partial µGraph still on a path to the target?

Every tensor of a µGraph has an abstract expression (the op table defines one per op).  The
target program's output expressions are saturated *once* with egglog under Mirage's axioms
(commutativity, associativity, distributivity, division rules, sum commutation, sums of sums
and factoring constants out of sums), plus the unit of multiplication, so that
x · rsqrt(v) = x · (1 / √v) meets x / √v (a decomposed norm meets ``rms_norm``).  A new tensor survives only if its expression is
represented in that e-graph, i.e. it is equal, under the axioms, to a subexpression of some
form of the target.  Membership is a bottom-up hash-cons lookup in a Python dict built from
the serialized e-graph, so each check costs microseconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import egglog.bindings as egg

from .dimclass import dim_classes, out_classes
from .ir import EGG_FUNCTIONS, OPS, BlockGraph, Expr, Graph, KernelGraph

_AXIOMS = """
(rewrite (Add a b) (Add b a))
(rewrite (Mul a b) (Mul b a))
(birewrite (Add a (Add b c)) (Add (Add a b) c))
(birewrite (Mul a (Mul b c)) (Mul (Mul a b) c))
(birewrite (Mul a (Add b c)) (Add (Mul a b) (Mul a c)))
(birewrite (Add (Div a b) (Div c b)) (Div (Add a c) b))
(birewrite (Mul a (Div b c)) (Div (Mul a b) c))
(birewrite (Div (Div a b) c) (Div a (Mul b c)))
(birewrite (Sum c (Sum c a)) (Sum c a))
(rewrite (Sum c (Sum d a)) (Sum d (Sum c a)))
(birewrite (Sum c (Add a b)) (Add (Sum c a) (Sum c b)))
(birewrite (Sum c (Mul a b)) (Mul (Sum c a) b))
(birewrite (Sum c (Div a b)) (Div (Sum c a) b))
(rewrite (Mul a (Cst "1.0")) a)
"""


def to_sexpr(term: Expr) -> str:
    tag = term[0]
    if tag == "var":
        return f'(Var "{term[1]}")'
    if tag == "cst":
        return f'(Cst "{term[1]}")'
    if tag == "sum":
        return f'(Sum "{term[1]}" {to_sexpr(term[2])})'
    return f"({EGG_FUNCTIONS[tag]} {' '.join(to_sexpr(t) for t in term[1:])})"


@dataclass
class SaturatedTarget:
    """The target's e-graph as a hash-cons: (function, child classes) → class."""

    roots: list[str]
    table: dict[tuple, str]
    nodes: int
    iterations: int
    saturated: bool
    seconds: float
    _memo: dict[Any, str | None] = field(default_factory=dict)

    def eclass(self, term: Expr) -> str | None:
        """The e-class representing ``term``, or None when it is not a target subexpression."""
        hit = self._memo.get(term, False)
        if hit is not False:
            return hit  # type: ignore[return-value]
        tag = term[0]
        if tag == "cls":  # an already-resolved e-class standing in for a subterm
            return term[1]
        if tag in ("var", "cst"):
            leaf = self.table.get(("leaf", f'"{term[1]}"'))
            result = leaf and self.table.get(("Var" if tag == "var" else "Cst", leaf))
        elif tag == "sum":
            kids = [self.table.get(("leaf", f'"{term[1]}"')), self.eclass(term[2])]
            result = None if None in kids else self.table.get(("Sum", *kids))
        else:
            kids = [self.eclass(t) for t in term[1:]]
            result = None if None in kids else self.table.get((EGG_FUNCTIONS[tag], *kids))
        self._memo[term] = result
        return result

    def contains(self, term: Expr) -> bool:
        return self.eclass(term) is not None

    def apply(self, kind: str, classes: list[str], shapes: list, attrs: dict) -> str | None:
        """The e-class of op ``kind`` applied to operands already known by e-class: a few
        dict lookups, however deep the operands' own expressions are."""
        term = OPS[kind].expression([("cls", c) for c in classes], shapes, attrs)
        return self.eclass(term)


def saturate(outputs: Iterable[Expr], *, max_nodes: int = 50_000, max_iterations: int = 30,
             time_limit_s: float = 20.0) -> SaturatedTarget:
    """Saturate the target expressions under the axioms (bounded; ``saturated`` says if the
    fixpoint was reached — if not, pruning may lose structures and the stats report it)."""
    import egglog.bindings as egg  # only the search saturates: lowering and devices need no egglog

    start = time.perf_counter()
    eg = egg.EGraph()
    decl = [_datatype(), _AXIOMS]
    outputs = list(outputs)
    for i, term in enumerate(outputs):
        decl.append(f"(let $out{i} {to_sexpr(term)})")
    eg.run_program(*eg.parse_program("\n".join(decl)))
    iterations, saturated, nodes = 0, False, 0
    while iterations < max_iterations:
        reports = eg.run_program(*eg.parse_program("(run 1)"))
        iterations += 1
        nodes = _size(eg)
        updated = any(getattr(getattr(r, "report", None), "updated", False) for r in reports)
        if not updated:
            saturated = True
            break
        if nodes > max_nodes or time.perf_counter() - start > time_limit_s:
            break
    table, roots = _hashcons(eg, len(outputs))
    return SaturatedTarget(roots, table, nodes, iterations, saturated,
                           time.perf_counter() - start)


def _datatype() -> str:
    """The e-graph's term language: leaves, then a function per ``EGG_FUNCTIONS`` entry (a sum
    also names the dimension class it reduces)."""
    funcs = []
    for tag, func in EGG_FUNCTIONS.items():
        args = "String M" if tag == "sum" else " ".join(["M"] * (OPS[tag].arity or 0))
        funcs.append(f"({func} {args})")
    return f"(datatype M (Var String) (Cst String) {' '.join(funcs)})"


def _size(eg: egg.EGraph) -> int:
    data = json.loads(eg.serialize([]).to_json())
    return len(data["nodes"])


def _hashcons(eg: egg.EGraph, n_outputs: int) -> tuple[dict[tuple, str], list[str]]:
    data = json.loads(eg.serialize([]).to_json())
    nodes = data["nodes"]
    table: dict[tuple, str] = {}
    for node in nodes.values():
        op, kids = node["op"], tuple(nodes[c]["eclass"] for c in node["children"])
        key = ("leaf", op) if op.startswith('"') else (op, *kids)
        table[key] = node["eclass"]
    return table, []


class Expressions:
    """Abstract expressions of every tensor of a graph, computed from the op table, with the
    dimension classes each op reduces (so sums over unrelated dims stay distinct)."""

    @staticmethod
    def of_kernel_graph(graph: KernelGraph, classes: Mapping[int, tuple] | None = None
                        ) -> dict[int, Expr]:
        if classes is None:
            classes = dim_classes(graph).of
        cls = dict(classes)
        exprs: dict[int, Expr] = {}
        for op in graph.ops:
            if op.kind == "input":
                t = op.outputs[0]
                exprs[t] = ("var", graph.tensors[t].name or f"in{t}")
            elif op.kind == "graph_kernel":
                bg: BlockGraph = op.attrs["block_graph"]
                sub, sub_cls = Expressions.of_block_graph(
                    bg, [exprs[t] for t in op.inputs], [cls[t] for t in op.inputs])
                outs = [o.inputs[0] for o in bg.ops_of("output")]
                for t, o in zip(op.outputs, outs, strict=True):
                    exprs[t], cls[t] = sub[o], sub_cls[o]
            elif op.kind != "output":
                attrs = dict(op.attrs, _cls=[cls[t] for t in op.inputs])
                exprs[op.outputs[0]] = Expressions.of_op(graph, op, exprs, attrs)
                cls.setdefault(op.outputs[0], out_classes(op.kind, op.attrs, attrs["_cls"]))
        return exprs

    @staticmethod
    def of_block_graph(bg: BlockGraph, inputs: list[Expr], input_classes: list[tuple]
                       ) -> tuple[dict[int, Expr], dict[int, tuple]]:
        exprs: dict[int, Expr] = {}
        cls: dict[int, tuple] = {}
        loop_cls = next((input_classes[o.attrs["index"]][o.attrs["fmap"]]
                         for o in bg.ops_of("input") if o.attrs["fmap"] >= 0), -1)
        for op in bg.ops:
            if op.kind == "input":
                t = op.outputs[0]
                exprs[t], cls[t] = inputs[op.attrs["index"]], input_classes[op.attrs["index"]]
            elif op.kind != "output":
                attrs = dict(op.attrs, _cls=[cls[t] for t in op.inputs], _loop_cls=loop_cls,
                             _loop=bg.forloop_range != 1)
                exprs[op.outputs[0]] = Expressions.of_op(bg, op, exprs, attrs)
                cls[op.outputs[0]] = out_classes(op.kind, op.attrs, attrs["_cls"])
        return exprs, cls

    @staticmethod
    def of_op(graph: Graph, op, exprs: Mapping[int, Expr], attrs: dict) -> Expr:
        shapes = [graph.tensors[t].shape for t in op.inputs]
        return OPS[op.kind].expression([exprs[t] for t in op.inputs], shapes, attrs)


def target_expressions(reference: KernelGraph) -> list[Expr]:
    exprs = Expressions.of_kernel_graph(reference)
    return [exprs[t] for t in reference.output_ids]
