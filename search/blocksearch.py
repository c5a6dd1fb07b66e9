"""Depth-first enumeration of one shard's block graphs, in a canonical op order.

Moves are kept sorted by a canonical key; after choosing move i a child may use moves i+1…
plus the moves that read the tile just made, so every DAG is built in exactly one order.
Each move's abstract expression is looked up in the saturated target once (memoised by the
operands' e-classes and dimension classes); a tile budget stops branches that can no longer
close with the ops left.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

from .dimclass import out_classes
from .ir import OPS, BlockGraph, KernelGraph, ShapeError
from .space import GRID_SYMBOLS, Context, Shard, Stats, op_key


class BlockSearch:
    """Depth-first enumeration of one shard's block graphs."""

    def __init__(self, ctx: Context, shard: Shard) -> None:
        self.ctx, self.shard = ctx, shard
        self.kg, self.kexprs, self.classes, _ = ctx.prefix_graph(shard.prefix)
        self.stats = Stats()
        self.memo: dict[tuple, str | None] = {}
        self.sig_ids: dict[tuple, int] = {}
        self.block_ops = ctx.useful_ops(ctx.limits.block_ops)
        # per op: its table row, arity, commutativity, and whether it is binary without attrs
        self.op_rows = [(k, OPS[k], OPS[k].arity, OPS[k].commutative,
                         OPS[k].arity == 2 and not OPS[k].attrs) for k in self.block_ops]
        self.pair_memo: dict[str, tuple[dict, dict]] = {k: ({}, {}) for k in self.block_ops}
        self.attr_memo: dict[tuple, list[tuple]] = {}  # (op, shape, stage) -> attr sets
        # a shard without grid dims (outputs that keep no dim to split) is one block
        grid = tuple(GRID_SYMBOLS[i] for i in range(len(shard.grid))) or (1,)
        specs = [(self.kg.tensors[t].shape, self.kg.tensors[t].dtype) for t in shard.inputs]
        self.bg = BlockGraph(grid, "F" if shard.loop is not None else 1, (128,), specs)
        self.exprs: list = []  # e-class of each tile (pruning on), or None (pruning off)
        self.tile_cls: list[tuple[int, ...]] = []  # dim classes of each tile's dims
        prune = ctx.limits.prune
        for i, t in enumerate(shard.inputs):
            cls = self.classes.of[t]
            imap = tuple(cls.index(c) if c in cls else -1 for c in shard.grid) or (-1,)
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
        e-class looked up once (moves that leave the target are dropped here).

        This runs once per search state over every op and operand pair (ntrans at small
        shapes: 11 million moves, most of them pruned), so its inner loop is kept flat: an
        op's e-class is memoised per (op, attributes, operand signatures) in one dict per op
        and newest operand, keyed by the other operand's signature alone."""
        bg, prune = self.bg, self.ctx.limits.prune
        looped = bg.forloop_range != 1
        sig, out, classify = self.sig, [], self._classify
        pruned = 0
        for kind, opdef, arity, commutative, plain in self.op_rows:
            for n in fresh:
                if plain and prune:  # a binary op without attributes: the common, hot case
                    sn = sig[n]
                    # (a, n) for every a <= n, then (n, a) for every a < n (not commutative);
                    # by_second[s] maps a first operand's signature to the e-class of the op
                    # with s second, by_first[s] a second operand's with s first: one fact
                    # stored under both, as a pair of signatures is met from either side
                    by_first, by_second = self.pair_memo[kind]
                    for side in ((0,) if commutative else (0, 1)):
                        memo = (by_second if side == 0 else by_first).setdefault(sn, {})
                        for a in range(n + 1 if side == 0 else n):
                            sa = sig[a]
                            cls = memo.get(sa, memo)
                            pair: tuple[int, ...] = (a, n) if side == 0 else (n, a)
                            if cls is memo:
                                cls = memo[sa] = classify(kind, pair, (), looped)
                                (by_first if side == 0 else by_second).setdefault(
                                    sa, {})[sn] = cls
                            if cls is None:
                                pruned += 1
                                continue
                            out.append(((n, (n, a), kind, ()), kind, pair, (), cls))
                    continue
                tuples: list[tuple[int, ...]]
                if arity == 1:
                    tuples = [(n,)]
                elif commutative:
                    tuples = [(a, n) for a in range(n + 1)]
                else:
                    tuples = [*((a, n) for a in range(n + 1)), *((n, a) for a in range(n))]
                for operands in tuples:
                    attr_sets = [()] if plain else \
                        self._attr_sets(kind, opdef, bg.tensors[operands[0]], looped)
                    sigs = (sig[n],) if arity == 1 else (sig[operands[0]], sig[operands[1]])
                    for attrs in attr_sets:
                        cls = None
                        if prune:
                            memo_key = (kind, sigs, attrs)
                            cls = self.memo.get(memo_key, self.memo)
                            if cls is self.memo:
                                cls = self.memo[memo_key] = classify(kind, operands, attrs,
                                                                     looped)
                            if cls is None:
                                pruned += 1
                                continue
                        out.append((op_key(kind, operands, attrs), kind, operands, attrs, cls))
        self.stats.pruned += pruned
        out.sort(key=lambda m: m[0])
        return out

    def _attr_sets(self, kind: str, opdef, first, looped: bool) -> list[tuple]:
        key = (kind, first.shape, first.stage)
        sets = self.attr_memo.get(key)
        if sets is None:
            sets = self.attr_memo[key] = self._attr_sets_of(kind, opdef, first, looped)
        return sets

    def _attr_sets_of(self, kind: str, opdef, first, looped: bool) -> list[tuple]:
        if kind == "accum":
            if first.stage == "epilogue":
                return []
            kinds = ("no_red", "sum", "mean", "rms") if looped else ("no_red",)
            return [(("kind", k),) for k in kinds]
        if "dim" in opdef.attrs:
            return [(("dim", d),) for d, s in enumerate(first.shape) if s != 1]
        if kind in ("mul_scalar", "add_scalar"):
            return [(("scalar", c),) for c in self.ctx.numbers.get((kind, "scalar"), ())]
        if kind == "rms_norm":  # without eps, and with each eps or added constant the
            # reference uses (a decomposed norm adds its eps with add_scalar)
            eps = {*self.ctx.numbers.get((kind, "eps"), ()),
                   *(c for c in self.ctx.numbers.get(("add_scalar", "scalar"), ()) if c > 0)}
            return [(), *((("eps", e),) for e in sorted(eps))]
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
            if need and len(unread.intersection(operands)) < need:
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
        for t, shape in zip(ref.input_ids, ref.input_shapes(), strict=True):
            g.new_input(shape, ref.tensors[t].dtype, ref.tensors[t].name,
                        layout=ref.input_layout(t))
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
