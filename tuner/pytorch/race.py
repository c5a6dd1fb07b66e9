"""Kernel against PyTorch, once per compile: a region keeps its kernel only where it is faster.

The launch that tuned a kernel compared it with the library path of *our* runtime (numpy op by
op), not with PyTorch's own ops, which call oneDNN / MKL for a matmul and differ from numpy's
BLAS; a tuned matmul kernel can win there and lose here.  So before a region is replaced, its
kernel (called as the direct path calls it) and the region's ATen ops (run eagerly, as
PyTorch would run them without a compiler) are timed interleaved on real-scale random inputs
of the region's shapes, strides and dtypes; the slower one is not used, and the report says
so with both times.  A few milliseconds of compile time per region.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from .aten import meta

ROUNDS = 5
ROUND_S = 1e-2  # each round times this long of calls, at least one, after one untimed call
# (a parallel kernel right after PyTorch's ops runs slower than alone: a 221 µs kernel was
# timed at 912 µs in 2 ms rounds; longer rounds after an untimed call keep most of that out)


def region_function(nodes: list) -> tuple[Callable[..., Any], list]:
    """The region's ATen ops as a function of its outside inputs (returned with them)."""
    members = set(nodes)
    graph = torch.fx.Graph()
    env: dict[Any, Any] = {}
    inputs: list = []
    for n in nodes:
        for a in n.all_input_nodes:
            if a not in members and a not in env:
                env[a] = graph.placeholder(f"x{len(inputs)}")
                inputs.append(a)
        env[n] = graph.node_copy(n, lambda a: env[a])
    outs = [n for n in nodes if any(u not in members for u in n.users)]
    graph.output(tuple(env[n] for n in outs))
    return torch.fx.GraphModule(torch.nn.Module(), graph).forward, inputs


def example(node: Any, gen: torch.Generator) -> Any:
    """A real tensor like ``node``'s example value (its shape, strides and dtype)."""
    v = meta(node)
    if not isinstance(v, torch.Tensor):
        return v
    size = 1 + sum((n - 1) * st for n, st in zip(v.shape, v.stride(), strict=True) if n > 0)
    if v.dtype.is_floating_point:
        base = torch.randn(size, generator=gen).to(v.dtype)
    elif v.dtype == torch.bool:
        base = torch.randint(0, 2, (size,), generator=gen).bool()
    else:
        base = torch.zeros(size, dtype=v.dtype)
    # the same strides, broadcast (stride-0) dims included: an expanded view stays one
    return base.as_strided(tuple(v.shape), tuple(v.stride()))


def per_call(fn: Callable[..., Any], args: list, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - t0) / calls


def race(kernel: Callable[..., Any], kernel_args: list, nodes: list) -> tuple[float, float]:
    """(kernel, PyTorch) seconds per call for the region ``nodes``: medians of interleaved
    rounds, each one's calls sized to ``ROUND_S``."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), torch.no_grad():
        eager, inputs = region_function(nodes)
        gen = torch.Generator().manual_seed(0)
        args = [example(a, gen) for a in inputs]
        pair = ((kernel, kernel_args), (eager, args))
        for f, a in pair:
            f(*a)  # first calls (allocations, lazy loading) are not timed
        calls = [max(1, int(ROUND_S / max(per_call(f, a, 1), 1e-7))) for f, a in pair]
        times: list[list[float]] = [[], []]
        for _ in range(ROUNDS):
            for i, (f, a) in enumerate(pair):
                f(*a)
                times[i].append(per_call(f, a, calls[i]))
    return statistics.median(times[0]), statistics.median(times[1])
