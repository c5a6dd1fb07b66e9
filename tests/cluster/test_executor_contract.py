"""What every executor of the search's shards promises (``search.Executor``: ``LocalExecutor``
in this process, ``RayExecutor`` on Ray workers).

The driver (``search.run_search``) holds an executor without knowing where its shards run, so
each keeps the same promises:

- ``workers`` is how many shards may run at once (at least 1);
- ``next_result`` with nothing in flight answers None at once;
- every submitted shard comes back exactly once, as what the executor's task returned for
  it with the payload it was submitted with (in any order), and then None;
- ``close`` drops what is still in flight;
- the search on it finds the same verified set as on any other executor.
"""

from __future__ import annotations

import sys

import pytest
from ray import cloudpickle

from cluster import LocalExecutor, RayExecutor, search_program
from search import Limits, Shard, ShardResult, Stats
from search.ir import load_program

# the task below travels to Ray workers by value (they cannot import this test module)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def echo(payload: dict, shard: Shard) -> ShardResult:
    """A task that reports which shard it ran and with what payload."""
    return ShardResult(shard.id, shard.config_id, Stats(),
                       {shard.id: {"tag": payload["tag"], "ops": shard.ops}})


EXECUTORS = {  # each made with its default task (enumerate and verify) or the one given
    "local": lambda **task: LocalExecutor(**task),
    "ray": lambda **task: RayExecutor(2, speculation=None, **task),
}
SHARDS = [Shard(prefix=(), inputs=(0, 1), grid=(2,), loop=1, ops=n) for n in range(1, 6)]
PROGRAM = ("softmax_rows", {"rows": 16, "cols": 16})
LIMITS = Limits(max_block_ops=4, block_ops=("exp", "div", "sum", "accum"), max_extra_ops=None)


@pytest.fixture(scope="module")
def reference_set():
    program = load_program(*PROGRAM)
    return set(search_program(program, LIMITS, executor=LocalExecutor()).verified)


@pytest.mark.parametrize("kind", sorted(EXECUTORS))
def test_every_executor_keeps_the_drivers_promises(kind, reference_set):
    executor = EXECUTORS[kind](task=echo)
    try:
        assert isinstance(executor.workers, int) and executor.workers >= 1
        assert executor.next_result() is None
        for shard in SHARDS:
            executor.submit(shard, {"tag": kind})
        back = []
        while (result := executor.next_result()) is not None:
            back.append(result)
        assert sorted(r.shard_id for r in back) == sorted(s.id for s in SHARDS)
        assert all(r.verified == {r.shard_id: {"tag": kind, "ops": s.ops}}
                   for r in back for s in SHARDS if s.id == r.shard_id)
        executor.submit(SHARDS[0], {"tag": kind})
    finally:
        executor.close()
    assert executor.next_result() is None  # close dropped the shard in flight

    executor = EXECUTORS[kind]()
    try:
        result = search_program(load_program(*PROGRAM), LIMITS, executor=executor)
    finally:
        executor.close()
    assert reference_set and set(result.verified) == reference_set
