"""Helpers the test modules share (imported as ``support``; pytest puts tests/ on sys.path)."""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kernels import Execution, KernelPlan, get_device
from search import KernelGraph, ShapeError

CPU = get_device("cpu")


def build_cpu(graph: KernelGraph, config: Mapping[str, int] | None = None,
              **check: Any) -> Execution:
    """Lower ``graph`` for this CPU, build it, check it against its own bound reference."""
    return CPU.build(graph, config, **check)


def check_plan(plan: KernelPlan, reference: KernelGraph, **check: Any) -> Execution:
    """Run any device's plan as C++ on this CPU against ``reference``."""
    return CPU.check(plan, reference, **check)


def small_config(g: KernelGraph) -> dict[str, int]:
    """Every symbol at 2 where the shapes allow: several blocks and for-loop iterations."""
    cfg: dict[str, int] = {}
    for s in sorted(g.symbols()):
        try:
            g.bind({**{t: 1 for t in g.symbols()}, **cfg, s: 2})
            cfg[s] = 2
        except ShapeError:
            cfg[s] = 1
    return cfg


def mha_structure(over: str, heads: int = 4, rows: int = 8, dim: int = 16,
                   seq: int = 256) -> dict:
    """One of mha's verified structures at small shapes: the grid over heads (``heads``) or
    over V's columns (``columns``, every block recomputing all of Q·K and exp)."""
    q, k, v, out = ([0, -1, -1], [0, -1, -1], [0, -1, -1], [0, -1, -1]) if over == "heads" \
        else ([-1, -1, -1], [-1, -1, -1], [2, -1, -1], [2, -1, -1])
    return {"format": "tuner.mugraph/1", "ops": [
        {"op": "input", "shape": [heads, rows, dim], "dtype": "float16", "name": "Q"},
        {"op": "input", "shape": [heads, dim, seq], "dtype": "float16", "name": "K"},
        {"op": "input", "shape": [heads, seq, dim], "dtype": "float16", "name": "V"},
        {"op": "graph_kernel", "in": [0, 1, 2], "block_graph": {
            "grid": ["g0", 1, 1], "forloop_range": "F", "block": [128, 1, 1], "ops": [
                {"op": "input", "index": 0, "imap": q, "fmap": -1},
                {"op": "input", "index": 1, "imap": k, "fmap": 2},
                {"op": "input", "index": 2, "imap": v, "fmap": 1},
                {"op": "matmul", "in": [0, 1]}, {"op": "exp", "in": [3]},
                {"op": "matmul", "in": [4, 2]}, {"op": "accum", "in": [5], "kind": "no_red"},
                {"op": "accum", "in": [4], "kind": "sum"}, {"op": "div", "in": [6, 7]},
                {"op": "output", "in": [8], "omap": out}]}},
        {"op": "output", "in": [3]}]}


def kernel_tuner_cache(directory: Path, name: str = "A100",
                       times: Callable[[int, int], float] | None = None,
                       device: str = "NVIDIA A100-PCIE-40GB") -> str:
    """A small Kernel Tuner cache file (two parameters, 48 configs that ran, one that did
    not) at ``directory/name.json.gz``; ``times(a, b)`` gives milliseconds."""
    entries = {}
    for a in (1, 2, 4, 8, 16, 32, 64, 128):
        for b in (1, 2, 4, 8, 16, 32):
            t = times(a, b) if times else (math.log2(a) - 3) ** 2 + 0.5 * math.log2(b) + 1.0
            entries[f"{a},{b}"] = {"a": a, "b": b, "time": t}
    entries["256,1"] = {"a": 256, "b": 1, "time": "InvalidConfig"}
    doc = {"device_name": device, "kernel_name": "toy", "problem_size": [1024, 1024],
           "tune_params_keys": ["a", "b"], "cache": entries}
    path = Path(directory) / f"{name}.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return str(path)
