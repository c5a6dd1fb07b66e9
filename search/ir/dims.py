"""Symbolic dimensions.

A *structure* keeps its grid sizes and for-loop range as symbols, so a tile dimension is
"tensor dim divided by some symbols" (``4096/F·g0``) and a per-block partial result laid out
over the grid is "tile times a symbol".  Shape rules compare such dims structurally; a config
later binds the symbols and every division must then be exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Size = int | str  # a concrete size, or the name of a symbol bound later by a config


class ShapeError(ValueError):
    """A shape rule was violated; the message names the op and the shapes involved.

    ``context`` is formatted only when the message is read: the search provokes and catches
    hundreds of thousands of these and never reads them."""

    def __init__(self, message: str, context=None) -> None:
        super().__init__(message)
        self._context = context

    def __str__(self) -> str:
        base = super().__str__()
        return f"{base} [{self._context()}]" if self._context is not None else base


@dataclass(frozen=True, order=True)
class SymDim:
    """``coef · product(num) / product(den)``: a size that depends on grid / for-loop symbols.

    Kept normalised (symbols cancelled, both tuples sorted) so that equal sizes compare equal.
    """

    coef: int
    num: tuple[str, ...] = ()
    den: tuple[str, ...] = ()

    def __str__(self) -> str:
        top = "·".join([str(self.coef)] * (self.coef != 1 or not self.num) + list(self.num))
        return top + (f"/{'·'.join(self.den)}" if self.den else "")

    __repr__ = __str__


Dim = int | SymDim


def _normalise(coef: int, num: list[str], den: list[str]) -> Dim:
    for sym in list(num):
        if sym in den:
            num.remove(sym)
            den.remove(sym)
    if not num and not den:
        return coef
    return SymDim(coef, tuple(sorted(num)), tuple(sorted(den)))


def _parts(dim: Dim) -> tuple[int, list[str], list[str]]:
    if isinstance(dim, SymDim):
        return dim.coef, list(dim.num), list(dim.den)
    return dim, [], []


def divide(dim: Dim, by: Size) -> Dim:
    """Split ``dim`` into ``by`` equal parts, symbolically when ``by`` is a symbol."""
    coef, num, den = _parts(dim)
    if isinstance(by, str):
        return _normalise(coef, num, den + [by])
    if by < 1:
        raise ShapeError(f"cannot split a dimension into {by} parts")
    if coef % by:
        raise ShapeError(f"dimension {dim} is not divisible by {by}")
    return _normalise(coef // by, num, den)


def multiply(dim: Dim, by: Size) -> Dim:
    """``by`` copies of ``dim`` side by side (an output assembled from a grid of tiles)."""
    coef, num, den = _parts(dim)
    if isinstance(by, str):
        return _normalise(coef, num + [by], den)
    return _normalise(coef * by, num, den)


def bind_dim(dim: Dim, config: Mapping[str, int]) -> int:
    """The concrete size of ``dim`` under ``config``; raises if a symbol is unbound or inexact."""
    if isinstance(dim, int):
        return dim
    top, bottom = dim.coef, 1
    for sym in dim.num:
        top *= bind_size(sym, config)
    for sym in dim.den:
        bottom *= bind_size(sym, config)
    if bottom <= 0 or top % bottom:
        raise ShapeError(f"{dim} is not a whole number under {dict(config)} "
                         f"({top} is not divisible by {bottom})")
    return top // bottom


def bind_size(size: Size, config: Mapping[str, int]) -> int:
    if isinstance(size, int):
        return size
    if size not in config:
        raise ShapeError(f"symbol {size!r} is not bound by the config {dict(config)}")
    return int(config[size])


def fmt_shape(shape: tuple[Dim, ...]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"
