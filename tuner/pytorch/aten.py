"""ATen → µGraph: how each ATen op of a captured region is written with the op table's ops.

``HANDLERS`` holds one translation per ATen op: it writes the node with the ops and operands of
a ``Writer`` (the ``Emitter`` of emitter.py, which walks a region and calls them) and returns
its value.  This module also holds what the translations and the emitter share: the canonical
shapes, ``Unsupported`` and the FX node helpers.

A region's tensors are held in a *canonical* shape in which the views a model puts between its
ops cost nothing: ``rows`` (every tensor ``[prod(leading dims), last]``) for regions of
matmuls, pointwise ops and last-dim reductions, ``batched`` (``[prod(dims[:-2]), rows,
last]``) for regions holding a ``bmm`` or broadcasting over a leading dim (``rows`` is tried
first).  A view, reshape, unsqueeze or same-shape expand whose
input and output have the same canonical shape is then the identity; any other view ends the
region (it runs in PyTorch, where a view of a contiguous tensor is free).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from search import OPS

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


class Writer(Protocol):
    """What a translation writes with: the ``Emitter`` (emitter.py) as the handlers see it."""

    members: set  # the region's FX nodes
    mode: str  # ROWS or BATCHED
    env: dict  # member node -> its value so far

    def op(self, kind: str, *args: Any, **attrs: Any) -> Any:
        """A tensor of op ``kind`` of the op table (``Unsupported`` where it lacks one)."""

    def t(self, arg: Any) -> Any:
        """An operand: a member's value, or the canonical view of an outside tensor."""

    def rhs(self, arg: Any) -> Any:
        """A matmul's right operand."""

    def new_input(self, node: Any, shape: tuple[int, ...], kind: str = "plain") -> Any:
        """A kernel input holding ``node``'s value at ``shape``."""


Handler = Callable[[Writer, Any], Any]


# --- the handlers ------------------------------------------------------------------------

def _scalar(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _binary(kind: str) -> Handler:
    def handler(em: Writer, n: Any) -> Any:
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


def _rsub(em: Writer, n: Any) -> Any:
    a, b = n.args[:2]
    if not _scalar(b):
        raise Unsupported("rsub of two tensors")
    return em.op("add_scalar", _neg(em, em.t(a)), scalar=float(b))


def _neg(em: Writer, x: Any) -> Any:
    return em.op("neg", x) if "neg" in OPS else em.op("mul_scalar", x, scalar=-1.0)


def _unary(kind: str) -> Handler:
    return lambda em, n: em.op(kind, em.t(n.args[0]))


def _gelu(em: Writer, n: Any) -> Any:
    if n.kwargs.get("approximate", "none") != "tanh":
        raise Unsupported("gelu with the exact erf (the op table's gelu is the tanh "
                          "approximation: use approximate='tanh')")
    return em.op("gelu", em.t(n.args[0]))


def _pow(em: Writer, n: Any) -> Any:
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


def _reduce(kind: str) -> Handler:
    def handler(em: Writer, n: Any) -> Any:
        _last_dim(n, n.args[1] if len(n.args) > 1 else None)
        keep = n.args[2] if len(n.args) > 2 else n.kwargs.get("keepdim", False)
        if not keep:
            raise Unsupported(f"{op_name(n)} without keepdim")
        if n.kwargs.get("dtype") is not None:
            raise Unsupported(f"{op_name(n)} with a dtype")
        return em.op(kind, em.t(n.args[0]), dim=-1)
    return handler


def _softmax(em: Writer, n: Any) -> Any:
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


def _masked_fill(em: Writer, n: Any) -> Any:
    scores, mask, value = n.args[:3]
    if value != -math.inf or not is_node(mask) or mask in em.members:
        raise Unsupported("masked_fill other than with -inf by an outside mask")
    if any(u not in em.members or op_name(u) != "_softmax.default" for u in n.users):
        raise Unsupported("masked_fill(-inf) not feeding a softmax")
    if meta(mask).dtype.is_floating_point:
        raise Unsupported("masked_fill with a float mask")
    return Masked(em.t(scores), mask)


def _layer_norm(em: Writer, n: Any) -> Any:
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


def _getitem(em: Writer, n: Any) -> Any:
    src, i = n.args
    value = em.env.get(src) if src in em.members else None
    if isinstance(value, tuple) and value[0] == "layer_norm" and i == 0:
        return value[1]
    raise Unsupported("the mean or rstd output of layer_norm")


def _identity(em: Writer, n: Any) -> Any:
    src = n.args[0]
    if canon(meta(src).shape, em.mode) != canon(meta(n).shape, em.mode):
        raise Unsupported(f"{op_name(n)} changes the canonical shape "
                          f"{tuple(meta(src).shape)} → {tuple(meta(n).shape)}")
    return em.t(src)


def _to_copy(em: Writer, n: Any) -> Any:
    extra = set(n.kwargs) - {"dtype", "memory_format", "layout", "device"}
    dt = n.kwargs.get("dtype") or (n.args[1] if len(n.args) > 1 else None)
    if extra or (dt is not None and not dt.is_floating_point):
        raise Unsupported(f"{op_name(n)} to a non-float dtype or with {sorted(extra)}")
    return _identity(em, n)  # kernels compute in float32; the output's dtype is restored


def _matmul(em: Writer, n: Any) -> Any:
    return em.op("matmul", em.t(n.args[0]), em.rhs(n.args[1]))


def _addmm(em: Writer, n: Any) -> Any:
    bias, a, w = n.args[:3]
    if n.kwargs.get("beta", 1) != 1 or n.kwargs.get("alpha", 1) != 1:
        raise Unsupported("addmm with alpha or beta")
    return em.op("add", em.op("matmul", em.t(a), em.rhs(w)), em.t(bias))


# the identity where input and output have the same canonical shape (``_identity``); the
# emitter follows them to a matmul's transposed right operand (``Emitter.rhs``)
VIEWS = ("view.default", "_unsafe_view.default", "reshape.default", "unsqueeze.default",
         "squeeze.dim", "squeeze.default", "expand.default", "clone.default", "alias.default",
         "detach.default", "contiguous.default")

HANDLERS: dict[str, Handler] = {
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
    **{v: _identity for v in VIEWS},
}
BATCHED_OPS = frozenset({"bmm.default"})
# views and copies: free in PyTorch, not counted as ops in the report
FREE_OPS = frozenset({*VIEWS, "getitem", "_to_copy.default", "prims.convert_element_type.default",
                      "t.default", "transpose.int", "permute.default", "slice.Tensor",
                      "select.int", "split.Tensor", "split_with_sizes.default"})
