"""Fusing a block graph's primitive ops into loops (see ``stitch`` for the scheme).

``Fuser`` decides, op by op, which loop computes a value and whether the value stays Local (a
scalar of that loop) or must be stored for a later loop.  Placement rules, in order:

* an elementwise op joins the loop that computes its latest operand when its shape is that
  loop's tile (a column step) or that loop's rows with the last dim reduced (a row step);
* a last-dim sum becomes a reduction sink of the loop computing its operand;
* a matmul, a reduction over another dim, or anything that fits nowhere opens a new loop;
* block outputs and for-loop accumulators are stores in the loop computing the value.

Anything read by a loop other than its producer gets a tile buffer; its level (Regional or
Global) is decided afterwards by ``lower`` from lifetimes, phases and the shared-memory limit.
"""

from __future__ import annotations

from collections.abc import Mapping

from ._plan import Access, Buffer, Let, Level, Loop, RowReduce, Store
from ._stitch import Home, IOp, access, dense_strides


def var(v: str) -> str:
    return f"v_{v}"


class Fuser:
    """Builds the loop list of one kernel from expanded ops (see the module docstring)."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], homes: dict[str, Home],
                 out_homes: list[Home], row_len: int, split: int,
                 inplace: Mapping[str, int] | None = None) -> None:
        self.shapes = dict(shapes)
        self.homes = homes
        self.out_homes = out_homes
        self.row_len, self.split = row_len, split
        self.inplace = dict(inplace or {})  # accumulator value -> output index it writes directly
        self.loops: list[Loop] = []
        self.local: dict[str, tuple[int, str]] = {}
        self.produced: dict[str, int] = {}
        self.alias: dict[str, str] = {}
        self.tiles: dict[str, Buffer] = {}
        self.pending: list[tuple[str, int, str]] = []
        self.loaded: set[tuple[int, str]] = set()
        self.done_outputs: set[int] = set()

    # ------------------------------------------------------------------ helpers
    def r(self, v: str) -> str:
        while v in self.alias:
            v = self.alias[v]
        return v

    def chunked(self, shape: tuple[int, ...]) -> bool:
        return self.split > 1 and self.row_len > 1 and shape[-1] == self.row_len

    def new_loop(self, shape: tuple[int, ...], stage: str, comment: str) -> int:
        self.loops.append(Loop(shape, stage, chunked=self.chunked(shape), comment=comment))
        return len(self.loops) - 1

    def last(self, stage: str) -> int | None:
        if self.loops and self.loops[-1].stage == stage:
            return len(self.loops) - 1
        return None

    def home(self, v: str) -> Home:
        """Where ``v`` can be read; materialises a local value into a tile buffer."""
        if v in self.homes:
            return self.homes[v]
        if v not in self.local:
            raise RuntimeError(f"lowering bug: value {v} read before it is computed")
        shape = self.shapes[v]
        chunk = self.row_len // self.split if self.chunked(shape) else 0
        buf = Buffer(f"b_{v}", shape, Level.REGIONAL, "tile", chunk=chunk,
                     doc=f"{v}: read by a later loop of the same block")
        self.tiles[buf.name] = buf
        h = Home(buf.name, dense_strides((*shape[:-1], chunk or shape[-1])), bool(chunk))
        self.homes[v] = h
        li, part = self.local[v]
        self.pending.append((v, li, part))
        return h

    def accum_buffer(self, v: str, shape: tuple[int, ...], doc: str) -> Home:
        buf = Buffer(f"b_{v}", shape, Level.REGIONAL, "accum", doc=doc)
        self.tiles[buf.name] = buf
        h = Home(buf.name, dense_strides(shape))
        self.homes[v] = h
        return h

    def operand(self, v: str, li: int, part: str) -> str:
        """The scalar name of ``v`` in loop ``li``: local, or loaded once per loop."""
        v = self.r(v)
        if self.local.get(v, (None,))[0] == li:
            return var(v)
        if (li, v) in self.loaded:
            return var(v)
        self.loaded.add((li, v))
        lp = self.loops[li]
        vs = self.shapes[v]
        let = Let(var(v), "load", access=(access(self.home(v), vs, lp.shape),),
                  comment=f"read {v} {vs}")
        if part == "row":
            lp.row.append(let)
        elif vs[-1] == 1 and lp.shape[-1] > 1:
            lp.hoisted.append(let)
        else:
            lp.col.append(let)
        return var(v)

    def place(self, v: str, li: int, part: str) -> None:
        self.local[v] = (li, part)
        self.produced[v] = li

    # ------------------------------------------------------------------ ops
    def add(self, op: IOp) -> None:
        kind = op.kind
        if kind == "alias":
            self.alias[op.out] = self.r(op.ins[0])
        elif kind in ("matmul", "reduce"):
            self._new_loop_op(op)
        elif kind in ("rowsum", "rowacc"):
            self._rowsum(op)
        elif kind == "acc":
            self._acc(op)
        elif kind == "output":
            self._output(op)
        else:
            self._elementwise(op)

    def _elementwise(self, op: IOp) -> None:
        shape = self.shapes[op.out]
        ins = [self.r(a) for a in op.ins]
        prods = [self.produced[a] for a in ins if a in self.produced]
        cand = max(prods) if prods else None
        if cand is None or self.loops[cand].stage != op.stage:
            cand = self.last(op.stage)
        part = None
        if cand is not None:
            lp = self.loops[cand]
            where = [self.local.get(a) for a in ins]
            if shape == lp.shape and (cand, "row") not in where:
                part = "col"
            elif lp.shape[-1] > 1 and shape == (*lp.shape[:-1], 1) and (cand, "col") not in where:
                part = "row"
        if part is None:
            cand, part = self.new_loop(shape, op.stage, op.comment), "col"
        args = tuple(self.operand(a, cand, part) for a in ins)
        attrs = {"scalar": op.attrs["scalar"]} if "scalar" in op.attrs else {}
        getattr(self.loops[cand], part).append(
            Let(var(op.out), op.kind, args, attrs=attrs, comment=op.comment))
        self.place(op.out, cand, part)

    def _new_loop_op(self, op: IOp) -> None:
        shape = self.shapes[op.out]
        li = self.new_loop(shape, op.stage, op.comment)
        n = len(shape)
        if op.kind == "matmul":
            a, b = (self.r(x) for x in op.ins)
            ha, hb = self.home(a), self.home(b)
            sa, sb = self.shapes[a], self.shapes[b]

            def batch(h, s, d):
                return h.strides[d] if s[d] == shape[d] and shape[d] > 1 else 0

            rows_a = tuple(batch(ha, sa, d) for d in range(n - 2)) + (
                ha.strides[-2] if shape[-2] > 1 else 0,)
            rows_b = tuple(batch(hb, sb, d) for d in range(n - 2)) + (0,)
            acc_a = Access(ha.view, rows_a, 0, red=ha.strides[-1])
            acc_b = Access(hb.view, rows_b, hb.strides[-1] if shape[-1] > 1 else 0,
                           red=hb.strides[-2])
            let = Let(var(op.out), "matmul", access=(acc_a, acc_b), attrs={"k": sa[-1]},
                      comment=op.comment)
        else:
            x = self.r(op.ins[0])
            hx, sx, d = self.home(x), self.shapes[x], op.attrs["dim"]
            base = access(hx, sx, shape)
            acc = Access(hx.view, base.rows, base.col, red=hx.strides[d])
            let = Let(var(op.out), "reduce", access=(acc,), attrs={"n": sx[d]},
                      comment=op.comment)
        self.loops[li].col.append(let)
        self.place(op.out, li, "col")

    def _rowsum(self, op: IOp) -> None:
        x = self.r(op.ins[0])
        shape = self.shapes[x]
        li = None
        if self.local.get(x, (None, ""))[1] == "col":
            li = self.local[x][0]
            if self.loops[li].stage != op.stage:
                li = None
        if li is None:
            last = self.last(op.stage)
            li = last if last is not None and self.loops[last].shape == shape else \
                self.new_loop(shape, op.stage, op.comment)
            self.operand(x, li, "col")
        lp = self.loops[li]
        if op.kind == "rowsum":
            lp.reductions.append(RowReduce(var(x), var(op.out), op.comment))
            self.place(op.out, li, "row")
            return
        part = f"{op.out}_it"
        lp.reductions.append(RowReduce(var(x), var(part), op.comment))
        row = self.shapes[op.out]
        h = self.accum_buffer(op.out, row, f"{op.out}: row sums carried across the for-loop")
        lp.row.append(Store(var(part), access(h, row, lp.shape), accumulate=True,
                            comment=op.comment))
        self.produced[op.out] = li

    def _acc(self, op: IOp) -> None:
        x = self.r(op.ins[0])
        if x in self.local and self.loops[self.local[x][0]].stage == "body":
            li, part = self.local[x]
        else:
            li, part = self.new_loop(self.shapes[x], "body", op.comment), "col"
            self.operand(x, li, "col")
        shape = self.shapes[x]
        idx = self.inplace.get(op.out)
        if idx is not None:
            target = self.out_homes[idx]
            self.done_outputs.add(idx)
        else:
            target = self.accum_buffer(op.out, shape, f"{op.out}: accumulator of the for-loop")
        lp = self.loops[li]
        getattr(lp, part).append(Store(var(x), access(target, shape, lp.shape),
                                       accumulate=True, comment=op.comment))
        self.produced[op.out] = li

    def _output(self, op: IOp) -> None:
        idx = op.attrs["index"]
        if idx in self.done_outputs:
            return
        v = self.r(op.ins[0])
        oh = self.out_homes[idx]
        if v in self.local:
            li, part = self.local[v]
        else:
            li, part = self.new_loop(self.shapes[v], op.stage, op.comment), "col"
            self.operand(v, li, "col")
        lp = self.loops[li]
        getattr(lp, part).append(Store(var(v), access(oh, self.shapes[v], lp.shape),
                                       comment=op.comment))

    # ------------------------------------------------------------------ finishing
    def finish(self) -> list[Loop]:
        """Store every value a later loop reads, right where it is computed."""
        for v, li, part in self.pending:
            lp = self.loops[li]
            getattr(lp, part).append(Store(var(v), access(self.homes[v], self.shapes[v],
                                                          lp.shape), comment=f"keep {v}"))
        return self.loops
