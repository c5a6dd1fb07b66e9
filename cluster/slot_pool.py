"""``SlotPool``: measurement slots as Ray actors, one per GPU or one per CPU node, and what
a pool does when a slot or its node dies (see the class)."""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from typing import Any

from kernels import NODE_LOST, RUNTIME_ERROR, Device, thread_env

from .slots import MeasureSlot, Method, TrialRequest, TrialResult


def cpu_slot_nodes() -> list[str]:
    """The Ray nodes that can time cpu kernels: alive, with CPUs of their own (a head
    started with ``--num-cpus 0`` only drives).  A cpu kernel uses every core of its node
    through OpenMP, so a cpu pool takes one slot on each of them, never two on one."""
    import ray

    return sorted(n["NodeID"] for n in ray.nodes()
                  if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0)


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
        self.resources: dict[str, Any] = resources if resources is not None else (
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
        slot = (self._safe_free() or self.free)[-1]
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

    def _safe_free(self) -> list[Any]:
        """Free slots on nodes where no slot has died."""
        return [s for s in self.free if self.nodes.get(s, (None, None))[1] not in self.suspect]

    def _retry_slot(self) -> Any | None:
        """A free slot for a request sent again: one on a node where no slot has died, while
        any other slot is still working (the GCS may not yet know that a removed node is gone,
        so its other slots look free but are dead too)."""
        safe = self._safe_free()
        if not safe and self.inflight:
            return None
        slot = (safe or self.free or [None])[-1]
        if slot is not None:
            self.free.remove(slot)
        return slot

    def _failed(self, request: TrialRequest, lost: bool, why: str) -> TrialResult:
        tries = self.tries.pop(id(request), 0)
        return TrialResult(NODE_LOST if lost else RUNTIME_ERROR, request.tag,
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
        """Stop every slot and drop what is still in flight (``next_done`` then answers None;
        a dead slot is not replaced after close).  Calling it again does nothing."""
        self.inflight.clear()
        self.pending.clear()
        self.tries.clear()
        for slot in self.slots:
            try:
                self.ray.get(slot.close.remote(), timeout=10)
                self.ray.kill(slot)
            except Exception:  # noqa: BLE001 - best effort at shutdown
                pass
        self.slots, self.free = [], []
