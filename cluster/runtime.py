"""Where shards run: in this process, or as Ray tasks (embedded or on a cluster).

Both executors satisfy ``search.Executor`` and take the task a shard runs as an argument
(``task(payload, shard) -> ShardResult``; default ``search_tasks.run_and_verify``), so the
driver in ``search`` never names the verifier and nothing here imports the driver.
"""

from __future__ import annotations

import logging
import os
import statistics
import subprocess
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
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


_PROBE = """
import sys
from ray._raylet import GcsClient
try:
    GcsClient(address=sys.argv[1]).internal_kv_get(b"tuner-auth-probe", None, timeout=5)
except Exception as err:
    print(type(err).__name__)
    sys.exit(3)
"""


def cluster_wants_token(address: str, timeout_s: float = 20.0) -> bool | None:
    """Whether the Ray cluster at ``address`` refuses a client that sends no auth token:
    True, False, or None when it cannot tell (unreachable, another Ray).  Asked from a child
    process with token mode off (Ray caches the mode per process; the refusal's warning goes
    to the child's stderr)."""
    try:
        res = subprocess.run([sys.executable, "-c", _PROBE, address], capture_output=True,
                             text=True, timeout=timeout_s,
                             env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode == 0:
        return False
    return True if "AuthenticationError" in res.stdout else None


def token_auth_for_join(address: str | None = None) -> bool | None:
    """Read Ray's auth token the way Ray's CLI does before a driver joins by address.

    Ray >= 2.52 starts clusters with token authentication on; ``ray.init(address=...)``
    only sends the token (``~/.ray/auth_token``, ``RAY_AUTH_TOKEN`` or
    ``RAY_AUTH_TOKEN_PATH``) when token mode is on in the driver, which ``ray start`` and
    ``address="auto"`` switch on and an explicit address did not: every launch with
    ``--address`` failed with InvalidAuthToken.  The converse breaks too: a driver in token
    mode on a cluster started without it joins, but the cluster's workers cannot call it back,
    so no actor ever starts (every measurement slot "cancelled before it started running").
    So a cluster at ``address`` that answers without a token is joined without one, whatever
    token file this machine has.  An explicit ``RAY_AUTH_MODE`` is left alone.  Returns
    whether token mode is on (None: this Ray has no token auth)."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None:
        return mode.lower() == "token"
    wants = cluster_wants_token(address) if address else None
    if wants is False:
        return False
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
        enabled = maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    finally:
        quiet.setLevel(level)
    if wants and not enabled:  # say so now, not after ray.init's ~20 s of refused retries
        raise ClusterJoinError(f"could not join the Ray cluster at {address}: it uses token "
                               f"authentication and this machine has no token; {TOKEN_HINT}")
    return enabled


def join_ray(address: str) -> None:
    """``ray.init`` at ``address`` with the auth token when there is one; a failure to
    connect becomes ``ClusterJoinError`` with one line on what to do."""
    import ray

    token = token_auth_for_join(address)
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


@dataclass
class _Copy:
    """One Ray task running a shard: what to re-issue it with, and when it was sent."""

    shard: Shard
    payload_ref: Any
    sent: float


@dataclass(frozen=True)
class Speculation:
    """When a straggling shard is copied to an idle worker: once it has been out longer than
    ``factor`` x the median finished shard's run time and at least ``floor_s`` (so the usual
    spread of shard times copies nothing); at most ``copies`` extra copies of one shard."""

    factor: float = 4.0
    floor_s: float = 2.0
    copies: int = 1

    def threshold(self, finished: list[float]) -> float:
        return max(self.floor_s, self.factor * statistics.median(finished) if finished else 0.0)


DEFAULT_SPECULATION = Speculation()


class RayExecutor:
    """Shards as Ray tasks; a task whose worker dies is retried (``max_retries``), and a
    shard that straggles while a worker is idle is re-issued there (``Speculation``; None:
    never): the first copy to finish wins, the others are cancelled.  A shard's result does
    not depend on where it ran, so the verified set is the same; a slow node no longer
    holds the search for as long as it takes.  ``reissued`` lists the re-issued shard ids;
    ``on_reissue(shard_id, out_s, threshold_s)`` hears of each as it happens."""

    def __init__(self, workers: int = 1, address: str | None = None,
                 max_retries: int = 3, task: Task = run_and_verify,
                 speculation: Speculation | None = DEFAULT_SPECULATION) -> None:
        import ray

        self.ray = ray
        self.started = start_ray(workers, address)
        cpus = int(ray.cluster_resources().get("CPU", workers))
        self.workers = cpus if address else workers
        # SPREAD: shards go round the nodes with a free CPU, so every node of a cluster takes
        # part (the default packs short tasks onto the nodes whose workers are warm)
        self.task = ray.remote(num_cpus=1, max_retries=max_retries,
                               scheduling_strategy="SPREAD")(task)
        self.inflight: dict[Any, _Copy] = {}
        self.speculation = speculation
        self.finished_s: list[float] = []
        self.reissued: list[str] = []
        self.on_reissue: Callable[[str, float, float], None] | None = None
        self._payload_ref: tuple[dict, Any] | None = None

    def submit(self, shard: Shard, payload: dict) -> None:
        if self._payload_ref is None or self._payload_ref[0] is not payload:
            # keep the payload itself: an id() could be reused by a later search's payload
            self._payload_ref = (payload, self.ray.put(payload))
        self._send(shard, self._payload_ref[1])

    def _send(self, shard: Shard, payload_ref: Any) -> None:
        ref = self.task.remote(payload_ref, shard)
        self.inflight[ref] = _Copy(shard, payload_ref, time.monotonic())

    def next_result(self) -> ShardResult | None:
        """The first shard to finish; while none does, straggling shards are re-issued to
        idle workers.  A copy that fails while another copy of its shard still runs is
        forgotten; the last copy's failure is raised."""
        while self.inflight:
            done, _ = self.ray.wait(list(self.inflight), num_returns=1,
                                    timeout=self._poll_s())
            if not done:
                self._speculate()
                continue
            copy = self.inflight.pop(done[0])
            others = [r for r, c in self.inflight.items() if c.shard.id == copy.shard.id]
            try:
                result = self._result(self.ray.get(done[0]))
            except Exception:
                if others:
                    continue  # another copy of this shard still runs: wait for it
                raise
            for ref in others:  # the losers: their result would be the same
                del self.inflight[ref]
                self.ray.cancel(ref)
            self.finished_s.append(result.elapsed_s)
            return result
        return None

    def _result(self, value: Any) -> ShardResult:
        """What the task returned, as the shard's result (a subclass whose task returns more
        unpacks it here)."""
        return value

    def _poll_s(self) -> float | None:
        """How long to wait for a result before looking for stragglers (None: no limit)."""
        if self.speculation is None:
            return None
        return min(0.25, max(0.02, self.speculation.threshold(self.finished_s) / 8))

    def _speculate(self) -> None:
        """Copy the longest-out stragglers to idle CPUs of the cluster, one copy each.

        Idle is what Ray reports free, not workers minus tasks in flight: tasks queued behind
        a straggler on its node count as in flight but hold no CPU."""
        spec = self.speculation
        if spec is None:
            return
        now, limit = time.monotonic(), spec.threshold(self.finished_s)
        copies = Counter(c.shard.id for c in self.inflight.values())
        oldest: dict[str, _Copy] = {}
        for c in self.inflight.values():
            if c.shard.id not in oldest or c.sent < oldest[c.shard.id].sent:
                oldest[c.shard.id] = c
        late = sorted((c for c in oldest.values()
                       if now - c.sent > limit and copies[c.shard.id] <= spec.copies),
                      key=lambda c: c.sent)
        if not late:
            return
        idle = int(self.ray.available_resources().get("CPU", 0))
        for c in late[:idle]:
            self._send(c.shard, c.payload_ref)
            self.reissued.append(c.shard.id)
            if self.on_reissue is not None:
                self.on_reissue(c.shard.id, now - c.sent, limit)

    def close(self) -> None:
        for ref in self.inflight:
            self.ray.cancel(ref, force=True)
        self.inflight = {}
        if self.started:
            self.ray.shutdown()


def make_executor(workers: int = 1, address: str | None = None) -> Executor:
    """Ray, embedded (started here with ``workers`` CPUs) or joined at ``address``."""
    if workers < 1:
        raise ValueError(f"workers must be ≥ 1, got {workers}")
    return RayExecutor(workers, address)
