"""The search, sharded: ``search.run_search`` on an executor of this package.

The deepening driver and the device-free ranking live in ``search`` (``search.driver``,
``search.ranking``); what this adds is where the shards run (``runtime``: in this process or
as Ray tasks) and what a shard is (``search_tasks.run_and_verify``: enumerate, then verify in
the finite field).  A program searched in pieces joins, of each piece's verified structures,
the one the roofline estimate of ``piece_device`` ranks first (``kernels.rank_structures``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from kernels import DeviceSpec, rank_structures
from search import Limits, SearchResult, ShardResult, run_search
from search.ir import KernelGraph, Program, small_instance
from verifier import DEFAULT_TESTS

from .runtime import Executor, make_executor
from .search_tasks import verify_structure


def search_program(program: Program, limits: Limits | None = None, *, workers: int = 1,
                   address: str | None = None, time_limit_s: float | None = None,
                   tests: int = DEFAULT_TESTS, executor: Executor | None = None,
                   on_progress: Callable[[dict], None] | None = None,
                   done: Mapping[str, ShardResult] | None = None,
                   on_shard: Callable[[ShardResult], None] | None = None,
                   piece_device: str | DeviceSpec = "cpu") -> SearchResult:
    """Search ``program`` for verified structures; ranks them (fewest kernels first).

    Without ``executor``, one is made (Ray with ``workers`` CPUs, or joined at ``address``)
    and closed at the end.  ``done``, ``on_shard`` and the default time limit: see
    ``search.run_search``.  The result's ``reissued`` names the straggling shards this search
    copied to idle workers.  A program big enough to be searched in pieces gets one structure
    of the pieces' kernels (of each piece's, the one ``piece_device``'s roofline estimate
    ranks first), verified here against the whole program.
    """
    small = small_instance(program).build()

    def verify(structure: KernelGraph) -> tuple[bool, str]:
        return verify_structure(structure, small, tests)

    def choose_piece(structures: list[KernelGraph]) -> int:
        return rank_structures(structures, piece_device)[0]

    own = executor is None
    executor = executor or make_executor(workers, address)
    before = len(getattr(executor, "reissued", ()))
    try:
        result = run_search(program, limits, executor, time_limit_s=time_limit_s, tests=tests,
                            on_progress=on_progress, done=done, on_shard=on_shard,
                            verify=verify, choose_piece=choose_piece)
        result.reissued = list(getattr(executor, "reissued", ())[before:])
        return result
    finally:
        if own:
            executor.close()
