"""The ``cuda`` device: rendered CUDA compiled by NVRTC through CuPy, timed with CUDA events.

A plan's CUDA text declares ``extern "C"`` kernels taking ``(inputs…, outputs…, float* ws,
unsigned int* bar)``; ``launches`` lists them in order with their grid and block sizes, the
workspace holds ``plan.workspace_floats`` floats and the barrier array ``2 · plan.barriers``
zeroed counters (docs/kernels.md).  Building, the check and timing happen in the isolated
worker (a ``call`` job): an illegal address poisons a CUDA context for good, so it must cost
a worker, not the tuner.  The op-by-op baseline is the reference graph run by the interpreter
over CuPy arrays in the program's dtype (cuBLAS for the matmuls), timed in the same worker
with the same loop and clock.

Without a GPU (or without CuPy) ``CudaDevice()`` raises ``DeviceUnavailable`` with a
one-line reason (``kernels.machine.cuda_available``).  First run on a GPU: an H100, 2026-11-22
(docs/devices.md has the table).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.device_names import device_key
from kernels.hardware import DeviceSpec, cuda_device_spec
from kernels.lowering import KernelPlan
from kernels.machine import cuda_available
from search.ir import KernelGraph, from_obj, to_obj
from verifier import FloatArith, run

from ._base import TRIAL_TIMING, Device, DeviceUnavailable, Execution
from ._check import Expected, as_stored, input_layouts, random_inputs
from ._isolate import IsolatedWorker, run_isolated
from ._nvrtc import NVRTC_OPTIONS
from ._status import COMPILE_ERROR, OK, RUNTIME_ERROR
from ._storage import STORAGE, from_storage, to_storage
from ._timing import measure
from ._worker import checked


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch: ``args`` are ``in:i``, ``out:j``, ``ws`` and ``bar``, in order."""

    kernel: str
    blocks: int
    threads: int
    args: tuple[str, ...]


def launches(plan: KernelPlan) -> list[KernelLaunch]:
    """The plan's launches in order, with the argument list its CUDA signatures declare."""
    out = []
    for k in plan.kernels:
        args = []
        for p in k.params:
            b = plan.globals[p]
            if b.role not in ("input", "output"):
                raise ValueError(f"launches: {k.name} takes {p} ({b.role}); only program "
                                 "inputs and outputs are kernel parameters")
            args.append(f"{'in' if b.role == 'input' else 'out'}:{b.io_index}")
        out.append(KernelLaunch(k.name, k.blocks, k.mapping.threads, (*args, "ws", "bar")))
    return out


# ---------------------------------------------------------------- the device


class CudaDevice(Device):
    """One GPU of this machine, through CuPy.  It runs either dialect: CUDA C (NVRTC) or
    Triton, as the plan chose (the ``triton`` knob of its config)."""

    kind = "cuda"
    dialect = "cuda"

    def render(self, plan: KernelPlan) -> str:
        """The plan in the dialect its config chose (``triton=1``), else CUDA C."""
        from kernels.rendering import render

        return render(plan, plan.dialect or self.dialect)

    def __init__(self, index: int = 0) -> None:
        ok, reason = cuda_available()
        if not ok:
            raise DeviceUnavailable(f"the cuda device is unavailable: {reason}")
        self.index = index
        self._spec = cuda_device_spec(index)

    @property
    def key(self) -> str:
        return device_key("cuda", self.index)

    @property
    def spec(self) -> DeviceSpec:
        return self._spec

    def stored(self, plan: KernelPlan, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        dtypes = [b.dtype for b in plan.inputs]
        return [from_storage(to_storage(x, d), d) for x, d in zip(inputs, dtypes, strict=True)]

    def compute_dtype(self, plan: KernelPlan) -> str:
        return plan.dtype

    def execute(self, plan: KernelPlan, source: str, inputs: list[np.ndarray],
                want: Expected | None, *, timing: dict | None, worker: IsolatedWorker | None,
                timeout_s: float, baseline: KernelGraph | None = None) -> Execution:
        args: dict = {"plan": plan, "source": source, "device": self.index}
        if baseline is not None:
            args["baseline"] = to_obj(baseline)
        job = {"call": "kernels.devices._cuda:worker_job", "args": args, "inputs": inputs,
               "outputs": [tuple(b.shape) for b in plan.outputs], "timing": timing}
        if want is not None:
            job.update(expected=want.outputs, slack=want.slack, rtol=want.rtol, atol=want.atol)
        res = run_isolated(job, timeout_s, worker)
        return Execution(res.status, res.message, plan, source,
                         list(res.payload.get("max_abs_err", [])),
                         list(res.payload.get("outputs", [])), res.payload.get("timing"),
                         res.payload.get("baseline"))

    def time_baseline(self, reference: KernelGraph, *, seed: int = 0,
                      timing: Mapping | None = None, worker: IsolatedWorker | None = None,
                      timeout_s: float = 600.0) -> float | None:
        dtype = reference.tensors[reference.input_ids[0]].dtype if reference.input_ids \
            else "float32"
        xs = [from_storage(to_storage(x, dtype), dtype) for x in
              as_stored(random_inputs(reference, seed), input_layouts(reference))]
        res = run_isolated({"call": "kernels.devices._cuda:baseline_job", "inputs": xs,
                            "timing": {**TRIAL_TIMING, **(timing or {})},
                            "args": {"reference": to_obj(reference), "dtype": dtype,
                                     "device": self.index}}, timeout_s, worker)
        return res.payload["timing"]["median_s"] if res.ok else None

    def load(self, plan: KernelPlan, source: str) -> Callable[..., list]:
        import cupy

        kernel = build_kernel(cupy, plan, source)

        def call(*inputs: Any) -> list:
            outs = [cupy.empty(b.shape, STORAGE.get(b.dtype, np.float32)) for b in plan.outputs]
            kernel([cupy.asarray(x, STORAGE.get(b.dtype, np.float32))
                    for x, b in zip(inputs, plan.inputs, strict=True)], outs)
            return outs

        return call


def _include_options(cp: Any) -> tuple[str, ...]:
    """NVRTC needs the toolkit's headers for cuda_fp16.h / cuda_bf16.h (without a GPU,
    ``nvrtc_check`` finds the same headers its own way: ``nvrtc_include_dir``)."""
    try:
        path = cp.cuda.get_cuda_path()
    except Exception:  # noqa: BLE001 - CuPy raises various errors when the toolkit is absent
        path = None
    return (f"-I{path}/include",) if path else ()


class CudaKernel:
    """A plan's CUDA module on the current device: call it with CuPy arrays in the plan's
    storage dtypes (``STORAGE``)."""

    def __init__(self, cp: Any, plan: KernelPlan, source: str,
                 options: Sequence[str] = NVRTC_OPTIONS) -> None:
        self.plan, self.source = plan, source
        self.module = cp.RawModule(code=source, options=(*options, *_include_options(cp)))
        self.launches = launches(plan)
        self.functions = {ln.kernel: self.module.get_function(ln.kernel)
                          for ln in self.launches}
        self.ws = cp.zeros(max(1, plan.workspace_floats), dtype=cp.float32)
        self.bar = cp.zeros(max(1, 2 * plan.barriers), dtype=cp.uint32)

    def __call__(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        """Launch every kernel in order on the current stream (asynchronous)."""
        pick = {"ws": self.ws, "bar": self.bar}
        for ln in self.launches:
            args = [pick[a] if a in pick else
                    (inputs if a.startswith("in:") else outputs)[int(a.split(":")[1])]
                    for a in ln.args]
            self.functions[ln.kernel]((ln.blocks,), (ln.threads,), tuple(args))


def is_triton_source(source: str) -> bool:
    return source.startswith("# generated by kernels.render (triton dialect)")


def build_kernel(cp: Any, plan: KernelPlan, source: str) -> Any:
    """The plan's kernels on the current GPU, in the dialect ``source`` is written in: CUDA C
    through NVRTC, or Triton (compiled at the first launch)."""
    if is_triton_source(source):
        from ._triton import TritonKernel

        kernel = TritonKernel(plan, source, cupy=cp)
        io = [cp.zeros(b.stored_shape, STORAGE.get(b.dtype, np.float32)) for b in plan.inputs]
        outs = [cp.zeros(b.shape, STORAGE.get(b.dtype, np.float32)) for b in plan.outputs]
        kernel(io, outs)  # Triton compiles at the first launch: a compile error shows here
        cp.cuda.Device().synchronize()
        return kernel
    return CudaKernel(cp, plan, source)


class EventClock:
    """``kernels.devices.Clock`` over CUDA events: launches are asynchronous, so only events
    around them on the stream see the GPU's own time."""

    def __init__(self, cp: Any) -> None:
        self.cp = cp
        self.begin, self.end = cp.cuda.Event(), cp.cuda.Event()

    def start(self) -> None:
        self.begin.record()

    def stop(self) -> float:
        self.end.record()
        self.end.synchronize()
        return self.cp.cuda.get_elapsed_time(self.begin, self.end) * 1e-3


# ---------------------------------------------------------------- worker side


def cupy_arith(cp: Any) -> Any:
    """The float interpreter's arithmetic over CuPy arrays (the op-by-op GPU baseline)."""
    class CupyArith(FloatArith):
        name = "cupy"

        def matmul(self, a, b):
            return cp.matmul(a, b)

        def exp(self, a):
            return cp.exp(a)

        def sqrt(self, a):
            return cp.sqrt(a)

        def sigmoid(self, a):
            return 0.5 + 0.5 * cp.tanh(0.5 * a)

        def gelu(self, a):
            return 0.5 * a * (1.0 + cp.tanh(0.7978845608028654 * (a + 0.044715 * a * a * a)))

        def relu(self, a):
            return cp.maximum(a, 0.0)

        def rsqrt(self, a):
            return 1.0 / cp.sqrt(a)

        def tanh(self, a):
            return cp.tanh(a)

        def sum_axes(self, a, axes):
            self._check_axes(a, axes)
            return cp.sum(a, axis=tuple(axes), keepdims=True)

    return CupyArith()


def _errors(cp: Any) -> tuple[type, ...]:
    return (cp.cuda.runtime.CUDARuntimeError, cp.cuda.driver.CUDADriverError)


def worker_job(inputs: list[np.ndarray], expected: list[np.ndarray], args: dict) -> dict:
    """Run in the isolated worker: compile, launch once, check, time; optionally the baseline.

    ``args``: plan, source, device (index), timing (None: no timing), rtol, atol, slack, and
    ``baseline`` (a reference graph's canonical object, timed op by op in the program's
    dtype after the kernel)."""
    ok, reason = cuda_available()
    if not ok:
        return {"status": RUNTIME_ERROR, "message": f"the cuda device is unavailable: {reason}"}
    import cupy as cp

    cp.cuda.Device(args.get("device", 0)).use()
    plan: KernelPlan = args["plan"]
    try:
        kernel = build_kernel(cp, plan, args["source"])
    except cp.cuda.compiler.CompileException as e:
        return {"status": COMPILE_ERROR, "message": str(e).strip()[:4000]}
    except Exception as e:  # noqa: BLE001 - Triton's compiler raises its own error types
        return {"status": COMPILE_ERROR, "message": f"{type(e).__name__}: {e}"[:4000]}
    io = {b.io_index: b.dtype for b in plan.inputs}
    xs = [cp.asarray(to_storage(x, io[i])) for i, x in enumerate(inputs)]
    outs = [cp.asarray(to_storage(np.full(b.shape, np.nan, np.float32), b.dtype))
            for b in plan.outputs]
    try:
        kernel(xs, outs)
        cp.cuda.Device().synchronize()
    except _errors(cp) as e:
        return {"status": RUNTIME_ERROR, "message": f"kernel launch failed: {e}"}
    host = [from_storage(cp.asnumpy(o), b.dtype) for o, b in zip(outs, plan.outputs, strict=True)]
    reply = checked(host, expected, args.get("rtol", 0.0), args.get("atol", 0.0),
                    {"outputs": host}, args.get("slack"))
    if reply["status"] != OK or args.get("timing") is None:
        return reply
    try:
        clock = EventClock(cp)
        reply["timing"] = measure(lambda: kernel(xs, outs), clock=clock,
                                  **args["timing"]).as_dict()
        if args.get("baseline"):
            # op by op in the program's dtype, as a framework would (bfloat16: float32)
            base = [x if x.dtype != cp.uint16 else cp.asarray(inputs[i])
                    for i, x in enumerate(xs)]
            reply["baseline"] = _time_reference(cp, args["baseline"], base, args["timing"])
    except _errors(cp) as e:
        return {"status": RUNTIME_ERROR, "message": f"failed while timing: {e}"}
    return reply


def baseline_job(inputs: list[np.ndarray], expected: list[np.ndarray], args: dict) -> dict:
    """Worker side: the reference graph op by op with CuPy in ``args["dtype"]``, timed."""
    import cupy as cp

    cp.cuda.Device(args.get("device", 0)).use()
    dtype = STORAGE.get(args["dtype"], np.float32)
    xs = [cp.asarray(x, np.float32 if dtype == np.uint16 else dtype) for x in inputs]
    try:
        return {"status": OK, "message": "",
                "timing": _time_reference(cp, args["reference"], xs, args["timing"])}
    except _errors(cp) as e:
        return {"status": RUNTIME_ERROR, "message": f"the baseline failed: {e}"}


def _time_reference(cp: Any, graph_obj: dict, xs: list, timing: dict) -> dict:
    """The reference op by op on the kernel's (stored) inputs: transposed ones as views."""
    graph, arith = from_obj(graph_obj), cupy_arith(cp)
    xs = [cp.swapaxes(x, -1, -2) if lay == "transposed" else x
          for x, lay in zip(xs, input_layouts(graph), strict=True)]
    return measure(lambda: run(graph, xs, arith), clock=EventClock(cp), **timing).as_dict()
