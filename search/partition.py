"""Partitioning a program too big for one search into pieces, and joining the pieces' structures.

The search is exhaustive per block configuration, so its cost grows steeply with the program's
op count: fine up to 6-7 ops, hopeless at 9-12 (a whole decode or MLP block).  As Mirage does
with its inputs, a big program is cut into *pieces* of consecutive ops (in the program's
order, so each piece reads only program inputs and earlier pieces' results), every piece is
searched as a program of its own, and the pieces' best structures are joined into one
structure of several kernels whose intermediates live in global memory between them.

The cut is chosen by the traffic it sends through global memory: a piece reads its inputs and
writes the results later pieces read (or the program returns) once each, and the plan
minimises the sum over pieces (so it keeps the most traffic on chip), with at most
``max_piece_ops`` ops per piece (what the search finishes in seconds), at most
``max_outputs`` results per piece, and a cut after every matmul over a long inner dim whose
result is contracted or reduced along its rows later (``_fusable``: the matmul and reduction
boundaries where fusing would make every block recompute the whole first product).  Ties go
to fewer pieces.

``search_in_pieces`` plans, has each piece searched by the function it is given (the
driver's ``run_search`` on the caller's executor: ``search.driver``), re-cuts a piece that
finds nothing and joins; nothing here enumerates or verifies, and the driver hands the joined
structure to the caller's verifier.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from keyword import iskeyword
from typing import Any

from .ir import DTYPE_BYTES, OPS, KernelGraph, Program, from_obj
from .space import Stats

# A piece's search gets this many seconds per op of the piece (never more than what is left
# of the whole search's limit): a piece exists to be searched in seconds, and one that is not
# is cut in halves, which costs less than waiting for it (the pieces of the 8-10-op blocks
# in benchmarks/programs finish in 0.1-9 s each on 2 loaded cores).
PIECE_SECONDS_PER_OP = 10.0


@dataclass(frozen=True)
class Piece:
    """Consecutive compute ops of a program, searched as a program of its own."""

    index: int
    ops: tuple[int, ...]  # positions in the program's list of compute ops
    inputs: tuple[int, ...]  # reference tensor ids it reads: program inputs, earlier results
    outputs: tuple[int, ...]  # reference tensor ids later pieces read or the program returns
    program: Program  # the piece as a program (inputs and outputs in the orders above)
    traffic: int  # bytes it reads and writes in global memory at the program's shapes


def compute_ops(graph: KernelGraph) -> list:
    """The ops that are kernels of the reference (not inputs, not output marks)."""
    return [op for op in graph.ops if op.kind not in ("input", "output")]


def heavy_ops(graph: KernelGraph) -> int:
    """Matmuls and reductions (every compute op that is not pointwise): what makes the
    search's cost grow with a program, and where partitioning cuts."""
    return sum(1 for op in compute_ops(graph) if not OPS[op.kind].elementwise)


def needs_pieces(graph: KernelGraph, partition_above: int | None, min_heavy: int) -> bool:
    """Whether a program is searched in pieces (never when ``partition_above`` is None): more
    than ``partition_above`` compute ops, and a matmul among them or at least ``min_heavy``
    reductions (``Limits``); or, at any size, a costly contraction (``costly_contraction``)."""
    if partition_above is None:
        return False
    ops = compute_ops(graph)
    return (len(ops) > partition_above
            and (any(op.kind == "matmul" for op in ops) or heavy_ops(graph) >= min_heavy)) \
        or costly_contraction(graph)


# A matmul operand (its B: a weight) of at least this many bytes is costly to read again.
LARGE_OPERAND = 1 << 20


def costly_contraction(graph: KernelGraph, row_reductions: bool = True) -> bool:
    """Whether a matmul over a long inner dim, whose B is large (``LARGE_OPERAND``: a weight,
    not LoRA's 256 x 16 A), has its result contracted (by a matmul; with ``row_reductions``
    also row-reduced: a norm after an output projection) later (a SwiGLU MLP's
    gate and up projections, then the down projection).  The search builds one graph-defined
    kernel, or the ops as library kernels, never two graph-defined kernels; fused, every block
    of the contraction would read the whole weight again (``_fusable``), so only the pieces
    give the fused kernel per side of the cut.  A 5-op Llama MLP (4 x 1024, float32, AMD
    EPYC): 0.90 ms searched whole, 0.66 ms in pieces."""
    ops = compute_ops(graph)
    long_rows: set[int] = set()
    for op in ops:
        reads_long = any(t in long_rows for t in op.inputs)
        if reads_long and (op.kind == "matmul" or
                           (row_reductions and OPS[op.kind].row_reduction)):
            return True
        if op.kind == "matmul":
            inner = _concrete(graph.tensors[op.inputs[0]].shape)[-1]
            b = graph.tensors[op.inputs[1]]
            if inner > SHORT_INNER and \
                    math.prod(_concrete(b.shape)) * DTYPE_BYTES[b.dtype] >= LARGE_OPERAND:
                long_rows.update(op.outputs)
                continue
        if reads_long:
            long_rows.update(op.outputs)
    return False


def plan_pieces(program: Program, max_piece_ops: int, max_outputs: int = 2) -> list[Piece]:
    """Cut ``program`` into pieces of at most ``max_piece_ops`` consecutive ops, choosing the
    cut that moves the fewest bytes through global memory (then the fewest pieces)."""
    if max_piece_ops < 1:
        raise ValueError("max_piece_ops must be at least 1")
    ref = program.build()
    ops = compute_ops(ref)
    n = len(ops)
    made_at = {t: i for i, op in enumerate(ops) for t in op.outputs}
    last_use = {t: n if t in ref.output_ids else -1 for t in made_at}
    for i, op in enumerate(ops):
        for t in op.inputs:
            if t in last_use:
                last_use[t] = max(last_use[t], i)

    def nbytes(t: int) -> int:
        info = ref.tensors[t]
        return math.prod(_concrete(info.shape)) * DTYPE_BYTES[info.dtype]

    def segment(j: int, i: int) -> tuple[list[int], list[int]] | None:
        """(reads, results) of ops j..i-1 as one piece; None when it cannot be one."""
        reads: list[int] = []
        results: list[int] = []
        for k in range(j, i):
            for t in ops[k].inputs:
                if made_at.get(t, -1) < j and t not in reads:
                    reads.append(t)
            results += [t for t in ops[k].outputs if last_use[t] >= i]
        if not results or len(results) > max_outputs or not _fusable(ref, ops[j:i]):
            return None
        return reads, results

    inf = (math.inf, math.inf)
    best: list[tuple[float, float]] = [(0, 0)] + [inf] * n
    cut_from: list[int] = [0] * (n + 1)
    for i in range(1, n + 1):
        for j in range(max(0, i - max_piece_ops), i):
            if best[j] == inf or (seg := segment(j, i)) is None:
                continue
            cost = (best[j][0] + sum(map(nbytes, seg[0] + seg[1])), best[j][1] + 1)
            if cost < best[i]:
                best[i], cut_from[i] = cost, j
    if best[n] == inf:  # single ops always form pieces unless one op has > max_outputs results
        raise ValueError(f"{program.name}: no cut into pieces of at most {max_piece_ops} ops "
                         f"with at most {max_outputs} results each")
    bounds = []
    i = n
    while i > 0:
        bounds.append((cut_from[i], i))
        i = cut_from[i]
    pieces = []
    for index, (j, i) in enumerate(reversed(bounds)):
        reads, results = segment(j, i) or ([], [])
        pieces.append(Piece(index, tuple(range(j, i)), tuple(reads), tuple(results),
                            _piece_program(program, ref, ops[j:i], reads, results, index),
                            sum(map(nbytes, reads + results))))
    return pieces


# A matmul's inner dim a block holds whole at no cost (attention's head dim: 64, 128).
SHORT_INNER = 128


def _fusable(ref: KernelGraph, ops: list) -> bool:
    """Whether one piece may hold these ops: nothing in it contracts or reduces, along a
    row, the result of a matmul over a long inner dim computed in the same piece.  Fused in
    one kernel, every block would need that result's whole row, so every block would compute
    all of it and read the whole first weight (a query projection then the scores, an up
    projection then the down projection): no parallelism, or the weight read once per block.
    A short inner dim (gqa's Q·K over 64) costs nothing to hold whole."""
    long_rows: set[int] = set()  # results downstream of a matmul over a long inner dim
    for op in ops:
        reads_long = any(t in long_rows for t in op.inputs)
        if reads_long and (op.kind == "matmul" or OPS[op.kind].row_reduction):
            return False
        inner = ref.tensors[op.inputs[0]].shape[-1] if op.kind == "matmul" else 0
        if reads_long or (op.kind == "matmul" and _concrete((inner,))[0] > SHORT_INNER):
            long_rows.update(op.outputs)
    return True


def _concrete(shape: tuple) -> tuple[int, ...]:
    """A reference tensor's shape (a program's reference has no grid symbols)."""
    dims = tuple(d for d in shape if isinstance(d, int))
    if len(dims) != len(shape):
        raise ValueError(f"a program's reference has whole-number shapes, not {shape}")
    return dims


def _piece_program(program: Program, ref: KernelGraph, ops: list, reads: list[int],
                   results: list[int], index: int) -> Program:
    """The piece as a program file would write it: its inputs named, one line per op."""
    return ops_program(ref, ops, reads, results, f"{program.name}.p{index}", program.dtype,
                       description=f"piece {index} of {program.name}",
                       source=f"{program.source} (piece {index})")


def graph_program(graph: KernelGraph, name: str) -> Program:
    """A reference graph of predefined ops as the program a file would write (its inputs,
    every compute op, its outputs), e.g. a program the database holds only as its graph."""
    dtype = graph.tensors[graph.input_ids[0]].dtype
    return ops_program(graph, compute_ops(graph), list(graph.input_ids),
                       list(graph.output_ids), name, dtype, source=f"<graph of {name}>")


def ops_program(ref: KernelGraph, ops: list, reads: list[int], results: list[int], name: str,
                dtype: str, *, description: str = "", source: str = "") -> Program:
    """The ops ``ops`` of ``ref``, reading ``reads`` and returning ``results``, as a program
    file would write them: its inputs named, one line per op."""
    names: dict[int, str] = {}
    taken: set[str] = set()
    for t in [*reads, *(o for op in ops for o in op.outputs)]:
        tensor_name = ref.tensors[t].name or ""
        k = 0
        while not tensor_name.isidentifier() or iskeyword(tensor_name) or \
                tensor_name in taken or tensor_name in OPS:
            tensor_name = f"t{t}" + (f"_{k}" if k else "")
            k += 1
        names[t] = tensor_name
        taken.add(tensor_name)
    lines = []
    for op in ops:
        args = [names[t] for t in op.inputs]
        args += [f"{k}={v!r}" for k, v in op.attrs.items()]
        lines.append(f"{names[op.outputs[0]]} = {op.kind}({', '.join(args)})")
    inputs = {names[t]: _concrete(ref.tensors[t].shape) for t in reads}
    layouts = {names[t]: ref.input_layout(t) for t in reads  # a transposed program input
               if t in ref.input_ids and ref.input_layout(t) != "row"}  # stays transposed
    return Program(name, dtype, inputs, "\n".join(lines) + "\n", [names[t] for t in results],
                   description=description, source=source, layouts=layouts)


def join_pieces(program: Program, pieces: list[Piece],
                structures: list[KernelGraph]) -> KernelGraph:
    """One structure of the pieces' structures, in order: each piece's kernels read the
    program's inputs and earlier pieces' results from global memory.  Grid and loop symbols
    keep their names (``g0``, ``F``), so one config tiles every piece's kernel alike."""
    ref = program.build()
    g = KernelGraph()
    where: dict[int, int] = {}
    for t in ref.input_ids:
        info = ref.tensors[t]
        where[t] = g.new_input(_concrete(info.shape), info.dtype, info.name,
                               layout=ref.input_layout(t)).id
    for piece, structure in zip(pieces, structures, strict=True):
        local = {t: where[r] for t, r in zip(structure.input_ids, piece.inputs, strict=True)}
        for op in structure.ops:
            if op.kind in ("input", "output"):
                continue
            attrs = dict(op.attrs)
            if op.kind == "graph_kernel":
                specs = [(g.tensors[local[i]].shape, g.tensors[local[i]].dtype)
                         for i in op.inputs]
                attrs["block_graph"] = attrs["block_graph"].replay(specs, None)
            made = g._append(op.kind, [local[i] for i in op.inputs], attrs)
            local.update({o: m.id for o, m in zip(op.outputs, made, strict=True)})
        for t, r in zip(structure.output_ids, piece.outputs, strict=True):
            where[r] = local[t]
            g.tensors[local[t]].name = ref.tensors[r].name
    for t in ref.output_ids:
        g.mark_output(g.tensor(where[t]))
    return g


@dataclass
class PieceSearch:
    """What searching a program in pieces gave: the joined structure (None when a piece found
    nothing even cut down to single ops), one report per piece searched, summed statistics."""

    structure: KernelGraph | None
    pieces: list[dict] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)
    shards: int = 0
    checked: int = 0
    unfinished: list[str] = field(default_factory=list)
    saturated: bool = True


# search_piece(piece program, time limit in seconds) -> a search.SearchResult
SearchPiece = Callable[[Program, float], Any]
# choose_piece(a piece's verified structures, the search's best first) -> the index of the one
# to join: the caller's ranking (the search's own counts each tensor's bytes once, so it
# cannot see a grid whose blocks all re-read one operand; the cluster passes the roofline
# estimate's, which picks another structure for gpt2_mlp's first piece, and on an H100 for
# lora_block's second)
ChoosePiece = Callable[[list[KernelGraph]], int]


def search_in_pieces(program: Program, search_piece: SearchPiece, *, max_piece_ops: int,
                     max_outputs: int, deadline: float,
                     choose_piece: ChoosePiece | None = None) -> PieceSearch:
    """Plan ``program``'s pieces, search each (``search_piece``: the caller's search of one
    program, on its executor), and join one structure of each: the search's best, or the
    one ``choose_piece`` picks among its verified structures.  A piece that finds nothing
    within its time is planned again in pieces of half its ops (down to single ops, which
    always have a structure: the op as a predefined kernel).  ``deadline``: ``time.time()``
    past which no piece starts and a running one is cut short."""
    out = PieceSearch(None)
    structures = []
    pieces = plan_pieces(program, max_piece_ops, max_outputs)
    for piece in pieces:
        limit = max(0.5, min(deadline - time.time(), PIECE_SECONDS_PER_OP * len(piece.ops)))
        res = search_piece(piece.program, limit)
        out.stats.add(res.stats)
        out.shards, out.checked = out.shards + res.shards_run, out.checked + res.checked
        out.unfinished += [f"{piece.program.name}: {c}" for c in res.unfinished]
        out.saturated &= bool(res.saturation.get("saturated", True))
        ranked = [from_obj(d["graph"]) for d in res.structures]
        chosen = choose_piece(ranked) if choose_piece and len(ranked) > 1 else 0
        out.pieces.append({
            "piece": piece.program.name, "ops": len(piece.ops),
            "body": piece.program.body.strip().splitlines(), "outputs": piece.program.outputs,
            "traffic_bytes": piece.traffic, "time_limit_s": round(limit, 1),
            "elapsed_s": round(res.elapsed_s, 3), "states": res.stats.states,
            "verified": len(res.verified), "timed_out": res.stats.timed_out,
            "kernels": res.structures[chosen]["num_kernels"] if ranked else None,
            "chosen": chosen})
        if ranked:
            structures.append(ranked[chosen])
            continue
        if len(piece.ops) == 1 or time.time() > deadline:
            return out  # nothing for this piece: no structure for the program
        sub = search_in_pieces(piece.program, search_piece,
                               max_piece_ops=max(1, len(piece.ops) // 2),
                               max_outputs=max_outputs, deadline=deadline,
                               choose_piece=choose_piece)
        out.pieces += sub.pieces
        out.stats.add(sub.stats)
        out.shards, out.checked = out.shards + sub.shards, out.checked + sub.checked
        out.unfinished += sub.unfinished
        out.saturated &= sub.saturated
        if sub.structure is None:
            return out
        structures.append(sub.structure)
    out.structure = join_pieces(program, pieces, structures)
    return out
