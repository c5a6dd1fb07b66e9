"""The Triton dialect's tiles: padding, register tiles, and the matmul / reduction forms.

``TileMath`` prints a plan's ``matmul`` and ``reduce`` lets as tile operations: ``tl.dot`` on
operands as stored (float16 / bfloat16 tiles straight from memory meet a computed tile in their
dtype when it is known to lie in the half range), a 3-D ``tl.dot`` over a block's batch dims, a
broadcast product where a dim is 1 or B differs per row in a way no dot covers.  A matmul of
two tiles with k = 1 (a for-loop step of 1 walking attention's keys) is printed as the outer
product itself, not summed over an axis of size 1 (on an H100, Triton 3.6 miscompiled
``tl.sum(a[:, :, None] * b[None, :, :], axis=1)`` of a (256, 1, 16) product: gqa's E·V at
F = 4096 came out wrong in every element).  The batched per-row-B form and one-element
reductions still sum over such an axis: no suite structure reaches them (not run on a GPU).  The dialect
(``_triton.py``) mixes it in and supplies the loop state it reads (``_li``, ``_lp``, ``_k``,
``_plan``, ``_views``, ``_tiles``, ``_unbounded``).
"""

from __future__ import annotations

import math

from kernels.lowering import Access, Buffer, Let, Loop

DOT_MIN = 16  # tl.dot needs every dimension of its operands to be at least this


class TritonUnsupported(ValueError):
    """The plan needs something the Triton dialect does not print (the message says what)."""


def pad(n: int) -> int:
    """A tile dimension as Triton holds it: 1 stays 1 (a broadcast dim), anything else the
    power of two at or above it and at least ``DOT_MIN``, so every tile can feed ``tl.dot``."""
    return 1 if n == 1 else max(DOT_MIN, 1 << (n - 1).bit_length())


class _Tile:
    """A register tile standing for a Regional buffer: its logical rows × columns."""

    def __init__(self, buf: Buffer) -> None:
        self.buf = buf
        self.rows = math.prod(buf.shape[:-1]) if len(buf.shape) > 1 else 1
        self.cols = buf.shape[-1] if buf.shape else 1
        self.name = buf.name

    @property
    def padded(self) -> tuple[int, int]:
        return pad(self.rows), pad(self.cols)


class TileMath:
    """The matmul and reduction forms of the Triton dialect (see the module docstring)."""

    _li: int
    _lp: Loop
    _last_unbounded: bool

    def _operand(self, acc: Access, side: str, k: int) -> tuple[str, bool]:
        """One tl.dot operand: (tile expression, whether it is a native-dtype load).
        A is rows × k, B is k × columns; register tiles are masked to zero outside their
        extent so padding never reaches the sum."""
        p = f"L{self._li}_"
        kp = pad(k)
        kk = f"tl.arange(0, {kp})"
        t = self._tile_of(acc)
        if t is not None:
            lp = self._lp
            if side == "a":
                ok = acc.col == 0 and acc.red == 1 and t.cols == k and (
                    (t.rows == lp.rows and tuple(acc.rows) == _dense(lp.shape[:-1], k))
                    or (t.rows == 1 and not any(acc.rows)))
                mask = f"({p}rm & ({kk}[None, :] < {k}))"
            else:
                ok = not any(acc.rows) and acc.red == t.cols and t.rows == k and (
                    (acc.col == 1 and t.cols == lp.cols) or (acc.col == 0 and t.cols == 1))
                mask = f"(({kk}[:, None] < {k}) & {p}cm)"
            if not ok:
                raise TritonUnsupported(f"{self._k.name}: tile {t.name} {t.buf.shape} as "
                                        f"matmul operand {side} through {acc}")
            self._last_unbounded = self._last_unbounded or t.name in self._unbounded
            return f"tl.where({mask}, {t.name}, 0.0)", False
        if side == "a":
            row = self._rowoff(acc)
            off = " + ".join(x for x in (row, _mul(f"{kk}[None, :]", acc.red)) if x)
            mask = f"{p}rm & ({kk}[None, :] < {k})" if row else f"{kk}[None, :] < {k}"
        else:
            off = " + ".join(x for x in (_mul(f"{kk}[:, None]", acc.red),
                                          _mul(f"{p}c", acc.col) if acc.col else "") if x)
            mask = f"({kk}[:, None] < {k}) & {p}cm" if acc.col else f"{kk}[:, None] < {k}"
        buf = self._views[acc.view].buffer
        native = self._buffer(buf).dtype == self._plan.dtype
        self._last_unbounded = self._last_unbounded or buf in self._unbounded
        return f"tl.load({acc.view} + {off}, mask={mask}, other=0.0)", native

    def _matmul(self, st: Let) -> list[str]:
        a_acc, b_acc = st.access
        k = int(st.attrs["k"])
        lp, p = self._lp, f"L{self._li}_"
        batched = any(b_acc.rows)
        small = 1 in (lp.rows, lp.cols, k)  # padded, every other dim is >= DOT_MIN
        if batched:
            three = self._batched_dot(st, a_acc, b_acc, k)
            if three is not None:
                return three
            # B differs per output row and the tile is not a whole batch of dot shapes: a
            # broadcast product summed over k (no tensor cores)
            if self._tile_of(b_acc) is not None:
                raise TritonUnsupported(f"{self._k.name}: batched matmul of a register tile "
                                        f"in a loop over {lp.shape}")
            a, _ = self._operand(a_acc, "a", k)
            kk = f"tl.arange(0, {pad(k)})[None, :, None]"
            cc = f"tl.arange(0, {pad(lp.cols)})[None, None, :]"
            off = " + ".join(x for x in (self._rowoff(b_acc, axis3=True), _mul(kk, b_acc.red),
                                          _mul(cc, b_acc.col) if b_acc.col else "") if x)
            mask = f"{p}rm[:, :, None] & ({kk} < {k})" + (
                f" & ({cc} < {lp.cols})" if b_acc.col else "")
            b = f"tl.load({b_acc.view} + {off}, mask={mask}, other=0.0).to(tl.float32)"
            return [f"{st.var}_a = ({a}).to(tl.float32)",
                    f"{st.var} = tl.sum({st.var}_a[:, :, None] * {b}, axis=1)"
                    f"  # {st.comment} (per-row B: broadcast product)"]
        self._last_unbounded = False
        a, a_native = self._operand(a_acc, "a", k)
        b, b_native = self._operand(b_acc, "b", k)
        lines = [f"{st.var}_a = {a}", f"{st.var}_b = {b}"]
        if small and k == 1:
            # an outer product (rows x 1 times 1 x columns): summing a (rows, 1, columns)
            # product over its axis of size 1 is what Triton 3.6 miscompiled on the H100
            lines.append(f"{st.var} = {st.var}_a.to(tl.float32) * {st.var}_b.to(tl.float32)"
                         "  # k = 1: an outer product, no tl.dot")
            return lines
        if small:
            lines.append(f"{st.var} = tl.sum({st.var}_a.to(tl.float32)[:, :, None] * "
                         f"{st.var}_b.to(tl.float32)[None, :, :], axis=1)"
                         "  # a dim of 1: no tl.dot")
            return lines
        return lines + self._dot(st.var, a_native, b_native)

    def _dot(self, var: str, a_native: bool, b_native: bool) -> list[str]:
        """``var = tl.dot(var_a, var_b)`` with float32 accumulation.  Operands as stored: a
        computed float32 tile meets a half one in the half dtype (FlashAttention's
        p.to(v.dtype)); two float32 tiles multiply in full precision (no TF32)."""
        lines = []
        half = self._plan.dtype in ("float16", "bfloat16")
        if a_native != b_native and self._last_unbounded:
            # a computed tile that may exceed the half range (an exp not shifted by its row
            # max): both operands in float32 rather than an overflow to inf
            lines.append(f"{var}_{'a' if a_native else 'b'} = "
                         f"{var}_{'a' if a_native else 'b'}.to(tl.float32)")
            half = False
        elif a_native and not b_native:
            lines.append(f"{var}_b = {var}_b.to({var}_a.dtype)")
        elif b_native and not a_native:
            lines.append(f"{var}_a = {var}_a.to({var}_b.dtype)")
        elif not a_native and not b_native:
            half = False
        prec = "" if half else ", input_precision=\"ieee\""
        return lines + [f"{var} = tl.dot({var}_a, {var}_b, out_dtype=tl.float32{prec})"]

    def _batched_dot(self, st: Let, a_acc: Access, b_acc: Access, k: int) -> list[str] | None:
        """A 3-D ``tl.dot`` over the batch dims of the loop's rows, when the tile is an exact
        batch of dot-sized matrices (powers of two, each dim >= 16); else None."""
        lp = self._lp
        lead = lp.shape[:-1]
        bt, m, n = math.prod(lead[:-1]), lead[-1], lp.cols
        if not all(_pow2(x) for x in (bt, m, k, n)) or min(m, k, n) < DOT_MIN:
            return None
        self._last_unbounded = False
        a, a_native = self._operand(a_acc, "a", k)
        t = self._tile_of(b_acc)
        if t is not None:
            dense = _dense(lead[:-1], k * n)
            if t.rows != bt * k or t.cols != n or tuple(b_acc.rows[:-1]) != dense or \
                    b_acc.red != n or b_acc.col != 1:
                return None
            b, b_native = f"tl.reshape({t.name}, [{bt}, {k}, {n}])", False
        else:
            q = f"tl.arange(0, {bt})[:, None, None]"
            terms = []
            for d, stride in enumerate(b_acc.rows[:-1]):
                inner = math.prod(lead[d + 1:-1])
                if stride:
                    coord = f"({q} // {inner}) % {lead[d]}" if inner > 1 else f"{q} % {lead[d]}"
                    terms.append(f"({coord}) * {stride}")
            terms += [_mul(f"tl.arange(0, {k})[None, :, None]", b_acc.red),
                      _mul(f"tl.arange(0, {n})[None, None, :]", b_acc.col)]
            b = f"tl.load({b_acc.view} + {' + '.join(terms)})"
            b_native = self._buffer(self._views[b_acc.view].buffer).dtype == self._plan.dtype
        lines = [f"{st.var}_a = tl.reshape({a}, [{bt}, {m}, {k}])", f"{st.var}_b = {b}"]
        lines += self._dot(st.var, a_native, b_native)
        return lines + [f"{st.var} = tl.reshape({st.var}, [{bt * m}, {n}])"
                        f"  # {st.comment} (a batch of {bt} tensor-core products)"]

    def _reduce(self, st: Let) -> list[str]:
        acc = st.access[0]
        if self._tile_of(acc) is not None:
            raise TritonUnsupported(f"{self._k.name}: a reduction over a non-last dim of a "
                                    "register tile")
        n = int(st.attrs["n"])
        p = f"L{self._li}_"
        q = f"tl.arange(0, {pad(n)})[None, None, :]"
        row3 = self._rowoff(acc, axis3=True)
        terms = [x for x in (row3, f"{p}c[:, :, None] * {acc.col}" if acc.col else "",
                             _mul(q, acc.red)) if x]
        mask = f"{p}m[:, :, None] & ({q} < {n})"
        return [f"{st.var} = tl.sum(tl.load({acc.view} + {' + '.join(terms)}, mask={mask}, "
                f"other=0.0).to(tl.float32), axis=2)"]

def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _views_used(loops: list[Loop]) -> set[str]:
    return {a.view for lp in loops for st in (*lp.hoisted, *lp.col, *lp.row)
            for a in (st.access if isinstance(st, Let) else (st.access,))}


def _value_shape(lp: Loop, row: bool) -> tuple[int, int]:
    return pad(lp.rows), 1 if row else pad(lp.cols)


def _dense(lead: tuple[int, ...], cols: int) -> tuple[int, ...]:
    """Row strides of a row-major tile with rows ``lead`` and ``cols`` columns (0 where a
    dim has size 1, as the plan writes broadcast-free dims)."""
    out, s = [], cols
    for d in reversed(lead):
        out.append(s if d > 1 else 0)
        s *= d
    return tuple(reversed(out))


def _param_arg(b: Buffer) -> str:
    return f"{'inputs' if b.role == 'input' else 'outputs'}[{b.io_index}]"


def _mul(name: str, stride: int) -> str:
    return name if stride == 1 else f"{name} * {stride}"


def _indent(lines: list[str], by: str = "    ") -> list[str]:
    return [by + ln if ln else ln for ln in lines]


__all__ = ["DOT_MIN", "TileMath", "TritonUnsupported", "pad"]
