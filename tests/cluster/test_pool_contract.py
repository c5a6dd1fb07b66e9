"""What every measurement pool promises (``cluster.MeasurementPool``: ``LocalPool``, one slot
in the driver; ``ReplayPool``, recorded timings; ``SlotPool``, slots as Ray actors, here on the
cpu device and on a replay device as a recorded space's launch uses it).

The study driver (``tuner.pipeline.tune``) holds a pool without knowing which it is: it submits
while ``idle``, files every result under ``key`` by its ``tag`` and stores it by its status, so
each pool keeps the same promises:

- ``key`` is the key of the device that measures, ``spec`` its ``kernels.DeviceSpec``; a new
  pool is idle and ``next_done`` with nothing in flight answers None at once;
- each submit takes one of ``idle``; every request comes back exactly once, as a
  ``TrialResult`` with the request's tag (any order), a status of the kernels' vocabulary and
  the node that measured it in ``host``, and then None, the pool idle again;
- a trial that measured carries its config and timing; a config that does not lower is an
  ``invalid`` result, a trial that fails (a kernel past its time limit, a recorded failure) a
  result with that status, never an exception, and the pool goes on measuring;
- a baseline request comes back with the op-by-op time of its reference;
- a request sent as the mapping of its fields is answered as the request itself;
- ``close`` drops what is still in flight, may be called again, and leaves no slot actor or
  kernel worker process running.

Real workloads: rmsnorm_matmul at 16x64 @ 64x64 on this cpu, and the convolution Kernel Tuner
cache (A100) on the replay device.  One embedded Ray for the module.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from support import shared_cache

import db
from cluster import (
    LocalPool,
    MeasurementPool,
    MeasureSlot,
    ReplayPool,
    SlotPool,
    TrialRequest,
    TrialResult,
    start_ray,
    stop_ray,
)
from costmodel import read_kernel_tuner
from kernels import (
    INVALID,
    MEASUREMENT_STATUSES,
    OK,
    TIMEOUT,
    TRIAL_STATUSES,
    DeviceSpec,
    ReplayDevice,
    config_space,
    device_key,
    get_device,
)
from search import handwritten, load_program, to_obj
from tuner.pipeline.recorded import replay_spec, replay_table

CONV = shared_cache("convolution", "A100")
pytestmark = pytest.mark.skipif(not CONV.exists(), reason=f"no Kernel Tuner cache at {CONV}")

VOCABULARY = set(TRIAL_STATUSES) | set(MEASUREMENT_STATUSES)
TIMING = {"warmup": 1, "min_repeats": 3, "budget_s": 0.05}
# at least 50 samples of at least 0.1 ms each: past a 1 ms limit on any machine
SLOW = ({"warmup": 1, "min_repeats": 50, "budget_s": 1.0}, 1e-3)
BASELINE_S = 2.5e-3  # the replay device's recorded op-by-op time


@dataclass
class Workload:
    """Requests one device answers: ``good`` configs that measure ok, one ``invalid`` config
    (it does not lower, or is not in the recorded table), and one ``failing`` trial with the
    status it must come back with."""

    device: Callable[[], Any]  # what a slot is made with: a device name or a new Device
    key: str
    spec: DeviceSpec
    reference: dict
    structure: dict
    good: list[dict[str, int]]
    invalid: dict[str, int]
    failing: TrialRequest
    failing_status: str
    baseline_s: float | None = None  # the exact baseline, where the device recorded one
    table: dict[str, dict] = field(default_factory=dict)  # a replay device's recorded trials

    def trial(self, config: dict[str, int], tag: Any) -> TrialRequest:
        return TrialRequest(self.reference, self.structure, config, tag=tag, timing=TIMING)


def cpu_workload() -> Workload:
    program = load_program("rmsnorm_matmul", {"X": "16x64", "W": "64x64"})
    structure = handwritten(program)
    space = config_space(structure, "cpu")
    reference, structure_obj = to_obj(program.build()), to_obj(structure)
    good = [dict(space.default)] + [c for c in (
        {**space.default, "F": 2}, {**space.default, "g0": 4}, {**space.default, "F": 4})
        if space.check(c) is None]
    timing, limit = SLOW
    return Workload(lambda: "cpu", device_key("cpu"), get_device("cpu").spec, reference,
                    structure_obj, good, {**space.default, "g0": 7},
                    TrialRequest(reference, structure_obj, space.default, tag="failing",
                                 timing=timing, timeout_s=limit), TIMEOUT)


def replay_workload() -> Workload:
    space = read_kernel_tuner(CONV)
    table = replay_table(space, str(CONV))
    spec = replay_spec(space.device)
    ok = [r["config"] for r in table.values() if r["status"] == OK][:4]
    failed = next(r for r in table.values() if r["status"] != OK)
    invalid = {k: 3 for k in space.keys}
    assert db.config_hash(invalid) not in table
    reference = to_obj(load_program("softmax_rows", {"rows": 8, "cols": 16}).build())
    return Workload(lambda: ReplayDevice(table, db.config_hash, space.device_key, spec,
                                         BASELINE_S),
                    space.device_key, spec, reference, {}, ok, invalid,
                    TrialRequest(reference, {}, failed["config"], tag="failing"),
                    failed["status"], BASELINE_S, table)


WORKLOADS = {"cpu": cpu_workload, "replay": replay_workload}
POOLS: dict[str, tuple[str, Callable[[Workload], MeasurementPool]]] = {
    "local-cpu": ("cpu", lambda w: LocalPool(MeasureSlot(w.device()))),
    "replay": ("replay", lambda w: ReplayPool(w.table, db.config_hash, w.key, w.spec,
                                              w.baseline_s)),
    "slot-cpu": ("cpu", lambda w: SlotPool(w.device(), 1)),
    # two slots that reserve nothing, as a recorded space's launch on a Ray without GPUs
    # (tuner.pipeline.recorded.replay_slots) but with two requests truly in flight
    "slot-replay": ("replay", lambda w: SlotPool(w.device(), 2, resources={"num_cpus": 0})),
}


@pytest.fixture(scope="module")
def ray_up():
    started = start_ray(2)
    yield
    if started:
        stop_ray()


@pytest.fixture(scope="module")
def workloads() -> dict[str, Workload]:
    return {}


def make(kind: str, request: pytest.FixtureRequest, workloads: dict[str, Workload]
         ) -> tuple[MeasurementPool, Workload]:
    device, factory = POOLS[kind]
    if device not in workloads:
        workloads[device] = WORKLOADS[device]()
    if kind.startswith("slot"):
        request.getfixturevalue("ray_up")
    work = workloads[device]
    return factory(work), work


@pytest.fixture(scope="module", params=sorted(POOLS))
def shared_pool(request, workloads):
    pool, work = make(request.param, request, workloads)
    yield pool, work
    pool.close()


@pytest.fixture
def pool_and_work(shared_pool):
    """The module's pool of one kind, drained after each test (a failed test leaves nothing
    in flight for the next)."""
    yield shared_pool
    while shared_pool[0].next_done() is not None:
        pass


def nodes(pool: MeasurementPool) -> set[str]:
    """The node labels of the pool's slots (what ``host`` may name)."""
    if isinstance(pool, SlotPool):
        return {label for label, _ in pool.placement()}
    assert isinstance(pool, LocalPool)
    return {pool.slot.node}


def drive(pool: MeasurementPool, requests: list[tuple[Any, Any]]) -> dict[Any, TrialResult]:
    """Run ``(method, request)`` pairs as the study driver does (submit while idle, then
    wait for the next result); each tag must come back exactly once."""
    capacity, todo, back = pool.idle, list(requests), {}
    inflight: set[Any] = set()
    while todo or inflight:
        while pool.idle and todo:
            method, request = todo.pop(0)
            before = pool.idle
            pool.submit(method, request)
            assert pool.idle == before - 1
            inflight.add(TrialRequest.of(request).tag)
        assert inflight, "the pool took no request while idle"
        res = pool.next_done()
        assert isinstance(res, TrialResult), res
        assert res.tag in inflight and res.tag not in back, res.tag
        inflight.discard(res.tag)
        back[res.tag] = res
        assert res.status in VOCABULARY, res.status
        assert res.host in nodes(pool), (res.host, nodes(pool))
    assert pool.next_done() is None and pool.idle == capacity
    return back


def test_a_pool_names_its_device_and_starts_idle(pool_and_work) -> None:
    pool, work = pool_and_work
    assert pool.key == work.key and isinstance(pool.key, str)
    assert isinstance(pool.spec, DeviceSpec) and pool.spec == work.spec
    assert isinstance(pool.idle, int) and pool.idle >= 1
    t0 = time.monotonic()
    assert pool.next_done() is None and time.monotonic() - t0 < 1.0  # no wait on nothing


def test_every_request_in_flight_comes_back_once_with_its_tag(pool_and_work) -> None:
    pool, work = pool_and_work
    requests = [("trial", work.trial(c, i)) for i, c in enumerate(work.good)]
    requests.insert(1, ("trial", work.trial(work.invalid, "invalid")))
    requests.insert(2, ("baseline", TrialRequest(work.reference, tag=("base", 1))))
    back = drive(pool, requests)
    assert set(back) == {TrialRequest.of(r).tag for _, r in requests}
    for i, config in enumerate(work.good):
        res = back[i]
        assert res.status == OK, res.message
        assert res.config == config and res.median_s and res.median_s > 0 and res.samples


def test_a_config_that_does_not_lower_is_an_invalid_result(pool_and_work) -> None:
    pool, work = pool_and_work
    res = drive(pool, [("trial", work.trial(work.invalid, "bad"))])["bad"]
    assert res.status == INVALID and res.message and res.median_s is None
    assert res.config == work.invalid


def test_a_failing_trial_is_a_result_and_the_pool_measures_on(pool_and_work) -> None:
    pool, work = pool_and_work
    back = drive(pool, [("trial", work.failing), ("trial", work.trial(work.good[0], "after"))])
    assert back["failing"].status == work.failing_status, back["failing"].message
    assert back["failing"].median_s is None and back["failing"].message
    assert back["after"].status == OK, back["after"].message


def test_a_baseline_comes_back_with_the_references_op_by_op_time(pool_and_work) -> None:
    pool, work = pool_and_work
    res = drive(pool, [("baseline", TrialRequest(work.reference, tag="baseline"))])["baseline"]
    assert res.status == OK and res.baseline_s and res.baseline_s > 0
    if work.baseline_s is not None:
        assert res.baseline_s == work.baseline_s


def test_a_request_sent_as_a_mapping_is_answered_as_the_request(pool_and_work) -> None:
    pool, work = pool_and_work
    config = work.good[0]
    res = drive(pool, [("trial", {"reference": work.reference, "structure": work.structure,
                                  "config": config, "tag": "mapped", "timing": TIMING})])
    assert res["mapped"].status == OK and res["mapped"].config == config


def _processes(pool: MeasurementPool) -> list[int]:
    """The pids the pool holds: each slot's kernel worker, and on Ray each slot's actor."""
    if isinstance(pool, SlotPool):
        import ray

        pids = ray.get([s.__ray_call__.remote(lambda slot: (os.getpid(), slot.worker.pid))
                        for s in pool.slots])
        return [p for pair in pids for p in pair if p is not None]
    assert isinstance(pool, LocalPool)
    return [p for p in [pool.slot.worker.pid] if p is not None]


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("kind", sorted(POOLS))
def test_close_drops_what_is_in_flight_and_leaves_nothing_running(kind, request,
                                                                  workloads) -> None:
    pool, work = make(kind, request, workloads)
    try:
        drive(pool, [("trial", work.trial(work.good[0], "warm"))])  # the workers are up
        held = _processes(pool)
        assert held or isinstance(pool, ReplayPool)  # a replay slot builds nothing
        actors = list(pool.slots) if isinstance(pool, SlotPool) else []
        while pool.idle:
            pool.submit("trial", work.trial(work.good[0], "dropped"))
    finally:
        pool.close()
    assert pool.next_done() is None  # close dropped the requests in flight
    pool.close()  # again: nothing to release, no error
    assert pool.next_done() is None
    deadline = time.monotonic() + 15
    while any(map(_running, held)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in held if _running(p)]
    if actors:
        import ray

        for actor in actors:
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(actor.where.remote(), timeout=30)
