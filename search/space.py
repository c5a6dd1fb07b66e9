"""The search space's vocabulary: limits, shards (with stable ids), statistics, and the
per-process context (the saturated target, dimension classes of each kernel prefix).

Both the shard planner (``search.enumerate``) and the block-graph search
(``search.blocksearch``) speak it; neither imports the other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .absexpr import Expressions, SaturatedTarget, saturate, target_expressions
from .dimclass import DimClasses, dim_classes
from .ir import EGG_FUNCTIONS, OPS, Expr, KernelGraph

DEFAULT_KERNEL_OPS = ("matmul", "exp", "silu", "add", "mul", "div", "sum", "rms_norm")
DEFAULT_BLOCK_OPS = ("matmul", "exp", "square", "sqrt", "rsqrt", "neg", "tanh", "silu",
                     "sigmoid", "gelu", "relu", "add", "sub", "mul", "div", "mul_scalar",
                     "add_scalar", "sum", "mean", "rms_norm", "accum")
GRID_SYMBOLS = ("g0", "g1", "g2")
MIN_BLOCK_INPUTS = 3  # Mirage's default; the adaptive limit never goes below it


@dataclass(frozen=True)
class Limits:
    """Search limits; the defaults follow Mirage's (5 kernel ops, 11 block ops, 3 inputs),
    except that block inputs adapt to the program: ``max_block_inputs=None`` (the default)
    means ``max(3, the program's inputs)`` (``for_program``), so a program reading four
    tensors (lora) can still be one kernel; a number is used as given."""

    max_kernel_ops: int = 5
    max_block_ops: int = 11
    max_block_inputs: int | None = None
    max_block_outputs: int = 2
    max_grid_dims: int = 2
    kernel_ops: tuple[str, ...] = DEFAULT_KERNEL_OPS
    block_ops: tuple[str, ...] = DEFAULT_BLOCK_OPS
    prune: bool = True
    time_limit_s: float | None = None
    # a configuration stops deepening this many ops past the smallest block graph verified
    # in any configuration (None: deepen every configuration to max_block_ops)
    max_extra_ops: int | None = 1
    # a program of more compute ops than this is searched in pieces of at most max_piece_ops
    # consecutive ops, joined into one structure of several kernels (None: never partition;
    # search.partition)
    partition_above: int | None = 7
    max_piece_ops: int = 4
    # ... unless it has no matmul and fewer than this many reductions: a norm written out
    # (LayerNorm: 9 ops, 2 reductions, the rest pointwise) fuses into one kernel the search
    # finds in seconds, and cutting it would cost two round trips through global memory
    partition_min_heavy: int = 3

    def __post_init__(self) -> None:
        for name in (*self.kernel_ops, *self.block_ops):
            if name not in OPS or name in ("input", "output", "graph_kernel"):
                raise ValueError(f"unknown op {name!r} in the search's op lists")
        if not 1 <= self.max_grid_dims <= 3:
            raise ValueError("max_grid_dims must be 1, 2 or 3")
        if self.max_block_inputs is not None and self.max_block_inputs < 1:
            raise ValueError("max_block_inputs must be at least 1 (or None: adaptive)")
        if self.partition_above is not None and self.partition_above < 1:
            raise ValueError("partition_above must be at least 1 (or None: never partition)")
        if self.max_piece_ops < 1:
            raise ValueError("max_piece_ops must be at least 1")
        if self.partition_min_heavy < 0:
            raise ValueError("partition_min_heavy must be at least 0")

    def for_program(self, n_inputs: int) -> Limits:
        """These limits with an adaptive ``max_block_inputs`` resolved for a program of
        ``n_inputs`` input tensors: at least Mirage's 3, and enough for one kernel to read
        every input (only lora of the suite reads more than 3)."""
        if self.max_block_inputs is not None:
            return self
        return replace(self, max_block_inputs=max(MIN_BLOCK_INPUTS, n_inputs))


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
    constants: tuple[float, ...]  # of the reference's mul_scalar ops
    # the numeric attributes the reference uses, per (op, attribute): the only values the
    # block search tries (add_scalar's scalars, rms_norm's eps, ...)
    numbers: dict[tuple[str, str], tuple[float, ...]] = field(default_factory=dict)
    _prefix_cache: dict = field(default_factory=dict)
    _useful_cache: dict = field(default_factory=dict)

    @classmethod
    def build(cls, reference: KernelGraph, limits: Limits) -> Context:
        outputs = target_expressions(reference)
        target = saturate(outputs)
        numbers: dict[tuple[str, str], set[float]] = {}
        for op in reference.ops:
            for key in ("scalar", "eps"):
                if key in op.attrs:
                    numbers.setdefault((op.kind, key), set()).add(float(op.attrs[key]))
        consts = tuple(sorted(numbers.get(("mul_scalar", "scalar"), ())))
        limits = limits.for_program(len(reference.input_ids))
        return cls(reference, limits, target, [target.eclass(e) for e in outputs], consts,
                   numbers={k: tuple(sorted(v)) for k, v in numbers.items()})

    def useful_ops(self, ops: tuple[str, ...]) -> tuple[str, ...]:
        """Ops whose result could be in the target at all: the function at the top of their
        abstract expression occurs in the saturated e-graph (sound: anything else is pruned
        the moment it is built, so trying it is wasted work).  An op is probed in a block
        graph with and without a for-loop: a loop-less ``no_red`` accumulator is the identity
        (it only moves a tile to the epilogue), so it is useful to every target, one without
        a sum included (a pure elementwise program)."""
        if not self.limits.prune:
            return ops
        asked = tuple(ops)
        if asked in self._useful_cache:  # every shard asks; the saturated table is large
            return self._useful_cache[asked]
        present = {key[0] for key in self.target.table}
        kept = []
        for name in ops:
            for looped in (True, False):
                probe = OPS[name].expression([("var", "a"), ("var", "b")][:OPS[name].arity or 1],
                                           [(2, 2)] * 2, {"kind": "no_red", "_loop": looped,
                                                          "dim": 0, "scalar": 1.0})
                top = EGG_FUNCTIONS.get(probe[0])
                if top is None or top in present:
                    kept.append(name)
                    break
        self._useful_cache[asked] = tuple(kept)
        return tuple(kept)

    def keep(self, expr: Expr) -> bool:
        return not self.limits.prune or self.target.contains(expr)

    def prefix_graph(self, prefix) -> tuple[KernelGraph, dict[int, Expr], DimClasses, int]:
        """The inputs plus prefix ops; their expressions; dim classes shared with the outputs."""
        if prefix in self._prefix_cache:
            return self._prefix_cache[prefix]
        ref = self.reference
        g = KernelGraph()
        for t, shape in zip(ref.input_ids, ref.input_shapes(), strict=True):
            g.new_input(shape, ref.tensors[t].dtype, ref.tensors[t].name,
                        layout=ref.input_layout(t))
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


def op_key(kind: str, operands: tuple[int, ...], attrs: tuple) -> tuple:
    ordered = tuple(sorted(operands, reverse=True))
    return (ordered[0] if ordered else -1, ordered, kind, attrs)
