"""Dimension classes: which tensor dims of a program are "the same axis".

A matmul ties its operands' inner dims together and its output dims to the outer ones; an
elementwise op ties all dims; a reduction leaves a size-1 dim.  The search splits a *class*
over a grid dim or walks it with the for-loop, consistently in every tensor that carries it,
which is what makes a tiling meaningful; it never needs to try imaps that split unrelated
dims of different inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .ir import KernelGraph


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[tuple[int, int], tuple[int, int]] = {}

    def find(self, x: tuple[int, int]) -> tuple[int, int]:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: tuple[int, int], b: tuple[int, int]) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


@dataclass(frozen=True)
class DimClasses:
    """``of[tensor_id][dim]`` is the class id of that dim, or -1 for a size-1 dim."""

    of: dict[int, tuple[int, ...]]
    sizes: dict[int, int]

    def classes(self) -> list[int]:
        return sorted(self.sizes)


def dim_classes(graph: KernelGraph) -> DimClasses:
    """Union the dims of a (reference) kernel graph of predefined ops."""
    uf = _UnionFind()
    t = graph.tensors

    def tie(a: int, da: int, b: int, db: int) -> None:
        if t[a].shape[da] != 1 and t[b].shape[db] != 1:
            uf.union((a, da), (b, db))

    for op in graph.ops:
        if op.kind in ("input", "output") or not op.outputs:
            continue
        out = op.outputs[0]
        rank = len(t[out].shape)
        if op.kind == "matmul":
            a, b = op.inputs
            tie(a, rank - 1, b, rank - 2)
            tie(out, rank - 2, a, rank - 2)
            tie(out, rank - 1, b, rank - 1)
            for d in range(rank - 2):
                tie(out, d, a, d)
                tie(out, d, b, d)
        elif op.kind == "graph_kernel":
            continue  # a structure's kernel: its classes come from the reference's
        elif op.kind in ("sum", "mean"):
            for d in range(rank):
                if d != op.attrs["dim"]:
                    tie(out, d, op.inputs[0], d)
        else:  # elementwise, rms_norm, graph kernels are not expected in a reference
            for src in op.inputs:
                for d in range(rank):
                    tie(out, d, src, d)
    roots: dict[tuple[int, int], int] = {}
    of: dict[int, tuple[int, ...]] = {}
    sizes: dict[int, int] = {}
    for tid, info in enumerate(t):
        ids = []
        for d, size in enumerate(info.shape):
            if size == 1:
                ids.append(-1)
                continue
            root = uf.find((tid, d))
            cls = roots.setdefault(root, len(roots))
            sizes[cls] = int(size)  # type: ignore[arg-type]
            ids.append(cls)
        of[tid] = tuple(ids)
    return DimClasses(of, sizes)


def _merge(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(x if x != -1 else y for x, y in zip(a, b, strict=True))


def out_classes(kind: str, attrs: Mapping[str, Any], ins: list[tuple[int, ...]]) -> tuple[int, ...]:
    """Dim classes of an op's result from its operands' (the forward half of dim_classes)."""
    if kind == "matmul":
        a, b = ins
        return (*_merge(a[:-2], b[:-2]), a[-2], b[-1])
    if kind in ("sum", "mean"):
        x, d = ins[0], attrs["dim"]
        return x[:d] + (-1,) + x[d + 1:]
    if kind == "accum":
        x = ins[0]
        return x if attrs["kind"] == "no_red" else x[:-1] + (-1,)
    if len(ins) == 2:
        return _merge(ins[0], ins[1])
    return ins[0]
