"""Mirage's Python API on top of the tuner: bring a Mirage script, change only its import.

    import tuner as mi                      # was: import mirage as mi
    graph = mi.new_kernel_graph()
    X = graph.new_input(dims=(16, 4096), dtype=mi.float16)
    W = graph.new_input(dims=(4096, 6144), dtype=mi.float16)
    D = graph.rms_norm(X, normalized_shape=(4096,))
    O = graph.matmul(D, W)
    graph.mark_output(O)
    optimized = graph.superoptimize()       # search, verify, tune here, store, load
    (out,) = optimized(inputs=[x, w])       # as in Mirage; optimized(x, w) works too

``new_kernel_graph()`` returns a ``KNGraph``: the native ``search.KernelGraph`` builder (every
native method and call form still works) with Mirage's spellings added — ``new_input(dims=,
strides=, dtype=)``, ``mark_output(t, strides=)``, ``rms_norm(t, normalized_shape=)``,
``reduction(t, dim)`` — and ``superoptimize``, which runs the whole tuner on this machine's
device (a ``tuner launch`` of the graph as a program), stores everything in the database
(default ``sqlite:///./tuner.db``, or ``db=URL``) and returns the best kernel as a callable.
A later call with the same graph reuses what the database holds (nothing is measured twice).
See docs/mirage.md.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from search import DTYPES, KernelGraph, Program, ShapeError, parse_program, structural_hash

# Mirage's dtype names; the tuner's dtypes are plain strings.
float16 = "float16"
bfloat16 = "bfloat16"
float32 = "float32"

__all__ = ["KNGraph", "Optimized", "bfloat16", "float16", "float32", "new_kernel_graph",
           "to_program"]


class KNGraph(KernelGraph):
    """A kernel graph with Mirage's builder spellings and ``superoptimize``."""

    def new_input(self, dims: Sequence[int] | None = None, *args: Any,
                  strides: Sequence[int] | None = None, dtype: str | None = None,
                  name: str | None = None, shape: Sequence[int] | None = None) -> Any:
        """Mirage's ``new_input(dims, strides=None, dtype=float16)`` and the native
        ``new_input(shape, dtype="float16", name=None)``, told apart by the second positional
        argument (a dtype string is native).  Only row-major (default) strides exist here."""
        dims = dims if dims is not None else shape
        rest = list(args)
        if rest and isinstance(rest[0], str):  # native: (shape, dtype, name)
            dtype = rest.pop(0)
            name = rest.pop(0) if rest else name
        elif rest:  # Mirage: (dims, strides, dtype)
            strides = rest.pop(0)
            dtype = rest.pop(0) if rest else dtype
        if rest:
            raise TypeError("new_input: too many positional arguments")
        if dims is None:
            raise TypeError("new_input: give dims=(...) (Mirage) or a shape (native)")
        dims = tuple(int(d) for d in dims)
        _check_strides(dims, strides)
        dtype = _dtype(dtype if dtype is not None else float16)
        if name is None:
            name = f"I{len(self.input_ids)}"
        return super().new_input(dims, dtype, name)

    def mark_output(self, tensor: Any, strides: Sequence[int] | None = None) -> None:
        _check_strides(tuple(int(d) for d in tensor.shape), strides)
        super().mark_output(tensor)

    def rms_norm(self, tensor: Any, normalized_shape: Sequence[int] | None = None,
                 **kw: Any) -> Any:
        """RMS normalisation over the last dim (Mirage's ``normalized_shape`` must name it:
        the tuner's rms_norm has no weight and normalises the last dim only)."""
        if normalized_shape is not None:
            want = tuple(int(d) for d in tensor.shape[-len(tuple(normalized_shape)):])
            if tuple(int(d) for d in normalized_shape) != want or len(want) != 1:
                raise ShapeError(f"rms_norm: normalized_shape {tuple(normalized_shape)} must "
                                 f"be the last dim of {tuple(tensor.shape)}, i.e. "
                                 f"({tensor.shape[-1]},)")
        return self.apply("rms_norm", tensor, **kw)

    def reduction(self, tensor: Any, dim: int) -> Any:
        """Mirage's ``reduction(A, dim)``: the sum over ``dim``, kept with size 1."""
        return self.apply("sum", tensor, int(dim))

    def superoptimize(self, *args: Any, db: str | None = None, device: str | None = None,
                      name: str | None = None, trials: int = 8, structures: int = 3,
                      time_budget_s: float | None = 120.0,
                      search_time_limit_s: float | None = 120.0, workers: int = 1,
                      verbose: bool = False, **mirage_options: Any) -> Optimized:
        """Search, verify, tune on this machine's device (``cuda`` where a GPU is usable,
        else ``cpu``; or ``device=``), store in ``db`` (default ``sqlite:///./tuner.db``) and
        return the best kernel (or the library path, where it is faster) as a callable.

        Mirage's own options (``config=``, ``imaps=``, ``griddims=``, ``backend=``,
        ``warmup_iters=``, ...) are accepted and not used: the search here enumerates its
        own grids and maps, and the tuner times every candidate itself."""
        if args:
            raise TypeError("superoptimize takes keyword arguments only")
        return superoptimize(self, db=db, device=device, name=name, trials=trials,
                             structures=structures, time_budget_s=time_budget_s,
                             search_time_limit_s=search_time_limit_s, workers=workers,
                             verbose=verbose, ignored=sorted(mirage_options))


def new_kernel_graph() -> KNGraph:
    """Start a program, as ``mirage.new_kernel_graph()`` does."""
    return KNGraph()


class Optimized:
    """What ``superoptimize`` returns: ``f(inputs=[...])`` (Mirage) or ``f(*arrays, out=)``
    (the tuner's kernels), a list of outputs either way.  ``record`` is the database's
    best-kernel row, ``program`` the graph as a tuner program, ``url`` the database."""

    def __init__(self, kernel: Callable[..., list], record: Any, program: Program,
                 url: str) -> None:
        self.kernel, self.record, self.program, self.url = kernel, record, program, url

    @property
    def library(self) -> bool:
        """The library path (numpy / CuPy op by op) was faster than every tuned kernel."""
        return bool(self.record.library)

    def __call__(self, *arrays: Any, inputs: Sequence[Any] | None = None, out: Any = None,
                 **_: Any) -> list:
        if inputs is not None:
            if arrays:
                raise TypeError("give the inputs positionally or as inputs=[...], not both")
            arrays = tuple(inputs)
        return self.kernel(*arrays, out=out)

    def __repr__(self) -> str:
        what = "library path" if self.library else \
            f"structure {self.record.structure_hash[:12]} config {self.record.config}"
        return (f"Optimized({self.program.name}: {what}, {self.record.time_s * 1e3:.3f} ms "
                f"on {self.record.device_key})")


def to_program(graph: KernelGraph, name: str | None = None) -> Program:
    """A graph of predefined ops as a tuner program (the body in the program language), so
    that the launch can search it, shrink it for verification and tune it like a built-in."""
    if not graph.output_ids:
        raise ShapeError("superoptimize: mark at least one output (graph.mark_output(t))")
    dtypes = {graph.tensors[t].dtype for t in graph.input_ids}
    if len(dtypes) != 1:
        raise ShapeError(f"superoptimize: every input needs the same dtype, got {sorted(dtypes)}")
    names: dict[int, str] = {}
    inputs: dict[str, list[int]] = {}
    lines: list[str] = []
    for op in graph.ops:
        if op.kind == "input":
            n = graph.tensors[op.outputs[0]].name or f"I{len(inputs)}"
            names[op.outputs[0]] = n
            inputs[n] = [int(d) for d in graph.tensors[op.outputs[0]].shape]
        elif op.kind == "output":
            continue
        elif op.kind == "graph_kernel":
            raise ShapeError("superoptimize: the graph already holds a customized (graph-"
                             "defined) kernel; give the program as predefined ops and the "
                             "search finds the fused kernels")
        else:
            args = [names[t] for t in op.inputs]
            args += [repr(op.attrs[a]) for a in _attr_names(op.kind)]
            out = f"T{op.outputs[0]}"
            names[op.outputs[0]] = out
            lines.append(f"{out} = {op.kind}({', '.join(args)})")
    outputs = []
    for t in graph.output_ids:
        if t in graph.input_ids:  # an input marked as output: copy it through a name
            raise ShapeError("superoptimize: an input marked as an output computes nothing")
        outputs.append(names[t])
    name = name or f"mirage_{structural_hash(graph)[:12]}"
    shapes = "\n".join(f"  {n}: [{', '.join(map(str, s))}]" for n, s in inputs.items())
    text = (f"name: {name}\ndtype: {dtypes.pop()}\ninputs:\n{shapes}\nbody: |\n"
            + "".join(f"  {line}\n" for line in lines)
            + f"outputs: [{', '.join(outputs)}]\n")
    return parse_program(text, f"<mirage graph {name}>")


def superoptimize(graph: KernelGraph, *, db: str | None = None, device: str | None = None,
                  name: str | None = None, trials: int = 8, structures: int = 3,
                  time_budget_s: float | None = 120.0,
                  search_time_limit_s: float | None = 120.0, workers: int = 1,
                  verbose: bool = False, ignored: Sequence[str] = ()) -> Optimized:
    """``KNGraph.superoptimize`` for any kernel graph of predefined ops."""
    import db as tuner_db

    from .jobfile import ClusterSpec, DatabaseSpec, JobSpec, ProgramEntry, SearchSpec, TuningSpec
    from .pipeline import JobRun, check_devices
    from .serving import load

    program = to_program(graph, name)
    device = device or _this_device()
    url = db or tuner_db.DEFAULT_URL
    tuner_db.normalize_url(url)
    check_devices((device,))
    log = (lambda msg: print(msg, file=sys.stderr, flush=True)) if verbose else None
    if verbose and ignored:
        print(f"superoptimize: Mirage options {', '.join(ignored)} are not used here",
              file=sys.stderr)
    job = JobSpec(source=f"mirage:{program.name}",
                  programs=(ProgramEntry(program, "inline", "inline", {}, 1),),
                  search=SearchSpec(time_limit_s=search_time_limit_s),
                  tuning=TuningSpec(trials_per_structure=trials, structures=structures,
                                    time_budget_s=time_budget_s, seed=0),
                  devices=(device,), cluster=ClusterSpec(workers=workers),
                  database=DatabaseSpec(url))
    JobRun(job, url, log=log).run()
    kernel = load(program, device=device, url=url)
    record = _best(program, device, url)
    return Optimized(kernel, record, program, url)


def _best(program: Program, device: str, url: str) -> Any:
    from .serving import best

    return best(program, device=device, url=url)


def _this_device() -> str:
    from kernels import cuda_available

    return "cuda" if cuda_available()[0] else "cpu"


def _dtype(dtype: Any) -> str:
    text = getattr(dtype, "name", None) or str(dtype)
    text = text.removeprefix("torch.").removeprefix("mirage.")
    if text not in DTYPES:
        raise ShapeError(f"dtype {dtype!r}: use one of {', '.join(DTYPES)} "
                         "(mi.float16, mi.bfloat16, mi.float32)")
    return text


def _check_strides(dims: tuple[int, ...], strides: Sequence[int] | None) -> None:
    if strides is None:
        return
    want, step = [], 1
    for d in reversed(dims):
        want.append(step)
        step *= d
    if tuple(int(s) for s in strides) != tuple(reversed(want)):
        raise ShapeError(f"strides {tuple(strides)}: only row-major tensors are supported "
                         f"here (strides {tuple(reversed(want))} for dims {dims})")


def _attr_names(kind: str) -> tuple[str, ...]:
    from search import OPS

    return OPS[kind].attrs
