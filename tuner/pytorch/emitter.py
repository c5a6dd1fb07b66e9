"""A captured region written as one kernel graph (``emit_region``): the ``Emitter`` walks the
region's nodes in graph order and writes each with its ATen op's translation (``HANDLERS``,
aten.py), in the region's canonical shapes (aten.py: ``rows`` tried first, then ``batched``).
Every emitted op's shape is checked against the canonical shape of the ATen node's own, so a
broadcast the canonical form would get wrong is refused instead of computed.

Every target op is looked up in ``search.OPS``: an ATen op whose translation needs an op the
table lacks is not captured, with the reason "op X not in the op table".
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from search import OPS, KernelGraph, ShapeError

from .aten import (
    BATCHED,
    BATCHED_OPS,
    HANDLERS,
    ROWS,
    VIEWS,
    Unsupported,
    canon,
    is_node,
    meta,
    op_name,
)


@dataclass
class InputSpec:
    """One kernel input: ``node``'s value reshaped to ``shape`` (the storage shape, for a
    transposed input), or, for a mask, 1.0 where ``node`` (bool) is False."""

    node: Any
    shape: tuple[int, ...]
    kind: str = "plain"  # "plain" | "transposed" | "mask"


@dataclass
class Emitted:
    """A region written as a kernel graph: its inputs and which FX nodes its outputs are."""

    graph: KernelGraph
    inputs: list[InputSpec]
    outputs: list[tuple[Any, int]]  # (FX node, graph tensor id)
    ops: int  # compute ops of the graph
    mode: str


@functools.cache
def has_layout() -> bool:
    """Whether the builder takes ``layout="transposed"`` (the ops branch's input attribute)."""
    import inspect

    return "layout" in inspect.signature(KernelGraph.new_input).parameters


@dataclass
class Emitter:
    """Writes member nodes, in graph order, into a fresh kernel graph."""

    members: set
    mode: str
    dtype: str
    graph: KernelGraph = field(default_factory=KernelGraph)
    env: dict = field(default_factory=dict)
    inputs: list[InputSpec] = field(default_factory=list)
    # outside transposes of outside tensors that reach only matmuls' right operands through
    # the region's own views (attention's ``k.transpose(-2, -1)`` expanded and viewed for a
    # bmm): read through their storage, not copied
    read_through: set = field(default_factory=set)
    _input_ids: dict = field(default_factory=dict)

    def op(self, kind: str, *args: Any, **attrs: Any) -> Any:
        if kind not in OPS:
            raise Unsupported(f"op {kind} not in the op table")
        try:
            return self.graph.apply(kind, *args, **attrs)
        except ShapeError as err:
            raise Unsupported(str(err).split(" [in ")[0]) from None

    def new_input(self, node: Any, shape: tuple[int, ...], kind: str = "plain") -> Any:
        key = (node, shape, kind)
        if key not in self._input_ids:
            name = f"I{len(self.inputs)}"
            if kind == "transposed":
                logical = (*shape[:-2], shape[-1], shape[-2])
                layout = {"layout": "transposed"}  # the ops branch's input attribute
                t = self.graph.new_input(logical, self.dtype, name, **layout)
            else:
                t = self.graph.new_input(shape, self.dtype, name)
            self.inputs.append(InputSpec(node, shape, kind))
            self._input_ids[key] = t
        return self._input_ids[key]

    def t(self, arg: Any) -> Any:
        """An operand: a member's value, or the canonical view of an outside tensor (read
        through, transposed, where it is a matmul's right operand: ``read_through``)."""
        if not is_node(arg):
            raise Unsupported(f"a constant operand {arg!r} where a tensor is expected")
        if arg in self.members:
            return self.env[arg]
        if arg in self.read_through:
            src = arg.args[0]
            return self.new_input(src, canon(meta(src).shape, self.mode), "transposed")
        v = meta(arg)
        if not hasattr(v, "dtype") or not v.dtype.is_floating_point:
            raise Unsupported(f"input {arg.name} is not a floating-point tensor")
        return self.new_input(arg, canon(v.shape, self.mode))

    def rhs(self, arg: Any) -> Any:
        """A matmul's right operand: an outside ``transpose`` of the last two dims (a weight
        under ``nn.Linear``, ``k`` in attention) is read through where the builder has the
        transposed layout, else passed as the view (the runtime copies it once per weight)."""
        if arg in self.members or not has_layout():
            return self.t(arg)
        node = arg
        while node not in self.members and is_node(node):
            if _swaps_last_two(node):
                src = node.args[0]
                if src in self.members or not is_node(src):
                    break
                storage = canon(meta(src).shape, self.mode)
                return self.new_input(src, storage, "transposed")
            if op_name(node) in VIEWS and canon(meta(node.args[0]).shape, self.mode) == \
                    canon(meta(node).shape, self.mode):
                node = node.args[0]
                continue
            break
        return self.t(arg)

    def emit(self, node: Any) -> None:
        handler = HANDLERS.get(op_name(node))
        if handler is None:
            raise Unsupported(f"{op_name(node)} has no µGraph translation")
        value = handler(self, node)
        if hasattr(value, "shape"):
            want = canon(meta(node).shape, self.mode)
            if tuple(value.shape) != want:
                raise Unsupported(f"{op_name(node)}: broadcast of shapes the region's "
                                  f"canonical form cannot hold")
        self.env[node] = value


def _swaps_last_two(node: Any) -> bool:
    name, args = op_name(node), node.args
    rank = len(meta(node).shape) if hasattr(meta(node), "shape") else 0
    if name == "t.default":
        return rank == 2
    if name == "transpose.int" and rank >= 2:
        return sorted(d % rank for d in args[1:3]) == [rank - 2, rank - 1]
    if name == "permute.default" and rank >= 2:
        perm = [d % rank for d in args[1]]
        return perm == [*range(rank - 2), rank - 1, rank - 2]
    return False


def emit_region(nodes: Sequence[Any], dtype: str) -> Emitted:
    """Write ``nodes`` (in graph order) as one kernel graph; raises ``Unsupported``."""
    batched = any(op_name(n) in BATCHED_OPS for n in nodes)
    for mode in (BATCHED,) if batched else (ROWS, BATCHED):
        try:
            return _emit(nodes, dtype, mode)
        except Unsupported as err:
            error = err
    raise error


def _read_through(nodes: Sequence[Any], mode: str) -> set:
    """The outside transposes of outside tensors whose only use is a chain of the region's
    identity views ending as a matmul's right operand (``Emitter.read_through``)."""
    if not has_layout():
        return set()
    members, out = set(nodes), set()
    for n in nodes:
        if op_name(n) not in ("mm.default", "bmm.default", "matmul.default"):
            continue
        x = n.args[1]
        while x in members and op_name(x) in VIEWS and len(x.users) == 1 and \
                canon(meta(x.args[0]).shape, mode) == canon(meta(x).shape, mode):
            x = x.args[0]
        if x not in members and is_node(x) and len(x.users) == 1 and _swaps_last_two(x) \
                and is_node(x.args[0]) and x.args[0] not in members and x is not n.args[1]:
            out.add(x)
    return out


def _emit(nodes: Sequence[Any], dtype: str, mode: str) -> Emitted:
    members = set(nodes)
    em = Emitter(members, mode, dtype, read_through=_read_through(nodes, mode))
    for node in nodes:
        em.emit(node)
    outputs: list[tuple[Any, int]] = []
    marked: set[int] = set()
    inputs = set(em.graph.input_ids)
    for node in nodes:
        if all(u in members for u in node.users):
            continue
        value = em.env[node]
        if not hasattr(value, "id"):
            raise Unsupported(f"{op_name(node)}'s value leaves the region unfinished")
        if value.id in inputs:
            continue  # a view of an input: stays a view in PyTorch
        if value.id not in marked:
            em.graph.mark_output(value)
            marked.add(value.id)
        outputs.append((node, value.id))
    ops = sum(1 for op in em.graph.ops if op.kind not in ("input", "output"))
    return Emitted(em.graph, em.inputs, outputs, ops, mode)

