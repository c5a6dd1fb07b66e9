"""The ``cpu`` device: plans rendered as C++/OpenMP, compiled by g++, run through ctypes.

A kernel is compiled in the calling process (g++ is its own subprocess; the library is cached
by source hash) and run in the isolated worker, so a crash or a hang costs a worker, not the
tuner.  The worker's OpenMP and BLAS thread counts follow the launching process's (Ray starts
actors with one thread), and its OpenMP waiting policy follows how crowded the cores are
(``default_env``).  The op-by-op baseline is the reference graph run by the interpreter over
numpy in float32, timed in the same worker with the same loop.
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kernels.device_names import device_key
from kernels.hardware import DeviceSpec, local_cpu_spec
from kernels.lowering import KernelPlan, concretize
from search.ir import KernelGraph, ShapeError, from_obj, to_obj
from verifier import FloatArith, run

from ._base import TRIAL_TIMING, Device, Execution, field_check
from ._batch import compile_units, units
from ._check import Expected, as_logical, as_stored, expected, input_layouts, random_inputs
from ._compile import CompileError, compile_cpp
from ._isolate import IsolatedWorker, run_isolated
from ._noise import timing_noise
from ._result import RunResult
from ._status import COMPILE_ERROR, INVALID, OK, RUNTIME_ERROR, WRONG_RESULT
from ._storage import STORAGE, from_storage, to_storage
from ._timing import measure

ENV_TTL_S = 5.0  # how long a look at the run queue sets the worker's OpenMP waiting policy
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")  # who sets cores


def thread_env() -> dict[str, str | None]:
    """This process's thread-count variables (None: unset, i.e. every core), to hand to a
    process that should time kernels as this one would run them."""
    return {k: os.environ.get(k) for k in THREAD_VARS}


def default_env() -> dict[str, str]:
    """The kernel worker's environment for timing: OpenMP's own waiting (threads spin a while
    at the end of a parallel region, as a deployed kernel's do) on a machine with room for the
    kernel's threads, ``OMP_WAIT_POLICY=passive`` on one crowded with other work, and nothing
    when the caller chose a policy.  Measured on this 2-core VM: on an idle machine passive
    waiting lost the second core to wake-up latency (lora 0.26-0.39 ms passive, 0.18 ms
    spinning); with 4 busy loops beside it spinning threads waited out whole scheduler slices
    (softmax_rows 64x30000: 19-32 ms spinning, 0.9 ms passive); with 1 or 2 busy loops
    spinning was still the faster (0.39-0.61 vs 0.78 ms)."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return {}
    cores = os.cpu_count() or 1
    try:
        threads = max(1, int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0]))
    except ValueError:
        threads = cores
    crowded = other_runnable() > cores - min(threads, cores) + 1
    return {"OMP_WAIT_POLICY": "passive"} if crowded else {}


def other_runnable(samples: int = 5, interval_s: float = 0.01) -> float:
    """Threads of other processes ready to run now (median of a few looks at the kernel's run
    queue in /proc/loadavg, less this process), or the 1-minute load average elsewhere."""
    counts = []
    for i in range(samples):
        try:
            with open("/proc/loadavg") as f:
                counts.append(int(f.read().split()[3].split("/")[0]) - 1)
        except (OSError, ValueError, IndexError):
            return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        if i + 1 < samples:
            time.sleep(interval_s)
    return float(np.median(counts))


def machine_load() -> str | None:
    """Why this machine is too busy for trustworthy cpu timings now, or None
    (``_noise.loaded`` of the run queue beside this process and the kernels' thread count)."""
    from ._noise import loaded

    cores = os.cpu_count() or 1
    try:
        threads = max(1, int(os.environ.get("OMP_NUM_THREADS", "").split(",")[0]))
    except ValueError:
        threads = cores
    return loaded(other_runnable(), cores, threads)


class CpuDevice(Device):
    """This machine's CPU (all the cores this process may use)."""

    kind = "cpu"
    dialect = "cpp"

    def __init__(self, env: Mapping[str, str | None] | None = None) -> None:
        self._env = env  # the worker's environment (default: default_env(), see worker_env)
        self._default: tuple[float, dict[str, str]] | None = None

    @property
    def key(self) -> str:
        return device_key("cpu")

    @property
    def spec(self) -> DeviceSpec:
        return local_cpu_spec()

    def worker_env(self) -> dict[str, str | None]:
        """The worker's environment: ``env`` as given, else ``default_env()``, looked at
        once every ``ENV_TTL_S`` (a look costs 40 ms of sampling, and a policy flipping with
        every trial would restart the worker each time)."""
        if self._env is not None:
            return dict(self._env)
        now = time.monotonic()
        if self._default is None or now - self._default[0] > ENV_TTL_S:
            self._default = (now, default_env())
        return dict(self._default[1])

    def run_trials(self, structure: KernelGraph, reference: KernelGraph,
                   configs: Sequence[Mapping[str, int]], *, seed: int = 0,
                   timing: Mapping | None = None, worker: IsolatedWorker | None = None,
                   timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Every config's trial, built and timed as batches (``kernels.devices._batch``)."""
        from ._isolate import default_worker

        return cpu_trials(self, structure, reference, configs, seed=seed, timing=timing,
                          worker=worker or default_worker(), timeout_s=timeout_s)

    def stored(self, plan: KernelPlan, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Inputs rounded to the program's dtype: a half program's kernel reads them so."""
        return [from_storage(to_storage(x, b.dtype), b.dtype)
                for x, b in zip(inputs, plan.inputs, strict=True)]

    def compute_dtype(self, plan: KernelPlan) -> str:
        """Outputs are stored in the program's dtype (computed in float32): its tolerance."""
        return plan.dtype if any(b.dtype != "float32" for b in plan.outputs) else "float32"

    def execute(self, plan: KernelPlan, source: str, inputs: list[np.ndarray],
                want: Expected | None, *, timing: dict | None, worker: IsolatedWorker | None,
                timeout_s: float, baseline: KernelGraph | None = None) -> Execution:
        env = self.worker_env()
        job = {"source": source, "inputs": inputs,
               "outputs": [tuple(b.shape) for b in plan.outputs], "timing": timing, "env": env,
               "storage": [b.dtype for b in (*plan.inputs, *plan.outputs)]}
        if want is not None:
            job.update(expected=want.outputs, slack=want.slack, rtol=want.rtol, atol=want.atol)
        res = run_isolated(job, timeout_s, worker)
        out = Execution(res.status, res.message, plan, source,
                        list(res.payload.get("max_abs_err", [])),
                        list(res.payload.get("outputs", [])), res.payload.get("timing"),
                        artifact=res.payload.get("library"))
        if out.ok and timing is not None and baseline is not None:
            base = run_isolated({"call": "kernels.devices._cpu:baseline_job", "inputs": inputs,
                                 "timing": timing, "env": env,
                                 "args": {"reference": to_obj(baseline)}}, timeout_s, worker)
            out.baseline = base.payload.get("timing") if base.ok else None
        return out

    def time_baseline(self, reference: KernelGraph, *, seed: int = 0,
                      timing: Mapping | None = None, worker: IsolatedWorker | None = None,
                      timeout_s: float = 600.0) -> float | None:
        """Timed in the isolated worker: its numpy threads follow the worker's environment."""
        xs = as_stored(random_inputs(reference, seed), input_layouts(reference))
        res = run_isolated({"call": "kernels.devices._cpu:baseline_job",
                            "inputs": xs, "env": self.worker_env(),
                            "timing": {**TRIAL_TIMING, **(timing or {})},
                            "args": {"reference": to_obj(reference)}}, timeout_s, worker)
        return res.payload["timing"]["median_s"] if res.ok else None

    def load(self, plan: KernelPlan, source: str) -> Callable[..., list]:
        return CpuKernel(plan, compile_cpp(source))


def baseline_job(inputs: list, expected: list, args: dict) -> dict:
    """Worker side: the reference graph (``args["reference"]``) run op by op with numpy on the
    job's float32 inputs (as stored: a transposed input is read through a view), timed with
    the job's ``timing``."""
    graph = from_obj(args["reference"])
    xs = as_logical([np.ascontiguousarray(x, np.float32) for x in inputs],
                    input_layouts(graph))
    arith = FloatArith()
    timing = measure(lambda: run(graph, xs, arith), **(args["timing"] or {}))
    return {"status": OK, "message": "", "timing": timing.as_dict()}


class CpuKernel:
    """A compiled plan called in this process through ctypes: ``kernel(*inputs, out=None)``.

    Inputs and outputs are C-contiguous arrays of the plan's shapes in the program's dtype
    (an input of layout "transposed" at its stored shape, ``Buffer.stored_shape``;
    float32; float16; bfloat16 as torch.bfloat16 or numpy uint16 bits, ``STORAGE``): numpy
    arrays, torch CPU tensors or anything with ``__dlpack__`` are used in place (no copy).  An
    input of another dtype (float32 arrays given to a float16 program) is converted on every
    call, with a warning the first time: pass arrays of the program's dtype to avoid the copy.
    Without ``out`` the outputs are new arrays of the program's dtype (torch tensors when the
    first input is one).  The pointer arrays and the ctypes signature are built once, and
    arrays passed again are recognised by identity (the kernel holds them until the next call),
    so a call costs a few microseconds over the kernel itself.

    Only for kernels that already passed the device's isolated check: a faulty kernel here
    would take this process down with it.
    """

    def __init__(self, plan: KernelPlan, library: str | Path) -> None:
        self.plan = plan
        self.library = Path(library)
        self._in_shapes = [tuple(b.stored_shape) for b in plan.inputs]
        self._out_shapes = [tuple(b.shape) for b in plan.outputs]
        self._dtypes = [b.dtype for b in (*plan.inputs, *plan.outputs)]
        self._ins = (ctypes.c_void_p * max(1, len(self._in_shapes)))()
        self._outs = (ctypes.c_void_p * max(1, len(self._out_shapes)))()
        self._fn = ctypes.CDLL(str(self.library)).kernel
        self._fn.argtypes = [type(self._ins), type(self._outs)]
        self._fn.restype = None
        self._seen: list = [None] * (len(self._in_shapes) + len(self._out_shapes))
        self.warned = False

    def __call__(self, *inputs: Any, out: Any = None, outputs: Any = None) -> list:
        out = out if out is not None else outputs
        if len(inputs) != len(self._in_shapes):
            raise ValueError(f"{self.plan.name}: expected {len(self._in_shapes)} inputs, "
                             f"got {len(inputs)}")
        n = len(self._in_shapes)
        if out is None:
            outs = [_new_like(inputs[0], s, d) for s, d in zip(self._out_shapes, self._dtypes[n:],
                                                               strict=True)]
        else:
            outs = [out] if len(self._out_shapes) == 1 and not isinstance(out, list | tuple) \
                else list(out)
            if len(outs) != len(self._out_shapes):
                raise ValueError(f"{self.plan.name}: out= needs {len(self._out_shapes)} arrays")
        keep = []  # what owns the memory (a converted copy) lives until the kernel returns
        for i, x in enumerate((*inputs, *outs)):
            shape, ptrs, j = (self._in_shapes[i], self._ins, i) if i < n else \
                (self._out_shapes[i - n], self._outs, i - n)
            seen = self._seen[i]
            if seen is not None and x is seen[0] and (
                    seen[1] is None or (x.data_ptr() == seen[1] and fits_shape(x.shape, shape))):
                continue
            ptrs[j], owner, same = _address(x, shape, self._dtypes[i],
                                            f"{'input' if i < n else 'output'} {j}",
                                            self.plan, writable=i >= n)
            if not same and i < n and not self.warned:
                self.warned = True
                have, want = _dtype_name(x), self._dtypes[i]
                why = f"is converted to the program's {want}" if have != want else \
                    "(not C-contiguous) is copied"
                warnings.warn(f"{self.plan.name}: input {j} ({have}) {why} on every call; pass "
                              f"C-contiguous {want} arrays to skip the copy", stacklevel=2)
            keep.append(owner)
            # numpy cannot move an array the kernel holds; a torch tensor can be resized in
            # place, so its address and shape are checked again when it comes back
            self._seen[i] = None if not same else (x, x.data_ptr() if same == "torch" else None)
        self._fn(self._ins, self._outs)
        return outs

    def entry(self) -> tuple[Any, type, type]:
        """(the compiled entry point, the types of its input and output pointer arrays): for
        a caller that calls ``fn(Ins(*addresses), Outs(*addresses))`` itself, with
        C-contiguous memory of the plan's (stored) shapes in its storage dtypes, checked by
        that caller (nothing is checked here: the fast path of a caller whose inputs are
        fixed, such as a guarded PyTorch graph).  Arrays made per call keep concurrent calls
        apart (``__call__``'s are shared, and ctypes releases the GIL in the kernel)."""
        return self._fn, type(self._ins), type(self._outs)


def _dtype_name(x: Any) -> str:
    return str(getattr(x, "dtype", type(x).__name__)).removeprefix("torch.")


def _address(x: Any, shape: tuple, dtype: str, what: str, plan: KernelPlan,
             writable: bool = False) -> tuple[int, Any, str]:
    """(data address, the object owning it, how ``x`` may be recognised next time: "numpy",
    "torch" or "" for not at all) of a C-contiguous array of ``shape`` in the storage dtype
    ``dtype``, without a copy where ``x`` is one; outputs must be such arrays already."""
    if type(x).__module__ == "torch":
        if str(x.dtype) == f"torch.{dtype}" and x.is_contiguous() and \
                x.device.type == "cpu" and fits_shape(x.shape, shape):
            return x.data_ptr(), x, "torch"
        if writable:
            raise ValueError(f"{plan.name}: {what} must be a contiguous {dtype} CPU tensor "
                             f"(torch.{dtype}) of shape {shape}")
        x = x.detach().cpu().float().numpy()  # then converted as numpy arrays are: by torch
    elif not isinstance(x, np.ndarray) and hasattr(x, "__dlpack__"):
        x = np.from_dlpack(x)
    store = np.dtype(STORAGE[dtype])
    if isinstance(x, np.ndarray) and x.dtype == store and x.flags.c_contiguous and \
            fits_shape(x.shape, shape) and (not writable or x.flags.writeable):
        return x.__array_interface__["data"][0], x, "numpy" if type(x) is np.ndarray else ""
    if writable:
        raise ValueError(f"{plan.name}: {what} must be a C-contiguous, writable {store} array "
                         f"of shape {shape} (the program's {dtype})")
    a = _converted(np.asarray(x, np.float32), dtype)
    if not fits_shape(a.shape, shape):
        raise ValueError(f"{plan.name}: {what} has shape {a.shape}, expected {shape}")
    return a.__array_interface__["data"][0], a, ""


def _converted(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` (float32) in the storage dtype ``dtype``, by torch where the process already
    loaded it (importing it for this would cost a second): numpy's float16 cast runs one
    element at a time, 163 us for a 256x256 array where torch's takes 6 us, and 66 against
    18 ms for 4096x6144 (AMD EPYC Zen 4, numpy 2.4, torch 2.13).  Both round to nearest even,
    so the values are the same."""
    torch = sys.modules.get("torch")
    if torch is None or dtype not in ("float16", "bfloat16"):
        return to_storage(x, dtype)
    # C order, and a copy of a read-only array (which torch.from_numpy warns of)
    t = torch.from_numpy(np.array(x, np.float32, order="C", copy=None if x.flags.writeable
                                  else True))
    half = t.to(getattr(torch, dtype))
    return half.numpy() if dtype == "float16" else half.view(torch.int16).numpy().view(np.uint16)


def fits_shape(have: Any, want: tuple) -> bool:
    """``have`` is ``want`` up to leading dims of size 1 (a (1, 1, 7168) tensor for a
    (1, 7168) input, as Mirage's scripts pass them): the same elements in the same order."""
    have = tuple(have)
    return have == want or _strip_ones(have) == _strip_ones(want)


def _strip_ones(shape: tuple) -> tuple:
    return shape[next((i for i, d in enumerate(shape) if d != 1), len(shape)):]


def _new_like(first: Any, shape: tuple, dtype: str) -> Any:
    if type(first).__module__ == "torch":
        import torch  # the caller already has it loaded

        return torch.empty(shape, dtype=getattr(torch, dtype))
    return np.empty(shape, STORAGE[dtype])


def cpu_trials(device: CpuDevice, structure: KernelGraph, reference: KernelGraph,
               configs: Sequence[Mapping[str, int]], *, seed: int = 0,
               timing: Mapping | None = None, worker: IsolatedWorker,
               timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """``run_trial`` of every config (same checks, same timing loop, same result dicts, plus
    ``phases``: each config's share of the batch's preparing, compiling and running seconds),
    compiled and run as batches (see the module docstring)."""
    t0 = time.perf_counter()
    timing = {**TRIAL_TIMING, **(timing or {})}
    host = socket.gethostname()
    results: list[dict[str, Any]] = []
    todo: list[int] = []  # results that need building, with their source
    sources: list[str] = []
    plans = []
    for config in configs:
        out: dict[str, Any] = {"status": INVALID, "message": "", "config": dict(config),
                               "host": host, "source": None}
        results.append(out)
        try:
            bound, _, _ = concretize(structure, config, device.spec)
            plan = device.lower(structure, config, "trial")
        except (ShapeError, ValueError) as err:
            out["message"] = str(err)
            continue
        out["config"], out["kernels"] = dict(plan.config), len(plan.kernels)
        why = field_check(reference, bound)
        if why:
            out.update(status=WRONG_RESULT, message=why)
            continue
        out["source"] = device.render(plan)
        todo.append(len(results) - 1)
        sources.append(out["source"])
        plans.append(plan)
    t_prepared = time.perf_counter()
    t_built = t_prepared
    if todo:
        layouts = [b.layout for b in plans[0].inputs]  # a transposed input is passed stored
        xs = device.stored(plans[0], as_stored(random_inputs(reference, seed), layouts))
        want = expected(reference, as_logical(xs, layouts), device.compute_dtype(plans[0]))
        unique: dict[str, int] = {}  # one build and one timing per distinct source
        for src in sources:
            unique.setdefault(src, len(unique))
        distinct = list(unique)
        built = compile_units(distinct, units(distinct))
        t_built = time.perf_counter()
        runs: dict[int, RunResult] = {}
        libs: dict[Path, list[tuple[int, str]]] = {}
        for k, b in built.items():
            if isinstance(b, CompileError):
                runs[k] = RunResult(COMPILE_ERROR, f"{b.message}\n{b.log.strip()}")
            else:
                libs.setdefault(b[0], []).append((k, b[1]))
        env = device.worker_env()
        shapes = [tuple(b.shape) for b in plans[0].outputs]
        storage = [b.dtype for b in (*plans[0].inputs, *plans[0].outputs)]
        for lib, entries in libs.items():
            replies = worker.run_batch(lib, [name for _, name in entries], xs, want.outputs,
                                       shapes, rtol=want.rtol, atol=want.atol,
                                       timing=dict(timing), env=env, timeout_s=timeout_s,
                                       storage=storage, slack=want.slack)
            runs.update(zip((k for k, _ in entries), replies, strict=True))
        for j, src in zip(todo, sources, strict=True):
            _fill(results[j], runs[unique[src]])
    t_end, n = time.perf_counter(), max(1, len(configs))
    phases = {"prepare_s": (t_prepared - t0) / n, "compile_s": (t_built - t_prepared) / n,
              "run_s": (t_end - t_built) / n}  # each config's share of the batch's time
    for out in results:
        out["wall_s"] = (t_end - t0) / n
        out["phases"] = phases
    return results


def _fill(out: dict[str, Any], res: RunResult) -> None:
    """A trial's result dict from its kernel's run (as ``run_trial`` fills it)."""
    out.update(status=res.status, message=res.message)
    errs = res.payload.get("max_abs_err")
    if errs:
        out["max_error"] = max(errs)
    tm = res.payload.get("timing")
    if res.status == OK and tm:
        out.update(median_s=tm["median_s"], spread_s=tm["iqr_s"], samples=tm["samples_s"],
                   noise=timing_noise(tm))
    elif res.status == OK:
        out.update(status=RUNTIME_ERROR, message="the kernel ran but was not timed")
