"""Helpers the test modules share (imported as ``support``; pytest puts tests/ on sys.path)."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
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


# A Triton-dialect config per suite program at the paper's shapes, of the kind the tuner tries
# there: output tiles of 16-64 rows or columns, a for-loop step of 32-64 (ntrans: one row per
# block, not split across blocks, which the Triton dialect cannot print).
TRITON_PAPER_CONFIGS = {
    "rmsnorm_matmul": {"g0": 96, "F": 32}, "gated_mlp": {"g0": 64, "F": 64},
    "lora": {"g0": 64, "F": 4}, "gqa": {"g0": 2, "g1": 4, "F": 64},
    "qknorm_gqa": {"g0": 2, "g1": 16, "F": 128}, "mha": {"g0": 32, "g1": 1, "F": 64},
    "mqa": {"g0": 16, "F": 64}, "ntrans": {"g0": 8, "split": 1},
}


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


def row_cut_structure(rows: int = 4, cols: int = 64) -> KernelGraph:
    """A row-wise product of two [4, rows, cols] tensors whose grid cuts the rows (``g0``)
    and the row itself (``g1``): each block's tile holds ``cols/g1`` columns, the rule a
    RoPE region's searched structures put ``split`` under."""
    from search import new_block_graph, new_kernel_graph

    g = new_kernel_graph()
    a = g.new_input((4, rows, cols), "float32", "A")
    b = g.new_input((4, rows, cols), "float32", "B")
    bg = new_block_graph(("g0", "g1"))
    x, y = bg.new_input(a, imap=(0, 2), fmap=-1), bg.new_input(b, imap=(0, 2), fmap=-1)
    bg.new_output(bg.forloop_accum(bg.mul(x, y)), omap=(0, 2))
    g.mark_output(g.graph_kernel(bg)[0])
    return g


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


def shared_cache(space: str, gpu: str) -> Path:
    """A real Kernel Tuner cache from the project's shared data (``shared/`` beside the
    checkout, as CI and the development machines have it); may not exist: skip then."""
    for root in (REPO.parent / "shared", Path("/work/shared")):
        path = root / "data" / "kernel_tuner_caches" / space / f"{gpu}.json.gz"
        if path.exists():
            return path
    return REPO.parent / "shared" / "data" / "kernel_tuner_caches" / space / f"{gpu}.json.gz"


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


# Malformed job files (tests/tuner/test_jobfile.py checks each one's error; tests/tuner/test_launch.py
# that `tuner launch` refuses them without touching the database):
# (job text, line, key path, a fragment of the reason)
MALFORMED = [
    ("", 1, "job", "empty"),
    ("programs: [rmsnorm_matmul\n", 2, "yaml", "not valid YAML"),
    ("search: {max_block_ops: 4}\n", 1, "programs", "missing"),
    ("programs: [rmsnorm_matmul]\ntunning: {}\n", 2, "tunning", "did you mean 'tuning'"),
    ("programs: []\n", 1, "programs", "non-empty list"),
    ("programs:\n  - rmsnorm_matmul\n  - rmsnrom_matmul\n", 3, "programs[1]",
     "did you mean 'rmsnorm_matmul'"),
    ("programs:\n  - name: lora\n    file: x.yaml\n", 2, "programs[0]", "exactly one of"),
    ("programs:\n  - name: rmsnorm_matmul\n    set:\n      batch: 2\n      Z: 4\n", 5,
     "programs[0].set.Z", "no parameter or input 'Z'"),
    ("programs:\n  - name: rmsnorm_matmul\n    set:\n      X: 16xabc\n", 4,
     "programs[0].set.X", "16x1024"),
    ("programs:\n  - name: softmax_rows\n    set: {rows: 0}\n", 3,
     "programs[0].set.rows", "at least 1"),
    ("programs:\n  - name: rmsnorm_matmul\n    set:\n      X: 16x100\n", 4,
     "programs[0].set", "inner dims differ"),
    ("programs:\n  - lora\n  - file: nowhere/prog.yaml\n", 3, "programs[1].file",
     "no program file"),
    ("programs:\n  - mha\n  - mha\n", 3, "programs[1]", "already programs[0]"),
    ("programs: [lora]\nsearch:\n  max_grid_dims: 4\n", 3, "search.max_grid_dims", "1 to 3"),
    ("programs: [lora]\nsearch:\n  block_ops:\n    - exp\n    - softmax\n", 5,
     "search.block_ops[1]", "not a block op"),
    ("programs: [lora]\nsearch:\n  kernel_ops: [matmul, accum]\n", 3, "search.kernel_ops[1]",
     "not a kernel op"),
    ("programs: [lora]\ntuning:\n  sampler: tpe\n  trials_per_structure: 0\n", 4,
     "tuning.trials_per_structure", "at least 1"),
    ("programs: [lora]\ntuning:\n  time_budget_s: -5\n", 3, "tuning.time_budget_s", "> 0"),
    ("programs: [lora]\ntuning: {sampler: cmaes}\n", 2, "tuning.sampler", "tpe, random, grid"),
    ("programs: [lora]\ntuning:\n  confirm: -1\n", 3, "tuning.confirm", "at least 0"),
    ("programs: [lora]\ntuning:\n  trial_timeout_s: null\n", 3, "tuning.trial_timeout_s",
     "seconds > 0"),
    ("programs: [lora]\ndevices:\n  - cpu\n  - gpu0\n", 4, "devices[1]", "unknown device"),
    ("programs: [lora]\ndevices: [cuda, cuda:0]\n", 2, "devices[1]", "repeats"),
    ("programs: [lora]\ncluster:\n  workers: 1.5\n", 3, "cluster.workers", "whole number"),
    ("programs: [lora]\ndatabase:\n  url: mysql://u@h/db\n", 3, "database.url",
     "unsupported database"),
    ("programs: [lora]\ncluster: {workers: 2, workers: 3}\n", 2, "cluster.workers",
     "duplicate key"),
]


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    """``tuner ARGV`` in this process: (exit code, stdout, stderr)."""
    from tuner.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(err: str, command: str) -> str:
    """The single ``tuner COMMAND: error: ...`` line a refused command prints."""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"tuner {command}: error: "), err
    return lines[0]


# A small real launch (softmax_rows 64x64 on the cpu, one worker): tests/tuner/test_launch.py,
# tests/costmodel/test_costmodel_cli.py
REPO = Path(__file__).resolve().parents[1]
TUNER = [sys.executable, "-m", "tuner.cli"]


def load_script(path: str) -> Any:
    """A script of the repository (``benchmarks/peers.py``), imported as a module by its path:
    benchmarks and tools are scripts, not packages."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"script_{Path(path).stem}", REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


JOB = """
programs:
  - name: softmax_rows
    set: {{rows: 64, cols: 64}}
search:
  time_limit_s: 120
tuning:
  trials_per_structure: {trials}
  structures: {structures}
  sampler: {sampler}
  seed: 0
  trial_timeout_s: {timeout}
devices: [cpu]
cluster:
  workers: 1
"""


def write_job(tmp_path: Path, trials: int = 4, structures: int = 1, sampler: str = "tpe",
              timeout: float = 30, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(JOB.format(trials=trials, structures=structures, sampler=sampler,
                               timeout=timeout))
    return path


def run_cli(*args: str, env: dict | None = None, timeout: float = 300
            ) -> subprocess.CompletedProcess:
    return subprocess.run([*TUNER, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env={**os.environ, **(env or {})})




def guided_correction(codes: Any, predicted: Any, measured: list[tuple[int, float]],
                      main_from: float, ridge: float) -> Any:
    """``GuidedRanking``'s correction written plainly, summed afresh: from ``main_from``
    measurements on, a ridge fit of the residuals (log measured / predicted) on one indicator
    per parameter value, then the 2^-(parameters that differ) spread of what it leaves against
    a prior weight of 1; before, the spread of the residuals."""
    import numpy as np

    n = len(predicted)
    main = np.zeros(n)
    if len(measured) >= main_from:
        x = np.array([[float(row[j] == v) for j in range(codes.shape[1])
                       for v in sorted(set(codes[:, j])) if len(set(codes[:, j])) > 1]
                      for row in codes])
        idx = [i for i, _ in measured]
        r = np.array([math.log(t) - predicted[i] for i, t in measured])
        main = x @ np.linalg.solve(x[idx].T @ x[idx] + ridge * np.eye(x.shape[1]), x[idx].T @ r)
    num, den = np.zeros(n), np.ones(n)
    for i, seconds in measured:
        weight = 2.0 ** -(codes != codes[i]).sum(1)
        num += weight * (math.log(seconds) - predicted[i] - main[i])
        den += weight
    return main + num / den
