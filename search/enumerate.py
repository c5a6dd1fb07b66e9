"""Expression-guided enumeration of µGraph structures, cut into shards with stable ids.

A structure here is: zero or more predefined kernel ops (the *prefix*), then at most one
graph-defined kernel that produces every output.  The graph-defined kernel is fixed by a
*shard*: which kernel tensors it reads, which dimension classes its grid dims split (symbols
``g0``, ``g1``…) and which class its for-loop walks (symbol ``F``, or no loop).  Within a
shard, block ops are added depth-first in a canonical order (each op's key is greater than
the previous op's, so a DAG is built in exactly one order), and every new tile must have an
abstract expression that is a subexpression of the saturated target.  Candidates come out
as kernel graphs with symbols; the caller verifies them.
"""

from __future__ import annotations

import itertools

from .absexpr import target_expressions
from .blocksearch import BlockSearch
from .dimclass import DimClasses, dim_classes
from .ir import OPS, Expr, KernelGraph, ShapeError
from .space import (
    DEFAULT_BLOCK_OPS,
    DEFAULT_KERNEL_OPS,
    Context,
    Limits,
    Shard,
    Stats,
    op_key,
)

# --- kernel level: prefixes and shards -----------------------------------------------------

def _kernel_moves(g: KernelGraph, exprs: dict[int, Expr], ctx: Context,
                  classes: DimClasses):
    """Predefined ops over existing tensors whose expressions stay inside the target."""
    tensors = list(range(len(g.tensors)))
    for kind in ctx.limits.kernel_ops:
        opdef = OPS[kind]
        for operands in itertools.product(tensors, repeat=opdef.arity or 0):
            if opdef.commutative and list(operands) != sorted(operands):
                continue
            attr_sets: list[tuple[tuple[str, int], ...]] = [()]
            if "dim" in opdef.attrs:
                attr_sets = [(("dim", d),) for d in range(len(g.tensors[operands[0]].shape))]
            for attrs in attr_sets:
                expr = opdef.expression([exprs[t] for t in operands],
                                      [g.tensors[t].shape for t in operands],
                                      dict(attrs, _cls=[classes.of[t] for t in operands]))
                yield kind, tuple(operands), attrs, expr


def plan_configs(ctx: Context, kernels: int = 1) -> list[Shard]:
    """The block configurations of structures with exactly ``kernels`` kernels, in order.

    The driver deepens one kernel count at a time (1, 2, …, ``max_kernel_ops``) and stops at
    the first count that yields a verified structure: ranking puts fewer kernels first, so
    a structure with more kernels could never be the answer.
    """
    shards: list[Shard] = []
    lim = ctx.limits
    target_vars = {e[1] for e in _leaves(target_expressions(ctx.reference))}

    def walk(prefix: tuple, last_key: tuple | None) -> None:
        g, exprs, classes, _ = ctx.prefix_graph(prefix)
        if len(prefix) == kernels - 1:
            shards.extend(_block_shards(ctx, prefix, g, exprs, classes, target_vars))
        elif len(prefix) == kernels:
            shards.extend(s for s in _block_shards(ctx, prefix, g, exprs, classes, target_vars)
                          if not s.inputs)
        if len(prefix) >= kernels or not lim.prune:
            return  # without pruning only single-kernel structures are explored
        for kind, operands, attrs, expr in _kernel_moves(g, exprs, ctx, classes):
            key = op_key(kind, operands, attrs)
            if last_key is not None and key <= last_key:
                continue
            if not ctx.keep(expr) or any(exprs[t] == expr for t in exprs):
                continue
            try:
                ctx.prefix_graph(prefix + ((kind, operands, attrs),))
            except ShapeError:
                continue
            walk(prefix + ((kind, operands, attrs),), key)

    if kernels <= lim.max_kernel_ops:
        walk((), None)
    return shards


def _leaves(exprs) -> set:
    out: set = set()
    stack = list(exprs)
    while stack:
        e = stack.pop()
        if e[0] == "var":
            out.add(e)
        elif e[0] != "cst":
            stack.extend(e[1:])
    return out


def _block_shards(ctx: Context, prefix, g: KernelGraph, exprs, classes: DimClasses,
                  target_vars: set) -> list[Shard]:
    lim = ctx.limits
    n_out = len(ctx.reference.output_ids)
    shards: list[Shard] = []
    produced = set(range(len(ctx.reference.input_ids), len(g.tensors)))
    consumed = {t for op in g.ops for t in op.inputs}
    must = produced - consumed  # prefix results nobody else reads: the kernel must
    outs = [classes.of[-1 - i] for i in range(n_out)]
    # A single kernel's blocks cannot combine partial sums: a dim the program reduces must
    # not be split across blocks (sums have no size in the abstraction, so say it here).
    reduced = reduced_classes(ctx.reference)
    if all(exprs.get(t) is not None for t in must) and len(must) == n_out and ctx.limits.prune:
        got = [ctx.target.eclass(exprs[t]) for t in sorted(must)]
        if sorted(map(str, got)) == sorted(map(str, ctx.roots)):
            shards.append(Shard(prefix, ()))
    pool = sorted(range(len(g.tensors)))
    assert lim.max_block_inputs is not None  # a Context's limits are resolved (Limits.for_program)
    for k in range(1, lim.max_block_inputs + 1):
        for inputs in itertools.combinations(pool, k):
            if not must <= set(inputs):
                continue
            if {e[1] for e in _leaves(exprs[t] for t in inputs)} != target_vars:
                continue
            present = {c for t in inputs for c in classes.of[t] if c >= 0}
            placeable = [c for c in present if all(c in o for o in outs)
                         and classes.sizes[c] >= 2
                         and not (not prefix and c in reduced)]
            # a loop over a dim the outputs keep could never give the outputs their shape
            out_classes = {c for o in outs for c in o}
            loops = [None] + [c for c in sorted(present) if c not in out_classes
                              and classes.sizes[c] >= 2]
            for n_grid in range(0 if not placeable else 1, lim.max_grid_dims + 1):
                for grid in itertools.combinations(sorted(placeable), n_grid):
                    shards.extend(Shard(prefix, inputs, grid, loop) for loop in loops)
    return shards


def reduced_classes(reference: KernelGraph) -> set[int]:
    """Dimension classes that the program sums over (matmul, sum, mean, rms_norm)."""
    classes = dim_classes(reference).of
    out: set[int] = set()
    for op in reference.ops:
        if op.kind in ("matmul", "rms_norm"):
            out.add(classes[op.inputs[0]][-1])
        elif op.kind in ("sum", "mean"):
            out.add(classes[op.inputs[0]][op.attrs["dim"]])
    out.discard(-1)
    return out


def split_shard(ctx: Context, shard: Shard) -> list[Shard]:
    """A shard cut by its first block op, so that one heavy shard can keep workers busy."""
    search = BlockSearch(ctx, shard)
    search.sig = [search._signature(t) for t in range(len(search.bg.tensors))]
    n_first = len(search.first_moves())
    return [shard.at(shard.ops, i) for i in range(n_first)]


def prefix_structure(ctx: Context, shard: Shard) -> KernelGraph:
    """A structure of predefined kernels only (a shard without a graph-defined kernel)."""
    g, exprs, _, _ = ctx.prefix_graph(shard.prefix)
    g = g.replay()
    by_class = {ctx.target.eclass(exprs[t]): t for t in range(len(g.tensors))
                if exprs.get(t) is not None}
    for root in ctx.roots:
        g.mark_output(g.tensor(by_class[root]))
    return g


def run_shard(ctx: Context, shard: Shard) -> tuple[list[KernelGraph], Stats]:
    """Every candidate structure of one shard (unverified), with the shard's statistics."""
    if not shard.inputs or not shard.ops:
        return [prefix_structure(ctx, shard)], Stats(states=1, candidates=1)
    search = BlockSearch(ctx, shard)
    found = list(search.run())
    return found, search.stats


__all__ = ["DEFAULT_BLOCK_OPS", "DEFAULT_KERNEL_OPS", "BlockSearch", "Context", "Limits",
           "Shard", "Stats", "plan_configs", "prefix_structure", "reduced_classes", "run_shard",
           "split_shard"]
