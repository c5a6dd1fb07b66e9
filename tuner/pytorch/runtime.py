"""The kernels inside a PyTorch graph: one custom op, ``tuner::kernel(key, xs) -> ys``.

A region with a tuned kernel is replaced in the ATen graph by a call of this op (and the
views and dtype conversions around it, as ATen ops), so the graph stays traceable: Inductor
compiles the rest around it (the op's fake implementation gives its outputs' shapes), and the
eager fallback just runs it.  Kernels are registered here under their key at compile time.

The cpu kernels take and give arrays of their program's dtype (float16 / bfloat16 read and
written as they are, computed in float32), so a region's tensors go in without a copy; an
input of another dtype (a 0/1 mask) is converted, and outputs converted to the dtype the
graph expects where it differs.
A transposed weight the builder cannot read through yet is copied once and kept while the
weight is alive and unchanged (its version counter), never once per call.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable
from typing import Any

import torch

from .aten import meta
from .emitter import Emitted

_KERNELS: dict[str, tuple[Callable[..., list], list[tuple[int, ...]], torch.dtype]] = {}
_COPIES: dict[int, tuple[Any, int, tuple, torch.Tensor]] = {}


def register_kernel(key: str, kernel: Callable[..., list], out_shapes: list[tuple[int, ...]],
                    dtype: str = "float32") -> None:
    """Make ``key`` callable through ``tuner::kernel``: inputs and outputs (of
    ``out_shapes``) in the program's ``dtype``."""
    _KERNELS[key] = (kernel, [tuple(int(d) for d in s) for s in out_shapes],
                     getattr(torch, dtype))


def kernel_table() -> dict[str, tuple[Callable[..., list], list[tuple[int, ...]], torch.dtype]]:
    """key → (kernel, output shapes, dtype) of every kernel registered in this process."""
    return _KERNELS


def kernel_dtype(key: str) -> torch.dtype:
    """The dtype the kernel under ``key`` takes and gives."""
    return _KERNELS[key][2]


def _contiguous(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if x.is_contiguous() and x.dtype == dtype:
        return x.detach()  # a weight requires grad even under no_grad; kernels never do
    base = x._base if x._base is not None else x
    sig = (tuple(x.shape), tuple(x.stride()), x.storage_offset(), x.dtype)
    hit = _COPIES.get(id(base))
    if hit is not None and hit[0]() is base and hit[1] == base._version and hit[2] == sig:
        return hit[3]
    copy = x.detach().to(dtype).contiguous()
    if base.requires_grad or isinstance(base, torch.nn.Parameter):  # weights: keep the copy
        key = id(base)

        def forget(_ref: Any, k: int = key) -> None:
            _COPIES.pop(k, None)

        _COPIES[key] = (weakref.ref(base, forget), base._version, sig, copy)
    return copy


# a plain library definition: ``torch.library.custom_op``'s Python wrapper costs ~30 µs a call,
# more than a decode-shape kernel itself; this costs a few
_LIB = torch.library.Library("tuner", "DEF")
_LIB.define("kernel(str key, Tensor[] xs) -> Tensor[]")


def kernel_op(key: str, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Run the tuned kernel registered under ``key`` on ``xs`` (outputs of its dtype)."""
    kernel, shapes, dtype = _KERNELS[key]
    ins = [_contiguous(x, dtype) for x in xs]
    outs = [torch.empty(s, dtype=dtype) for s in shapes]
    kernel(*ins, out=outs)
    return outs


def _fake(key: str, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    if key not in _KERNELS:
        raise RuntimeError(f"tuner::kernel: no kernel registered under {key!r}")
    _kernel, shapes, dtype = _KERNELS[key]
    return [xs[0].new_empty(s, dtype=dtype) for s in shapes]


_LIB.impl("kernel", kernel_op, "CPU")
torch.library.register_fake("tuner::kernel", _fake, lib=_LIB)


def replace(gm: torch.fx.GraphModule, nodes: list, emitted: Emitted, key: str,
            replaced: dict) -> None:
    """Replace the region ``nodes`` of ``gm`` by a call of the kernel registered as ``key``;
    ``replaced`` maps the outputs of regions replaced before to their new nodes (and gets
    this region's); ``finish`` cleans the graph up after the last one."""
    graph = gm.graph
    aten = torch.ops.aten
    dtype = kernel_dtype(key)
    with graph.inserting_after(nodes[-1]):
        args = []
        for spec in emitted.inputs:
            x = replaced.get(spec.node, spec.node)
            if spec.kind == "mask":
                x = graph.call_function(aten.logical_not.default, (x,))
                x = graph.call_function(aten._to_copy.default, (x,), {"dtype": dtype})
            if tuple(meta(spec.node).shape) != tuple(spec.shape):
                x = graph.call_function(aten.reshape.default, (x, list(spec.shape)))
            args.append(x)
        call = graph.call_function(torch.ops.tuner.kernel.default, (key, args))
        ids = list(dict.fromkeys(t for _n, t in emitted.outputs))
        for node, tid in emitted.outputs:
            y = graph.call_function(operator.getitem, (call, ids.index(tid)))
            v = meta(node)
            if v.dtype != dtype:
                y = graph.call_function(aten._to_copy.default, (y,), {"dtype": v.dtype})
            if tuple(v.shape) != tuple(emitted.graph.tensors[tid].shape):
                y = graph.call_function(aten.reshape.default, (y, list(v.shape)))
            node.replace_all_uses_with(y)
            replaced[node] = y


def finish(gm: torch.fx.GraphModule) -> None:
    """Order the graph again (a kernel call sits after its region's last op, some of whose
    outputs' users may have come earlier), drop the replaced ops, check and recompile."""
    _toposort(gm.graph)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()


def _toposort(graph: torch.fx.Graph) -> None:
    """Reorder ``graph`` so every node follows its operands, keeping the order otherwise."""
    nodes = list(graph.nodes)
    index = {n: i for i, n in enumerate(nodes)}
    done: set = set()
    order: list = []

    def visit(n: Any) -> None:
        stack = [(n, False)]
        while stack:
            m, expanded = stack.pop()
            if m in done:
                continue
            if expanded:
                done.add(m)
                order.append(m)
                continue
            stack.append((m, True))
            for a in sorted(m.all_input_nodes, key=lambda a: index[a], reverse=True):
                if a not in done:
                    stack.append((a, False))

    for n in nodes:
        visit(n)
    cursor = None
    for n in order:
        if cursor is not None and cursor.next is not n:
            cursor.append(n)
        cursor = n
