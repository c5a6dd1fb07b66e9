"""Programs, graphs and verification: the first part of the Python API (``tuner.api``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from search import (
    GraphFormatError,
    KernelGraph,
    Program,
    ProgramError,
    ShapeError,
    builtin_names,
    from_json,
    handwritten,
    load_program,
)
from verifier import DEFAULT_TESTS, Verdict, equivalent

from ..jobfile import JobError


class InputError(ValueError):
    """A bad argument to the API (the CLI prints it as one line, exit code 2)."""


# Everything a user can get wrong in an input; the CLI turns these into exit code 2.
# db.DatabaseError (a missing driver, a schema to upgrade) is added by the commands using db.
INPUT_ERRORS: tuple[type[Exception], ...] = (InputError, ProgramError, GraphFormatError,
                                             ShapeError, FileNotFoundError, JobError)



def parse_pairs(items: list[str] | None, flag: str = "--set") -> dict[str, str]:
    """NAME=VALUE strings of a repeated CLI flag as a dict (the one parser for all commands)."""
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            example = "batch=8 or --set X=16x1024" if flag == "--set" else "g0=64"
            raise InputError(f"{flag} {item!r}: write NAME=VALUE, e.g. {flag} {example}")
        out[key.strip()] = value.strip()
    return out


def parse_config(items: list[str] | None) -> dict[str, int]:
    """``--config K=V`` values: each a positive integer (a symbol or a lowering knob), or 0
    for the knobs where 0 means off (``ZERO_OK``: smem_kb, tile_rows, stream, triton)."""
    from kernels import ZERO_OK

    config = {}
    for key, value in parse_pairs(items, "--config").items():
        low = 0 if key in ZERO_OK else 1
        if not value.isdigit() or int(value) < low:
            raise InputError(f"--config {key}={value}: a config value is a positive integer "
                             "(a symbol such as g0=64 or a knob such as block=256; "
                             f"{', '.join(ZERO_OK)} may be 0)")
        config[key] = int(value)
    return config


def list_programs() -> list[dict[str, Any]]:
    """Every built-in program with its default shapes, parameters and description."""
    rows = []
    for name in builtin_names():
        p = load_program(name)
        rows.append({"name": name, "inputs": {n: list(s) for n, s in p.inputs.items()},
                     "params": p.params, "dtype": p.dtype, "description": p.description})
    return rows


def program_graph(spec: str, overrides: Mapping[str, Any] | None = None, *,
                  fused: bool = False, config: Mapping[str, int] | None = None
                  ) -> KernelGraph:
    """The reference graph of a program, or its hand-written fused structure."""
    program: Program = load_program(spec, overrides)
    if not fused:
        return program.build()
    try:
        graph = handwritten(program)
    except KeyError as err:
        raise InputError(str(err.args[0])) from None
    return graph.bind(config) if config else graph


def load_graph(spec: str) -> KernelGraph:
    """A µGraph JSON file, or a program (built-in name / program file) as its reference."""
    path = Path(spec)
    if path.suffix == ".json":
        try:
            text = path.read_text()
        except OSError as err:
            raise FileNotFoundError(f"{spec}: cannot read: {err.strerror}") from None
        try:
            return from_json(text)
        except GraphFormatError as err:
            raise GraphFormatError(f"{spec}: {err}") from None
    return load_program(spec).build()


def verify_files(reference: str, candidate: str, *, tests: int = DEFAULT_TESTS, seed: int = 0,
                 config: Mapping[str, int] | None = None, arithmetic: str = "field") -> Verdict:
    if tests < 1:
        raise InputError(f"--tests {tests}: need at least one test")
    return equivalent(load_graph(reference), load_graph(candidate), tests=tests, seed=seed,
                      config=config, arithmetic=arithmetic)
