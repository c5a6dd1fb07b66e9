"""Canonical JSON and a stable content hash for µGraphs.

The hash is a Merkle hash: an op's hash covers its kind, attributes and the hashes of the
tensors it reads, never tensor names or positions in the op list, so two graphs built with
independent ops in another order, or with other tensor names, hash the same in any process.
Operands of commutative ops are ordered by hash.  The canonical JSON lists ops in a
deterministic topological order derived from those hashes, so equal graphs print equal JSON
and ``to_json(from_json(s)) == s`` for canonical ``s``.
"""

from __future__ import annotations

import hashlib
import heapq
import json
from collections.abc import Sequence
from typing import Any

from .core import Graph, Op
from .dims import ShapeError
from .graph import BlockGraph, KernelGraph
from .ops import OPS

FORMAT = "tuner.mugraph/1"


class GraphFormatError(ValueError):
    """A µGraph JSON document is malformed; the message gives the JSON path of the problem."""


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
                          ).hexdigest()


def _attrs_json(op: Op) -> dict[str, Any]:
    """Attributes as plain JSON values (the block graph handled by the caller)."""
    out: dict[str, Any] = {}
    for key, value in op.attrs.items():
        if key == "block_graph":
            continue
        out[key] = list(value) if isinstance(value, tuple) else value
    return out


class _Canon:
    """Hashes and canonical order of one graph (block graphs recursively)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.tensor_hash: dict[int, str] = {}
        self.op_hash: list[str] = []
        self.sub: dict[int, _Canon] = {}
        self._hash_ops()
        self.order = self._order()

    def operands(self, i: int) -> tuple[int, ...]:
        op = self.graph.ops[i]
        if OPS[op.kind].commutative:
            return tuple(sorted(op.inputs, key=lambda t: self.tensor_hash[t]))
        return op.inputs

    def _hash_ops(self) -> None:
        position = {"input": 0, "output": 0}
        for i, op in enumerate(self.graph.ops):
            key: dict[str, Any] = {"op": op.kind, "attrs": _attrs_json(op)}
            if op.kind in position:  # inputs and outputs are a calling convention: keep order
                key["pos"] = position[op.kind]
                position[op.kind] += 1
            if op.kind == "graph_kernel":
                self.sub[i] = _Canon(op.attrs["block_graph"])
                key["block_graph"] = self.sub[i].graph_hash()
            key["in"] = [self.tensor_hash[t] for t in self.operands(i)]
            h = _digest(key)
            self.op_hash.append(h)
            for slot, t in enumerate(op.outputs):
                self.tensor_hash[t] = _digest([h, slot])

    def _order(self) -> list[int]:
        """Inputs in order, then a topological order breaking ties by op hash, then outputs."""
        ops = self.graph.ops
        producer = {t: i for i, op in enumerate(ops) for t in op.outputs}
        waiting = {i: len({producer[t] for t in op.inputs}) for i, op in enumerate(ops)}
        users: dict[int, set[int]] = {}
        for i, op in enumerate(ops):
            for t in op.inputs:
                users.setdefault(producer[t], set()).add(i)
        inputs = [i for i, op in enumerate(ops) if op.kind == "input"]
        outputs = [i for i, op in enumerate(ops) if op.kind == "output"]
        order = list(inputs)
        ready: list[tuple[str, int]] = []

        def release(i: int) -> None:
            for u in sorted(users.get(i, ())):
                waiting[u] -= 1
                if waiting[u] == 0 and ops[u].kind != "output":
                    heapq.heappush(ready, (self.op_hash[u], u))

        for i in inputs:
            release(i)
        while ready:
            _, i = heapq.heappop(ready)
            order.append(i)
            release(i)
        return order + outputs

    def graph_hash(self) -> str:
        g = self.graph
        head: dict[str, Any] = {"level": g.level}
        if isinstance(g, BlockGraph):
            head.update(grid=list(g.grid), forloop_range=g.forloop_range, block=list(g.block))
        outputs = [self.op_hash[i] for i, op in enumerate(g.ops) if op.kind == "output"]
        return _digest([head, outputs, sorted(self.op_hash)])

    def to_obj(self) -> dict[str, Any]:
        g = self.graph
        renumber: dict[int, int] = {}
        ops_json = []
        for i in self.order:
            op = g.ops[i]
            entry: dict[str, Any] = {"op": op.kind}
            if op.inputs:
                entry["in"] = [renumber[t] for t in self.operands(i)]
            entry.update(_attrs_json(op))
            if op.kind == "graph_kernel":
                entry["block_graph"] = self.sub[i].to_obj()
            name = g.tensors[op.outputs[0]].name if op.outputs else None
            if name:
                entry["name"] = name
            for t in op.outputs:
                renumber[t] = len(renumber)
            ops_json.append(entry)
        if isinstance(g, BlockGraph):
            return {"grid": list(g.grid), "forloop_range": g.forloop_range,
                    "block": list(g.block), "ops": ops_json}
        return {"format": FORMAT, "ops": ops_json}


def structural_hash(graph: Graph) -> str:
    """Same graph ⇒ same hash, whatever the tensor names or the order of independent ops."""
    return _Canon(graph).graph_hash()


def to_obj(graph: KernelGraph) -> dict[str, Any]:
    return _Canon(graph).to_obj()


def to_json(graph: KernelGraph, indent: int | None = None) -> str:
    """Canonical JSON text of ``graph`` (sorted keys; ``indent`` only changes whitespace)."""
    return json.dumps(to_obj(graph), sort_keys=True, indent=indent,
                      separators=None if indent else (",", ":"))


# --- reading -----------------------------------------------------------------------------

def _expect(cond: bool, path: str, msg: str) -> None:
    if not cond:
        raise GraphFormatError(f"{path}: {msg}")


def _replay_ops(graph: Graph, ops: Any, path: str) -> None:
    _expect(isinstance(ops, list), path, "'ops' must be a list")
    count = 0
    for n, entry in enumerate(ops):
        where = f"{path}[{n}]"
        _expect(isinstance(entry, dict) and isinstance(entry.get("op"), str), where,
                "each op must be an object with a string 'op'")
        kind = entry["op"]
        _expect(kind in OPS, where, f"unknown op {kind!r}; known: {', '.join(sorted(OPS))}")
        opdef = OPS[kind]
        inputs = entry.get("in", [])
        _expect(isinstance(inputs, list) and all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < count for t in inputs),
            where, f"'in' must list ids of earlier tensors (0..{count - 1}), got {inputs!r}")
        allowed = {"op", "in", "name", *opdef.attrs}
        unknown = set(entry) - allowed
        _expect(not unknown, where, f"unknown key(s) {sorted(unknown)} for op {kind}")
        attrs = {k: (tuple(v) if isinstance(v, list) else v)
                 for k, v in entry.items() if k in opdef.attrs}
        if kind == "graph_kernel":
            _expect(isinstance(graph, KernelGraph), where, "graph_kernel inside a block graph")
            specs = [(graph.tensors[t].shape, graph.tensors[t].dtype) for t in inputs]
            attrs["block_graph"] = _block_from_obj(entry.get("block_graph"), specs,
                                                    f"{where}.block_graph")
        elif kind == "input" and isinstance(graph, KernelGraph):
            _expect(isinstance(attrs.get("shape"), tuple) and isinstance(attrs.get("dtype"), str),
                    where, "a kernel input needs 'shape' (list of ints) and 'dtype'")
        elif kind == "input":
            _expect(isinstance(attrs.get("index"), int), where, "a block input needs 'index'")
            attrs.setdefault("imap", (-1, -1, -1))
            attrs.setdefault("fmap", -1)
        elif kind == "output" and isinstance(graph, BlockGraph):
            attrs.setdefault("omap", (-1, -1, -1))
        elif kind != "output":
            _expect(opdef.arity == len(inputs), where,
                    f"{kind} takes {opdef.arity} operand(s), got {len(inputs)}")
            _expect(graph.level in opdef.levels, where, f"{kind} is not allowed at "
                    f"{graph.level} level")
        try:
            outs = graph._append(kind, inputs, attrs, entry.get("name"))
        except (ShapeError, KeyError, TypeError) as err:
            raise GraphFormatError(f"{where}: {err}") from None
        count += len(outs)


def _block_from_obj(obj: Any, specs: Sequence, path: str) -> BlockGraph:
    _expect(isinstance(obj, dict), path, "must be an object")
    unknown = set(obj) - {"grid", "forloop_range", "block", "ops"}
    _expect(not unknown, path, f"unknown key(s) {sorted(unknown)}")
    _expect(isinstance(obj.get("grid"), list), path, "'grid' must be a list")
    try:
        bg = BlockGraph(obj["grid"], obj.get("forloop_range", 1), obj.get("block", [128]), specs)
    except ShapeError as err:
        raise GraphFormatError(f"{path}: {err}") from None
    _replay_ops(bg, obj.get("ops"), f"{path}.ops")
    return bg


def from_obj(obj: Any) -> KernelGraph:
    _expect(isinstance(obj, dict), "$", "a µGraph document must be a JSON object")
    _expect(obj.get("format") == FORMAT, "$.format", f"expected {FORMAT!r}, got "
            f"{obj.get('format')!r}")
    graph = KernelGraph()
    _replay_ops(graph, obj.get("ops"), "$.ops")
    return graph


def from_json(text: str) -> KernelGraph:
    """Parse and fully re-validate a µGraph; errors name the JSON path."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise GraphFormatError(f"not valid JSON: {err}") from None
    return from_obj(obj)
