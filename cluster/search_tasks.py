"""The worker side of the search: enumerate one shard and verify what it yields.

What a Ray task (or the local executor) runs for the driver in ``search.driver``: the
executors (``runtime``) take it as their task, so the driver never names the verifier.
"""

from __future__ import annotations

import os
import time

from search import Context, Limits, Shard, ShardResult, run_shard
from search.ir import KernelGraph, from_obj, structural_hash, to_obj
from verifier import DEFAULT_TESTS, equivalent

_CONTEXTS: dict[tuple, tuple[Context, KernelGraph]] = {}


def _context(payload: dict) -> tuple[Context, KernelGraph]:
    """One Context per worker process and job (saturating the target once)."""
    key = (payload["reference_hash"], repr(payload["limits"]))
    if key not in _CONTEXTS:
        reference = from_obj(payload["reference"])
        small = from_obj(payload["small"])
        _CONTEXTS.clear()
        _CONTEXTS[key] = (Context.build(reference, Limits(**payload["limits"])), small)
    return _CONTEXTS[key]


# what every grid / for-loop symbol is bound to at the small instance, in turn: 2 (several
# blocks and for-loop iterations), then 1 (one block, one iteration: each for-loop chunk is
# the whole dim).  At 2 alone, a structure that squares each chunk's sum passed on a dim of 2
# (chunks of one element: the square of the sum is the sum of squares) and was wrong for every
# other config (random_4101 of the dataset: sqrt(sum(X^2, 0)) on X of 2x16x16).
VERIFY_BINDINGS = (2, 1)


def verify_structure(structure: KernelGraph, small_reference: KernelGraph,
                     tests: int = DEFAULT_TESTS) -> tuple[bool, str]:
    """Verify at the small instance with every grid / for-loop symbol bound to each value of
    ``VERIFY_BINDINGS`` in turn (a binding the shapes refuse, after the first, is skipped)."""
    symbols = sorted(structure.symbols())
    shapes = small_reference.input_shapes()
    reason = ""
    for n, value in enumerate(VERIFY_BINDINGS if symbols else VERIFY_BINDINGS[:1]):
        try:
            small = structure.replay(shapes, {s: value for s in symbols})
        except ValueError as err:
            if n == 0:
                return False, f"cannot instantiate small: {err}"
            continue
        verdict = equivalent(small_reference, small, tests=tests)
        where = f" (every symbol bound to {value})" if n else ""
        if not verdict.equivalent:
            return False, verdict.reason + where
        if verdict.output_map != sorted(verdict.output_map):
            # equal up to output order: a structure returns its outputs in the program's order
            return False, f"outputs in another order ({verdict.output_map}){where}"
        reason = reason or verdict.reason
    return True, reason


def run_and_verify(payload: dict, shard: Shard) -> ShardResult:
    """The unit of distributed work: enumerate one shard, verify what it yields."""
    _maybe_inject_fault(shard)
    _normal_priority(payload.get("nice"))
    start = time.perf_counter()
    ctx, small = _context(payload)
    if payload.get("deadline"):
        remaining = payload["deadline"] - time.time()
        ctx.limits = Limits(**{**payload["limits"], "time_limit_s": max(0.01, remaining)})
    found, stats = run_shard(ctx, shard)
    verified: dict[str, dict] = {}
    checked = rejected = 0
    seen: set[str] = set()
    for graph in found:
        h = structural_hash(graph)
        if h in seen:
            continue
        seen.add(h)
        checked += 1
        ok, _ = verify_structure(graph, small, payload.get("tests") or DEFAULT_TESTS)
        if ok:
            verified[h] = to_obj(graph)
        else:
            rejected += 1
    return ShardResult(shard.id, shard.config_id, stats, verified, checked, rejected,
                       time.perf_counter() - start)


def _normal_priority(nice: int | None = None) -> None:
    """Ray starts workers at nice 15; a shard is the job's main work, not background work: it
    runs at the niceness of the process that launched the search (``nice``; 0 when not said),
    never above it.  A shard run in that process itself (the local executor) leaves it as it
    is: a `nice -n 10` test run or launch was raised to nice 0 by its first shard."""
    try:
        now, goal = os.nice(0), max(0, nice if nice is not None else 0)
        if now > goal:
            os.nice(goal - now)
    except OSError:
        pass  # not allowed to raise priority here; run as we are


def _maybe_inject_fault(shard: Shard) -> None:
    """Fault injection for the kill test: the first task to run after the marker directory
    is named kills its own worker process, once."""
    marker_dir = os.environ.get("TUNER_FAULT_KILL_ONCE")
    if not marker_dir:
        return
    marker = os.path.join(marker_dir, "killed")
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, shard.id.encode())
    os.close(fd)
    os._exit(137)
