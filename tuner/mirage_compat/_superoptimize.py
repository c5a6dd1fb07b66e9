"""``superoptimize``: a Mirage kernel graph of predefined ops searched, verified, tuned and
stored by the whole tuner, and the best kernel returned as a callable (see docs/mirage.md)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from search import KernelGraph, Program, ShapeError, parse_program, structural_hash

__all__ = ["Optimized", "superoptimize", "to_program"]


class Optimized:
    """What ``superoptimize`` returns: ``f(inputs=[...])`` (Mirage) or ``f(*arrays, out=)``
    (the tuner's kernels), a list of outputs either way.  ``record`` is the database's
    best-kernel row, ``program`` the graph as a tuner program, ``url`` the database."""

    def __init__(self, kernel: Callable[..., list], record: Any, program: Program,
                 url: str, graph: KernelGraph | None = None) -> None:
        self.kernel, self.record, self.program, self.url = kernel, record, program, url
        self.graph = graph

    @property
    def cygraph(self) -> KernelGraph:
        """Mirage's ``optimized.cygraph``: here the graph as it was given (its inputs, for
        ``get_input_dtensors``; ``generate_cuda_program`` prints it op by op, not the tuned
        kernel, whose source is ``record.source``)."""
        if self.graph is None:
            raise AttributeError("this Optimized was made without its graph")
        return self.graph

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
    layouts: dict[str, str] = {}
    lines: list[str] = []
    for op in graph.ops:
        if op.kind == "input":
            n = graph.tensors[op.outputs[0]].name or f"I{len(inputs)}"
            names[op.outputs[0]] = n
            inputs[n] = [int(d) for d in graph.tensors[op.outputs[0]].shape]  # type: ignore[arg-type]
            if op.attrs.get("layout", "row") != "row":  # memory other than row-major
                layouts[n] = op.attrs["layout"]
        elif op.kind == "output":
            continue
        elif op.kind == "graph_kernel":
            raise ShapeError("superoptimize: the graph already holds a customized (graph-"
                             "defined) kernel; give the program as predefined ops and the "
                             "search finds the fused kernels")
        else:
            args = [names[t] for t in op.inputs]
            args += [f"{a}={op.attrs[a]!r}" for a in _attr_names(op.kind) if a in op.attrs]
            out = f"T{op.outputs[0]}"
            names[op.outputs[0]] = out
            lines.append(f"{out} = {op.kind}({', '.join(args)})")
    outputs = []
    for t in graph.output_ids:
        if t in graph.input_ids:  # an input marked as output: copy it through a name
            raise ShapeError("superoptimize: an input marked as an output computes nothing")
        outputs.append(names[t])
    name = name or f"mirage_{structural_hash(graph)[:12]}"
    shapes = "\n".join(f"  {n}: {input_entry(s, layouts.get(n))}" for n, s in inputs.items())
    text = (f"name: {name}\ndtype: {dtypes.pop()}\ninputs:\n{shapes}\nbody: |\n"
            + "".join(f"  {line}\n" for line in lines)
            + f"outputs: [{', '.join(outputs)}]\n")
    return parse_program(text, f"<mirage graph {name}>")


def superoptimize(graph: KernelGraph, *, db: str | None = None, device: str | None = None,
                  name: str | None = None, trials: int = 8, structures: int = 3,
                  time_budget_s: float | None = 120.0,
                  search_time_limit_s: float | None = 120.0, workers: int = 1,
                  verbose: bool = True, ignored: Sequence[str] = ()) -> Optimized:
    """``KNGraph.superoptimize`` for any kernel graph of predefined ops.

    A graph whose job already finished in ``db`` (same program, shapes, dtype, limits and
    device) returns its stored best kernel at once: the database is read before Ray, the
    search or the tuner are imported.  Otherwise the whole launch runs, and with ``verbose``
    (the default, as Mirage prints its progress) a line per phase goes to stderr: the search's
    states and time, the verified structures, every tuning trial as n/N with the best so far."""
    import db as tuner_db

    from ..identity import job_key
    from ..jobfile import ClusterSpec, DatabaseSpec, JobSpec, ProgramEntry, SearchSpec, TuningSpec

    start = time.perf_counter()
    program = to_program(graph, name)
    device = device or _this_device()
    url = db or tuner_db.DEFAULT_URL
    tuner_db.normalize_url(url)
    say = _say if verbose else (lambda _msg: None)
    if ignored:
        say(f"Mirage options {', '.join(ignored)} are not used here")
    job = JobSpec(source=f"mirage:{program.name}",
                  programs=(ProgramEntry(program, "inline", "inline", {}, 1),),
                  search=SearchSpec(time_limit_s=search_time_limit_s),
                  tuning=TuningSpec(trials_per_structure=trials, structures=structures,
                                    time_budget_s=time_budget_s, seed=0),
                  devices=(device,), cluster=ClusterSpec(workers=workers),
                  database=DatabaseSpec(url))
    stored = _stored(program, device, url, job_key(job), graph)
    if stored is not None:
        say(f"{program.name}: stored in {url} by an earlier run: {stored!r} "
            f"({time.perf_counter() - start:.2f} s)")
        return stored

    from ..pipeline import JobRun, check_devices

    check_devices(job)
    say(f"{program.name}: {len(program.build().ops)} ops, {program.dtype}, on {device}; "
        f"search (limit {search_time_limit_s} s), verification, then up to "
        f"{structures} x {trials} tuning trials; results to {url}")
    progress = _Progress(structures * trials, start) if verbose else None
    JobRun(job, url, log=progress.log if progress else None, progress=progress).run()
    from ..serving import load

    kernel = load(program, device=device, url=url)
    result = Optimized(kernel, _best(program, device, url), program, url, graph)
    say(f"{program.name}: done in {time.perf_counter() - start:.1f} s: {result!r}")
    return result


def _stored(program: Program, device: str, url: str, key: str,
            graph: KernelGraph) -> Optimized | None:
    """The finished job ``key``'s best kernel in ``url``, or None (no such database, job or
    kernel): nothing is created or migrated."""
    import db as tuner_db

    from ..serving import best
    from ..serving.cache import kernel_from_record

    try:
        database = tuner_db.connect(url, migrate_schema=False)
    except tuner_db.DatabaseError:
        return None
    with database:
        job = database.job(key)
        if job is None or job.status != "finished":
            return None
        record = best(program, device=device, database=database)
    if record is None:
        return None
    return Optimized(kernel_from_record(record, program.name), record, program, url, graph)


def _say(message: str) -> None:
    print(f"superoptimize: {message}", file=sys.stderr, flush=True)


class _Progress:
    """The launch's progress as lines on stderr (the pipeline's ``ProgressSink``): the search
    every few seconds and when it verifies a structure, each tuning trial as n/N."""

    def __init__(self, total_trials: int, start: float, every_s: float = 5.0) -> None:
        self.total, self.start, self.every_s = total_trials, start, every_s
        self.trials, self.best_s = 0, None
        self._last: tuple[float, int] = (-every_s, -1)

    def log(self, message: str) -> None:
        _say(message)

    def search(self, program: str, info: dict[str, Any]) -> None:
        now, verified = time.perf_counter(), int(info.get("verified", 0))
        if now - self._last[0] < self.every_s and verified == self._last[1]:
            return
        self._last = (now, verified)
        _say(f"search: {int(info.get('states', 0)):,} states, {verified} verified, "
             f"{float(info.get('elapsed_s', 0.0)):.1f} s")

    def trial(self, program: str, structure_hash: str, res: dict[str, Any]) -> None:
        self.trials += 1
        t = res.get("median_s")
        if res.get("status") == "ok" and t:
            self.best_s = t if self.best_s is None else min(self.best_s, t)
        what = f"{t * 1e3:.3f} ms" if res.get("status") == "ok" and t else res.get("status")
        best = f"{self.best_s * 1e3:.3f} ms" if self.best_s is not None else "none yet"
        _say(f"tuning trial {self.trials}/{self.total} [{structure_hash[:10]}] "
             f"{res.get('config')}: {what} (best {best}; "
             f"{time.perf_counter() - self.start:.0f} s)")


def _best(program: Program, device: str, url: str) -> Any:
    from ..serving import best

    return best(program, device=device, url=url)


def _this_device() -> str:
    from kernels import cuda_available

    return "cuda" if cuda_available()[0] else "cpu"


def input_entry(shape: Sequence[int], layout: str | None) -> str:
    """An input's entry in the program language: ``[dims]``, or ``{shape: [dims], layout: L}``
    for memory other than row-major."""
    dims = f"[{', '.join(map(str, shape))}]"
    return f"{{shape: {dims}, layout: {layout}}}" if layout else dims


def _attr_names(kind: str) -> tuple[str, ...]:
    from search import OPS

    return OPS[kind].attrs
