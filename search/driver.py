"""The deepening search driver: plan shards, hand them to an executor, collect the results.

The driver deepens each block configuration one op count at a time and stops it at the
first count that yields a verified structure (the smallest block graphs of that
configuration); it deepens the number of kernels the same way.  Every unit of work is a
``Shard`` with a stable id, run by whatever ``Executor`` the caller passes (in this process,
or Ray tasks that retry when their worker dies: ``cluster``); results are keyed by shard id,
so a retried shard is recorded once and the verified set does not depend on how many workers
ran it.  Verifying a shard's candidates is the executor's task, not the driver's: this module
imports nothing outside ``search``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from .enumerate import Context, Limits, Shard, Stats, plan_configs, split_shard
from .ir import KernelGraph, Program, from_obj, small_instance, structural_hash, to_obj
from .partition import ChoosePiece, compute_ops, needs_pieces, search_in_pieces
from .ranking import describe, flops, rank

log = logging.getLogger("search")


class Executor(Protocol):
    """Runs shards: ``submit`` one with the search's payload, ``next_result`` returns a
    finished one's ``ShardResult`` (blocking; None when nothing is in flight)."""

    workers: int

    def submit(self, shard: Shard, payload: dict) -> None: ...
    def next_result(self) -> ShardResult | None: ...
    def close(self) -> None: ...


@dataclass
class ShardResult:
    """What the executor's task returns for one shard: its statistics and the structures it
    verified (by structural hash), which the driver merges."""

    shard_id: str
    config_id: str
    stats: Stats
    verified: dict[str, dict]  # hash → canonical µGraph JSON object
    checked: int = 0
    rejected: int = 0
    elapsed_s: float = 0.0

    @property
    def complete(self) -> bool:
        """Whether the shard ran to its end (a shard cut by the deadline must run again)."""
        return not self.stats.timed_out

    def to_json(self) -> dict:
        """A JSON object for the database, so a resumed job skips this shard."""
        return {"shard_id": self.shard_id, "config_id": self.config_id,
                "stats": asdict(self.stats), "verified": self.verified,
                "checked": self.checked, "rejected": self.rejected,
                "elapsed_s": self.elapsed_s}

    @classmethod
    def from_json(cls, obj: dict) -> ShardResult:
        return cls(obj["shard_id"], obj["config_id"], Stats(**obj["stats"]),
                   dict(obj["verified"]), obj["checked"], obj["rejected"], obj["elapsed_s"])


# A configuration whose smallest verified block graphs all do more arithmetic than the program
# as written (lora's X·(W + A·B): A·B recomputed in every loop iteration) keeps deepening, up
# to this many ops past its first verified level, for one that does not ((X·A)·B after the
# loop); otherwise a configuration stops at its first verified level.
WASTE_EXTRA_OPS = 2
# "more arithmetic": at least this many times the program's (rmsnorm_matmul's structures do
# a few % more, recomputing the norm: deepening them took 10x the search and found nothing
# better)
WASTE_RATIO = 1.05
SPLIT_FROM_OPS = 7  # with several workers, shards of this many block ops or more are split
# The time limit when the caller sets none, per compute op of the program: the suite's
# slowest search (qknorm_gqa, 7 ops) takes 100-150 s with one worker on 2 loaded cores, inside
# its 210 s; a partitioned program's pieces take seconds each.
SECONDS_PER_OP = 30.0


def default_time_limit(ops: int) -> float:
    """The search's time limit, in seconds, for a program of ``ops`` compute ops when the
    caller gives none: it scales with the program."""
    return SECONDS_PER_OP * max(1, ops)


@dataclass
class SearchResult:
    program: str
    elapsed_s: float
    stats: Stats
    verified: dict[str, KernelGraph]
    structures: list[dict]
    shards_run: int
    checked: int
    first_single_kernel_s: float | None
    saturation: dict
    limits: Limits
    unfinished: list[str] = field(default_factory=list)
    reissued: list[str] = field(default_factory=list)  # shards the executor ran twice
    time_limit_s: float | None = None  # the limit in force (the caller's or the default)
    # a partitioned search: its pieces (one report each) and the whole structure's verdict
    partition: dict | None = None

    @property
    def time_limit_hit(self) -> bool:
        """Whether the search (or one of its pieces) stopped at its time limit: what it
        found is the best so far, not all there is within the other limits."""
        return self.stats.timed_out

    @property
    def best(self) -> dict | None:
        return self.structures[0] if self.structures else None

    def summary(self) -> dict[str, Any]:
        return {
            "program": self.program, "elapsed_s": round(self.elapsed_s, 3),
            "states_explored": self.stats.states, "pruned": self.stats.pruned,
            "invalid": self.stats.invalid, "candidates": self.stats.candidates,
            "checked": self.checked, "verified": len(self.verified),
            "timed_out": self.stats.timed_out, "shards": self.shards_run,
            "first_single_kernel_s": self.first_single_kernel_s,
            "saturation": self.saturation, "limits": _limits_dict(self.limits),
            "unfinished_configs": self.unfinished, "reissued_shards": self.reissued,
            "time_limit_s": self.time_limit_s, "time_limit_hit": self.time_limit_hit,
            "partition": self.partition,
            "structures": [{k: v for k, v in s.items() if k != "graph"}
                           for s in self.structures],
            "best": ({k: v for k, v in self.best.items() if k != "graph"}
                     if self.best else None),
        }


def _limits_dict(limits: Limits) -> dict:
    d = asdict(limits)
    d["kernel_ops"], d["block_ops"] = list(d["kernel_ops"]), list(d["block_ops"])
    return d


def run_search(program: Program, limits: Limits | None, executor: Executor, *,
               time_limit_s: float | None = None, tests: int | None = None,
               on_progress: Callable[[dict], None] | None = None,
               done: Mapping[str, ShardResult] | None = None,
               on_shard: Callable[[ShardResult], None] | None = None,
               verify: Callable[[KernelGraph], tuple[bool, str]] | None = None,
               choose_piece: ChoosePiece | None = None) -> SearchResult:
    """Search ``program`` for verified structures on ``executor``; ranks them (fewest kernels
    first).  The caller owns the executor (this does not close it).

    ``time_limit_s``: None means ``limits.time_limit_s`` or else ``default_time_limit`` of the
    program's op count; the result says whether it was hit (``time_limit_hit``, and a log
    line).  A program of more than ``limits.partition_above`` ops is searched in pieces
    (``search.partition``), each piece on ``executor``, and the pieces' best structures are
    joined into one; ``verify(structure) -> (ok, reason)`` checks the joined structure against
    the whole program (the caller's verifier: this package has none), and a structure it
    rejects is not returned; ``choose_piece`` picks each piece's structure among its verified
    ones (``search.partition.ChoosePiece``; None: the search's best).

    ``tests``: random tests per candidate, passed to the shard task in the payload (None: the
    task's default).  ``done`` holds shards finished by an earlier, interrupted run (by shard
    id): they are not run again, their results count as if they had just arrived.
    ``on_shard`` sees every shard this call runs, as it arrives, so a caller can save it
    before the next one finishes.
    """
    start = time.perf_counter()
    reference = program.build()
    given = limits or Limits()
    limits = given.for_program(len(reference.input_ids))
    ops = len(compute_ops(reference))
    if time_limit_s is None:
        time_limit_s = limits.time_limit_s or default_time_limit(ops)
    if needs_pieces(reference, limits.partition_above, limits.partition_min_heavy):
        return _search_pieces(program, given, executor, time_limit_s, tests, on_progress,
                              done or {}, on_shard, verify, start, choose_piece)
    small = small_instance(program).build()
    ctx = Context.build(reference, limits)
    payload = {"reference": to_obj(reference), "small": to_obj(small),
               "reference_hash": structural_hash(reference), "limits": _limits_dict(limits),
               "tests": tests, "nice": _niceness(),
               "deadline": time.time() + time_limit_s if time_limit_s else None}
    totals = Stats()
    results: dict[str, ShardResult] = {}
    verified: dict[str, KernelGraph] = {}
    first_single: float | None = None
    checked = 0
    unfinished: list[str] = []
    for kernels in range(1, limits.max_kernel_ops + 1):
        configs = plan_configs(ctx, kernels)
        before = set(results)
        unfinished = _deepen(ctx, configs, executor, payload, results, limits,
                             done or {}, on_shard)
        found_here = False
        for sid in sorted(set(results) - before):
            res = results[sid]
            totals.add(res.stats)
            checked += res.checked
            for h, obj in res.verified.items():
                if h not in verified:
                    verified[h] = from_obj(obj)
                    found_here = True
        if found_here and kernels == 1 and first_single is None:
            first_single = min(r.elapsed_s for r in results.values() if r.verified)
        if on_progress:
            on_progress({"states": totals.states, "verified": len(verified),
                         "elapsed_s": time.perf_counter() - start})
        if verified or _past(payload):
            break
    totals.timed_out |= _past(payload)
    structures = rank([describe(h, g) for h, g in verified.items()])
    sat = ctx.target
    result = SearchResult(program.name, time.perf_counter() - start, totals, verified,
                          structures, len(results), checked, first_single,
                          {"nodes": sat.nodes, "iterations": sat.iterations,
                           "saturated": sat.saturated, "seconds": round(sat.seconds, 3)},
                          limits, unfinished, time_limit_s=time_limit_s)
    _say_if_cut(result)
    return result


def _say_if_cut(result: SearchResult) -> None:
    if result.time_limit_hit:
        log.warning("%s: the search stopped at its time limit (%.0f s) after %.1f s; %d "
                    "verified structure(s) so far (set a longer time limit for more)",
                    result.program, result.time_limit_s or 0, result.elapsed_s,
                    len(result.verified))


def _search_pieces(program: Program, limits: Limits, executor: Executor, time_limit_s: float,
                   tests: int | None, on_progress: Callable[[dict], None] | None,
                   done: Mapping[str, ShardResult],
                   on_shard: Callable[[ShardResult], None] | None,
                   verify: Callable[[KernelGraph], tuple[bool, str]] | None,
                   start: float, choose_piece: ChoosePiece | None = None) -> SearchResult:
    """``run_search`` of a program cut into pieces: each piece searched alone on the
    executor (its shard ids, as ``done`` and ``on_shard`` see them, prefixed by the piece's
    name), their best structures joined, the joined structure verified by ``verify``."""
    piece_limits = replace(limits, partition_above=None)
    seen = {"states": 0, "verified": 0}

    def search_piece(piece: Program, limit: float) -> SearchResult:
        tag = f"{piece.name}/"
        mine = {sid[len(tag):]: replace(res, shard_id=res.shard_id[len(tag):])
                for sid, res in done.items() if sid.startswith(tag)}

        def saved(res: ShardResult) -> None:
            if on_shard is not None:
                on_shard(replace(res, shard_id=tag + res.shard_id))

        def progress(info: dict) -> None:
            if on_progress is not None:
                on_progress({**info, "states": seen["states"] + info["states"],
                             "elapsed_s": time.perf_counter() - start, "piece": piece.name})

        res = run_search(piece, piece_limits, executor, time_limit_s=limit, tests=tests,
                         on_progress=progress, done=mine, on_shard=saved)
        seen["states"] += res.stats.states
        return res

    found = search_in_pieces(program, search_piece, max_piece_ops=limits.max_piece_ops,
                             max_outputs=limits.max_block_outputs,
                             deadline=time.time() + time_limit_s - (time.perf_counter() - start),
                             choose_piece=choose_piece)
    verified: dict[str, KernelGraph] = {}
    whole: dict[str, Any] = {"pieces": found.pieces, "verified_whole": None, "reason": ""}
    if found.structure is None:
        whole["reason"] = "a piece found no structure, even cut down to single ops"
    else:
        ok, reason = verify(found.structure) if verify else (
            True, "not checked as a whole (no verifier given); every piece verified")
        whole["verified_whole"] = ok if verify else None
        whole["reason"] = reason
        if ok:
            verified[structural_hash(found.structure)] = found.structure
        else:
            log.warning("%s: the joined structure of %d pieces failed verification (%s)",
                        program.name, len(found.pieces), reason)
    if on_progress:
        on_progress({"states": found.stats.states, "verified": len(verified),
                     "elapsed_s": time.perf_counter() - start})
    result = SearchResult(program.name, time.perf_counter() - start, found.stats, verified,
                          rank([describe(h, g) for h, g in verified.items()]), found.shards,
                          found.checked, None, {"saturated": found.saturated,
                                                "pieces": len(found.pieces)},
                          limits.for_program(len(program.inputs)), found.unfinished,
                          time_limit_s=time_limit_s, partition=whole)
    _say_if_cut(result)
    return result


def _past(payload: dict) -> bool:
    return bool(payload.get("deadline")) and time.time() > payload["deadline"]


def _deepen(ctx: Context, configs: list[Shard], executor: Executor, payload: dict,
            results: dict[str, ShardResult], limits: Limits,
            done: Mapping[str, ShardResult],
            on_shard: Callable[[ShardResult], None] | None) -> list[str]:
    """Run every configuration at op counts 1, 2, … until it verifies something; returns
    the configurations that never did (within the limits).  Shards in ``done`` are taken
    from there instead of being run."""
    level = {c.config_id: (1 if c.inputs else 0) for c in configs}
    by_id = {c.config_id: c for c in configs}
    pending: dict[str, set[str]] = {}
    hit: dict[str, bool] = {}
    first_hit: dict[str, int] = {}  # configuration → op count of its first verified level
    flop_memo: dict[str, int] = {}
    ref_flops = flops(ctx.reference)

    def _wasteful(cid: str) -> bool:
        shards = [results[s] for s in results if results[s].config_id == cid]
        for res in shards:
            for h, obj in res.verified.items():
                if h not in flop_memo:
                    try:
                        flop_memo[h] = flops(from_obj(obj))
                    except ValueError:  # a loop of two steps does not fit: not wasteful
                        flop_memo[h] = 0
                if flop_memo[h] < WASTE_RATIO * ref_flops:
                    return False
        return True
    best = [10**9]  # smallest op count verified in any configuration so far

    def submit(cid: str) -> None:
        shard = by_id[cid].at(level[cid])
        parts = [shard]
        in_flight = len(pending) + 1 if started[0] else len(level)
        deep = executor.workers > 1 and shard.ops >= SPLIT_FROM_OPS
        if shard.id not in done and shard.inputs and (
                in_flight < 2 * executor.workers or deep or done):
            # too few configurations in flight to keep every worker busy, or a level deep
            # enough that one shard could hold the others up at the end: cut it by its first
            # op (the pieces partition the shard, so results do not change).  On a resumed
            # run, pieces an earlier run finished are reused however this run would cut.
            pieces = split_shard(ctx, shard)
            if in_flight < 2 * executor.workers or deep or (
                    pieces and all(p.id in done for p in pieces)):
                parts = pieces
        pending[cid], hit[cid] = {p.id for p in parts}, False
        for part in parts:
            if part.id in done:
                ready.append(done[part.id])
            else:
                executor.submit(part, payload)
        if not parts:
            del pending[cid]

    started = [False]
    ready: deque[ShardResult] = deque()
    for cid in list(level):
        submit(cid)
    started[0] = True
    while pending:
        res = ready.popleft() if ready else executor.next_result()
        if res is None:
            break
        if res.shard_id in results or res.config_id not in pending:
            continue  # a retried shard already recorded: keep the first result
        if on_shard is not None and res.shard_id not in done:
            on_shard(res)
        results[res.shard_id] = res
        cid = res.config_id
        hit[cid] |= bool(res.verified)
        pending[cid].discard(res.shard_id)
        if pending[cid]:
            continue
        del pending[cid]
        if hit[cid]:
            best[0] = min(best[0], level[cid])
            first_hit.setdefault(cid, level[cid])
            if not _wasteful(cid) or level[cid] >= min(limits.max_block_ops,
                                                       first_hit[cid] + WASTE_EXTRA_OPS):
                level[cid] = 0  # done: it verified
                continue
            level[cid] += 1  # every structure so far does more arithmetic than the program
            submit(cid)
            continue
        if cid in first_hit:  # a level past a wasteful hit found nothing: try the next
            if level[cid] < min(limits.max_block_ops, first_hit[cid] + WASTE_EXTRA_OPS):
                level[cid] += 1
                submit(cid)
            else:
                level[cid] = 0
            continue
        ceiling = limits.max_block_ops
        if limits.max_extra_ops is not None and best[0] < 10**9:
            ceiling = min(ceiling, best[0] + limits.max_extra_ops)
        if 0 < level[cid] < ceiling and not _past(payload):
            level[cid] += 1
            submit(cid)
        else:
            level[cid] = -1
    return sorted(cid for cid, lv in level.items() if lv == -1)


def _niceness() -> int | None:
    """This process's niceness, the priority its search shards run at (None: not known here)."""
    import os

    try:
        return os.nice(0)
    except (AttributeError, OSError):
        return None
