"""ATen → µGraph: how each ATen op of a captured region is written with the op table's ops.

A region's tensors are held in a *canonical* shape in which the views a model puts between its
ops cost nothing: ``rows`` (every tensor ``[prod(leading dims), last]``) for regions of
matmuls, pointwise ops and last-dim reductions, ``batched`` (``[prod(dims[:-2]), rows,
last]``) for regions holding a ``bmm`` or broadcasting over a leading dim (``rows`` is tried
first).  A view, reshape, unsqueeze or same-shape expand whose
input and output have the same canonical shape is then the identity; any other view ends the
region (it runs in PyTorch, where a view of a contiguous tensor is free).  Every emitted op's
shape is checked against the canonical shape of the ATen node's own, so a broadcast the
canonical form would get wrong is refused instead of computed.

Every target op is looked up in ``search.OPS``: an ATen op whose translation needs an op the
table lacks is not captured, with the reason "op X not in the op table".
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from search import OPS, KernelGraph, ShapeError

ROWS, BATCHED = "rows", "batched"


class Unsupported(Exception):
    """A node (or a region) the op table cannot express; the message is the one-line reason."""


def canon(shape: Sequence[int], mode: str) -> tuple[int, ...]:
    """The canonical shape of a tensor of ``shape`` in a region of ``mode``."""
    s = [int(d) for d in shape]
    if not s:
        raise Unsupported("a 0-dim tensor")
    if mode == ROWS:
        return (math.prod(s[:-1]), s[-1]) if len(s) > 1 else (1, s[0])
    s = [1] * (3 - len(s)) + s
    return (math.prod(s[:-2]), s[-2], s[-1])


def meta(node: Any) -> Any:
    """The example value (a FakeTensor, or a tuple of them) the tracer recorded on ``node``."""
    return node.meta.get("val")


def is_node(x: Any) -> bool:
    return hasattr(x, "op") and hasattr(x, "meta")


def op_name(node: Any) -> str:
    """``aten.mm.default`` → ``mm.default``: the spelling the table and the report use."""
    target = node.target
    name = getattr(target, "__name__", None) or str(target)
    ns = getattr(target, "namespace", None)
    return name if ns in (None, "aten") else f"{ns}.{name}"


@dataclass
class Masked:
    """``masked_fill(scores, mask, -inf)``: held until the softmax that consumes it."""

    scores: Any
    mask: Any  # the bool mask's FX node


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
            if op_name(node) in _VIEWS and canon(meta(node.args[0]).shape, self.mode) == \
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


# --- the handlers ------------------------------------------------------------------------

def _scalar(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _binary(kind: str) -> Callable[[Emitter, Any], Any]:
    def handler(em: Emitter, n: Any) -> Any:
        a, b = n.args[:2]
        if n.kwargs.get("alpha", 1) != 1:
            raise Unsupported(f"{op_name(n)} with alpha={n.kwargs['alpha']}")
        if _scalar(b):
            x = em.t(a)
            c = float(b)
            if kind == "add":
                return em.op("add_scalar", x, scalar=c)
            if kind == "sub":
                return em.op("add_scalar", x, scalar=-c)
            if kind == "mul":
                return em.op("mul_scalar", x, scalar=c)
            if c == 0:
                raise Unsupported("division by the constant 0")
            return em.op("mul_scalar", x, scalar=1.0 / c)
        if _scalar(a):
            raise Unsupported(f"{op_name(n)} with a constant left operand")
        return em.op(kind, em.t(a), em.t(b))
    return handler


def _rsub(em: Emitter, n: Any) -> Any:
    a, b = n.args[:2]
    if not _scalar(b):
        raise Unsupported("rsub of two tensors")
    return em.op("add_scalar", _neg(em, em.t(a)), scalar=float(b))


def _neg(em: Emitter, x: Any) -> Any:
    return em.op("neg", x) if "neg" in OPS else em.op("mul_scalar", x, scalar=-1.0)


def _unary(kind: str) -> Callable[[Emitter, Any], Any]:
    return lambda em, n: em.op(kind, em.t(n.args[0]))


def _gelu(em: Emitter, n: Any) -> Any:
    if n.kwargs.get("approximate", "none") != "tanh":
        raise Unsupported("gelu with the exact erf (the op table's gelu is the tanh "
                          "approximation: use approximate='tanh')")
    return em.op("gelu", em.t(n.args[0]))


def _pow(em: Emitter, n: Any) -> Any:
    x, p = em.t(n.args[0]), n.args[1]
    if p == 2:
        return em.op("square", x)
    if p == 3:
        return em.op("mul", em.op("square", x), x)
    if p == 0.5:
        return em.op("sqrt", x)
    if p == -0.5:
        return em.op("rsqrt", x)
    raise Unsupported(f"pow with exponent {p!r}")


def _last_dim(n: Any, dims: Any) -> None:
    rank = len(meta(n.args[0]).shape)
    dims = [dims] if isinstance(dims, int) else list(dims or [])
    if [d % rank for d in dims] != [rank - 1]:
        raise Unsupported(f"{op_name(n)} over dims {dims} (only the last dim is captured)")


def _reduce(kind: str) -> Callable[[Emitter, Any], Any]:
    def handler(em: Emitter, n: Any) -> Any:
        _last_dim(n, n.args[1] if len(n.args) > 1 else None)
        keep = n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False)
        if not keep:
            raise Unsupported(f"{op_name(n)} without keepdim")
        if n.kwargs.get("dtype") is not None:
            raise Unsupported(f"{op_name(n)} with a dtype")
        return em.op(kind, em.t(n.args[0]), dim=-1)
    return handler


def _softmax(em: Emitter, n: Any) -> Any:
    _last_dim(n, n.args[1])
    src = n.args[0]
    value = em.env.get(src) if src in em.members else None
    if isinstance(value, Masked):
        e = em.op("exp", value.scores)
        shape = tuple(meta(src).shape)
        mshape = (1,) * (len(shape) - len(meta(value.mask).shape)) + tuple(meta(value.mask).shape)
        e = em.op("mul", e, em.new_input(value.mask, canon(mshape, em.mode), "mask"))
    else:
        e = em.op("exp", em.t(src))
    return em.op("div", e, em.op("sum", e, dim=-1))


def _masked_fill(em: Emitter, n: Any) -> Any:
    scores, mask, value = n.args[:3]
    if value != -math.inf or not is_node(mask) or mask in em.members:
        raise Unsupported("masked_fill other than with -inf by an outside mask")
    if any(u not in em.members or op_name(u) != "_softmax.default" for u in n.users):
        raise Unsupported("masked_fill(-inf) not feeding a softmax")
    if meta(mask).dtype.is_floating_point:
        raise Unsupported("masked_fill with a float mask")
    return Masked(em.t(scores), mask)


def _layer_norm(em: Emitter, n: Any) -> Any:
    x, shape, w, b, eps = n.args[:5]
    if len(shape) != 1:
        raise Unsupported("layer_norm over more than the last dim")
    xt = em.t(x)
    d = em.op("sub", xt, em.op("mean", xt, dim=-1))
    var = em.op("mean", em.op("square", d), dim=-1)
    y = em.op("mul", d, em.op("rsqrt", em.op("add_scalar", var, scalar=float(eps))))
    if w is not None:
        y = em.op("mul", y, em.t(w))
    if b is not None:
        y = em.op("add", y, em.t(b))
    return ("layer_norm", y)


def _getitem(em: Emitter, n: Any) -> Any:
    src, i = n.args
    value = em.env.get(src) if src in em.members else None
    if isinstance(value, tuple) and value[0] == "layer_norm" and i == 0:
        return value[1]
    raise Unsupported("the mean or rstd output of layer_norm")


def _identity(em: Emitter, n: Any) -> Any:
    src = n.args[0]
    if canon(meta(src).shape, em.mode) != canon(meta(n).shape, em.mode):
        raise Unsupported(f"{op_name(n)} changes the canonical shape "
                          f"{tuple(meta(src).shape)} → {tuple(meta(n).shape)}")
    return em.t(src)


def _to_copy(em: Emitter, n: Any) -> Any:
    extra = set(n.kwargs) - {"dtype", "memory_format", "layout", "device"}
    dt = n.kwargs.get("dtype") or (n.args[1] if len(n.args) > 1 else None)
    if extra or (dt is not None and not dt.is_floating_point):
        raise Unsupported(f"{op_name(n)} to a non-float dtype or with {sorted(extra)}")
    return _identity(em, n)  # kernels compute in float32; the output's dtype is restored


def _matmul(em: Emitter, n: Any) -> Any:
    return em.op("matmul", em.t(n.args[0]), em.rhs(n.args[1]))


def _addmm(em: Emitter, n: Any) -> Any:
    bias, a, w = n.args[:3]
    if n.kwargs.get("beta", 1) != 1 or n.kwargs.get("alpha", 1) != 1:
        raise Unsupported("addmm with alpha or beta")
    return em.op("add", em.op("matmul", em.t(a), em.rhs(w)), em.t(bias))


_VIEWS = ("view.default", "_unsafe_view.default", "reshape.default", "unsqueeze.default",
          "squeeze.dim", "squeeze.default", "expand.default", "clone.default", "alias.default",
          "detach.default", "contiguous.default")

HANDLERS: dict[str, Callable[[Emitter, Any], Any]] = {
    "mm.default": _matmul, "bmm.default": _matmul, "matmul.default": _matmul,
    "addmm.default": _addmm,
    **{f"{k}.Tensor": _binary(k) for k in ("add", "sub", "mul", "div")},
    **{f"{k}.Scalar": _binary(k) for k in ("add", "sub", "mul", "div")},
    "rsub.Scalar": _rsub, "neg.default": lambda em, n: _neg(em, em.t(n.args[0])),
    **{f"{k}.default": _unary(k) for k in ("rsqrt", "sqrt", "exp", "tanh", "sigmoid", "silu",
                                           "relu")},
    "gelu.default": _gelu, "pow.Tensor_Scalar": _pow,
    "mean.dim": _reduce("mean"), "sum.dim_IntList": _reduce("sum"),
    "_softmax.default": _softmax, "masked_fill.Scalar": _masked_fill,
    "native_layer_norm.default": _layer_norm, "getitem": _getitem,
    "_to_copy.default": _to_copy, "prims.convert_element_type.default": _to_copy,
    **{v: _identity for v in _VIEWS},
}
BATCHED_OPS = frozenset({"bmm.default"})
# views and copies: free in PyTorch, not counted as ops in the report
FREE_OPS = frozenset({*_VIEWS, "getitem", "_to_copy.default", "prims.convert_element_type.default",
                      "t.default", "transpose.int", "permute.default", "slice.Tensor",
                      "select.int", "split.Tensor", "split_with_sizes.default"})


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
        while x in members and op_name(x) in _VIEWS and len(x.users) == 1 and \
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

