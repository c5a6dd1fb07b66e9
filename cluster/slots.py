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
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from kernels import OK, RUNTIME_ERROR, Device, DeviceSpec, IsolatedWorker, ReplayDevice, get_device
from search.ir import from_obj

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
    ``next_done`` blocks for the next finished one's result (None when nothing is in flight):
    each request comes back once, with its ``tag`` and the node that ran it (``host``), and
    a trial that fails or does not lower is a result with its status, never an exception;
    ``close`` releases the slots and drops what is in flight (again: nothing to do).
    ``tests/cluster/test_pool_contract.py`` holds every pool to this."""

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
        timed in the isolated worker: this process's numpy may have loaded before ``env``.
        The result names this slot's node, as a trial's does."""
        seconds = self.device.time_baseline(
            from_obj(request.reference), seed=request.seed, timing=request.timing,
            worker=self.worker,
            timeout_s=600.0 if request.timeout_s is None else request.timeout_s)
        return TrialResult(OK if seconds is not None else RUNTIME_ERROR, request.tag,
                           "" if seconds is not None else
                           f"the op-by-op baseline could not be timed on {self.device.key}",
                           host=self.node, baseline_s=seconds)

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


def _ray_node_id() -> str | None:
    try:
        import ray

        if not ray.is_initialized():
            return None
        return ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - no Ray, or not in a Ray process: the host alone
        return None


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
