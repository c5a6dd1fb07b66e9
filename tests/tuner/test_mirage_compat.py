"""Mirage scripts run with only the import changed (`import tuner as mi`): the builder's
Mirage spellings, the graph as a tuner program, and `superoptimize` end to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tuner as mi
from search import ShapeError, structural_hash
from tuner.mirage_compat import to_program
from verifier import FloatArith, run

REPO = Path(__file__).resolve().parents[2]

# A Mirage script (rms_norm + matmul, Mirage's own demo at small shapes) as a user would
# bring it: only `import mirage as mi` became `import tuner as mi`, and the inputs are CPU
# arrays because this machine has no GPU.
SCRIPT = """
import numpy as np
import torch
import tuner as mi

graph = mi.new_kernel_graph()
X = graph.new_input(dims=(16, 64), dtype=mi.float16)
W = graph.new_input(dims=(64, 64), dtype=mi.float16)
D = graph.rms_norm(X, normalized_shape=(64,))
O = graph.matmul(D, W)
graph.mark_output(O)
optimized_graph = graph.superoptimize(config="mlp")

torch.manual_seed(0)
input_tensors = [torch.randn(16, 64, dtype=torch.float16, device="cpu"),
                 torch.randn(64, 64, dtype=torch.float16, device="cpu")]
outputs = optimized_graph(inputs=input_tensors)
x, w = (t.float().numpy() for t in input_tensors)
want = (x / np.sqrt(np.mean(x * x, axis=1, keepdims=True))) @ w
(plain,) = optimized_graph(x, w)  # float32 arrays: converted to the program's float16
print("dtype", outputs[0].dtype, plain.dtype)
print("max_error", float(np.max(np.abs(outputs[0].float().numpy() - want))),
      float(np.max(np.abs(plain.astype(np.float32) - want))), "scale", float(np.abs(want).max()))
"""


def test_a_mirage_script_runs_end_to_end(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="the script builds torch tensors, as Mirage's do")
    (tmp_path / "demo.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "demo.py"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    # float16 tensors in, float16 tensors out (numpy float16 for numpy inputs)
    assert "dtype torch.float16 float16" in res.stdout, res.stdout
    words = res.stdout.split("max_error", 1)[1].split()
    errors, scale = [float(v) for v in words[:2]], float(words[3])
    assert max(errors) < 2e-2 * scale, res.stdout
    # progress by default, one line per phase and per tuning trial
    for phase in ("superoptimize: search:", "verified structure(s)", "tuning trial 1/"):
        assert phase in res.stderr, res.stderr[-3000:]
    # stored in the default database of the directory it ran in, where `tuner best` finds it
    assert (tmp_path / "tuner.db").exists()
    program = to_program(_graph())
    record = mi.best(program, device="cpu", url=f"sqlite:///{tmp_path / 'tuner.db'}")
    assert record is not None and record.time_s > 0
    # run again: the stored result comes back without a search or a tuning trial
    again = subprocess.run([sys.executable, "demo.py"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=600, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "by an earlier run" in again.stderr and "tuning trial" not in again.stderr
    assert again.stdout == res.stdout


def _graph() -> mi.KNGraph:
    graph = mi.new_kernel_graph()
    x = graph.new_input(dims=(16, 64), dtype=mi.float16)
    w = graph.new_input(dims=(64, 64), dtype=mi.float16)
    graph.mark_output(graph.matmul(graph.rms_norm(x, normalized_shape=(64,)), w))
    return graph


def test_the_graph_becomes_the_same_program() -> None:
    graph = _graph()
    program = to_program(graph)
    assert program.inputs == {"I0": (16, 64), "I1": (64, 64)} and program.dtype == "float16"
    assert structural_hash(program.build()) == structural_hash(graph)
    assert program.name == f"mirage_{structural_hash(graph)[:12]}"


def test_mirage_spellings_and_the_native_builder() -> None:
    graph = mi.new_kernel_graph()
    x = graph.new_input(dims=(8, 32), strides=(32, 1), dtype=mi.float32)
    y = graph.new_input((8, 32), "float32", "Y")  # the native call form still works
    assert graph.tensors[y.id].name == "Y" and x.dtype == "float32"
    e = graph.exp(graph.silu(x))
    s = graph.reduction(e, 1)
    assert tuple(s.shape) == (8, 1)
    out = graph.add(graph.div(e, s), y)
    graph.mark_output(out)
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((8, 32)) for _ in range(2))
    (got,) = run(graph, [a, b], FloatArith())
    ex = np.exp(a / (1 + np.exp(-a)))
    np.testing.assert_allclose(got, ex / ex.sum(1, keepdims=True) + b, rtol=1e-9)
    with pytest.raises(ShapeError, match="only row-major"):
        graph.new_input(dims=(8, 32), strides=(64, 2))  # (1, 8) is W.t(): transposed
    with pytest.raises(ShapeError, match="normalized_shape"):
        graph.rms_norm(x, normalized_shape=(8, 32))
    with pytest.raises(ShapeError, match="dtype"):
        graph.new_input(dims=(2, 2), dtype="int8")


def test_transposed_strides_make_a_transposed_input():
    g = mi.new_kernel_graph()
    w = g.new_input(dims=(64, 32), strides=(1, 64), dtype=mi.float16)
    x = g.new_input(dims=(8, 64), dtype=mi.float16)
    g.mark_output(g.matmul(x, w))
    assert g.input_layout(w.id) == "transposed" and g.input_layout(x.id) == "row"
    assert g.new_input((4, 8), "float16", "N", layout="transposed").shape == (4, 8)
    with pytest.raises(ShapeError, match="only row-major tensors and inputs transposed"):
        g.new_input(dims=(64, 32), strides=(2, 64), dtype=mi.float16)
    # as a program (what superoptimize launches): the layout and an rms_norm eps survive
    from tuner.mirage_compat import to_program

    h = mi.new_kernel_graph()
    w = h.new_input(dims=(64, 32), strides=(1, 64), dtype=mi.float16)
    x = h.new_input(dims=(8, 64), dtype=mi.float16)
    h.mark_output(h.matmul(h.rms_norm(x, eps=1e-6), w))
    program = to_program(h)
    assert program.layouts == {"I0": "transposed"}
    assert structural_hash(program.build()) == structural_hash(h)
