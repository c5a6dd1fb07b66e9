"""Random valid programs drawn from the op table: the cost model's CPU dataset, and a test.

``random_program(seed)`` writes a program in the program language (the same text a program
file or a job's inline ``program:`` holds) with 1 to 8 compute ops: matmuls, row reductions
(alone, or folded back into the row as a softmax or a norm is), unary and binary elementwise
ops and scalings, over shapes drawn from a small set of powers of two and a few irregular
sizes.  Every op's shape rule is respected by construction and checked again by parsing the
text (``parse_program`` builds the graph), so what comes back always builds; the same seed
always gives the same program (``random.Random(seed)``, nothing else).

Op choices come from the op table (``search.ir.ops``): whatever ``UNARY_OPS``, ``BINARY_OPS``
and ``ROW_REDUCTIONS`` hold, matmul as the table's two-operand op that is neither
elementwise nor a reduction, and the elementwise op that takes a scalar.  A new op in the
table is drawn without touching this module, as long as it falls into one of those kinds.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import yaml

from .ir import (
    BINARY_OPS,
    COMPUTE_OPS,
    DTYPES,
    KERNEL,
    OPS,
    ROW_REDUCTIONS,
    UNARY_OPS,
    Program,
    parse_program,
)

# Dimension sizes: powers of two and a few irregular (but even) sizes; small enough that a
# search and a CPU measurement take seconds, large enough that tilings differ in speed.
DIMS = (8, 12, 16, 24, 32, 48, 64, 96, 128, 256)
MAX_ELEMENTS = 1 << 16  # of any one tensor
MAX_INPUTS = 4  # more inputs widen every block graph the search tries
SCALARS = (0.5, 2.0, 0.125, -1.0, 3.0)
MAX_OPS = 8
MAX_ATTEMPTS = 100  # draws per seed before giving up on ``accept``

# The op kinds, derived from the table.
MATMUL_OPS = tuple(n for n in COMPUTE_OPS if OPS[n].arity == 2 and not OPS[n].elementwise
                   and not OPS[n].row_reduction and KERNEL in OPS[n].levels)
SCALAR_OPS = tuple(n for n in COMPUTE_OPS if OPS[n].elementwise and OPS[n].arity == 1
                   and OPS[n].attrs)
DIM_REDUCTIONS = tuple(sorted(n for n in ROW_REDUCTIONS if "dim" in OPS[n].attrs))
ROW_NORMS = tuple(sorted(n for n in ROW_REDUCTIONS if not OPS[n].required))
# kind -> weight of drawing it at a step
KINDS = {"matmul": 3, "reduce": 3, "unary": 3, "binary": 3, "scalar": 1}

Shape = tuple[int, ...]


@dataclass
class _Draft:
    """A program being drawn: inputs, body lines, and the tensor the chain has reached."""

    rng: random.Random
    rank: int
    inputs: dict[str, Shape] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)
    shapes: dict[str, Shape] = field(default_factory=dict)  # every named tensor
    ops: int = 0
    cur: str = ""

    def new_input(self, shape: Shape) -> str:
        name = "XWABCDEFGH"[len(self.inputs)] if len(self.inputs) < 10 else f"I{len(self.inputs)}"
        self.inputs[name] = shape
        self.shapes[name] = shape
        return name

    def emit(self, expr: str, shape: Shape, ops: int = 1) -> str:
        name = f"T{len(self.lines)}"
        self.lines.append(f"{name} = {expr}")
        self.shapes[name] = shape
        self.ops += ops
        self.cur = name
        return name


def _fits(shape: Shape) -> bool:
    total = 1
    for d in shape:
        total *= d
    return total <= MAX_ELEMENTS


def _first_shape(rng: random.Random, rank: int) -> Shape:
    while True:
        shape = tuple(rng.choice(DIMS) for _ in range(rank))
        if rank == 3:
            shape = (rng.choice((2, 4, 8)), *shape[1:])
        if _fits(shape):
            return shape


def _matmul(d: _Draft) -> None:
    """cur @ W (a new input), or W @ cur: the contracted dim is cur's own."""
    shape = d.shapes[d.cur]
    op = d.rng.choice(MATMUL_OPS)
    right = d.rng.random() < 0.75
    for _ in range(20):
        p = d.rng.choice(DIMS)
        if right:
            w_shape, out = (*shape[:-2], shape[-1], p), (*shape[:-1], p)
        else:
            w_shape, out = (*shape[:-2], p, shape[-2]), (*shape[:-2], p, shape[-1])
        if _fits(w_shape) and _fits(out):
            break
    else:
        return
    w = d.new_input(w_shape)
    d.emit(f"{op}({d.cur}, {w})" if right else f"{op}({w}, {d.cur})", out)


def _reduce(d: _Draft, budget: int) -> None:
    """A row norm, or sum / mean over one dim (the last, mostly), then with room for it
    maybe folded back into the tensor by a binary op: E / sum(E, -1), X - mean(X, -1)."""
    shape = d.shapes[d.cur]
    kinds = [k for k, ops in (("norm", ROW_NORMS), ("dim", DIM_REDUCTIONS)) if ops]
    if d.rng.choice(kinds) == "norm":
        d.emit(f"{d.rng.choice(ROW_NORMS)}({d.cur})", shape)
        return
    dims = [i for i, n in enumerate(shape) if n > 1] or [len(shape) - 1]
    dim = len(shape) - 1 if d.rng.random() < 0.7 or len(shape) - 1 not in dims else \
        d.rng.choice(dims)
    if shape[dim] == 1:
        dim = dims[-1]
    reduced = tuple(1 if i == dim else n for i, n in enumerate(shape))
    source = d.cur
    red = d.emit(f"{d.rng.choice(DIM_REDUCTIONS)}({source}, {dim})", reduced)
    if budget >= 2 and d.rng.random() < 0.6:
        d.emit(f"{d.rng.choice(BINARY_OPS)}({source}, {red})", shape)


def _binary(d: _Draft) -> None:
    """cur with a second operand: an earlier tensor of a shape that broadcasts, or a new
    input of the same shape or with size-1 dims (a bias row, a per-row scale)."""
    shape = d.shapes[d.cur]
    op = d.rng.choice(BINARY_OPS)
    earlier = [n for n, s in d.shapes.items() if n != d.cur and len(s) == len(shape)
               and all(a == b or a == 1 for a, b in zip(s, shape, strict=True))]
    if earlier and (len(d.inputs) >= MAX_INPUTS or d.rng.random() < 0.4):
        other = d.rng.choice(sorted(earlier))
    elif len(d.inputs) < MAX_INPUTS:
        ones = d.rng.random()
        if ones < 0.6:
            other_shape = shape
        else:  # a broadcast operand: size 1 in one dim
            i = d.rng.randrange(len(shape))
            other_shape = tuple(1 if j == i else n for j, n in enumerate(shape))
        other = d.new_input(other_shape)
    else:
        other = d.cur  # x op x: square / double / 0 / 1, still a valid program
    a, b = (d.cur, other) if d.rng.random() < 0.8 or d.shapes[other] != shape \
        else (other, d.cur)
    d.emit(f"{op}({a}, {b})", shape)


def random_program_doc(seed: int, *, min_ops: int = 1, max_ops: int = MAX_OPS,
                       dtype: str | None = None,
                       accept: Callable[[Program], bool] | None = None) -> dict:
    """The program of ``seed`` as the mapping a program file (or a job's inline
    ``program:``) holds: name, dtype, inputs, body, outputs.

    ``accept`` (e.g. ``verifier.well_conditioned`` of the built graph) may refuse a draw;
    the next draw of the same seed is tried, so a seed still names one program."""
    if not 1 <= min_ops <= max_ops:
        raise ValueError(f"need 1 <= min_ops <= max_ops, got {min_ops} and {max_ops}")
    for attempt in range(MAX_ATTEMPTS):
        rng = random.Random(seed if attempt == 0 else f"{seed}/{attempt}")
        doc = _draw(rng, seed, min_ops, max_ops, dtype)
        if accept is None or accept(_parse(doc, seed)):
            return doc
    raise ValueError(f"random program {seed}: no draw of {MAX_ATTEMPTS} was accepted")


def random_program(seed: int, *, min_ops: int = 1, max_ops: int = MAX_OPS,
                   dtype: str | None = None,
                   accept: Callable[[Program], bool] | None = None) -> Program:
    """A valid program of 1-8 ops drawn with ``seed`` (see the module docstring); parsed
    from its own text, so it is exactly what a job file's inline program would give."""
    doc = random_program_doc(seed, min_ops=min_ops, max_ops=max_ops, dtype=dtype,
                             accept=accept)
    return _parse(doc, seed)


def _parse(doc: dict, seed: int) -> Program:
    return parse_program(yaml.safe_dump(doc, sort_keys=False), f"<random program {seed}>")


def _draw(rng: random.Random, seed: int, min_ops: int, max_ops: int,
          dtype: str | None) -> dict:
    n_ops = rng.randint(min_ops, max_ops)
    d = _Draft(rng, rank=3 if rng.random() < 0.25 else 2)
    d.cur = d.new_input(_first_shape(rng, d.rank))
    weights = dict(KINDS)
    if not MATMUL_OPS:
        weights.pop("matmul")
    if not (ROW_NORMS or DIM_REDUCTIONS):
        weights.pop("reduce")
    for kind, ops in (("unary", UNARY_OPS), ("binary", BINARY_OPS), ("scalar", SCALAR_OPS)):
        if not ops:
            weights.pop(kind)
    stalls = 0
    while d.ops < n_ops and stalls < 50:
        before = d.ops
        kind = rng.choices(list(weights), weights=list(weights.values()))[0]
        if kind == "matmul" and len(d.inputs) < MAX_INPUTS:
            _matmul(d)
        elif kind == "reduce":
            _reduce(d, n_ops - d.ops)
        elif kind == "unary":
            d.emit(f"{rng.choice(UNARY_OPS)}({d.cur})", d.shapes[d.cur])
        elif kind == "binary":
            _binary(d)
        elif kind == "scalar":
            d.emit(f"{rng.choice(SCALAR_OPS)}({d.cur}, {rng.choice(SCALARS)})",
                   d.shapes[d.cur])
        stalls = stalls + 1 if d.ops == before else 0
    if not d.lines:  # every draw stalled (cannot happen with the table as it is)
        d.emit(f"{UNARY_OPS[0]}({d.cur})", d.shapes[d.cur])
    d.lines[-1] = "O" + d.lines[-1][d.lines[-1].index(" = "):]
    return {"name": f"random_{seed}", "dtype": dtype or rng.choice(DTYPES),
            "inputs": {n: list(s) for n, s in d.inputs.items()},
            "body": "\n".join(d.lines) + "\n", "outputs": ["O"]}


def compute_ops(program: Program) -> list[str]:
    """The op names of a program's reference graph, in order (what the tests count)."""
    graph = program.build()
    return [op.kind for op in graph.ops if op.kind not in ("input", "output")]
