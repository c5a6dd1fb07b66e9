"""Distribution: the search sharded over Ray tasks (embedded or on a cluster), and the
measurement slots that time trials on devices.

The deepening driver and the ranking live in ``search`` (``run_search``, ``rank``,
``describe``); ``search_program`` runs them on an executor of this package.
"""

from search import SearchResult, ShardResult, describe, rank

from .runtime import (
    ClusterJoinError,
    LocalExecutor,
    RayExecutor,
    Speculation,
    join_ray,
    make_executor,
    start_ray,
    stop_ray,
)
from .search_tasks import VERIFY_BINDINGS, run_and_verify, verify_structure
from .sharded import search_program
from .slot_pool import SlotPool, cpu_slot_nodes
from .slots import (
    LocalPool,
    MeasurementPool,
    MeasureSlot,
    ReplayPool,
    TrialRequest,
    TrialResult,
)

__all__ = ["VERIFY_BINDINGS", "ClusterJoinError", "LocalExecutor", "LocalPool", "MeasureSlot", "MeasurementPool", "RayExecutor",
           "ReplayPool", "SearchResult", "ShardResult", "SlotPool", "Speculation", "TrialRequest", "TrialResult", "cpu_slot_nodes", "describe", "join_ray", "make_executor", "rank", "run_and_verify",
           "search_program", "start_ray", "stop_ray", "verify_structure"]
