"""The op table: every op of the µGraph IR defined once.

Each entry names the op, its arity, the graph levels that allow it, its attributes, its
shape rule, its dtype rule, its abstract expression (used by the search to prune) and the
egglog function that expression is built from.
The builder, the parser, the interpreter, the enumerator, the lowering and the renderer all
read this table or the sets derived from it below (``ELEMENTWISE_OPS``, ``UNARY_OPS``,
``BINARY_OPS``, ``ROW_REDUCTIONS``, ``EGG_FUNCTIONS``); none of them keeps its own list of ops.
``DTYPE_BYTES`` is the one table of dtypes and their widths.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .dims import Dim, ShapeError, fmt_shape

KERNEL = "kernel"
BLOCK = "block"
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}  # storage width of each dtype
DTYPES = tuple(DTYPE_BYTES)
# how a kernel input is stored: row-major, or as the contiguous transpose of its last two dims
# (logical [..., K, N] held as [..., N, K]: a Linear weight read as W.t(), no copy)
LAYOUTS = ("row", "transposed")
MAX_RANK = 4  # dims of a tensor
GRID_DIMS = 3  # dims of a block graph's grid and block (and of its imaps and omaps)
ACCUM_KINDS = ("no_red", "sum", "mean", "rms")

Shape = tuple[Dim, ...]
Expr = tuple  # abstract expressions are nested tuples: ("add", e1, e2), ("var", "X"), ...


@dataclass(frozen=True)
class OpDef:
    """One row of the op table."""

    name: str
    arity: int | None  # None: variadic (graph-defined kernel)
    levels: frozenset[str]
    shape_rule: Callable[[Sequence[Shape], dict], Shape] | None
    abstract: Callable[[Sequence[Expr], Sequence[Shape], dict], Expr] | None
    attrs: tuple[str, ...] = ()
    commutative: bool = False
    elementwise: bool = False  # unary or binary pointwise: fused into thread chains
    row_reduction: bool = False  # reduces a row (kept with size 1), or normalises by one
    egg: str | None = None  # the egglog function its abstract expression is tagged with
    doc: str = ""
    dtype_rule: Callable[[Sequence[str], dict], str] = field(default=None)  # type: ignore[assignment]
    # attributes that may be left out, with their default; a rule drops an attribute equal to
    # its default, so a graph that does not use it stores (and hashes) as it did before
    optional: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.dtype_rule is None:
            object.__setattr__(self, "dtype_rule", _same_dtype(self.name))

    @property
    def required(self) -> tuple[str, ...]:
        """The attributes a caller must give (``attrs`` less the ``optional`` ones)."""
        left_out = {k for k, _ in self.optional}
        return tuple(a for a in self.attrs if a not in left_out)

    def expression(self, operands: Sequence[Expr], shapes: Sequence[Shape], attrs: dict) -> Expr:
        """The op's abstract expression over its operands' (``abstract``; an op without one,
        such as ``input``, raises ValueError)."""
        if self.abstract is None:
            raise ValueError(f"{self.name} has no abstract expression")
        return self.abstract(operands, shapes, attrs)


def _same_dtype(name: str) -> Callable[[Sequence[str], dict], str]:
    def rule(dtypes: Sequence[str], attrs: dict) -> str:
        if len(set(dtypes)) > 1:
            raise ShapeError(f"{name}: operands have different dtypes {list(dtypes)}")
        return dtypes[0]

    return rule


def _is_one(d: Dim) -> bool:
    return isinstance(d, int) and d == 1


def _check_rank(name: str, shape: Shape) -> None:
    if not 1 <= len(shape) <= MAX_RANK:
        raise ShapeError(f"{name}: tensors have 1 to {MAX_RANK} dims, got {fmt_shape(shape)}")


def broadcast_shape(name: str, a: Shape, b: Shape) -> Shape:
    """Binary ops broadcast size-1 dims (same rank), so ``E / sum(E, -1)`` works."""
    if len(a) != len(b):
        raise ShapeError(f"{name}: operands have ranks {len(a)} and {len(b)}: "
                         f"{fmt_shape(a)} vs {fmt_shape(b)}")
    out = []
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x == y or _is_one(y):
            out.append(x)
        elif _is_one(x):
            out.append(y)
        else:
            raise ShapeError(f"{name}: shapes {fmt_shape(a)} and {fmt_shape(b)} differ in "
                             f"dim {i} ({x} vs {y}) and neither is 1")
    return tuple(out)


def _dim_attr(name: str, shape: Shape, attrs: dict) -> int:
    dim = attrs.get("dim")
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise ShapeError(f"{name}: attribute 'dim' must be an integer, got {dim!r}")
    if not -len(shape) <= dim < len(shape):
        raise ShapeError(f"{name}: dim {dim} is out of range for shape {fmt_shape(shape)}")
    return dim % len(shape)


# --- shape rules -------------------------------------------------------------------------

def _unary(name: str):
    def rule(shapes: Sequence[Shape], attrs: dict) -> Shape:
        _check_rank(name, shapes[0])
        return shapes[0]
    return rule


def _binary(name: str):
    def rule(shapes: Sequence[Shape], attrs: dict) -> Shape:
        _check_rank(name, shapes[0])
        return broadcast_shape(name, shapes[0], shapes[1])
    return rule


def _matmul_shape(shapes: Sequence[Shape], attrs: dict) -> Shape:
    a, b = shapes
    if len(a) < 2 or len(a) != len(b):
        raise ShapeError(f"matmul: operands must have the same rank ≥ 2, got "
                         f"{fmt_shape(a)} and {fmt_shape(b)}")
    if a[-1] != b[-2]:
        raise ShapeError(f"matmul: inner dims differ: {fmt_shape(a)} @ {fmt_shape(b)} "
                         f"({a[-1]} vs {b[-2]})")
    batch = broadcast_shape("matmul", a[:-2], b[:-2]) if len(a) > 2 else ()
    return (*batch, a[-2], b[-1])


def _reduce_shape(name: str):
    def rule(shapes: Sequence[Shape], attrs: dict) -> Shape:
        shape = shapes[0]
        _check_rank(name, shape)
        d = _dim_attr(name, shape, attrs)
        attrs["dim"] = d
        return tuple(1 if i == d else s for i, s in enumerate(shape))
    return rule


def _finite(name: str, key: str, c: Any) -> float:
    if not isinstance(c, int | float) or isinstance(c, bool) or not math.isfinite(c):
        raise ShapeError(f"{name}: attribute '{key}' must be a finite number, got {c!r}")
    return float(c)


def _scalar_shape(name: str):
    def rule(shapes: Sequence[Shape], attrs: dict) -> Shape:
        _check_rank(name, shapes[0])
        attrs["scalar"] = _finite(name, "scalar", attrs.get("scalar"))
        return shapes[0]
    return rule


def _rms_norm_shape(shapes: Sequence[Shape], attrs: dict) -> Shape:
    """x / sqrt(mean(x², last dim) + eps); eps ≥ 0, and eps = 0 is not stored."""
    _check_rank("rms_norm", shapes[0])
    eps = _finite("rms_norm", "eps", attrs.get("eps", 0.0))
    if eps < 0:
        raise ShapeError(f"rms_norm: eps must be ≥ 0, got {eps!r}")
    if eps == 0.0:
        attrs.pop("eps", None)
    else:
        attrs["eps"] = eps
    return shapes[0]


def _accum_shape(shapes: Sequence[Shape], attrs: dict) -> Shape:
    kind = attrs.get("kind")
    if kind not in ACCUM_KINDS:
        raise ShapeError(f"accum: kind must be one of {ACCUM_KINDS}, got {kind!r}")
    shape = shapes[0]
    return shape if kind == "no_red" else (*shape[:-1], 1)


# --- abstract expressions ----------------------------------------------------------------
# Terms over the program's inputs in the style of Mirage: ("var", name), ("cst", value),
# ("add", a, b), ("mul", a, b), ("div", a, b), ("sum", cls, e), ("exp", e), ("sqrt", e), and
# the non-Lax functions.  A sum names the *dimension class* it reduces (search.dimclass), not
# its size: a tile-level sum then a for-loop accumulation over the same class is one sum
# (sum(c, sum(c, e)) = sum(c, e)), while a sum over an unrelated dim is a different term.
# Callers pass per-operand dim classes in attrs["_cls"] and the loop's in attrs["_loop_cls"];
# without them every dim counts as one anonymous class, which is coarser but still sound.


def _dim_cls(a: dict, operand: int, dim: int) -> Any:
    classes = a.get("_cls")
    return classes[operand][dim] if classes else "?"


def _sum(cls: Any, e: Expr) -> Expr:
    return e if cls == -1 else ("sum", f"c{cls}", e)


def _inv(*classes: Any) -> Expr:
    return ("cst", "1/" + "·".join(f"c{c}" for c in classes if c != -1))


def _neg(e: Expr) -> Expr:
    return ("mul", ("cst", -1.0), e)


def _abs_unary(tag: str):
    return lambda e, s, a: (tag, e[0])


def _abs_binary(tag: str):
    if tag == "sub":
        return lambda e, s, a: ("add", e[0], _neg(e[1]))
    return lambda e, s, a: (tag, e[0], e[1])


def _abs_matmul(e, s, a):
    return _sum(_dim_cls(a, 0, -1), ("mul", e[0], e[1]))


def _abs_reduce(mean: bool):
    def rule(e, s, a):
        cls = _dim_cls(a, 0, a["dim"])
        if cls == -1:
            return e[0]
        return ("mul", _sum(cls, e[0]), _inv(cls)) if mean else _sum(cls, e[0])
    return rule


def _abs_rms_norm(e, s, a):
    cls = _dim_cls(a, 0, -1)
    ms = ("mul", e[0], e[0]) if cls == -1 else \
        ("mul", _sum(cls, ("mul", e[0], e[0])), _inv(cls))
    eps = float(a.get("eps", 0.0))
    return ("div", e[0], ("sqrt", ("add", ms, ("cst", eps)) if eps else ms))


def _abs_accum(e, s, a):
    kind, x = a["kind"], e[0]
    looped = a.get("_loop", True)
    loop = a.get("_loop_cls", "F") if looped else -1
    if kind == "no_red":
        return _sum(loop, x)
    last = _dim_cls(a, 0, -1)
    base = x if kind in ("sum", "mean") else ("mul", x, x)
    total = _sum(loop, _sum(last, base))
    if kind == "sum":
        return total
    classes = [loop] if loop == last else [loop, last]
    mean = ("mul", total, _inv(*classes))
    return mean if kind == "mean" else ("sqrt", mean)


# --- the table ---------------------------------------------------------------------------

_BOTH = frozenset({KERNEL, BLOCK})
_UNARY_DOCS = {
    "exp": "e^x", "square": "x²", "sqrt": "√x", "silu": "x·sigmoid(x)",
    "sigmoid": "1/(1+e^-x)", "gelu": "x·Φ(x) (tanh approximation in float)",
    "relu": "max(x, 0)", "neg": "−x", "rsqrt": "1/√x", "tanh": "tanh(x)",
}
# unary ops written with other functions of the e-graph (the rest are ("op", x))
_UNARY_ABSTRACT: dict[str, Callable[[Sequence[Expr], Sequence[Shape], dict], Expr]] = {
    "square": lambda e, s, a: ("mul", e[0], e[0]),
    "neg": lambda e, s, a: _neg(e[0]),
    "rsqrt": lambda e, s, a: ("div", ("cst", 1.0), ("sqrt", e[0])),
}
_BINARY_DOCS = {"add": "a + b", "sub": "a − b", "mul": "a · b", "div": "a / b"}
# ops whose abstract expression has a function of its own in the e-graph (the others are
# written with these: sub = add of a negation, square = mul, mean = sum times a constant, ...)
_EGG = {"add": "Add", "mul": "Mul", "div": "Div", "exp": "Exp", "sqrt": "Sqrt", "silu": "Silu",
        "sigmoid": "Sigmoid", "gelu": "Gelu", "relu": "Relu", "tanh": "Tanh"}


def _build() -> dict[str, OpDef]:
    ops = [
        OpDef("input", 0, _BOTH, None, None,
              ("shape", "dtype", "index", "imap", "fmap", "layout"),
              doc="a kernel input (shape, dtype, layout) or, in a block graph, a tile of one",
              optional=(("layout", "row"),)),
        OpDef("output", 1, _BOTH, None, None, ("omap",),
              doc="marks a graph output; in a block graph, omap places the tile"),
        OpDef("matmul", 2, _BOTH, _matmul_shape, _abs_matmul, doc="a @ b over the last two dims"),
        OpDef("mul_scalar", 1, _BOTH, _scalar_shape("mul_scalar"),
              lambda e, s, a: ("mul", e[0], ("cst", float(a["scalar"]))),
              ("scalar",), elementwise=True, doc="x · c for a numeric constant c"),
        OpDef("add_scalar", 1, _BOTH, _scalar_shape("add_scalar"),
              lambda e, s, a: ("add", e[0], ("cst", float(a["scalar"]))),
              ("scalar",), elementwise=True, doc="x + c for a numeric constant c"),
        OpDef("sum", 1, _BOTH, _reduce_shape("sum"), _abs_reduce(mean=False), ("dim",),
              row_reduction=True, egg="Sum", doc="sum over one dim, kept with size 1"),
        OpDef("mean", 1, _BOTH, _reduce_shape("mean"), _abs_reduce(mean=True), ("dim",),
              row_reduction=True, doc="mean over one dim, kept with size 1"),
        OpDef("rms_norm", 1, _BOTH, _rms_norm_shape, _abs_rms_norm, ("eps",),
              row_reduction=True, optional=(("eps", 0.0),),
              doc="x / sqrt(mean(x², last dim) + eps), no weight; eps defaults to 0"),
        OpDef("accum", 1, frozenset({BLOCK}), _accum_shape, _abs_accum, ("kind",),
              doc="for-loop accumulator: no_red (sum over iterations) or sum/mean/rms of the "
                  "last dim over all iterations"),
        OpDef("graph_kernel", None, frozenset({KERNEL}), None, None, ("block_graph",),
              doc="a graph-defined kernel: a block graph run over a grid"),
    ]
    for name, doc in _BINARY_DOCS.items():
        ops.append(OpDef(name, 2, _BOTH, _binary(name), _abs_binary(name),
                         commutative=name in ("add", "mul"), elementwise=True,
                         egg=_EGG.get(name), doc=doc))
    for name, doc in _UNARY_DOCS.items():
        abstract = _UNARY_ABSTRACT.get(name) or _abs_unary(name)
        ops.append(OpDef(name, 1, _BOTH, _unary(name), abstract, elementwise=True,
                         egg=_EGG.get(name), doc=doc))
    return {op.name: op for op in ops}


OPS: dict[str, OpDef] = _build()
COMPUTE_OPS = tuple(n for n in OPS if n not in ("input", "output", "graph_kernel", "accum"))
ELEMENTWISE_OPS = frozenset(n for n, op in OPS.items() if op.elementwise)
# pointwise ops of one operand and no attribute (mul_scalar and add_scalar, which take one,
# are neither)
UNARY_OPS = tuple(n for n, op in OPS.items() if op.elementwise and op.arity == 1 and not op.attrs)
BINARY_OPS = tuple(n for n, op in OPS.items() if op.elementwise and op.arity == 2)
ROW_REDUCTIONS = frozenset(n for n, op in OPS.items() if op.row_reduction)
# abstract-expression tag -> egglog function, two-operand functions first (the order of the
# e-graph's datatype declaration)
EGG_FUNCTIONS = {n: OPS[n].egg for n in sorted(OPS, key=lambda n: -(OPS[n].arity or 0))
                 if OPS[n].egg}


def op_def(name: str) -> OpDef:
    """The table row of ``name``, or a clear error listing the known ops."""
    try:
        return OPS[name]
    except KeyError:
        raise ShapeError(f"unknown op {name!r}; known ops: {', '.join(sorted(OPS))}") from None


def op_flops(kind: str, in_shapes: Sequence[Sequence[int]], out_shape: Sequence[int]) -> int:
    """Arithmetic of one op at concrete shapes: 2·M·N·K for a matmul, the larger of input and
    output elements for a reduction (every element read is added), one per output element
    otherwise.  The roofline (``kernels.estimate``) and the search's waste test
    (``search.ranking.flops``) both count with it."""
    elems = math.prod(int(d) for d in out_shape) if out_shape else 1
    if kind == "matmul":
        return 2 * elems * int(in_shapes[0][-1])
    if kind in ROW_REDUCTIONS or kind == "accum":
        return max(elems, math.prod(int(d) for d in in_shapes[0]))
    return elems
