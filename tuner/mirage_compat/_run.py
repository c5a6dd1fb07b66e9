"""A Mirage kernel graph run as written: ``graph(inputs=[...])`` and
``mi.generate_cuda_program(graph.cygraph, ...)``.

The graph, customized kernels and predefined ops alike, is lowered as the structure it is (no
search), rendered for this machine's device, checked once in the isolated worker against the
float interpreter of the same graph (so a lowering fault is an error, not a wrong answer or a
crash of this process), then loaded and kept on the graph for the next call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from search import KernelGraph, ShapeError, Tensor

# Mirage's target_cc -> a GPU of the device table with that compute capability
TARGET_CC = {80: "A100", 86: "RTX A6000", 90: "H100"}


def run_graph(graph: KernelGraph, arrays: Sequence[Any], inputs: Sequence[Any] | None,
              outputs: Sequence[Any] | None, options: Mapping[str, Any]) -> list:
    """``graph(inputs=[...], outputs=None)``: ``outputs`` names the graph tensors to return
    (where the graph marks none) or gives arrays to write into.  Mirage's run options
    (``enable_online_softmax``, ``stream``, ...) do not change what is computed here."""
    if inputs is not None:
        if arrays:
            raise TypeError("give the inputs positionally or as inputs=[...], not both")
        arrays = tuple(inputs)
    out_tensors = [t for t in outputs or () if isinstance(t, Tensor)]
    buffers = None if out_tensors or outputs is None else list(outputs)
    kernel = _compiled(graph, out_tensors)
    return kernel(*arrays, out=buffers)


def _compiled(graph: KernelGraph, out_tensors: list[Tensor]) -> Any:
    runnable = graph
    if out_tensors:
        if graph.output_ids and [t.id for t in out_tensors] != graph.output_ids:
            raise ShapeError("graph(outputs=[...]): the graph already marks outputs "
                             f"{graph.output_ids}; pass those or mark none")
        if not graph.output_ids:
            runnable = graph.replay()
            for t in out_tensors:
                runnable.mark_output(Tensor(runnable, t.id))
    if not runnable.output_ids:
        raise ShapeError("graph(inputs=...): mark an output first (graph.mark_output(t)) or "
                         "pass outputs=[tensors of the graph]")
    key = (len(graph.ops), tuple(runnable.output_ids))
    cache = graph.__dict__.setdefault("_mirage_kernels", {})
    if key not in cache:
        cache[key] = build_kernel(runnable)
    return cache[key]


def build_kernel(graph: KernelGraph, device: str | None = None) -> Any:
    """The graph lowered as it stands for ``device`` (default: ``cuda`` where usable, else
    ``cpu``), checked in the isolated worker, loaded as a callable."""
    from kernels import cuda_available, get_device

    dev = get_device(device or ("cuda" if cuda_available()[0] else "cpu"))
    res = dev.build(graph, name="mirage")
    if not res.ok:
        raise RuntimeError(f"graph(inputs=...): the graph as written did not pass its check "
                           f"on {dev.kind} ({res.status}): {res.message}")
    return dev.load(res.plan, res.source)


def generate_cuda_program(cygraph: KernelGraph, *, target_cc: int = 80,
                          input_strides: Sequence[Sequence[int]] | None = None,
                          **_: Any) -> dict[str, Any]:
    """Mirage's ``generate_cuda_program``: the graph as written, lowered for a GPU of compute
    capability ``target_cc`` and printed in the CUDA dialect (``code``), with the workspace
    (``buf_size``, bytes) and the largest shared-memory use (``max_smem_size``)."""
    from kernels import lower, render

    if int(target_cc) not in TARGET_CC:
        raise ValueError(f"generate_cuda_program: target_cc {target_cc} — use one of "
                         f"{sorted(TARGET_CC)}")
    for dims, strides in zip(cygraph.input_shapes(), input_strides or (), strict=False):
        want = [1]
        for d in reversed(dims[1:]):
            want.insert(0, want[0] * int(d))
        if tuple(int(s) for s in strides) != tuple(want):
            raise ShapeError(f"generate_cuda_program: input strides {tuple(strides)} — only "
                             f"row-major tensors are supported (strides {tuple(want)})")
    plan = lower(cygraph, None, TARGET_CC[int(target_cc)], "mirage")
    return {"code": render(plan, "cuda"), "buf_size": plan.workspace_floats * 4,
            "max_smem_size": max((k.smem_bytes for k in plan.kernels), default=0),
            "output_directives": []}


def generate_cpu_program(cygraph: KernelGraph, **_: Any) -> dict[str, Any]:
    """``generate_cuda_program`` for this machine's cpu (what a script whose ``cuda`` became
    ``cpu`` calls): the graph printed in the C++/OpenMP dialect (``code``)."""
    from kernels import lower, render

    plan = lower(cygraph, None, "cpu", "mirage")
    return {"code": render(plan, "cpp"), "buf_size": plan.workspace_floats * 4,
            "max_smem_size": max((k.smem_bytes for k in plan.kernels), default=0),
            "output_directives": []}
