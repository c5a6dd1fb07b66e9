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
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from .absexpr import Expressions, SaturatedTarget, saturate, target_expressions
from .dimclass import DimClasses, dim_classes, out_classes
from .dims import ShapeError
from .graph import BlockGraph, KernelGraph, Op
from .ops import OPS, Expr

DEFAULT_KERNEL_OPS = ("matmul", "exp", "silu", "add", "mul", "div", "sum", "rms_norm")
DEFAULT_BLOCK_OPS = ("matmul", "exp", "square", "sqrt", "silu", "sigmoid", "gelu", "relu",
                     "add", "sub", "mul", "div", "mul_scalar", "sum", "mean", "rms_norm",
                     "accum")
GRID_SYMBOLS = ("g0", "g1", "g2")


@dataclass(frozen=True)
class Limits:
    """Search limits; the defaults follow Mirage's (5 kernel ops, 11 block ops, 3 inputs)."""

    max_kernel_ops: int = 5
    max_block_ops: int = 11
    max_block_inputs: int = 3
    max_block_outputs: int = 2
    max_grid_dims: int = 2
    kernel_ops: tuple[str, ...] = DEFAULT_KERNEL_OPS
    block_ops: tuple[str, ...] = DEFAULT_BLOCK_OPS
    prune: bool = True
    time_limit_s: float | None = None
    # a configuration stops deepening this many ops past the smallest block graph verified
    # in any configuration (None: deepen every configuration to max_block_ops)
    max_extra_ops: int | None = 1

    def __post_init__(self) -> None:
        for name in (*self.kernel_ops, *self.block_ops):
            if name not in OPS or name in ("input", "output", "graph_kernel"):
                raise ValueError(f"unknown op {name!r} in the search's op lists")
        if not 1 <= self.max_grid_dims <= 3:
            raise ValueError("max_grid_dims must be 1, 2 or 3")


@dataclass(frozen=True)
class Shard:
    """One independent piece of the search tree; ``id`` is stable across runs and machines."""

    prefix: tuple[tuple[str, tuple[int, ...], tuple], ...]
    inputs: tuple[int, ...]  # () → the prefix alone computes the outputs
    grid: tuple[int, ...] = ()
    loop: int | None = None
    ops: int = 0  # exactly this many block ops (the driver deepens 1, 2, … per configuration)
    first_op: int | None = None  # set when a shard is split by its first block op

    @property
    def config_id(self) -> str:
        """The block configuration without the op count: what the driver deepens."""
        return Shard(self.prefix, self.inputs, self.grid, self.loop).id

    def at(self, ops: int, first_op: int | None = None) -> Shard:
        return Shard(self.prefix, self.inputs, self.grid, self.loop, ops, first_op)

    @property
    def id(self) -> str:
        pre = ";".join(f"{k}({','.join(map(str, a))}){dict(at) or ''}" for k, a, at in self.prefix)
        parts = [f"k[{pre}]", f"in{list(self.inputs)}"]
        if self.inputs:
            parts += [f"grid{list(self.grid)}", f"loop[{'' if self.loop is None else self.loop}]"]
        if self.ops:
            parts.append(f"ops{self.ops}")
        if self.first_op is not None:
            parts.append(f"op{self.first_op}")
        return "|".join(parts)


@dataclass
class Stats:
    states: int = 0
    pruned: int = 0
    invalid: int = 0
    candidates: int = 0
    timed_out: bool = False

    def add(self, other: Stats) -> None:
        self.states += other.states
        self.pruned += other.pruned
        self.invalid += other.invalid
        self.candidates += other.candidates
        self.timed_out |= other.timed_out


@dataclass
class Context:
    """Everything a shard needs, derived once per process from the reference graph."""

    reference: KernelGraph
    limits: Limits
    target: SaturatedTarget
    roots: list[str | None]
    constants: tuple[float, ...]
    _prefix_cache: dict = field(default_factory=dict)

    @classmethod
    def build(cls, reference: KernelGraph, limits: Limits) -> Context:
        outputs = target_expressions(reference)
        target = saturate(outputs)
        consts = tuple(sorted({op.attrs["scalar"] for op in reference.ops_of("mul_scalar")}))
        return cls(reference, limits, target, [target.eclass(e) for e in outputs], consts)

    def useful_ops(self, ops: tuple[str, ...]) -> tuple[str, ...]:
        """Ops whose result could be in the target at all: the function at the top of their
        abstract expression occurs in the saturated e-graph (sound: anything else is pruned
        the moment it is built, so trying it is wasted work)."""
        if not self.limits.prune:
            return ops
        present = {key[0] for key in self.target.table}
        kept = []
        for name in ops:
            probe = OPS[name].abstract([("var", "a"), ("var", "b")][:OPS[name].arity or 1],
                                       [(2, 2)] * 2, {"kind": "no_red", "_loop": True,
                                                      "dim": 0, "scalar": 1.0})
            top = {"add": "Add", "mul": "Mul", "div": "Div", "sum": "Sum", "exp": "Exp",
                   "sqrt": "Sqrt", "silu": "Silu", "sigmoid": "Sigmoid", "gelu": "Gelu",
                   "relu": "Relu"}.get(probe[0])
            if top is None or top in present:
                kept.append(name)
        return tuple(kept)

    def keep(self, expr: Expr) -> bool:
        return not self.limits.prune or self.target.contains(expr)

    def prefix_graph(self, prefix) -> tuple[KernelGraph, dict[int, Expr], DimClasses, int]:
        """The inputs plus prefix ops; their expressions; dim classes shared with the outputs."""
        if prefix in self._prefix_cache:
            return self._prefix_cache[prefix]
        ref = self.reference
        g = KernelGraph()
        for t in ref.input_ids:
            g.new_input(ref.tensors[t].shape, ref.tensors[t].dtype, ref.tensors[t].name)
        for kind, operands, attrs in prefix:
            g._append(kind, operands, dict(attrs))
        combined = ref.replay()
        base = len(combined.tensors)
        for kind, operands, attrs in prefix:  # same ops on the same inputs: classes line up
            n_in = len(ref.input_ids)
            combined._append(kind, [o if o < n_in else o - n_in + base for o in operands],
                             dict(attrs))
        classes = dim_classes(combined)
        of = {t: classes.of[t] for t in range(len(ref.input_ids))}
        of.update({t: classes.of[t - len(ref.input_ids) + base]
                   for t in range(len(ref.input_ids), len(g.tensors))})
        for i, t in enumerate(ref.output_ids):
            of[-1 - i] = classes.of[t]  # outputs under negative ids
        exprs = Expressions.of_kernel_graph(g, {t: of[t] for t in range(len(g.tensors))})
        result = (g, exprs, DimClasses(of, classes.sizes), base)
        self._prefix_cache[prefix] = result
        return result


def _op_key(kind: str, operands: tuple[int, ...], attrs: tuple) -> tuple:
    ordered = tuple(sorted(operands, reverse=True))
    return (ordered[0] if ordered else -1, ordered, kind, attrs)


# --- kernel level: prefixes and shards -----------------------------------------------------

def _kernel_moves(g: KernelGraph, exprs: dict[int, Expr], ctx: Context,
                  classes: DimClasses):
    """Predefined ops over existing tensors whose expressions stay inside the target."""
    tensors = list(range(len(g.tensors)))
    for kind in ctx.limits.kernel_ops:
        opdef = OPS[kind]
        for operands in itertools.product(tensors, repeat=opdef.arity):
            if opdef.commutative and list(operands) != sorted(operands):
                continue
            attr_sets = [()]
            if "dim" in opdef.attrs:
                attr_sets = [(("dim", d),) for d in range(len(g.tensors[operands[0]].shape))]
            for attrs in attr_sets:
                expr = opdef.abstract([exprs[t] for t in operands],
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
            key = _op_key(kind, operands, attrs)
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
            for n_grid in range(1, lim.max_grid_dims + 1):
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


# --- block level --------------------------------------------------------------------------

class BlockSearch:
    """Depth-first enumeration of one shard's block graphs."""

    def __init__(self, ctx: Context, shard: Shard) -> None:
        self.ctx, self.shard = ctx, shard
        self.kg, self.kexprs, self.classes, _ = ctx.prefix_graph(shard.prefix)
        self.stats = Stats()
        self.memo: dict[tuple, str | None] = {}
        self.sig_ids: dict[tuple, int] = {}
        self.block_ops = ctx.useful_ops(ctx.limits.block_ops)
        grid = tuple(GRID_SYMBOLS[i] for i in range(len(shard.grid)))
        specs = [(self.kg.tensors[t].shape, self.kg.tensors[t].dtype) for t in shard.inputs]
        self.bg = BlockGraph(grid, "F" if shard.loop is not None else 1, (128,), specs)
        self.exprs: list = []  # e-class of each tile (pruning on), or None (pruning off)
        self.tile_cls: list[tuple[int, ...]] = []  # dim classes of each tile's dims
        prune = ctx.limits.prune
        for i, t in enumerate(shard.inputs):
            cls = self.classes.of[t]
            imap = tuple(cls.index(c) if c in cls else -1 for c in shard.grid)
            fmap = cls.index(shard.loop) if shard.loop in cls else -1
            self.bg.input(i, imap, fmap)
            self.exprs.append(ctx.target.eclass(self.kexprs[t]) if prune else None)
            self.tile_cls.append(cls)
        self.n_inputs = len(shard.inputs)
        self.omaps = []
        for i in range(len(ctx.reference.output_ids)):
            ocls = self.classes.of[-1 - i]
            omap = tuple(ocls.index(c) for c in shard.grid)
            self.omaps.append(omap + (-1,) * (3 - len(omap)))
        self.deadline = (time.monotonic() + ctx.limits.time_limit_s
                         if ctx.limits.time_limit_s else None)

    def first_moves(self) -> list[tuple]:
        return self._new_moves(range(len(self.bg.tensors)))

    def _new_moves(self, fresh: range) -> list[tuple]:
        """Ops whose newest operand is in ``fresh``, sorted by canonical key, each with its
        e-class looked up once (moves that leave the target are dropped here)."""
        bg, prune = self.bg, self.ctx.limits.prune
        looped = bg.forloop_range != 1
        memo, out, sig = self.memo, [], self.sig
        for kind in self.block_ops:
            opdef = OPS[kind]
            for n in fresh:
                if opdef.arity == 1:
                    tuples = [(n,)]
                elif opdef.commutative:
                    tuples = [(a, n) for a in range(n + 1)]
                else:
                    tuples = [(a, n) for a in range(n + 1)] + [(n, a) for a in range(n)]
                for operands in tuples:
                    if opdef.arity == 2 and not opdef.attrs:
                        attr_sets: list[tuple] = [()]
                    else:
                        attr_sets = self._attr_sets(kind, opdef, bg.tensors[operands[0]], looped)
                    sigs = (sig[operands[0]], sig[operands[-1]]) if len(operands) == 2 \
                        else (sig[operands[0]],)
                    for attrs in attr_sets:
                        cls = None
                        if prune:
                            memo_key = (kind, sigs, attrs)
                            cls = memo.get(memo_key, memo)
                            if cls is memo:
                                cls = memo[memo_key] = self._classify(kind, operands, attrs,
                                                                      looped)
                            if cls is None:
                                self.stats.pruned += 1
                                continue
                        out.append((_op_key(kind, operands, attrs), kind, operands, attrs, cls))
        out.sort(key=lambda m: m[0])
        return out

    def _attr_sets(self, kind: str, opdef, first, looped: bool) -> list[tuple]:
        if kind == "accum":
            if first.stage == "epilogue":
                return []
            kinds = ("no_red", "sum", "mean", "rms") if looped else ("no_red",)
            return [(("kind", k),) for k in kinds]
        if "dim" in opdef.attrs:
            return [(("dim", d),) for d, s in enumerate(first.shape) if s != 1]
        if kind == "mul_scalar":
            return [(("scalar", c),) for c in self.ctx.constants]
        return [()]

    def _classify(self, kind: str, operands: tuple[int, ...], attrs: tuple,
                  looped: bool) -> str | None:
        kids = [self.exprs[t] for t in operands]
        if None in kids:
            return None
        tcls = [self.tile_cls[t] for t in operands]
        attrs_d = dict(attrs, _loop=looped, _cls=tcls, _loop_cls=self.shard.loop)
        shapes = [self.bg.tensors[t].shape for t in operands]
        return self.ctx.target.apply(kind, kids, shapes, attrs_d)

    def _signature(self, t: int) -> int:
        """A small id for (e-class, dim classes) of tile ``t``: what its expression depends on."""
        return self.sig_ids.setdefault((self.exprs[t], self.tile_cls[t]), len(self.sig_ids))

    def run(self) -> Iterator[KernelGraph]:
        """Block graphs of exactly ``shard.ops`` ops that complete the outputs."""
        self.uses = [0] * len(self.bg.tensors)
        self.sig = [self._signature(t) for t in range(len(self.bg.tensors))]
        yield from self._dfs(self.first_moves(), 0, only=self.shard.first_op)

    def _dfs(self, moves: list[tuple], depth: int,
             only: int | None = None) -> Iterator[KernelGraph]:
        """``moves`` is sorted by key: after choosing move i, the child may use moves i+1…
        (the canonical order) plus the moves that read the tile just made."""
        bg, total = self.bg, self.shard.ops
        n_out = len(self.ctx.reference.output_ids)
        unread = {t for t, n in enumerate(self.uses) if n == 0}
        # tiles nobody reads must be read later or be outputs, one fewer per op at best
        need = max(0, len(unread) + 1 - n_out - (total - depth - 1))
        for i, (_key, kind, operands, attrs, expr) in enumerate(moves):
            if only is not None and i != only:
                continue  # a split shard takes one first move (and keeps the later ones)
            if self.deadline and time.monotonic() > self.deadline:
                self.stats.timed_out = True
                return
            if need and sum(1 for t in set(operands) if t in unread) < need:
                continue
            attrs_d = dict(attrs)
            n_tensors = len(bg.tensors)
            try:
                bg._append(kind, operands, attrs_d)
            except ShapeError:
                self.stats.invalid += 1
                continue
            if expr is not None and self._duplicate(expr):
                bg.ops.pop()
                del bg.tensors[n_tensors:]
                self.stats.pruned += 1
                continue
            self.stats.states += 1
            self.exprs.append(expr)
            self.tile_cls.append(out_classes(kind, attrs_d, [self.tile_cls[t] for t in operands]))
            self.sig.append(self._signature(n_tensors))
            for t in set(operands):
                self.uses[t] += 1
            self.uses.append(0)
            if depth + 1 == total:
                yield from self._emit()
            else:
                child = moves[i + 1:] + self._new_moves(range(n_tensors, n_tensors + 1))
                yield from self._dfs(child, depth + 1)
            bg.ops.pop()
            del bg.tensors[n_tensors:]
            self.exprs.pop()
            self.tile_cls.pop()
            self.sig.pop()
            self.uses.pop()
            for t in set(operands):
                self.uses[t] -= 1

    def _duplicate(self, cls: str) -> bool:
        """A second tile with the same e-class, shape and stage as an existing one computes,
        as far as the abstraction can tell, the same thing again: a minimal graph never does."""
        new = self.bg.tensors[-1]
        return any(c == cls and t.shape == new.shape and t.stage == new.stage
                   for c, t in zip(self.exprs, self.bg.tensors, strict=False))

    def _emit(self) -> Iterator[KernelGraph]:
        """Complete the block graph with outputs wherever the new tile finishes one."""
        bg, ctx = self.bg, self.ctx
        ref = ctx.reference
        new = len(bg.tensors) - 1
        if bg.tensors[new].stage != "epilogue":
            return
        choices = []
        for i, t in enumerate(ref.output_ids):
            want = ref.tensors[t].shape
            fits = []
            for cand in range(len(bg.tensors)):
                info = bg.tensors[cand]
                if info.stage != "epilogue":
                    continue
                if ctx.limits.prune and self.exprs[cand] != ctx.roots[i]:
                    continue
                try:
                    if bg._place(info.shape, {"omap": self.omaps[i]}) == want:
                        fits.append(cand)
                except ShapeError:
                    continue
            choices.append(fits)
        for pick in itertools.product(*choices):
            if new not in pick or len(set(pick)) != len(pick):
                continue  # emitted before (without the new tile), or one tile twice
            if not self._all_used(pick):
                continue
            self.stats.candidates += 1
            yield self._structure(pick)

    def _all_used(self, outputs: tuple[int, ...]) -> bool:
        producer = {t: op for op in self.bg.ops for t in op.outputs}
        live, stack = set(), list(outputs)
        while stack:
            t = stack.pop()
            if t not in live:
                live.add(t)
                stack.extend(producer[t].inputs)
        return len(live) == len(self.bg.tensors)

    def _structure(self, outputs: tuple[int, ...]) -> KernelGraph:
        ref = self.ctx.reference
        g = KernelGraph()
        for t in ref.input_ids:
            g.new_input(ref.tensors[t].shape, ref.tensors[t].dtype, ref.tensors[t].name)
        for op in self.kg.ops[len(ref.input_ids):]:
            g._append(op.kind, op.inputs, dict(op.attrs))
        specs = [(g.tensors[t].shape, g.tensors[t].dtype) for t in self.shard.inputs]
        bg = BlockGraph(self.bg.grid, self.bg.forloop_range, self.bg.block, specs)
        for op in self.bg.ops:
            bg._append(op.kind, op.inputs, dict(op.attrs))
        for i, t in enumerate(outputs):
            bg._append("output", (t,), {"omap": self.omaps[i]})
        for out in g._append("graph_kernel", self.shard.inputs, {"block_graph": bg}):
            g.mark_output(out)
        return g


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
           "Op", "Shard", "Stats", "plan_configs", "prefix_structure", "run_shard",
           "split_shard"]
