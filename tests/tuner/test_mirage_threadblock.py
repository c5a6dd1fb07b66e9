"""Thread-block graphs written in Mirage's spelling (`import tuner as mi`), run as written with
`graph(inputs=[...])` on the cpu and compared with numpy; what cannot be expressed says why."""

from __future__ import annotations

import numpy as np
import pytest

import tuner as mi
from search import ShapeError
from tuner.mirage_compat import MirageUnsupported

RNG = np.random.default_rng(0)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape, dtype=np.float32)


def _rms_norm_matmul(dtype: str = mi.float32) -> mi.KNGraph:
    graph = mi.new_kernel_graph()
    X = graph.new_input(dims=(16, 256), dtype=dtype)
    W = graph.new_input(dims=(256, 128), dtype=dtype)
    tb = mi.new_threadblock_graph(grid_dim=(4, 1, 1), block_dim=(128, 1, 1), forloop_range=8,
                                  reduction_dimx=64)
    tX = tb.new_input(dtensor=X, input_map=(-1, -1, -1), forloop_dim=1)
    tW = tb.new_input(dtensor=W, input_map=(1, -1, -1), forloop_dim=0)
    tM = tb.matmul(tX, tW)
    tAccX = tb.forloop_accum(tX, "rms")
    tAccM = tb.forloop_accum(tM)
    tb.new_output(stensor=tb.div(tAccM, tAccX), output_map=(1, -1, -1))
    out_ts = graph.customized([X, W], tb)
    graph.mark_output(out_ts[0])
    return graph


def test_rms_norm_matmul_as_mirage_writes_it() -> None:
    x, w = _rand(16, 256), _rand(256, 128)
    (out,) = _rms_norm_matmul()(inputs=[x, w])
    want = (x / np.sqrt(np.mean(x * x, axis=1, keepdims=True))) @ w
    assert out.shape == (16, 128)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-3)


def test_a_float16_graph_takes_and_gives_float16_as_it_is() -> None:
    torch = pytest.importorskip("torch", reason="Mirage's scripts pass torch tensors")
    x, w = (torch.randn(*s, dtype=torch.float16) for s in ((16, 256), (256, 128)))
    (out,) = _rms_norm_matmul(mi.float16)(inputs=[x, w])
    assert out.dtype == torch.float16
    xf, wf = x.float().numpy(), w.float().numpy()
    want = (xf / np.sqrt(np.mean(xf * xf, axis=1, keepdims=True))) @ wf
    np.testing.assert_allclose(out.float().numpy(), want, rtol=2e-2,
                               atol=2e-2 * float(np.abs(want).max()))


def test_gated_mlp_as_mirage_writes_it() -> None:
    graph = mi.new_kernel_graph()
    X = graph.new_input(dims=(8, 128), dtype=mi.float32)
    W1 = graph.new_input(dims=(128, 256), dtype=mi.float32)
    W2 = graph.new_input(dims=(128, 256), dtype=mi.float32)
    tb = mi.new_threadblock_graph(grid_dim=(4, 1, 1), block_dim=(128, 1, 1), forloop_range=4,
                                  reduction_dimx=64)
    tX = tb.new_input(dtensor=X, input_map=(-1, -1, -1), forloop_dim=1)
    tW1 = tb.new_input(dtensor=W1, input_map=(1, -1, -1), forloop_dim=0)
    tW2 = tb.new_input(dtensor=W2, input_map=(1, -1, -1), forloop_dim=0)
    tA1 = tb.forloop_accum(tb.matmul(tX, tW1))
    tA2 = tb.forloop_accum(tb.matmul(tX, tW2))
    tb.new_output(stensor=tb.mul(tb.silu(tA1), tA2), output_map=(1, -1, -1))
    out_ts = graph.customized([X, W1, W2], tb)
    graph.mark_output(out_ts[0])
    x, w1, w2 = _rand(8, 128), _rand(128, 256), _rand(128, 256)
    (out,) = graph(inputs=[x, w1, w2])
    d = x @ w1
    np.testing.assert_allclose(out, d / (1 + np.exp(-d)) * (x @ w2), rtol=1e-4, atol=1e-3)


def test_group_query_attention_in_two_customized_kernels() -> None:
    """Mirage's GQA reference in its two-kernel form: per head and query block, exp(QK) V and
    the row sums of exp(QK) over the for-loop of key blocks, then one divide."""
    graph = mi.new_kernel_graph()
    Q = graph.new_input(dims=(2, 32, 16), dtype=mi.float32)
    K = graph.new_input(dims=(2, 16, 128), dtype=mi.float32)
    V = graph.new_input(dims=(2, 128, 16), dtype=mi.float32)
    tb1 = mi.new_threadblock_graph(grid_dim=(2, 1, 2), block_dim=(128, 1, 1), forloop_range=4,
                                   reduction_dimx=16)
    bQ = tb1.new_input(dtensor=Q, input_map=(0, -1, 1), forloop_dim=-1)
    bK = tb1.new_input(dtensor=K, input_map=(0, -1, -1), forloop_dim=2)
    bV = tb1.new_input(dtensor=V, input_map=(0, -1, -1), forloop_dim=1)
    bE = tb1.exp(tb1.matmul(bQ, bK))
    bO1 = tb1.forloop_accum(tb1.matmul(bE, bV))
    bO2 = tb1.forloop_accum(bE, "sum")
    tb1.new_output(stensor=bO1, output_map=(0, -1, 1))
    tb1.new_output(stensor=bO2, output_map=(0, -1, 1))
    out_ts = graph.customized([Q, K, V], tb1)
    tb2 = mi.new_threadblock_graph(grid_dim=(2, 4, 1), block_dim=(128, 1, 1), forloop_range=1,
                                   reduction_dimx=16)
    bA = tb2.forloop_accum(tb2.new_input(dtensor=out_ts[0], input_map=(0, 1, -1), forloop_dim=-1),
                           "sum_todimx")  # already reduction_dimx wide: the plain sum
    bB = tb2.forloop_accum(tb2.new_input(dtensor=out_ts[1], input_map=(0, 1, -1), forloop_dim=-1),
                           "sum")
    tb2.new_output(stensor=tb2.div(bA, bB), output_map=(0, 1, -1))
    (out_t,) = graph.customized(out_ts, tb2)
    graph.mark_output(out_t)
    q, k, v = _rand(2, 32, 16) * 0.3, _rand(2, 16, 128) * 0.3, _rand(2, 128, 16)
    # Mirage's call form with options it has (online softmax) that change nothing here
    (out,) = graph(inputs=[q, k, v], enable_online_softmax=True)
    e = np.exp(q @ k)
    np.testing.assert_allclose(out, (e @ v) / e.sum(-1, keepdims=True), rtol=1e-4, atol=1e-4)


def test_outputs_named_at_the_call_and_written_into_arrays() -> None:
    graph = _rms_norm_matmul()
    x, w = _rand(16, 256), _rand(256, 128)
    buf = np.zeros((16, 128), np.float32)
    (got,) = graph(inputs=[x, w], outputs=[buf])
    assert got is buf and np.abs(buf).sum() > 0
    unmarked = mi.new_kernel_graph()
    a = unmarked.new_input(dims=(4, 32), dtype=mi.float32)
    e = unmarked.exp(a)
    (out,) = unmarked(inputs=[x[:4, :32]], outputs=[e])  # Mirage's outputs=O (tensors)
    np.testing.assert_allclose(out, np.exp(x[:4, :32]), rtol=1e-5)


def test_the_graph_prints_as_cuda_and_cpp() -> None:
    graph = _rms_norm_matmul(mi.float16)
    cuda = mi.generate_cuda_program(graph.cygraph, target_cc=80,
                                    input_strides=[(256, 1), (128, 1)])
    assert "__global__" in cuda["code"] and "half" in cuda["code"]
    assert "extern \"C\" void kernel" in mi.generate_cpu_program(graph.cygraph)["code"]
    with pytest.raises(ShapeError, match="row-major"):
        mi.generate_cuda_program(graph.cygraph, target_cc=80, input_strides=[(1, 16), (128, 1)])


def test_what_cannot_be_expressed_says_why() -> None:
    graph = mi.new_kernel_graph()
    X = graph.new_input(dims=(2, 16, 256), dtype=mi.float16)
    tb = mi.new_threadblock_graph(grid_dim=(2, 1, 1), block_dim=(128, 1, 1), forloop_range=1,
                                  reduction_dimx=64)
    bX = tb.new_input(dtensor=X, input_map=(0, -1, -1), forloop_dim=-1)
    with pytest.raises(MirageUnsupported, match="sum_todimx.*strided sum"):
        tb.forloop_accum(bX, "sum_todimx")
    for call in ("forloop_accum_rescale", "forloop_accum_max", "reduction_max", "concat"):
        with pytest.raises(MirageUnsupported, match=call):
            getattr(tb, call)(bX)
    with pytest.raises(MirageUnsupported, match="forloop_dim"):
        tb.new_output(stensor=bX, output_map=(0, -1, -1), forloop_dim=1)
    with pytest.raises(ShapeError, match="acc 'max'"):
        tb.forloop_accum(bX, "max")
    for call in ("concat", "reduction_max", "clamp"):  # kernel-level calls with no op here
        with pytest.raises(MirageUnsupported, match=call):
            getattr(graph, call)(X)
    Y = graph.new_input(dims=(2, 16, 256), dtype=mi.float16)
    tb.forloop_accum(bX)
    with pytest.raises(ShapeError, match="customized: inputs"):
        graph.customized([Y], tb)
