"""Measurement slots: the processes that hold a device and time trials on it.

One slot per GPU (a Ray actor with ``num_gpus=1``) or one per CPU node (a CPU kernel uses
every core through OpenMP, so two slots on one machine would time each other).  A slot keeps
an isolated kernel worker (``kernels.isolate``) alive across trials, so a candidate that
crashes or hangs costs its own worker, never the slot or the driver.  The driver hands out
trials (``TrialRequest``) and receives ``TrialResult``s; it alone writes the database (one
writer).  ``MeasurementPool`` is what a driver may call on a pool: ``SlotPool`` (Ray actors),
``LocalPool`` (one slot in the driver) and ``ReplayPool`` (recorded timings) all satisfy it.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from kernels import Device, DeviceSpec, IsolatedWorker, ReplayDevice, get_device, thread_env
from search import from_obj

Method = Literal["trial", "baseline"]


@dataclass(frozen=True)
class TrialRequest:
    """What goes to a slot: a ``trial`` (``structure`` bound by ``config``, checked against
    ``reference``, timed) or a ``baseline`` (``reference`` op by op; no structure, no config).

    Graphs travel as canonical JSON objects (``search.to_obj``).  ``tag`` comes back on the
    result, so a driver with several requests in flight knows which one finished.
    ``timeout_s`` None: the method's default (60 s a trial, 600 s a baseline)."""

    reference: dict
    structure: dict | None = None
    config: Mapping[str, int] = field(default_factory=dict)
    tag: Any = None
    seed: int = 0
    timing: Mapping | None = None
    timeout_s: float | None = None

    @classmethod
    def of(cls, request: TrialRequest | Mapping[str, Any]) -> TrialRequest:
        """A request as is, or built from the mapping of its fields (callers that still send
        dicts: unknown keys are an error)."""
        if isinstance(request, TrialRequest):
            return request
        return cls(**request)


@dataclass
class TrialResult:
    """What comes back from a slot: ``Device.run_trial``'s outcome, or a baseline's.

    ``status``: one of ``kernels.STATUSES``, or "invalid" (the config does not lower); times in
    seconds.  ``extra`` keeps whatever else a recorded (replayed) result carried.  ``get`` and
    ``[]`` read a field by name, for callers written against the dicts this replaced."""

    status: str
    tag: Any = None
    message: str = ""
    config: dict[str, int] | None = None
    source: str | None = None
    median_s: float | None = None
    spread_s: float | None = None
    samples: list[float] | None = None
    max_error: float | None = None
    kernels: int | None = None
    host: str | None = None
    wall_s: float | None = None
    baseline_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, out: Mapping[str, Any], tag: Any = None) -> TrialResult:
        """From ``Device.run_trial``'s dict (or a recorded one); ``tag`` unless it has one."""
        known = {k: v for k, v in out.items() if k in _RESULT_FIELDS and k != "extra"}
        known.setdefault("tag", tag)
        extra = {k: v for k, v in out.items() if k not in _RESULT_FIELDS}
        return cls(**known, extra=extra)

    def get(self, name: str, default: Any = None) -> Any:
        if name in _RESULT_FIELDS and name != "extra":
            value = getattr(self, name)
            return default if value is None else value
        return self.extra.get(name, default)

    def __getitem__(self, name: str) -> Any:
        if name in _RESULT_FIELDS and name != "extra":
            return getattr(self, name)
        return self.extra[name]


_RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(TrialResult))  # what get/[] read


class MeasurementPool(Protocol):
    """Where a driver sends measurement requests, for one device.

    ``key``: the device key results are filed under; ``spec``: its ``kernels.DeviceSpec``;
    ``idle``: how many requests it can take now.  ``submit`` a request (only when ``idle``);
    ``next_done`` blocks for the next finished one's result (None when nothing is in flight);
    ``close`` releases the slots."""

    key: str
    spec: DeviceSpec

    @property
    def idle(self) -> int: ...
    def submit(self, method: Method, request: TrialRequest) -> None: ...
    def next_done(self) -> TrialResult | None: ...
    def close(self) -> None: ...


class MeasureSlot:
    """Runs trials and baselines on one device; lives in a Ray actor or in the driver.

    ``device``: a device name (``cpu``, ``cuda``, ``cuda:N``: made in this process) or a
    ``kernels.Device`` (a replay device, in the driver).  ``env``: the thread-count variables
    of the process that runs the kernels later (the launch's driver,
    ``kernels.thread_env``; None values unset).  Ray starts an actor that reserves no CPU with
    OMP_NUM_THREADS=1, which would time every cpu kernel and the numpy baseline on one core
    while ``tuner.load`` runs them on all of them."""

    def __init__(self, device: str | Device = "cpu",
                 env: dict[str, str | None] | None = None) -> None:
        for k, v in (env or {}).items():  # before the worker is spawned: it inherits them
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self.device = get_device(device) if isinstance(device, str) else device
        self.worker = IsolatedWorker()
        self.node = node_label()

    def device_key(self) -> str:
        return self.device.key

    def where(self) -> tuple[str, str | None]:
        """(the node label measurements are stored with, the Ray node id or None)."""
        return self.node, _ray_node_id()

    def spec(self) -> DeviceSpec:
        """This slot's device limits and speeds (for the roofline)."""
        return self.device.spec

    def trial(self, request: TrialRequest) -> TrialResult:
        """Check and time the request's structure bound by its config (``Device.run_trial``);
        the result carries the request's ``tag``."""
        if request.structure is None:
            raise ValueError("a trial request needs a structure (a baseline has none)")
        _maybe_slow_trial()
        replay = self.device.kind == "replay"  # answers from its table: nothing to build
        out = self.device.run_trial(
            request.structure if replay else from_obj(request.structure),
            request.reference if replay else from_obj(request.reference), request.config,
            seed=request.seed, timing=request.timing, worker=self.worker,
            timeout_s=60.0 if request.timeout_s is None else request.timeout_s)
        return TrialResult.from_dict({**out, "tag": request.tag, "host": self.node})

    def baseline(self, request: TrialRequest) -> TrialResult:
        """Op-by-op time of the reference on this device (numpy on a cpu, CuPy on a GPU),
        timed in the isolated worker: this process's numpy may have loaded before ``env``."""
        seconds = self.device.time_baseline(
            from_obj(request.reference), seed=request.seed, timing=request.timing,
            worker=self.worker,
            timeout_s=600.0 if request.timeout_s is None else request.timeout_s)
        return TrialResult("ok" if seconds is not None else "runtime_error", request.tag,
                           "" if seconds is not None else
                           f"the op-by-op baseline could not be timed on {self.device.key}",
                           baseline_s=seconds)

    def close(self) -> None:
        self.worker.close()


def _maybe_slow_trial() -> None:
    """Fault injection for the node-loss drill: a slot whose environment names
    ``TUNER_FAULT_SLOW_TRIAL_S`` (a node started with it) holds every trial that long first,
    so the node can be removed while its slots hold trials."""
    delay = float(os.environ.get("TUNER_FAULT_SLOW_TRIAL_S") or 0)
    if delay > 0:
        time.sleep(delay)


def node_label() -> str:
    """Where a measurement ran, for the ``host`` column: the host name, and in a Ray worker
    the Ray node's id (several nodes of one machine, e.g. ``ray.cluster_utils``, share a
    host name) and the GPU Ray gave the slot (``host:node:gpu1``)."""
    node = _ray_node_id()
    host = socket.gethostname()
    if not node:
        return host
    try:
        import ray

        gpus = ray.get_gpu_ids()
    except Exception:  # noqa: BLE001 - not in a worker: no GPU of its own
        gpus = []
    return f"{host}:{node[:12]}" + (f":gpu{','.join(map(str, gpus))}" if gpus else "")


def cpu_slot_nodes() -> list[str]:
    """The Ray nodes that can time cpu kernels: alive, with CPUs of their own (a head
    started with ``--num-cpus 0`` only drives).  A cpu kernel uses every core of its node
    through OpenMP, so a cpu pool takes one slot on each of them, never two on one."""
    import ray

    return sorted(n["NodeID"] for n in ray.nodes()
                  if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0)


def _ray_node_id() -> str | None:
    try:
        import ray

        if not ray.is_initialized():
            return None
        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - no Ray, or not in a Ray process: the host alone
        return None


class SlotPool:
    """Slots for one device as Ray actors; ``submit`` a request, ``next_done`` returns the
    finished ones (``cluster.ReplayPool`` has the same face without Ray or a device).

    ``device``: ``cpu``, ``cuda`` / ``cuda:N``, or a ``kernels.Device`` object made in the
    driver (a replay device: it takes a GPU slot as ``cuda`` does).  ``resources``: Ray
    resources of each slot actor (default ``num_gpus=1, num_cpus=0``; a cpu slot
    ``num_cpus=0``).  ``pin``: Ray node ids, one slot on each (a cpu slot per CPU node, see
    ``cpu_slot_nodes``); slots whose device key differs from ``prefer_key`` (or from the most
    common one) are left out, so that one study never mixes two CPUs' timings.

    Faults: a slot whose actor dies (its node removed, its process killed) is replaced by a
    new actor where the cluster still has room (``replaced`` counts them), and the request it
    held is sent again, at most ``retries`` times; a request that cannot be re-run comes back
    with status ``node_lost`` (its node is gone) or ``runtime_error`` (the slot died), never
    dropped.  Ray's own actor restart is not used: a restart waiting for a GPU that left with
    its node would wait forever."""

    def __init__(self, device: str | Device = "cpu", slots: int = 1, *,
                 resources: dict[str, Any] | None = None, retries: int = 1,
                 pin: Sequence[str] | None = None, prefer_key: str | None = None) -> None:
        import ray

        self.ray = ray
        self.device = device
        # a cpu slot reserves no CPU: it times only while the search tasks are idle
        # a GPU slot reserves no CPU either (an actor asking for none would hold one CPU to
        # be placed: on nodes of one CPU, GPU slots then waited for the search tasks)
        self.resources = resources if resources is not None else (
            {"num_cpus": 0} if device == "cpu" else {"num_cpus": 0, "num_gpus": 1})
        self.retries, self.replaced = retries, 0
        self._actor = ray.remote(max_restarts=0, max_task_retries=0,
                                 **self.resources)(MeasureSlot)
        self.pin = list(pin or [])
        self.slots = ([self._new_slot(node) for node in self.pin] if self.pin
                      else [self._new_slot() for _ in range(slots)])
        self.left_out: list[tuple[str, str]] = []  # (Ray node id, its device key)
        if self.pin:
            self._keep_one_key(prefer_key)
        self.free = list(self.slots)
        self.inflight: dict = {}
        self.tries: dict[int, int] = {}  # id(request) -> times it was sent again
        self.pending: deque = deque()  # (method, request, node lost, why) to send again
        self.suspect: set[str] = set()  # Ray node ids where a slot died: retries go elsewhere
        self.gone: set[str] = set()  # Ray node ids known to have left the cluster
        self.key = ray.get(self.slots[0].device_key.remote())
        self.spec = ray.get(self.slots[0].spec.remote())
        self.nodes = dict(zip(self.slots, ray.get([s.where.remote() for s in self.slots]),
                              strict=True))

    def _new_slot(self, node: str | None = None) -> Any:
        if node is None:
            return self._actor.remote(self.device, thread_env())
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return self._actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            node_id=node, soft=False)).remote(self.device, thread_env())

    def _keep_one_key(self, prefer: str | None) -> None:
        """Pinned slots whose nodes time as different devices (another CPU model or ISA
        level) would mix their timings in one study: keep the slots of one device key (
        ``prefer`` when a node has it, else the most common) and leave the others out."""
        keys = self.ray.get([s.device_key.remote() for s in self.slots])
        counts = Counter(keys)
        keep = prefer if prefer in counts else counts.most_common(1)[0][0]
        kept = []
        for slot, node, key in zip(self.slots, self.pin, keys, strict=True):
            if key == keep:
                kept.append(slot)
                continue
            self.left_out.append((node, key))
            try:
                self.ray.get(slot.close.remote(), timeout=10)
                self.ray.kill(slot)
            except Exception:  # noqa: BLE001 - it is dropped either way
                pass
        self.slots = kept
        self.pin = [n for n in self.pin if n not in {m for m, _ in self.left_out}]

    @property
    def idle(self) -> int:
        return max(0, len(self.free) - len(self.pending))

    def placement(self) -> list[tuple[str, str | None]]:
        """(node label, Ray node id) of every live slot."""
        return [self.nodes[s] for s in self.slots if s in self.nodes]

    def submit(self, method: Method, request: TrialRequest | Mapping[str, Any]) -> None:
        """Run ``method`` ("trial" or "baseline") on a free slot; call only when ``idle``."""
        request = TrialRequest.of(request)
        safe = [s for s in self.free if self.nodes.get(s, (None, None))[1] not in self.suspect]
        slot = (safe or self.free)[-1]
        self.free.remove(slot)
        self.inflight[getattr(slot, method).remote(request)] = (slot, method, request)

    def next_done(self) -> TrialResult | None:
        """The next finished request's result (blocking); None when nothing is in flight.
        A slot whose actor died is replaced and its request run again (see the class)."""
        while self.inflight or self.pending:
            if self.pending and not self.slots:  # nowhere left to run it
                method, request, lost, why = self.pending.popleft()
                return self._failed(request, lost, why)
            while self.pending and (slot := self._retry_slot()) is not None:
                method, request, _, _ = self.pending.popleft()
                self.inflight[getattr(slot, method).remote(request)] = (slot, method, request)
            if not self.inflight:  # no slot took it and none is working: it cannot run
                method, request, lost, why = self.pending.popleft()
                return self._failed(request, lost, why)
            done, _ = self.ray.wait(list(self.inflight), num_returns=1)
            slot, method, request = self.inflight.pop(done[0])
            try:
                result = self.ray.get(done[0])
            except self.ray.exceptions.RayError as err:
                lost = self._lose(slot)
                why = (f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                       )[:300]
                tries = self.tries.get(id(request), 0)
                if tries < self.retries:
                    self.tries[id(request)] = tries + 1
                    self.pending.append((method, request, lost, why))
                    continue
                return self._failed(request, lost, why)
            self.tries.pop(id(request), None)
            if self.nodes.get(slot, (None, None))[1] in self.gone:  # finished as its node left
                self.slots = [s for s in self.slots if s is not slot]
                self.nodes.pop(slot, None)
            else:
                self.free.append(slot)
            return result
        return None

    def _retry_slot(self) -> Any | None:
        """A free slot for a request sent again: one on a node where no slot has died, while
        any other slot is still working (the GCS may not yet know that a removed node is gone,
        so its other slots look free but are dead too)."""
        safe = [s for s in self.free if self.nodes.get(s, (None, None))[1] not in self.suspect]
        if not safe and self.inflight:
            return None
        slot = (safe or self.free or [None])[-1]
        if slot is not None:
            self.free.remove(slot)
        return slot

    def _failed(self, request: TrialRequest, lost: bool, why: str) -> TrialResult:
        tries = self.tries.pop(id(request), 0)
        return TrialResult("node_lost" if lost else "runtime_error", request.tag,
                           ("the node running the measurement slot was lost" if lost
                            else "the measurement slot died")
                           + f" ({tries + 1} attempt(s)): {why}", config=dict(request.config))

    def _lose(self, slot: Any) -> bool:
        """Drop a dead slot, start a replacement where the cluster has room; returns whether
        the slot's node is gone."""
        label, node = self.nodes.pop(slot, (None, None))
        self.slots = [s for s in self.slots if s is not slot]
        self.free = [s for s in self.free if s is not slot]
        if node is not None:
            self.suspect.add(node)
        lost = self._node_gone(node)
        if lost:  # the node's idle slots left with it
            self.gone.add(node)
            gone = [s for s in self.free if self.nodes.get(s, (None, None))[1] == node]
            self.free = [s for s in self.free if s not in gone]
            self.slots = [s for s in self.slots if s not in gone]
            for s in gone:
                self.nodes.pop(s, None)
        if self.pin:  # a pinned pool replaces a slot only on a pinned node without one
            taken = {n for _, n in self.nodes.values()}
            spare = [n for n in self.pin if n not in taken and n not in self.gone]
            if not spare:
                return lost
            new = self._new_slot(spare[0])
        elif self._room():
            new = self._new_slot()
        else:
            return lost
        try:
            self.nodes[new] = self.ray.get(new.where.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - it could not start: the pool shrinks
            return lost
        self.slots.append(new)
        self.free.append(new)
        self.replaced += 1
        return lost

    def _node_gone(self, node: str | None, wait_s: float = 5.0) -> bool:
        """Whether ``node`` has left the cluster.  A slot's process dies at once with its
        node, but the GCS marks the node dead only after its health checks fail: a node still
        listed alive is asked again for ``wait_s`` before the slot is called merely dead."""
        if node is None:
            return False
        deadline = time.monotonic() + wait_s
        while True:
            alive = {n["NodeID"] for n in self.ray.nodes() if n.get("Alive")}
            if node not in alive:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.25)

    def _room(self) -> bool:
        """Whether a new slot actor can be placed now (a GPU slot needs a free GPU: one that
        left with its node must not be waited for)."""
        avail = self.ray.available_resources()
        need = {"GPU": self.resources.get("num_gpus", 0),
                "CPU": self.resources.get("num_cpus", 0), **self.resources.get("resources", {})}
        return all(avail.get(k, 0) >= v for k, v in need.items() if v)

    def close(self) -> None:
        for slot in self.slots:
            try:
                self.ray.get(slot.close.remote(), timeout=10)
                self.ray.kill(slot)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
        self.slots, self.free = [], []


class LocalPool:
    """One slot in the driver's own process, the face of ``SlotPool`` without Ray: requests
    run one at a time when their result is asked for."""

    def __init__(self, slot: MeasureSlot) -> None:
        self.slot = slot
        self.key, self.spec = slot.device_key(), slot.spec()
        self._pending: deque = deque()

    @property
    def idle(self) -> int:
        return 0 if self._pending else 1

    def submit(self, method: Method, request: TrialRequest | Mapping[str, Any]) -> None:
        self._pending.append((method, TrialRequest.of(request)))

    def next_done(self) -> TrialResult | None:
        if not self._pending:
            return None
        method, request = self._pending.popleft()
        return getattr(self.slot, method)(request)

    def close(self) -> None:
        self._pending.clear()
        self.slot.close()


class ReplayPool(LocalPool):
    """A pool that answers trials from timings recorded earlier (Kernel Tuner's simulation
    mode, ``kernels.ReplayDevice``): the same study driver runs against it, no kernel is
    built, so search strategies can be compared on one fixed table of real measurements.

    ``table`` maps ``key_of(config)`` keys (e.g. ``db.config_hash``) to recorded trial results
    (the dicts ``Device.run_trial`` returns; they come back as ``TrialResult``); a config
    missing from it is 'invalid'."""

    def __init__(self, table: dict[str, dict], key_of: Callable[[Mapping[str, int]], str],
                 device_key: str, spec: DeviceSpec, baseline_s: float | None = None) -> None:
        super().__init__(MeasureSlot(ReplayDevice(table, key_of, device_key, spec, baseline_s)))
        self.table = table
