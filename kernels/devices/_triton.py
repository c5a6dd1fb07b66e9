"""Running Triton-dialect kernels: on a GPU (the cuda device, with CuPy arrays) or on the CPU
under Triton's interpreter (torch CPU tensors), where no GPU is needed.

The Triton printer (``kernels.rendering``) writes a Python module with one ``@triton.jit``
kernel per plan kernel and ``launch(inputs, outputs, ws)``.  ``TritonKernel`` imports that text
from a file (``triton.jit`` reads its function's source back, so the text must live in one),
holds the workspace and calls ``launch``.  ``TritonInterpreter`` is a device whose kernels run
under ``TRITON_INTERPRET=1``: every suite program's Triton kernel is checked on this machine
through the same ``Device.check`` as the cpu and cuda devices, against the program's float
reference with the tolerance of the dtype it stores.  It proves correctness, not speed: it
does not time.

On a GPU ``TritonKernel`` launches one of two ways (``launch=`` or ``$TUNER_TRITON_LAUNCH``):
``direct`` (the default) launches through Triton's dispatch once, keeps the ``CompiledKernel``
each ``kernel[grid](...)`` returns and from then on calls its launcher (``CompiledKernel.run``,
the same positional convention in Triton 3.6 and 3.9) with integer pointers; ``jit`` calls the
module's ``launch`` every time, so every call goes through Triton's dispatch
(``JITFunction.run``: argument binding, a specialisation of each argument, the cache key, launch
hooks, and in the C launcher a ``data_ptr()`` call and a ``cuPointerGetAttribute`` per
pointer).  Measured on an H100 (2026-11-27, Triton 3.6, ``benchmarks/launch_overhead.py``):
the same outputs bit for bit, and a call 1.26x (rmsnorm_matmul), 1.33x (gated_mlp) and 3.74x
(lora: 0.0309 -> 0.0083 ms) faster than ``jit``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from kernels.hardware import DeviceSpec, get_spec
from kernels.lowering import KernelPlan
from kernels.machine import cache_root
from kernels.rendering import triton_launches
from search.ir import KernelGraph

from ._base import Device, DeviceUnavailable, Execution
from ._check import Expected
from ._isolate import IsolatedWorker, run_isolated
from ._status import COMPILE_ERROR, RUNTIME_ERROR
from ._storage import from_storage, to_storage
from ._worker import checked

INTERPRET_ENV = {"TRITON_INTERPRET": "1"}
LAUNCH_ENV = "TUNER_TRITON_LAUNCH"
LAUNCH_MODES = ("jit", "direct")


def triton_available() -> tuple[bool, str]:
    """(usable, why not): the Triton package imports here."""
    try:
        import triton  # noqa: F401
    except ImportError as err:
        return False, (f"Triton is not installed ({err}); pip install the 'cuda' extra "
                       "(mugraph-tuner[cuda])")
    return True, ""


def load_module(source: str, interpret: bool = False) -> ModuleType:
    """The Triton source as a module, from a file named by its hash under the cache root.
    ``interpret``: its kernels run under Triton's interpreter (decided when it is imported)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    name = f"tuner_triton_{digest}{'_interp' if interpret else ''}"
    if name in sys.modules:
        return sys.modules[name]
    folder = cache_root() / "triton"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        tmp.replace(path)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if interpret:
        _interpreter_bf16_dot()
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        spec.loader.exec_module(module)
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before
    sys.modules[name] = module
    return module


def _interpreter_bf16_dot() -> None:
    """Triton 3.9's interpreter multiplies bfloat16 operands of ``tl.dot`` as their uint16
    bit patterns (its bfloat16 arrays are uint16; only float8 operands are converted): every
    bfloat16 product came out ~1e8 too large.  Convert them to float32 first, which is what a
    tensor core computes (exact products, float32 sums).  Only the interpreter is touched."""
    from triton import language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_bf16_fixed", False):
        return
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if tl.bfloat16 in (a.dtype.scalar, b.dtype.scalar):
            def f32(x):
                if x.dtype.scalar != tl.bfloat16:
                    return x
                data = interpreter._convert_float(x.data, tl.bfloat16, tl.float32, None)
                return interpreter.TensorHandle(data.view(np.float32), tl.float32)
            a, b = f32(a), f32(b)
        return original(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot._bf16_fixed = True  # type: ignore[attr-defined]
    builder.create_dot = create_dot


def launch_mode(mode: str | None = None) -> str:
    """How ``TritonKernel`` launches on a GPU: ``mode``, else ``$TUNER_TRITON_LAUNCH``, else
    ``"direct"`` (module docstring).  An unknown value raises ``ValueError`` naming the choices."""
    raw = os.environ.get(LAUNCH_ENV, "") if mode is None else mode
    value = raw.strip().lower() or "direct"
    if value not in LAUNCH_MODES:
        where = f"{LAUNCH_ENV}={raw!r}" if mode is None else f"launch={raw!r}"
        raise ValueError(f"{where}: unknown Triton launch mode; use one of "
                         f"{', '.join(LAUNCH_MODES)} (default direct)")
    return value


class _DevicePointer:
    """A CuPy array as Triton takes an argument: ``data_ptr()`` and a dtype name."""

    def __init__(self, array: Any, dtype: str) -> None:
        self.array, self.dtype = array, dtype

    def data_ptr(self) -> int:
        return int(self.array.data.ptr)


class TritonKernel:
    """A plan's Triton module: call it with arrays in the plan's storage dtypes.

    ``launch`` (GPU only, ``cupy`` given; default ``$TUNER_TRITON_LAUNCH``, else ``direct``):
    ``direct`` launches through Triton's dispatch at the first call, keeps each kernel's
    ``CompiledKernel`` and then calls its launcher with the arrays' integer pointers on CuPy's
    current stream (the one ``EventClock`` records on; the jit path takes torch's current
    stream, which is the same legacy default stream unless a stream is set).  A call whose
    pointers are not all 16-byte aligned (Triton specialised the compiled kernel on that) or
    that runs on another device than the first takes the jit path.  Triton's launch hooks
    (the proton profiler) are not called on the direct path."""

    def __init__(self, plan: KernelPlan, source: str, *, interpret: bool = False,
                 cupy: Any = None, launch: str | None = None) -> None:
        self.plan, self.source, self.cp = plan, source, cupy
        self.launch_mode = launch_mode(launch) if cupy is not None else "jit"
        self.launches = triton_launches(plan) if self.launch_mode == "direct" else []
        for ln in self.launches:
            if ln.line not in source:
                raise ValueError(f"{LAUNCH_ENV}=direct: the module's launch() does not make the "
                                 f"call {ln.line!r} that the plan implies; launch with jit")
        self.module = load_module(source, interpret)
        self.compiled: list[Any] = []  # direct: each launch's CompiledKernel, from the 1st call
        self._direct: list[tuple[Any, Any, Any, tuple[int, ...], tuple[int, ...]]] = []
        self._device, self._ws_ptr = -1, 0
        n = max(1, plan.workspace_floats)
        if cupy is not None:
            self.ws: Any = _DevicePointer(cupy.zeros(n, dtype=cupy.float32), "float32")
        else:
            import torch

            self.ws = torch.zeros(n, dtype=torch.float32)

    def __call__(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        if self.cp is not None:
            if self.launch_mode == "direct" and self._launch_direct(inputs, outputs):
                return
            inputs = [_DevicePointer(x, b.dtype) for x, b in zip(inputs, self.plan.inputs,
                                                               strict=True)]
            outputs = [_DevicePointer(x, b.dtype) for x, b in zip(outputs, self.plan.outputs,
                                                                strict=True)]
        self.module.launch(list(inputs), list(outputs), self.ws)

    def _launch_direct(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> bool:
        """Launch through the kept launchers; False: this call takes the jit path."""
        if not self._direct:
            self._bind_direct(inputs, outputs)
            return True
        ptrs = [x.data.ptr for x in inputs] + [x.data.ptr for x in outputs] + [self._ws_ptr]
        cp = self.cp
        if any(p & 15 for p in ptrs) or cp.cuda.runtime.getDevice() != self._device:
            return False
        stream = cp.cuda.get_current_stream().ptr
        for run, function, metadata, grid, args in self._direct:
            # grid x, y, z, stream, function, packed metadata, launch metadata, enter/exit
            # hooks, args
            run(*grid, stream, function, metadata, None, None, None, *[ptrs[i] for i in args])
        return True

    def _bind_direct(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        """The first direct call: each launch through Triton (it compiles there), keeping the
        ``CompiledKernel`` that ``kernel[grid](...)`` returns."""
        ptrs = [_DevicePointer(x, b.dtype) for x, b in zip(inputs, self.plan.inputs,
                                                          strict=True)]
        ptrs += [_DevicePointer(x, b.dtype) for x, b in zip(outputs, self.plan.outputs,
                                                           strict=True)]
        ptrs.append(self.ws)
        bound, compiled = [], []
        for ln in self.launches:
            kernel = getattr(self.module, ln.kernel)[ln.grid](
                *[ptrs[i] for i in ln.args], **dict(ln.options))
            run = getattr(kernel, "run", None)
            function = getattr(kernel, "function", None)
            metadata = getattr(kernel, "packed_metadata", None)
            if not callable(run) or function is None or metadata is None:
                import triton

                raise RuntimeError(
                    f"{LAUNCH_ENV}=direct: Triton {triton.__version__}'s kernel[grid](...) "
                    f"returned {type(kernel).__name__}, not a CompiledKernel with run, function "
                    "and packed_metadata (as Triton 3.6-3.9 do); launch with jit")
            grid = (*ln.grid, 1, 1)[:3]
            bound.append((run, function, metadata, grid, ln.args))
            compiled.append(kernel)
        self._device, self._ws_ptr = self.cp.cuda.runtime.getDevice(), self.ws.data_ptr()
        self._direct, self.compiled = bound, compiled


# ---------------------------------------------------------------- the interpreter device

def _torch_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "float16": torch.float16,
            "bfloat16": torch.bfloat16}[name]


def interpret_job(inputs: list[np.ndarray], expected: list[np.ndarray], args: dict) -> dict:
    """Worker side: import the module under the interpreter, run it once on torch CPU
    tensors in the plan's storage dtypes, compare with ``expected``."""
    import torch

    plan: KernelPlan = args["plan"]
    try:
        kernel = TritonKernel(plan, args["source"], interpret=True)
    except Exception as err:  # noqa: BLE001 - any import/compile failure is the kernel's
        return {"status": COMPILE_ERROR, "message": f"{type(err).__name__}: {err}"[:4000]}
    xs = [torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(_torch_dtype(b.dtype))
          for x, b in zip(inputs, plan.inputs, strict=True)]
    outs = [torch.full(tuple(b.shape), float("nan"), dtype=_torch_dtype(b.dtype))
            for b in plan.outputs]
    try:
        kernel(xs, outs)
    except Exception as err:  # noqa: BLE001 - an interpreted kernel raises what it hits
        return {"status": RUNTIME_ERROR, "message": f"{type(err).__name__}: {err}"[:4000]}
    host = [o.to(torch.float32).numpy() for o in outs]
    return checked(host, expected, args.get("rtol", 0.0), args.get("atol", 0.0),
                   {"outputs": host}, args.get("slack"))


class TritonInterpreter(Device):
    """Triton-dialect kernels of a GPU's plans, run on this CPU by Triton's interpreter.

    Plans are lowered for ``gpu`` (default the H100), so they are the plans the cuda device
    would run; inputs are rounded to the dtype the GPU stores and the check uses that dtype's
    tolerance.  Untimed: ``run_trial`` reports a checked kernel as not timed."""

    kind = "triton-interpret"
    dialect = "triton"

    def __init__(self, gpu: str = "H100") -> None:
        ok, reason = triton_available()
        if not ok:
            raise DeviceUnavailable(f"the Triton interpreter is unavailable: {reason}")
        try:
            import torch  # noqa: F401
        except ImportError as err:
            raise DeviceUnavailable(f"the Triton interpreter needs torch: {err}") from None
        self._spec = get_spec(gpu)

    @property
    def key(self) -> str:
        return f"triton-interpret:{self._spec.name}"

    @property
    def spec(self) -> DeviceSpec:
        return self._spec

    def lower(self, structure: KernelGraph, config: Mapping[str, int] | None = None,
              name: str = "prog") -> KernelPlan:
        return super().lower(structure, {**(config or {}), "triton": 1}, name)

    def stored(self, plan: KernelPlan, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [from_storage(to_storage(x, b.dtype), b.dtype)
                for x, b in zip(inputs, plan.inputs, strict=True)]

    def compute_dtype(self, plan: KernelPlan) -> str:
        return plan.dtype

    def execute(self, plan: KernelPlan, source: str, inputs: list[np.ndarray],
                want: Expected | None, *, timing: dict | None, worker: IsolatedWorker | None,
                timeout_s: float, baseline: KernelGraph | None = None) -> Execution:
        job = {"call": "kernels.devices._triton:interpret_job",
               "args": {"plan": plan, "source": source}, "inputs": inputs,
               "outputs": [tuple(b.shape) for b in plan.outputs], "timing": None,
               "env": INTERPRET_ENV}
        if want is not None:
            job.update(expected=want.outputs, slack=want.slack, rtol=want.rtol, atol=want.atol)
        res = run_isolated(job, timeout_s, worker)
        return Execution(res.status, res.message, plan, source,
                         list(res.payload.get("max_abs_err", [])),
                         list(res.payload.get("outputs", [])))

    def time_baseline(self, reference: KernelGraph, **_: Any) -> float | None:
        return None  # the interpreter's speed says nothing about a GPU's

    def load(self, plan: KernelPlan, source: str) -> Callable[..., list]:
        import torch

        kernel = TritonKernel(plan, source, interpret=True)

        def call(*inputs: Any) -> list:
            xs = [torch.as_tensor(np.asarray(x, np.float32)).to(_torch_dtype(b.dtype))
                  for x, b in zip(inputs, plan.inputs, strict=True)]
            outs = [torch.empty(tuple(b.shape), dtype=_torch_dtype(b.dtype))
                    for b in plan.outputs]
            kernel(xs, outs)
            return [o.to(torch.float32).numpy() for o in outs]

        return call



# ---------------------------------------------------------------- compiling without a GPU

TT_POINTER = {"float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16"}


def compile_plan(plan: KernelPlan, source: str, capability: int) -> dict[str, Any]:
    """Every kernel of the plan compiled for ``sm_<capability>`` (90: Hopper, 80: Ampere)
    without a GPU: ``triton.compile`` with the target named.  Pointers are declared 16-byte
    aligned, as Triton specialises them at a launch on CUDA allocations.  Returns program
    name (``Kernel.programs``: two for a split-K kernel) -> the compiled kernel
    (``.asm["cubin"]``, ``.asm["ptx"]``, ``.metadata``)."""
    import triton
    from triton.backends.compiler import GPUTarget

    module = load_module(source)
    out = {}
    for k in plan.kernels:
        names = [*k.params, "ws"]
        dtypes = [plan.globals[p].dtype for p in k.params] + ["float32"]
        signature = {n: TT_POINTER[d] for n, d in zip(names, dtypes, strict=True)}
        attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(names))}
        options = {"num_warps": max(1, k.mapping.threads // 32)}
        if plan.config.get("stages"):
            options["num_stages"] = int(plan.config["stages"])
        for program in k.programs:  # a split-K kernel: its partial and epilogue programs
            src = triton.compiler.ASTSource(fn=getattr(module, program), signature=signature,
                                            attrs=attrs)
            out[program] = triton.compile(src, target=GPUTarget("cuda", capability, 32),
                                          options=options)
    return out


def sass(cubin: bytes) -> str:
    """The SASS of a cubin, read with the ``cuobjdump`` that ships with Triton."""
    import subprocess
    import tempfile

    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True,
                             check=True)
    return res.stdout
