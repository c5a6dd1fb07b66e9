"""Distribution: the search sharded over Ray tasks (embedded or on a cluster)."""

from .ranking import describe, rank
from .runtime import LocalExecutor, RayExecutor, make_executor
from .search import SearchResult, search_program, verify_structure

__all__ = ["LocalExecutor", "RayExecutor", "SearchResult", "describe", "make_executor", "rank",
           "search_program", "verify_structure"]
