"""One block graph → one kernel: fused loops and a memory level for every intermediate.

This is AStitch's stitching made explicit.  Ops are walked in order and fused into loops over
tile shapes: an elementwise op joins the loop that computes its operands (a *Local* value, a
scalar in that loop), a last-dim reduction becomes a sink of the loop that computes its operand,
and ops on reduced rows run per row right after it.  A value read by a later loop is stored:
*Regional* (shared memory) because each block produces exactly the tile its own later loops
read — unless task splitting cuts rows across blocks, where a row reduction needs every chunk:
its partials then go *Global* and the kernel is cut into phases at a grid barrier (or split into
kernels).  Values that cross a phase boundary are Global too.  Shared memory is planned with
lifetimes (dead buffers' space is reused); when it overflows the device limit the largest
Regional buffer is downgraded to Global, one at a time, until it fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from search.ir import ELEMENTWISE_OPS, BlockGraph

from ._plan import Access, Buffer, Level, Loop, Phase

ALIGN = 16  # bytes: shared-memory buffers start on float4 boundaries


def dense_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return tuple(reversed(out))


@dataclass
class IOp:
    """A primitive op after expansion (rms_norm, mean and accum become sums and scalings)."""

    kind: str
    ins: tuple[str, ...]
    out: str
    stage: str
    attrs: dict = field(default_factory=dict)
    comment: str = ""


@dataclass
class Home:
    """Where a value can be read: a view with strides per tile dim."""

    view: str
    strides: tuple[int, ...]
    chunked: bool = False


def _fmt(bg: BlockGraph, op) -> str:
    args = ", ".join(f"t{i}" for i in op.inputs)
    attrs = {k: v for k, v in op.attrs.items() if k in ("dim", "kind", "scalar", "eps", "omap")}
    extra = "".join(f", {k}={v}" for k, v in attrs.items())
    out = f"t{op.outputs[0]} = " if op.outputs else ""
    shape = bg.tensors[op.outputs[0]].shape if op.outputs else bg.tensors[op.inputs[0]].shape
    return f"{out}{op.kind}({args}{extra})  {tuple(shape)}"


def expand(bg: BlockGraph) -> tuple[list[IOp], dict[str, tuple[int, ...]], dict[str, str]]:
    """Primitive ops, value shapes, and each block input's tensor id → its op comment.

    Stages: with a for-loop (F > 1) invariant ops are ``pre``, per-iteration ops ``body`` and
    accumulated ones ``post``; without one everything is ``pre``.  An accumulator of a value
    that does not change across iterations is that value scaled by F (the interpreter counts
    it every iteration too), so only per-iteration values need loop-carried accumulators.
    """
    f = int(bg.forloop_range)
    stage_of = {"invariant": "pre", "body": "body" if f > 1 else "pre",
                "epilogue": "post" if f > 1 else "pre"}
    ops: list[IOp] = []
    shapes: dict[str, tuple[int, ...]] = {}
    inputs: dict[str, str] = {}
    for i, info in enumerate(bg.tensors):
        shapes[f"t{i}"] = tuple(int(d) for d in info.shape)
    for op in bg.ops:
        c = _fmt(bg, op)
        if op.kind == "input":
            inputs[f"t{op.outputs[0]}"] = c
            continue
        if op.kind == "output":
            ops.append(IOp("output", (f"t{op.inputs[0]}",), "", "post" if f > 1 else "pre",
                           {"omap": op.attrs["omap"], "index": len([o for o in ops
                                                                    if o.kind == "output"])}, c))
            continue
        x, out = f"t{op.inputs[0]}", f"t{op.outputs[0]}"
        st = stage_of[bg.tensors[op.outputs[0]].stage]
        xs = shapes[x]

        def tmp(tag: str, shape: tuple[int, ...], _out: str = out) -> str:
            name = f"{_out}_{tag}"
            shapes[name] = shape
            return name

        def emit(kind: str, ins: tuple[str, ...], to: str, stage: str = st, _c: str = c,
                 **attrs) -> str:
            ops.append(IOp(kind, ins, to, stage, attrs, _c))
            return to

        row = (*xs[:-1], 1)
        if op.kind in ELEMENTWISE_OPS or op.kind == "matmul":
            emit(op.kind, tuple(f"t{i}" for i in op.inputs), out, **dict(op.attrs))
        elif op.kind in ("sum", "mean"):
            d = op.attrs["dim"]
            last = d == len(xs) - 1
            to = out if op.kind == "sum" else tmp("sum", shapes[out])
            emit("rowsum" if last else "reduce", (x,), to, dim=d)
            if op.kind == "mean":
                emit("mul_scalar", (to,), out, scalar=1.0 / xs[d])
        elif op.kind == "rms_norm":
            sq = emit("square", (x,), tmp("sq", xs))
            ss = emit("rowsum", (sq,), tmp("ss", row))
            ms = emit("mul_scalar", (ss,), tmp("ms", row), scalar=1.0 / xs[-1])
            if op.attrs.get("eps"):
                ms = emit("add_scalar", (ms,), tmp("eps", row), scalar=op.attrs["eps"])
            rr = emit("sqrt", (ms,), tmp("rms", row))
            emit("div", (x, rr), out)
        elif op.kind == "accum":
            kind = op.attrs["kind"]
            carried = f > 1 and bg.tensors[op.inputs[0]].stage == "body"
            n = f * xs[-1]
            if kind == "no_red":
                if carried:
                    emit("acc", (x,), out, stage="body")
                elif f > 1:
                    emit("mul_scalar", (x,), out, stage=stage_of["invariant"], scalar=float(f))
                else:
                    emit("alias", (x,), out)
                continue
            src = emit("square", (x,), tmp("sq", xs), stage="body" if carried else "pre") \
                if kind == "rms" else x
            red_stage = "body" if carried else "pre"
            total = emit("rowacc" if carried else "rowsum", (src,), tmp("tot", row),
                         stage=red_stage)
            if kind == "sum":
                scale = 1.0 if carried else float(f)
            else:
                scale = 1.0 / n if carried else 1.0 / xs[-1]
            post = "post" if carried else "pre"
            if kind == "rms":
                ms = emit("mul_scalar", (total,), tmp("ms", row), stage=post, scalar=scale)
                emit("sqrt", (ms,), out, stage=post)
            elif scale != 1.0:
                emit("mul_scalar", (total,), out, stage=post, scalar=scale)
            else:
                emit("alias", (total,), out, stage=post)
        else:
            raise NotImplementedError(f"lowering has no rule for block op {op.kind!r} ({c})")
    return ops, shapes, inputs


def access(home: Home, vshape: tuple[int, ...], lshape: tuple[int, ...]) -> Access:
    """Read/write a value of shape ``vshape`` from a loop over ``lshape`` (broadcast → 0)."""
    rows = tuple(home.strides[d] if vshape[d] == lshape[d] and lshape[d] > 1 else 0
                 for d in range(len(lshape) - 1))
    col = home.strides[-1] if vshape[-1] == lshape[-1] and lshape[-1] > 1 else 0
    return Access(home.view, rows, col, chunked=home.chunked and col != 0)


def plan_shared(buffers: list[Buffer], limit: float, extra: int = 0
                ) -> tuple[int, list[str]]:
    """Give Regional buffers offsets, reusing space of buffers whose lifetime has ended;
    downgrade the largest to Global while the peak exceeds ``limit``.  Returns (peak, notes)."""
    notes: list[str] = []
    while True:
        regional = [b for b in buffers if b.level is Level.REGIONAL]
        placed: list[Buffer] = []
        for b in sorted(regional, key=lambda b: (-b.nbytes, b.name)):
            size = -(-b.nbytes // ALIGN) * ALIGN
            clash = sorted((p.offset, p.offset + p.nbytes) for p in placed
                           if p.live[0] <= b.live[1] and b.live[0] <= p.live[1])
            off = 0
            for lo, hi in clash:
                if off + size <= lo:
                    break
                off = max(off, -(-hi // ALIGN) * ALIGN)
            b.offset = off
            placed.append(b)
        peak = max((b.offset + b.nbytes for b in placed), default=0) + extra
        movable = [b for b in regional if b.role != "scratch"]  # warp sums stay on chip
        if peak <= limit or not movable:
            return peak, notes
        victim = max(movable, key=lambda b: (b.nbytes, b.name))
        victim.level = Level.GLOBAL
        victim.offset = 0
        victim.doc += " [downgraded: shared memory overflow]"
        notes.append(f"shared memory overflow ({peak} B > {limit} B budget): {victim.name} "
                     f"({victim.nbytes} B, the largest Regional buffer) moved to Global")


def group_loops(loops: list[Loop], split: int) -> list[Phase]:
    """Cut the loop list after every loop whose row reduction is split across blocks."""
    phases, cur = [], Phase()
    for lp in loops:
        cur.loops.append(lp)
        if split > 1 and lp.chunked and lp.reductions:
            phases.append(cur)
            cur = Phase()
    if cur.loops:
        phases.append(cur)
    return phases


def chunk_cols(n: int, split: int) -> int:
    if n % split:
        raise ValueError(f"split={split} does not divide the row length {n}; choose a divisor "
                         f"of {n} (divisors: {[d for d in range(1, n + 1) if n % d == 0][:12]}…)")
    return n // split


def lanes_for(cols: int, lanes: int) -> int:
    return max(1, min(lanes, 1 << max(0, math.ceil(math.log2(max(1, cols))))))
