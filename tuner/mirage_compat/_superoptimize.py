"""``superoptimize``: a Mirage kernel graph of predefined ops searched, verified, tuned and
stored by the whole tuner, and the best kernel returned as a callable (see docs/mirage.md)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from search import KernelGraph, Program, ShapeError, parse_program, structural_hash

__all__ = ["Optimized", "superoptimize", "to_program"]


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
            inputs[n] = [int(d) for d in graph.tensors[op.outputs[0]].shape]  # type: ignore[arg-type]
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

    from ..jobfile import ClusterSpec, DatabaseSpec, JobSpec, ProgramEntry, SearchSpec, TuningSpec
    from ..pipeline import JobRun, check_devices
    from ..serving import load

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
    from ..serving import best

    return best(program, device=device, url=url)


def _this_device() -> str:
    from kernels import cuda_available

    return "cuda" if cuda_available()[0] else "cpu"


def _attr_names(kind: str) -> tuple[str, ...]:
    from search import OPS

    return OPS[kind].attrs
