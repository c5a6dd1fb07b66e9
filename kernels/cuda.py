"""The ``cuda`` device: rendered CUDA compiled by CuPy, launched per the plan, timed with events.

A plan's CUDA text (``render(plan, "cuda")``) declares ``extern "C"`` kernels taking
``(inputs…, outputs…, float* ws, unsigned int* bar)``; ``launches`` lists them in order with
their grid and block sizes, the workspace holds ``plan.workspace_floats`` floats and the
barrier array ``2 · plan.barriers`` zeroed counters (docs/kernels.md).  CuPy's ``RawModule``
compiles the text with NVRTC.  Building and timing happen in the isolated worker (a ``call``
job of ``kernels.isolate``): an illegal address poisons a CUDA context for good, so it must
kill a worker, not the tuner.  The op-by-op baseline is the reference graph run by the
interpreter over CuPy arrays in the program's dtype, timed the same way.

Without a GPU (or without CuPy) ``available()`` says why in one line and ``build_cuda`` /
``measure_program_cuda`` raise ``CudaUnavailable`` with that line.  This module has not been
run on a GPU: the machine it was written on has none (docs/kernels.md says what is tested).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernels.devices import cuda_available, cuda_device_spec, device_key
from kernels.isolate import IsolatedWorker, _compare, run_isolated
from kernels.timing import Timing, _stats

from .build import BuildResult, random_inputs, reference, tolerance
from .lower import concretize, lower
from .measure import DEFAULT_TIMING, Measurement
from .plan import KernelPlan
from .render import render


class CudaUnavailable(RuntimeError):
    """No usable CUDA GPU (or no CuPy); the message is one line saying which."""


def available() -> tuple[bool, str]:
    """(True, what GPU) or (False, why not): never raises."""
    return cuda_available()


def require_cuda() -> None:
    ok, reason = available()
    if not ok:
        raise CudaUnavailable(f"the cuda device is unavailable: {reason}")


@dataclass(frozen=True)
class Launch:
    """One kernel launch: ``args`` are ``in:i``, ``out:j``, ``ws`` and ``bar``, in order."""

    kernel: str
    blocks: int
    threads: int
    args: tuple[str, ...]


def launches(plan: KernelPlan) -> list[Launch]:
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
        out.append(Launch(k.name, k.blocks, k.mapping.threads, (*args, "ws", "bar")))
    return out


# ---------------------------------------------------------------- storage dtypes

def to_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """Host array in the device's storage format: float32, float16, or bfloat16 as uint16 bits
    (round to nearest even)."""
    x = np.ascontiguousarray(x, np.float32)
    if dtype == "float16":
        return x.astype(np.float16)
    if dtype == "bfloat16":
        bits = x.view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return bits.astype(np.uint16)
    return x


def from_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 host array from a storage-format one."""
    if dtype == "bfloat16":
        return (np.asarray(x, np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(x, np.float32)


# ---------------------------------------------------------------- the device itself

def _cupy() -> Any:
    require_cuda()
    import cupy

    return cupy


def _include_options(cp: Any) -> tuple[str, ...]:
    """NVRTC needs the toolkit's headers for cuda_fp16.h / cuda_bf16.h."""
    try:
        path = cp.cuda.get_cuda_path()
    except Exception:  # noqa: BLE001 - CuPy raises various errors when the toolkit is absent
        path = None
    return (f"-I{path}/include",) if path else ()


class CudaKernel:
    """A plan's CUDA module on the current device: call it with CuPy arrays."""

    def __init__(self, plan: KernelPlan, source: str | None = None,
                 options: Sequence[str] = ("--std=c++17",)) -> None:
        cp = _cupy()
        self.plan = plan
        self.source = source if source is not None else render(plan, "cuda")
        self.module = cp.RawModule(code=self.source,
                                   options=(*options, *_include_options(cp)))
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


def time_events(fn: Callable[[], object], *, warmup: int = 2, min_repeats: int = 7,
                max_repeats: int = 2000, target_rse: float = 0.02, budget_s: float = 1.0,
                min_sample_s: float = 1e-4) -> Timing:
    """``kernels.timing.measure`` with CUDA events around each sample instead of the host
    clock: launches are asynchronous, so only events see the GPU's own time."""
    import time

    cp = _cupy()
    start_wall = time.perf_counter()
    begin, end = cp.cuda.Event(), cp.cuda.Event()

    def sample(calls: int) -> float:
        begin.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return cp.cuda.get_elapsed_time(begin, end) * 1e-3 / calls

    fastest = math.inf
    for _ in range(warmup):
        fastest = min(fastest, sample(1))
    per = max(1, math.ceil(min_sample_s / max(fastest, 1e-9))) if fastest < min_sample_s else 1
    samples: list[float] = []
    reason, rse = "max_repeats", math.inf
    while len(samples) < max_repeats:
        samples.append(sample(per))
        if len(samples) >= min_repeats:
            _, _, _, rse = _stats(samples)
            if rse <= target_rse:
                reason = "stable"
                break
        if time.perf_counter() - start_wall >= budget_s:
            reason = "budget"
            break
    med, mad, iqr, rse = _stats(samples)
    a = np.asarray(samples)
    return Timing(median_s=med, iqr_s=iqr, mad_s=mad, min_s=float(a.min()),
                  mean_s=float(a.mean()), rse=rse, samples_s=tuple(samples),
                  calls_per_sample=per, warmup=warmup,
                  stable=rse <= target_rse and len(samples) >= min_repeats,
                  stop_reason=reason, total_s=time.perf_counter() - start_wall)


# ---------------------------------------------------------------- worker side


def _cupy_arith(cp: Any) -> Any:
    """The float interpreter's arithmetic over CuPy arrays (the op-by-op GPU baseline)."""
    from verifier import FloatArith

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

        def sum_axes(self, a, axes):
            self._check_axes(a, axes)
            return cp.sum(a, axis=tuple(axes), keepdims=True)

    return CupyArith()


def worker_job(inputs: list[np.ndarray], expected: list[np.ndarray], args: dict) -> dict:
    """Run in the isolated worker: compile, launch once, check, time; optionally the baseline.

    ``args``: plan, source, timing (None: no timing), rtol, atol, and ``baseline`` (the
    reference graph's JSON, to time op by op in the program's dtype)."""
    ok, reason = available()
    if not ok:
        return {"status": "runtime_error", "message": f"the cuda device is unavailable: {reason}"}
    cp = _cupy()
    plan: KernelPlan = args["plan"]
    try:
        kernel = CudaKernel(plan, args.get("source"))
    except cp.cuda.compiler.CompileException as e:
        return {"status": "compile_error", "message": str(e).strip()[:4000]}
    io = {b.io_index: b.dtype for b in plan.inputs}
    xs = [cp.asarray(to_storage(x, io[i])) for i, x in enumerate(inputs)]
    outs = [cp.asarray(to_storage(np.full(b.shape, np.nan, np.float32), b.dtype))
            for b in plan.outputs]
    try:
        kernel(xs, outs)
        cp.cuda.Device().synchronize()
    except (cp.cuda.runtime.CUDARuntimeError, cp.cuda.driver.CUDADriverError) as e:
        return {"status": "runtime_error", "message": f"kernel launch failed: {e}"}
    host = [from_storage(cp.asnumpy(o), b.dtype) for o, b in zip(outs, plan.outputs, strict=True)]
    reply: dict = {"status": "ok", "message": "", "outputs": host}
    if expected:
        errs, bad = _compare(host, expected, args["rtol"], args["atol"])
        reply["max_abs_err"] = errs
        if bad:
            reply.update(status="wrong_result", message=bad)
            return reply
    if args.get("timing") is not None:
        reply["timing"] = time_events(lambda: kernel(xs, outs), **args["timing"]).as_dict()
        if args.get("baseline"):
            from search import from_json
            from verifier import run

            ref, arith = from_json(args["baseline"]), _cupy_arith(cp)
            # op by op in the program's dtype, as a framework would (bfloat16: float32)
            base = [x if x.dtype != cp.uint16 else cp.asarray(inputs[i])
                    for i, x in enumerate(xs)]
            reply["baseline"] = time_events(lambda: run(ref, base, arith),
                                            **args["timing"]).as_dict()
    return reply


# ---------------------------------------------------------------- tuner side


def build_cuda(graph: Any, config: Mapping[str, int] | None = None, *, name: str = "prog",
               seed: int = 0, timing: dict | None = None, worker: IsolatedWorker | None = None,
               timeout_s: float = 120.0, inputs: Sequence[np.ndarray] | None = None,
               baseline: Any = None) -> BuildResult:
    """Lower ``graph`` for the local GPU, compile, run once in the worker against the float
    reference (tolerance by the program's dtype), and time it when ``timing`` is given.
    ``baseline`` (a reference KernelGraph) is then timed op by op too; its Timing dict is in
    ``result.timing["baseline"]``."""
    require_cuda()
    spec = cuda_device_spec()
    bound, _, _ = concretize(graph, config, spec)
    plan = lower(graph, config, spec, name)
    xs = [np.ascontiguousarray(x, np.float32) for x in inputs] if inputs is not None \
        else random_inputs(bound, seed)
    io = [b.dtype for b in plan.inputs]
    xs = [from_storage(to_storage(x, d), d) for x, d in zip(xs, io, strict=True)]
    expected = [e.astype(np.float32) for e in reference(bound, xs)]
    rtol, atol = tolerance(plan.dtype)
    scale = max((float(np.max(np.abs(e[np.isfinite(e)]), initial=0.0)) for e in expected),
                default=0.0)
    source = render(plan, "cuda")
    args: dict = {"plan": plan, "source": source}
    if baseline is not None:
        from search import to_json

        args["baseline"] = to_json(baseline)
    job = {"call": "kernels.cuda:worker_job", "args": args, "inputs": xs,
           "outputs": [tuple(b.shape) for b in plan.outputs], "expected": expected,
           "rtol": rtol, "atol": max(atol, rtol * scale), "timing": timing}
    res = run_isolated(job, timeout_s, worker)
    tm = res.payload.get("timing")
    if tm is not None and res.payload.get("baseline"):
        tm = {**tm, "baseline": res.payload["baseline"]}
    return BuildResult(res.status, res.message, plan, source, None,
                       list(res.payload.get("max_abs_err", [])),
                       list(res.payload.get("outputs", [])), tm)


def measure_program_cuda(program: Any, structure: Any = None,
                         config: Mapping[str, int] | None = None, *, seed: int = 0,
                         timing: Mapping | None = None, worker: IsolatedWorker | None = None
                         ) -> Measurement:
    """``kernels.measure.measure_program`` on the GPU: fused kernel vs the reference op by op
    with CuPy, both timed with CUDA events in the same worker."""
    from search.handwritten import handwritten

    require_cuda()
    structure = structure if structure is not None else handwritten(program)
    timing = {**DEFAULT_TIMING, **(timing or {})}
    ref = program.build()
    inputs = random_inputs(ref, seed)
    res = build_cuda(structure, config, name=program.name, seed=seed, timing=dict(timing),
                     worker=worker, inputs=inputs, baseline=ref)
    spec = cuda_device_spec()
    out = Measurement(program.name, res.status, res.message, kernels=len(res.plan.kernels),
                      config=dict(res.plan.config), device=device_key("cuda"))
    if res.max_abs_err:
        out.max_error = max(res.max_abs_err)
    if not res.ok or not res.timing:
        return out
    width = {"float16": 2, "bfloat16": 2}.get(res.plan.dtype, 4)
    out.kernel_s = res.timing["median_s"]
    out.baseline_s = res.timing["baseline"]["median_s"]
    out.speedup = out.baseline_s / out.kernel_s
    out.bytes_moved = width * (sum(x.size for x in inputs) + sum(
        int(np.prod(b.shape)) for b in res.plan.outputs))
    out.achieved_gbs = out.bytes_moved / out.kernel_s / 1e9
    out.copy_gbs = spec.mem_bandwidth_gbs
    out.fraction_of_copy = out.achieved_gbs / out.copy_gbs
    return out
