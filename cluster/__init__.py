"""Distribution: the search sharded over Ray tasks (embedded or on a cluster)."""

from .ranking import describe, rank
from .runtime import LocalExecutor, RayExecutor, make_executor, start_ray, stop_ray
from .search import SearchResult, search_program
from .search_tasks import ShardResult, verify_structure
from .slots import MeasureSlot, ReplayPool, SlotPool

__all__ = ["LocalExecutor", "MeasureSlot", "RayExecutor", "ReplayPool", "SearchResult", "ShardResult",
           "SlotPool", "describe", "make_executor", "rank", "search_program", "start_ray",
           "stop_ray", "verify_structure"]
