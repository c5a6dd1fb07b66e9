"""What kernel and block graphs share: a list of ops over numbered tensors, built op by op
from the op table (``g.exp(x)``, ``g.matmul(a, b)``: one method per compute op).

Below ``graph`` (the two levels) and ``printing`` (the listing), so that each of those can
stand on it without importing the other.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .dims import Dim, ShapeError, fmt_shape
from .ops import KERNEL, OPS, op_def


@dataclass(frozen=True)
class Op:
    kind: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class TensorInfo:
    shape: tuple[Dim, ...]
    dtype: str
    name: str | None = None
    stage: str = "kernel"  # in block graphs: "body", "invariant" or "epilogue" (BlockGraph._stage)


class Tensor:
    """A handle on one tensor of one graph, returned by the builder methods."""

    __slots__ = ("graph", "id")

    def __init__(self, graph: Graph, tid: int) -> None:
        self.graph, self.id = graph, tid

    @property
    def shape(self) -> tuple[Dim, ...]:
        return self.graph.tensors[self.id].shape

    @property
    def dtype(self) -> str:
        return self.graph.tensors[self.id].dtype

    @property
    def name(self) -> str | None:
        return self.graph.tensors[self.id].name

    def __repr__(self) -> str:
        label = self.name or f"t{self.id}"
        return f"<{label} {fmt_shape(self.shape)} {self.dtype}>"


class Graph:
    """What kernel and block graphs share: the op list, tensors, and op-table-driven building."""

    level = KERNEL

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.tensors: list[TensorInfo] = []

    if TYPE_CHECKING:  # g.matmul(a, b), g.exp(x), ...: set from the op table below
        def __getattr__(self, name: str) -> Callable[..., Tensor]: ...

    # --- building ------------------------------------------------------------------------
    def apply(self, kind: str, /, *args: Any, name: str | None = None, **attrs: Any) -> Tensor:
        """Append a compute op from the op table; extra positional args fill its attributes."""
        opdef = op_def(kind)
        if self.level not in opdef.levels or kind in ("input", "output", "graph_kernel"):
            raise ShapeError(f"{kind} is not allowed as a compute op in a {self.level} graph")
        tensors = [a for a in args if isinstance(a, Tensor)]
        extra = args[len(tensors):]
        if any(isinstance(a, Tensor) for a in extra):
            raise ShapeError(f"{kind}: tensor operands must come before attributes")
        if len(extra) > len(opdef.attrs):
            raise ShapeError(f"{kind}: takes {len(opdef.attrs)} attribute(s) "
                             f"{list(opdef.attrs)}, got {len(extra)}")
        attrs.update(zip(opdef.attrs, extra, strict=False))
        if len(tensors) != opdef.arity:
            raise ShapeError(f"{kind}: expects {opdef.arity} tensor operand(s), got {len(tensors)}")
        for t in tensors:
            if t.graph is not self:
                raise ShapeError(f"{kind}: operand {t} belongs to another graph")
        return self._append(kind, [t.id for t in tensors], attrs, name)[0]

    def _append(self, kind: str, inputs: Sequence[int], attrs: Mapping[str, Any],
                name: str | None = None) -> list[Tensor]:
        """Derive output shapes with the op table's rules (or the level's own) and record the op.

        Rules may normalise ``attrs`` in place (a negative ``dim`` becomes positive, maps become
        tuples), so that equal ops are stored equally.
        """
        attrs = dict(attrs)
        infos = self._infer(kind, inputs, attrs)
        first = len(self.tensors)
        for info in infos:
            self.tensors.append(info)
        if name is not None and infos:
            self.tensors[first].name = name
        outs = tuple(range(first, first + len(infos)))
        self.ops.append(Op(kind, tuple(inputs), outs, attrs))
        return [Tensor(self, t) for t in outs]

    def _infer(self, kind: str, inputs: Sequence[int], attrs: dict) -> list[TensorInfo]:
        opdef = OPS[kind]
        ins = [self.tensors[i] for i in inputs]
        if opdef.shape_rule is None:  # input, output, graph_kernel: the level's own _infer
            raise ShapeError(f"{kind} has no shape rule at the {self.level} level")
        try:
            shape = opdef.shape_rule([t.shape for t in ins], attrs)
            dtype = opdef.dtype_rule([t.dtype for t in ins], attrs)
        except ShapeError as err:
            def context() -> str:
                shown = ", ".join(f"{t.name or f't{i}'}{fmt_shape(t.shape)}"
                                  for i, t in zip(inputs, ins, strict=True))
                return f"in {self.level} op {kind}({shown})"

            raise ShapeError(str(err), context) from None
        return [TensorInfo(shape, dtype, stage=self._stage(kind, ins))]

    def _stage(self, kind: str, ins: Sequence[TensorInfo]) -> str:
        return "kernel"

    # --- reading -------------------------------------------------------------------------
    def ops_of(self, kind: str) -> list[Op]:
        return [op for op in self.ops if op.kind == kind]

    @property
    def input_ids(self) -> list[int]:
        return [op.outputs[0] for op in self.ops_of("input")]

    @property
    def output_ids(self) -> list[int]:
        return [op.inputs[0] for op in self.ops_of("output")]

    def tensor(self, tid: int) -> Tensor:
        return Tensor(self, tid)

    def producer(self) -> dict[int, Op]:
        return {t: op for op in self.ops for t in op.outputs}


def _add_builder_methods() -> None:
    """``g.exp(x)``, ``g.sum(x, 1)``, ... for every compute op in the table, defined once."""
    for name in OPS:
        if name in ("input", "output", "graph_kernel"):
            continue

        def method(self: Graph, /, *args: Any, _kind: str = name, **kw: Any) -> Tensor:
            return self.apply(_kind, *args, **kw)

        method.__name__ = name
        method.__doc__ = OPS[name].doc
        setattr(Graph, name, method)


_add_builder_methods()
