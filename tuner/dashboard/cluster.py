"""The Ray cluster a launch runs on, through Ray's state API (``ray.util.state``): nodes with
their CPUs and GPUs, the measurement slots (``MeasureSlot`` actors) and the search workers
(``run_and_verify`` tasks) and what each is doing, and the address of Ray's own dashboard.

Only with ``tuner dashboard --address``; the state API is asked at most every ``TTL_S``
seconds whatever the number of pages open, and a cluster that does not answer is said so on
the page rather than failing it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

TTL_S = 3.0
SLOT_CLASS = "MeasureSlot"
SEARCH_TASK = "run_and_verify"
TIMEOUT_S = 5


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


class ClusterView:
    """A cached view of one Ray cluster; ``state`` is ``ray.util.state`` (tests pass a fake)."""

    def __init__(self, address: str | None, state: Any = None,
                 dashboard_url: Callable[[str], str | None] | None = None) -> None:
        self.address = address
        self._state = state
        self._dashboard_url = dashboard_url
        self._cache: tuple[float, dict] | None = None
        self._lock = threading.Lock()

    def snapshot(self) -> dict:
        if not self.address:
            return {"address": None, "error": None, "nodes": [], "slots": [], "tasks": []}
        with self._lock:
            if self._cache is not None and time.monotonic() - self._cache[0] < TTL_S:
                return self._cache[1]
            try:
                snap = self._read()
            except Exception as err:  # noqa: BLE001 - any failure of the cluster is shown
                snap = {"address": self.address, "error": f"{type(err).__name__}: {err}",
                        "nodes": [], "slots": [], "tasks": [], "ray_dashboard": None}
            self._cache = (time.monotonic(), snap)
            return snap

    def _state_api(self) -> Any:
        if self._state is None:
            import ray.util.state as state

            self._state = state
        return self._state

    def _ray_dashboard(self) -> str | None:
        if not self.address:
            return None
        if self._dashboard_url is not None:
            return self._dashboard_url(self.address)
        try:
            from ray.util.state.api import get_address_for_submission_client

            url = get_address_for_submission_client(self.address)
        except Exception:  # noqa: BLE001
            return None
        return url if url and url.startswith("http") else None

    def _read(self) -> dict:
        st = self._state_api()
        kw = {"address": self.address, "timeout": TIMEOUT_S, "raise_on_missing_output": False}
        nodes = st.list_nodes(detail=True, **kw)
        actors = st.list_actors(filters=[("class_name", "=", SLOT_CLASS)], detail=True, **kw)
        tasks = st.list_tasks(filters=[("state", "=", "RUNNING")], detail=True, **kw)
        ips = {_get(n, "node_id"): _get(n, "node_ip") for n in nodes}
        out_nodes = []
        for n in nodes:
            res = _get(n, "resources_total") or {}
            out_nodes.append({"node_id": _get(n, "node_id"), "ip": _get(n, "node_ip"),
                              "head": bool(_get(n, "is_head_node")),
                              "state": _get(n, "state"), "name": _get(n, "node_name"),
                              "cpus": res.get("CPU", 0), "gpus": res.get("GPU", 0),
                              "memory_gb": round(res.get("memory", 0) / 2**30, 1)})
        running: dict[Any, list] = {}
        for t in tasks:
            if _get(t, "actor_id"):
                running.setdefault(_get(t, "actor_id"), []).append(_get(t, "name"))
        slots = [{"actor_id": _get(a, "actor_id"), "state": _get(a, "state"),
                  "node": ips.get(_get(a, "node_id"), _get(a, "node_id")),
                  "pid": _get(a, "pid"),
                  "gpus": (_get(a, "required_resources") or {}).get("GPU", 0),
                  "doing": ", ".join(str(x) for x in running.get(_get(a, "actor_id"), []))
                  or "idle"} for a in actors]
        searches = [{"task_id": _get(t, "task_id"), "name": _get(t, "name"),
                     "node": ips.get(_get(t, "node_id"), _get(t, "node_id")),
                     "pid": _get(t, "worker_pid"), "state": _get(t, "state")}
                    for t in tasks if SEARCH_TASK in str(_get(t, "func_or_class_name") or
                                                         _get(t, "name") or "")]
        return {"address": self.address, "error": None, "nodes": out_nodes, "slots": slots,
                "tasks": searches, "ray_dashboard": self._ray_dashboard()}
