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


class ClusterJoinError(ConnectionError):
    """Joining a running Ray cluster failed; the message is one line saying what to do."""


TOKEN_HINT = ("copy the head node's ~/.ray/auth_token to this machine's ~/.ray/auth_token "
              "(or export RAY_AUTH_TOKEN=<the head's `ray get-auth-token`>), then launch again")


def token_auth_for_join() -> bool | None:
    """Read Ray's auth token the way Ray's CLI does before a driver joins by address.

    Ray >= 2.52 starts clusters with token authentication on; ``ray.init(address=...)``
    only sends the token (``~/.ray/auth_token``, ``RAY_AUTH_TOKEN`` or
    ``RAY_AUTH_TOKEN_PATH``) when token mode is on in the driver, which ``ray start`` and
    ``address="auto"`` switch on and an explicit address did not: every launch with
    ``--address`` failed with InvalidAuthToken.  An explicit ``RAY_AUTH_MODE`` is left
    alone.  Returns whether token mode is on (None: this Ray has no token auth)."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None:
        return mode.lower() == "token"
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # an older Ray: no token authentication
        return None
    quiet = logging.getLogger(maybe_enable_token_auth_if_token_available.__module__)
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its "token authentication is enabled" warning
    try:
        return maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    finally:
        quiet.setLevel(level)


def join_ray(address: str) -> None:
    """``ray.init`` at ``address`` with the auth token when there is one; a failure to
    connect becomes ``ClusterJoinError`` with one line on what to do."""
    import ray

    token = token_auth_for_join()
    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    except (ConnectionError, RuntimeError) as err:
        first = (str(err).splitlines() or [type(err).__name__])[0]
        if token is False or "auth" in str(err).lower():
            raise ClusterJoinError(
                f"could not join the Ray cluster at {address} ({first}); if it was started "
                f"with token authentication (Ray's default), {TOKEN_HINT}") from None
        raise ClusterJoinError(f"could not join the Ray cluster at {address} ({first}); "
                               "check the address (`ray status` on the head prints it) and "
                               "that this machine can reach its port") from None


def start_ray(workers: int = 1, address: str | None = None,
              num_gpus: int | None = None) -> bool:
    """Join the Ray cluster at ``address``, or start an embedded one with ``workers`` CPUs
    (and ``num_gpus`` GPUs, default: the ones Ray detects); returns False when Ray was
    already running in this process (the caller must not stop it)."""
    import ray

    if ray.is_initialized():
        return False
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if address:
        join_ray(address)
    else:
        # a new embedded instance even when `ray start` left a cluster on this machine (Ray
        # would join that one and refuse num_cpus); workers at normal priority: they are the
        # job, not background work
        ray.init(address="local", num_cpus=workers, num_gpus=num_gpus, include_dashboard=False,
                 log_to_driver=False,
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
