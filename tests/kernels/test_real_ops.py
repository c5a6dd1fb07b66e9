"""The blocks real models are made of, end to end: Llama's RMSNorm written as PyTorch writes it
(``x * rsqrt(mean(x²) + eps) * w``), LayerNorm as its decomposition (mean, sub, square, mean,
add eps, rsqrt, mul, affine), and a Linear layer's ``X @ W.t()`` with W in its stored
(transposed) layout: each searched to a verified single-kernel structure, lowered and run on
the cpu and (at small sizes) the Triton interpreter, and compared with numpy on real-scale
inputs.  Plus every new op of the table through both dialects."""

from __future__ import annotations

import numpy as np
import pytest

from cluster import LocalExecutor, search_program
from kernels import IsolatedWorker, get_device
from kernels.devices import as_stored, input_layouts, random_inputs
from search import KernelGraph, Limits, from_obj, parse_program

LIMITS = Limits(max_block_ops=9)
EPS = 1e-6

RMSNORM = """name: llama_rmsnorm
dtype: {dtype}
inputs:
  x: [16, 256]
  w: [1, 256]
body: |
  O = x * rsqrt(mean(square(x), -1) + 1e-6) * w
outputs: [O]
"""
LAYERNORM = """name: layernorm
dtype: {dtype}
inputs:
  x: [16, 256]
  w: [1, 256]
  b: [1, 256]
body: |
  d = x - mean(x, -1)
  O = d * rsqrt(mean(square(d), -1) + 1e-5) * w + b
outputs: [O]
"""
LINEAR_T = """name: linear_t
dtype: {dtype}
inputs:
  X: [16, 128]
  W: {{shape: [128, 64], layout: transposed}}
body: |
  O = matmul(X, W)
outputs: [O]
"""


def _numpy(name: str, xs: list[np.ndarray]) -> np.ndarray:
    x = [a.astype(np.float64) for a in xs]
    if name == "rms":
        return x[0] / np.sqrt((x[0] ** 2).mean(-1, keepdims=True) + EPS) * x[1]
    if name == "ln":
        d = x[0] - x[0].mean(-1, keepdims=True)
        return d / np.sqrt((d ** 2).mean(-1, keepdims=True) + 1e-5) * x[1] + x[2]
    return x[0] @ x[1].T  # W as stored: [N, K], the Linear weight itself


PROGRAMS = {"rms": RMSNORM, "ln": LAYERNORM, "mmT": LINEAR_T}


@pytest.fixture(scope="module")
def worker():
    with IsolatedWorker() as w:
        yield w


def _kernels(g: KernelGraph) -> list[str]:
    return [op.kind for op in g.ops if op.kind not in ("input", "output")]


@pytest.fixture(scope="module")
def searched():
    """name -> (program, its verified single graph-defined kernel)."""
    out = {}
    for name, text in PROGRAMS.items():
        program = parse_program(text.format(dtype="float16"))
        result = search_program(program, LIMITS, executor=LocalExecutor(), time_limit_s=60)
        fused = [s for s in result.verified.values() if _kernels(s) == ["graph_kernel"]]
        assert fused, f"{name}: no verified single-kernel structure"
        out[name] = (program, min(fused, key=lambda s: len(s.block_graphs()[0].ops)))
    return out


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_searched_block_runs_on_the_cpu_like_numpy(name, searched, worker):
    program, structure = searched[name]
    reference = program.build()
    cpu = get_device("cpu")
    xs = as_stored(random_inputs(reference, seed=1), input_layouts(reference))
    res = cpu.build(structure, reference=reference, inputs=xs, worker=worker)
    assert res.ok, res.message
    # the programs are float16: the kernel computes in float32 and stores float16 outputs
    np.testing.assert_allclose(res.outputs[0], _numpy(name, xs), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_searched_block_runs_under_the_triton_interpreter(name, searched, worker):
    pytest.importorskip("triton", reason="Triton is not installed (the cuda extra)")
    pytest.importorskip("torch", reason="the Triton interpreter runs on torch CPU tensors")
    from kernels.devices import TritonInterpreter

    program, structure = searched[name]
    reference = program.build()
    xs = as_stored(random_inputs(reference, seed=2), input_layouts(reference))
    res = TritonInterpreter("H100").build(structure, reference=reference, inputs=xs,
                                          worker=worker)
    assert res.ok, res.message
    want = _numpy(name, [x.astype(np.float16) for x in xs])
    np.testing.assert_allclose(res.outputs[0], want, rtol=2e-2, atol=2e-2)


def test_a_transposed_input_is_read_through_its_strides_not_copied(searched):
    _, structure = searched["mmT"]
    plan = get_device("cpu").lower(structure, None, "lin")
    (w,) = [b for b in plan.inputs if b.layout == "transposed"]
    assert w.shape == (128, 64) and w.stored_shape == (64, 128)
    assert w.strides == (1, 128)
    assert not [b for k in plan.kernels for b in k.buffers.values() if b.shape == (128, 64)]


def test_every_new_op_lowers_and_runs_on_every_dialect(worker):
    text = """name: new_ops
dtype: float16
inputs:
  X: [8, 64]
  W: {shape: [64, 32], layout: transposed}
body: |
  A = tanh(-X) + rsqrt(rms_norm(X, eps=1e-5) * X + 1)
  B = 1 - A
  O = matmul(B - 0.5, W)
outputs: [O]
"""
    program = parse_program(text)
    reference = program.build()
    xs = as_stored(random_inputs(reference, seed=3), input_layouts(reference))
    x, wt = (a.astype(np.float64) for a in xs)
    r = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5)
    want = (1 - (np.tanh(-x) + 1 / np.sqrt(r * x + 1)) - 0.5) @ wt.T
    devices = [get_device("cpu")]
    try:
        from kernels.devices import TritonInterpreter

        devices.append(TritonInterpreter("H100"))
    except Exception:  # noqa: BLE001 - no Triton here: the cpu's dialect still runs
        pass
    for dev in devices:
        res = dev.build(reference, reference=reference, inputs=xs, worker=worker)
        assert res.ok, (dev.kind, res.message)
        assert np.isfinite(res.outputs[0]).all()
        tol = 2e-3 if dev.kind == "cpu" else 3e-2  # float16 outputs (computed in float32)
        np.testing.assert_allclose(res.outputs[0], want, rtol=tol, atol=tol)


def test_searched_structure_keeps_the_layout(searched):
    _, structure = searched["mmT"]
    again = from_obj({"format": "tuner.mugraph/1", **_obj(structure)})
    assert input_layouts(again) == ["row", "transposed"]


def _obj(g: KernelGraph) -> dict:
    from search import to_obj

    obj = to_obj(g)
    obj.pop("format")
    return obj


def test_real_blocks_compile_for_sm_90(searched):
    """CUDA-C through nvcc and the Triton dialect through triton.compile, both for sm_90:
    the norms, the transposed Linear weight and a masked softmax (its max pass and group_max)."""
    from kernels import lower, nvcc_available, nvcc_check, render

    masked = parse_program("""name: masked
dtype: float16
inputs:
  X: [16, 256]
  M: [16, 256]
body: |
  E = exp(X) * M
  O = E / sum(E, -1)
outputs: [O]
""")
    result = search_program(masked, Limits(max_block_ops=6), executor=LocalExecutor(),
                            time_limit_s=60)
    fused = [s for s in result.verified.values() if _kernels(s) == ["graph_kernel"]]
    structures = {**{n: s for n, (_, s) in searched.items()}, "masked": fused[0]}
    if nvcc_available():
        plans = [lower(s, None, "H100", f"real_{n}") for n, s in structures.items()]
        source = render(plans, "cuda")
        assert "group_max<" in source
        report = nvcc_check(source, "sm_90")
        for plan in plans:
            for k in plan.kernels:
                assert not report.kernel(k.name).spills, k.name
    pytest.importorskip("triton", reason="Triton is not installed (the cuda extra)")
    from kernels.devices import compile_plan

    for n, s in structures.items():
        plan = lower(s, {"triton": 1}, "H100", f"real_{n}")
        assert compile_plan(plan, render(plan), 90), n
