"""The Python API the CLI stands on: programs, graphs, verification (``programs``), fused
structures and their configs (``structures``), the learned cost model's loop (``tuner.api.models``).
Bad input raises ``InputError`` (or another of ``INPUT_ERRORS``): one line, what to fix."""

from search import format_graph, load_program, small_instance, to_json
from verifier import DEFAULT_TESTS

from .programs import (
    INPUT_ERRORS,
    InputError,
    list_programs,
    load_graph,
    parse_config,
    parse_pairs,
    program_graph,
    verify_files,
)
from .structures import (
    FoundStructure,
    check_inputs,
    lower_plan,
    read_structures,
    resolve_config,
    resolve_structure,
)

__all__ = ["DEFAULT_TESTS", "INPUT_ERRORS", "FoundStructure", "InputError", "check_inputs",
           "format_graph", "list_programs", "load_graph", "load_program", "lower_plan",
           "parse_config", "parse_pairs", "program_graph", "read_structures", "resolve_config",
           "resolve_structure", "small_instance", "to_json", "verify_files"]
