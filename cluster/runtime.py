"""Where shards run: in this process, or as Ray tasks (embedded or on a cluster).

Both executors satisfy ``search.Executor`` and take the task a shard runs as an argument
(``task(payload, shard) -> ShardResult``; default ``search_tasks.run_and_verify``), so the
driver in ``search`` never names the verifier and nothing here imports the driver.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable
from typing import Any

from search import Executor, Shard, ShardResult

from .search_tasks import run_and_verify

Task = Callable[[dict, Shard], ShardResult]


class LocalExecutor:
    """Runs shards one by one in this process (tests, and a machine without Ray)."""

    def __init__(self, task: Task = run_and_verify) -> None:
        self.workers = 1
        self.task = task
        self.queue: deque = deque()

    def submit(self, shard: Shard, payload: dict) -> None:
        self.queue.append((shard, payload))

    def next_result(self) -> ShardResult | None:
        if not self.queue:
            return None
        shard, payload = self.queue.popleft()
        return self.task(payload, shard)

    def close(self) -> None:
        self.queue.clear()


def start_ray(workers: int = 1, address: str | None = None) -> bool:
    """Join the Ray cluster at ``address``, or start an embedded one with ``workers`` CPUs;
    returns False when Ray was already running in this process (the caller must not stop it)."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if address:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    else:
        # a new embedded instance even when `ray start` left a cluster on this machine (Ray
        # would join that one and refuse num_cpus); workers at normal priority: they are the
        # job, not background work
        ray.init(address="local", num_cpus=workers, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR, object_store_memory=80 * 1024 * 1024,
                 _system_config={"worker_niceness": 0})
    return True


def stop_ray() -> None:
    import ray

    ray.shutdown()


class RayExecutor:
    """Shards as Ray tasks; a task whose worker dies is retried (``max_retries``)."""

    def __init__(self, workers: int = 1, address: str | None = None,
                 max_retries: int = 3, task: Task = run_and_verify) -> None:
        import ray

        self.ray = ray
        self.started = start_ray(workers, address)
        cpus = int(ray.cluster_resources().get("CPU", workers))
        self.workers = cpus if address else workers
        self.task = ray.remote(num_cpus=1, max_retries=max_retries)(task)
        self.inflight: list = []
        self._payload_ref: tuple[int, Any] | None = None

    def submit(self, shard: Shard, payload: dict) -> None:
        if self._payload_ref is None or self._payload_ref[0] is not payload:
            # keep the payload itself: an id() could be reused by a later search's payload
            self._payload_ref = (payload, self.ray.put(payload))
        self.inflight.append(self.task.remote(self._payload_ref[1], shard))

    def next_result(self) -> ShardResult | None:
        if not self.inflight:
            return None
        done, self.inflight = self.ray.wait(self.inflight, num_returns=1)
        return self.ray.get(done[0])

    def close(self) -> None:
        for ref in self.inflight:
            self.ray.cancel(ref, force=True)
        self.inflight = []
        if self.started:
            self.ray.shutdown()


def make_executor(workers: int = 1, address: str | None = None) -> Executor:
    """Ray, embedded (started here with ``workers`` CPUs) or joined at ``address``."""
    if workers < 1:
        raise ValueError(f"workers must be ≥ 1, got {workers}")
    return RayExecutor(workers, address)
