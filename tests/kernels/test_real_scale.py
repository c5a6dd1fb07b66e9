"""Numerics on real data: softmax (exp / sum / div, with and without a 0/1 mask multiplied after
the exp, the form a causal mask takes) on attention-scale logits up to |30|, in float32,
float16 and bfloat16, fused into one kernel and run on the cpu (C++) and the Triton
interpreter: finite and equal to a max-subtracted float64 softmax.  And the check inputs
themselves: activations N(0, 1), weights N(0, 1/fan_in)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cluster import LocalExecutor, search_program
from kernels import IsolatedWorker, get_device
from kernels.devices import input_roles, random_inputs, tolerance
from search import Limits, from_json, parse_program, to_json

ROWS, COLS = 16, 256
SOFTMAX = """name: softmax{tag}
dtype: {dtype}
inputs:
  X: [{rows}, {cols}]{mask_input}
body: |
  E = exp(X){mask}
  O = E / sum(E, -1)
outputs: [O]
"""
DTYPES = ("float32", "float16", "bfloat16")


def _program(dtype: str, masked: bool):
    return parse_program(SOFTMAX.format(
        tag="_masked" if masked else "", dtype=dtype, rows=ROWS, cols=COLS,
        mask_input=f"\n  M: [{ROWS}, {COLS}]" if masked else "",
        mask=" * M" if masked else ""))


def _logits(seed: int = 0) -> list[np.ndarray]:
    """Logits N(0, 1) scaled so the largest |x| is 30, and a causal-style 0/1 mask (row i keeps
    the first COLS - ROWS + i + 1 columns, so every row keeps some)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((ROWS, COLS))
    x *= 30.0 / np.abs(x).max()
    mask = (np.arange(COLS)[None, :] <= np.arange(ROWS)[:, None] + COLS - ROWS).astype(float)
    return [x.astype(np.float32), mask.astype(np.float32)]


def _softmax(x: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    if mask is not None:
        e = e * mask
    return e / e.sum(-1, keepdims=True)


@pytest.fixture(scope="module")
def worker():
    with IsolatedWorker() as w:
        yield w


@pytest.fixture(scope="module")
def fused():
    """(dtype, masked) -> a verified single-kernel structure of the softmax program."""
    out = {}
    for masked in (False, True):  # searched once, then the same structure in each dtype
        result = search_program(_program("float32", masked), Limits(max_block_ops=6),
                                executor=LocalExecutor(), time_limit_s=60)
        one = [s for s in result.verified.values()
               if [op.kind for op in s.ops if op.kind not in ("input", "output")]
               == ["graph_kernel"]]
        assert one, masked
        text = to_json(min(one, key=lambda s: len(s.block_graphs()[0].ops)))
        for dtype in DTYPES:
            out[dtype, masked] = from_json(text.replace('"float32"', f'"{dtype}"'))
    return out


def _devices():
    devices = [get_device("cpu")]
    try:
        from kernels.devices import TritonInterpreter

        devices.append(TritonInterpreter("H100"))
    except Exception:  # noqa: BLE001 - no Triton (or torch) here: the cpu still runs
        pass
    return devices


@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_on_logits_of_30_is_finite_and_correct(dtype, masked, fused, worker):
    program = _program(dtype, masked)
    xs = _logits()[:2 if masked else 1]
    assert 29.9 < np.abs(xs[0]).max() <= 30.0
    for dev in _devices():
        plan = dev.lower(fused[dtype, masked], None, "sm")
        shifted = [st for k in plan.kernels for ph in k.phases for lp in ph.loops
                   for st in lp.col if getattr(st, "op", "") == "exp"]
        assert shifted and all(st.attrs.get("shift") for st in shifted), \
            "softmax is lowered with its row max subtracted"
        res = dev.check(plan, program.build(), inputs=xs, worker=worker)
        assert res.ok, (dev.kind, res.message)
        (out,) = res.outputs
        assert np.isfinite(out).all(), dev.kind
        stored = dev.stored(plan, xs)  # the logits as the device holds them (rounded)
        want = _softmax(stored[0], stored[1] if masked else None)
        rtol, atol = tolerance(dev.compute_dtype(plan))
        np.testing.assert_allclose(out, want, rtol=rtol, atol=max(atol, 1e-6))
        if masked:
            assert (out[xs[1] == 0] == 0).all()


def test_check_inputs_are_at_the_scale_of_real_data():
    program = parse_program("""name: mlp
dtype: float16
inputs:
  X: [64, 1024]
  W: [1024, 512]
  V: {shape: [512, 256], layout: transposed}
  S: [64, 1]
body: |
  O = matmul(matmul(X, W), V) / S
outputs: [O]
""")
    g = program.build()
    assert input_roles(g) == ["activation", "weight", "weight", "divisor"]
    x, w, v, s = random_inputs(g, seed=0)
    assert abs(x.std() - 1) < 0.02 and abs(x.mean()) < 0.02
    assert abs(w.std() * np.sqrt(1024) - 1) < 0.05  # N(0, 1/fan_in): fan_in is K = 1024
    assert abs(v.std() * np.sqrt(512) - 1) < 0.05
    assert s.min() >= 0.5
    assert abs((x @ w).std() - 1) < 0.05  # a layer keeps unit scale, as trained ones do


ATTENTION = """name: attention_masked
dtype: {dtype}
inputs:
  Q: [2, 16, 32]
  K: [2, 32, 256]
  V: [2, 256, 32]
  M: [2, 16, 256]
body: |
  E = exp(matmul(Q, K)) * M
  O = matmul(E / sum(E, 2), V)
outputs: [O]
"""


@pytest.fixture(scope="module")
def attention():
    """A verified single-kernel structure of the masked attention program (float16)."""
    result = search_program(parse_program(ATTENTION.format(dtype="float16")),
                            Limits(max_block_ops=8), executor=LocalExecutor(), time_limit_s=90)
    one = [s for s in result.verified.values()
           if [op.kind for op in s.ops if op.kind not in ("input", "output")] == ["graph_kernel"]]
    assert one
    return to_json(one[0])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_masked_attention_on_logits_of_30_is_finite_and_correct(dtype, attention, worker):
    """Q·K up to |30| (Q scaled), a causal 0/1 mask after the exp, P·V: the fused kernel the
    search finds is lowered with the row max subtracted (through the mask and the P·V matmul)
    and equals eager attention on both dialects."""
    program = parse_program(ATTENTION.format(dtype=dtype))
    structure = from_json(attention.replace('"float16"', f'"{dtype}"'))
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s) for s in ((2, 16, 32), (2, 32, 256), (2, 256, 32)))
    q *= 30.0 / np.abs(q @ k).max()
    mask = np.broadcast_to(np.arange(256)[None, :] <= np.arange(16)[:, None] + 240,
                           (2, 16, 256)).astype(float)
    xs = [a.astype(np.float32) for a in (q, k, v, mask)]
    for dev in _devices():
        plan = dev.lower(structure, None, "attn")
        assert all(st.attrs.get("shift") for kk in plan.kernels for ph in kk.phases
                   for lp in ph.loops for st in lp.col if getattr(st, "op", "") == "exp")
        res = dev.check(plan, program.build(), inputs=xs, worker=worker)
        assert res.ok, (dev.kind, res.message)
        assert np.isfinite(res.outputs[0]).all()
        sq, sk, sv, sm = (a.astype(np.float64) for a in dev.stored(plan, xs))
        want = _softmax(sq @ sk, sm) @ sv
        rtol, atol = tolerance(dev.compute_dtype(plan))
        np.testing.assert_allclose(res.outputs[0], want, rtol=rtol, atol=max(atol, 1e-5))


def test_masked_flash_attention_keeps_a_running_max(worker):
    """The for-loop over the key sequence (FlashAttention's form, mha's hand-written one) with
    a 0/1 mask after the exp: the running max and the rescaled accumulators survive the mask
    on the cpu (C++, its per-row shared buffers) and the Triton interpreter."""
    heads, rows, dim, seq = 2, 8, 16, 256
    qmap, kmap = [0, -1, -1], [0, -1, -1]
    structure = from_json(json.dumps({"format": "tuner.mugraph/1", "ops": [
        {"op": "input", "shape": [heads, rows, dim], "dtype": "float16", "name": "Q"},
        {"op": "input", "shape": [heads, dim, seq], "dtype": "float16", "name": "K"},
        {"op": "input", "shape": [heads, seq, dim], "dtype": "float16", "name": "V"},
        {"op": "input", "shape": [heads, rows, seq], "dtype": "float16", "name": "M"},
        {"op": "graph_kernel", "in": [0, 1, 2, 3], "block_graph": {
            "grid": [heads, 1, 1], "forloop_range": 4, "block": [128, 1, 1], "ops": [
                {"op": "input", "index": 0, "imap": qmap, "fmap": -1},
                {"op": "input", "index": 1, "imap": kmap, "fmap": 2},
                {"op": "input", "index": 2, "imap": kmap, "fmap": 1},
                {"op": "input", "index": 3, "imap": qmap, "fmap": 2},
                {"op": "matmul", "in": [0, 1]}, {"op": "exp", "in": [4]},
                {"op": "mul", "in": [5, 3]},
                {"op": "matmul", "in": [6, 2]}, {"op": "accum", "in": [7], "kind": "no_red"},
                {"op": "accum", "in": [6], "kind": "sum"}, {"op": "div", "in": [8, 9]},
                {"op": "output", "in": [10], "omap": [0, -1, -1]}]}},
        {"op": "output", "in": [4]}]}))
    program = parse_program(f"""name: flash_masked
dtype: float16
inputs:
  Q: [{heads}, {rows}, {dim}]
  K: [{heads}, {dim}, {seq}]
  V: [{heads}, {seq}, {dim}]
  M: [{heads}, {rows}, {seq}]
body: |
  E = exp(matmul(Q, K)) * M
  O = matmul(E / sum(E, 2), V)
outputs: [O]
""")
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal(s) for s in ((heads, rows, dim), (heads, dim, seq),
                                                (heads, seq, dim)))
    q *= 30.0 / np.abs(q @ k).max()
    mask = np.broadcast_to(np.arange(seq)[None, :] <= np.arange(rows)[:, None] + seq - rows,
                           (heads, rows, seq)).astype(float)
    xs = [a.astype(np.float32) for a in (q, k, v, mask)]
    for dev in _devices():
        plan = dev.lower(structure, None, "flash")
        (exp,) = [st for kk in plan.kernels for ph in kk.phases for lp in ph.loops
                  for st in lp.col if getattr(st, "op", "") == "exp"]
        assert exp.attrs.get("shift") and not exp.attrs.get("local")
        if dev.kind == "cpu":
            assert exp.attrs.get("rows"), "the C++ dialect keeps the running max in rows"
        res = dev.check(plan, program.build(), inputs=xs, worker=worker)
        assert res.ok, (dev.kind, res.message)
        assert np.isfinite(res.outputs[0]).all()


def test_random_4748s_ill_conditioned_element_passes_on_every_path(worker):
    """random_4748, ``(T1 - B) / T1`` with T1 a 96-term dot product, on its dataset inputs
    (seed 4748): T1 is ~5e-5 at (3, 3, 16), where every kernel of every structure was refused
    (off by 7e-4 relative: float32's rounding of T1, amplified by 1/T1).  The program as
    written now passes by its rounding slack, and says so, through a single isolated job
    (``run_trial``), a batch job (``run_trials``) and the Triton interpreter's call job."""
    from search import random_program

    g = random_program(4748).build()
    cpu = get_device("cpu")
    results = [cpu.run_trial(g, g, {"g0": 8, "tile_rows": 8}, seed=4748, worker=worker),
               *cpu.run_trials(g, g, [{"g0": 2, "tile_rows": 4}], seed=4748, worker=worker)]
    for dev in _devices()[1:]:  # the interpreter is untimed: its check, not its trial
        res = dev.build(g, {}, reference=g, seed=4748, worker=worker)
        results.append({"status": res.status, "message": res.message})
    for res in results:
        assert res["status"] == "ok", res["message"]
        assert "1 of 3072 elements within tolerance only by their rounding slack" \
            in res["message"] and "index (3, 3, 16)" in res["message"]
