"""The built-in benchmark suite (docs: ../shared benchmarks), loadable by name or by file."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from .lang import Program, ProgramError, load_program_file, parse_program

# The paper suite first, then AStitch's memory-intensive patterns.
SUITE = ("rmsnorm_matmul", "gated_mlp", "lora", "gqa", "qknorm_gqa", "mha", "mqa", "ntrans")
EXTRA = ("softmax_rows", "rmsnorm_residual")


def builtin_names() -> tuple[str, ...]:
    return SUITE + EXTRA


def builtin_program(name: str) -> Program:
    if name not in builtin_names():
        raise ProgramError(name, None, "no built-in program of that name; built-ins: "
                           + ", ".join(builtin_names()) + " (or give a program file path)")
    text = resources.files("search.ir").joinpath("programs").joinpath(f"{name}.yaml").read_text()
    return parse_program(text, f"<builtin {name}>")


def load_program(spec: str, overrides: Mapping[str, Any] | None = None) -> Program:
    """A built-in name or a path to a program file, with ``--set`` overrides applied."""
    if spec in builtin_names():
        program = builtin_program(spec)
    elif Path(spec).suffix in (".yaml", ".yml") or Path(spec).exists():
        program = load_program_file(spec)
    else:
        raise ProgramError(spec, None, "not a built-in program and no such file; built-ins: "
                           + ", ".join(builtin_names()))
    return program.with_overrides(overrides or {})


def small_instance(program: Program, cap: int = 16) -> Program:
    """The program with every input dim capped at ``cap``: cheap to verify, and equal dims
    stay equal so every shape rule that held still holds.  With cap 16 and power-of-two
    shapes, every grid / for-loop symbol can be bound to 2 or more."""
    return program.with_overrides({n: tuple(min(d, cap) for d in s)
                                   for n, s in program.inputs.items()})
