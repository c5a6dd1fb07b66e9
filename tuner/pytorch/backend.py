"""The ``tuner`` backend of ``torch.compile`` and ``tuner.compile``.

Dynamo hands over an FX graph; ``aot_autograd`` turns it into ATen ops (functional, at
concrete shapes); ``regions.partition`` splits those into the largest regions the op table
writes; each region becomes a program named by its structural hash (``torch_<hash>``, the same
name in every process, so the database finds it again).  A region whose program has a tuned,
verified kernel for this device is replaced by a ``tuner::kernel`` call; the rest of the graph
runs through Inductor (``fallback="inductor"``) or as it is (``"eager"``).

``tune`` says what happens to a program with no kernel yet: ``"cached"`` (the default) uses
only what the database holds, so compiling never blocks for the minutes a search and a tuning
take; ``"now"`` searches and tunes it here within ``budget_s`` and stores it; ``"job"`` writes
it to ``job_file`` for ``tuner launch`` on a bigger machine.  Whatever is missing runs through
the fallback, with a one-line reason in the report.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import numpy as np
import torch

from search import KernelGraph, Program, ShapeError, structural_hash

from ..mirage_compat import to_program
from .aten import op_name
from .direct import direct_function, why_not_direct
from .emitter import Emitted
from .options import Options, make_options
from .regions import Region, partition
from .report import GraphReport, RegionReport, Report
from .runtime import kernel_table

log = logging.getLogger("tuner.pytorch")
_LAST: list[Report] = [Report()]


def last_report() -> Report:
    """The report of the most recent compile by ``torch.compile(..., backend="tuner")``."""
    return _LAST[0]


def backend(gm: torch.fx.GraphModule, example_inputs: list, **options: Any) -> Any:
    """The ``torch.compile`` backend (registered as ``tuner`` by the ``torch_dynamo_backends``
    entry point)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    opts = make_options(dict(options))
    _LAST[0] = opts.report
    if _symbolic(example_inputs):  # kernels are tuned at fixed shapes
        symbolic = GraphReport(total=0, uncaptured=[(
            "the whole graph", "dynamic shapes (kernels are tuned at fixed shapes: compile "
            "with dynamic=False, as tuner.compile does)")], path=opts.fallback)
        opts.report.graphs.append(symbolic)
        log.info(symbolic.summary())
        if opts.fallback == "eager":
            return gm.forward
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)
    # no gradient wanted: the one ATen graph AOT hands over is the whole computation, and
    # may be called without AOT's wrappers (Dynamo guards the grad mode and recompiles)
    inference = not torch.is_grad_enabled() or not any(
        getattr(x, "requires_grad", False) for x in (*gm.parameters(), *example_inputs))
    plain = inference and not _mutates(gm) and not any(True for _ in gm.buffers())
    seen: dict[str, Any] = {}

    def compile_aten(aten: torch.fx.GraphModule, inputs: list) -> Any:
        try:
            graph_report = capture(aten, opts)
        except Exception as err:  # a model this capture cannot read still runs, unchanged
            graph_report = GraphReport(total=0, uncaptured=[
                ("the whole graph", f"capture failed: {_one_line(err)}")])
        opts.report.graphs.append(graph_report)
        seen.update(aten=aten, report=graph_report)
        kernels = sum(r.status == "kernel" for r in graph_report.regions)
        if plain and not kernels:  # Inductor (or eager) gets Dynamo's graph itself, below
            return make_boxed_func(aten.forward)
        if plain and not why_not_direct(aten, kernel_table()):
            graph_report.path = "direct"
            return make_boxed_func(aten.forward)
        graph_report.path = opts.fallback
        if opts.fallback == "eager":
            return make_boxed_func(aten.forward)
        from torch._inductor.compile_fx import compile_fx

        # compile_fx, given an ATen graph inside aot_autograd, traces it again (our kernels
        # are opaque custom ops there) and returns a function of the arguments themselves
        return make_boxed_func(compile_fx(aten, inputs))

    compiled: Any = aot_autograd(fw_compiler=compile_aten)(gm, example_inputs)
    report: GraphReport | None = seen.get("report")
    if plain and report is not None and _flat_inputs(seen["aten"]) == len(example_inputs) + \
            len(dict(gm.named_parameters(remove_duplicate=False))):
        if report.path == "direct":
            try:
                fn = direct_function(seen["aten"], kernel_table())
            except Exception as err:  # the graph still runs: its kernels as tuner::kernel ops
                report.path = "eager"
                log.warning("tuner: the direct call path failed (%s); the graph runs "
                            "eagerly with its kernels", _one_line(err))
            else:
                params = tuple(dict(gm.named_parameters(remove_duplicate=False)).values())
                compiled = (lambda *args: fn(*params, *args)) if params else fn
        elif not any(r.status == "kernel" for r in report.regions):
            report.path = opts.fallback  # nothing of ours to run: the fallback's own compile
            if opts.fallback == "eager":
                compiled = gm.forward
            else:
                from torch._inductor.compile_fx import compile_fx

                compiled = compile_fx(gm, example_inputs)
    elif report is not None and report.path == "direct":
        report.path = opts.fallback  # AOT changed the inputs: its wrappers stay
    line = report.summary() if report is not None else "tuner: no graph captured"
    log.info(line)
    if opts.verbose:
        print(line, file=sys.stderr, flush=True)
    return compiled


def _symbolic(example_inputs: list) -> bool:
    """Whether Dynamo made any size symbolic (a graph for many shapes)."""
    for x in example_inputs:
        dims = x.shape if isinstance(x, torch.Tensor) else (x,)
        if any(isinstance(d, torch.SymInt) for d in dims):
            return True
    return False


def _mutates(gm: torch.fx.GraphModule) -> bool:
    """Whether Dynamo's graph writes into a tensor (an in-place op: AOT's wrappers copy the
    result back into the input, which a direct call would not)."""
    for n in gm.graph.nodes:
        name = getattr(n.target, "__name__", str(n.target)) if n.op != "placeholder" else ""
        if n.op in ("call_function", "call_method") and name.endswith("_") and \
                not name.endswith("__"):
            return True
    return False


def _flat_inputs(aten: torch.fx.GraphModule) -> int:
    return sum(n.op == "placeholder" for n in aten.graph.nodes)


def capture(gm: torch.fx.GraphModule, opts: Options) -> GraphReport:
    """Replace every region of ``gm`` that has a usable kernel; report what happened."""
    from .runtime import finish, register_kernel, replace

    part = partition(gm.graph, opts.max_ops)
    report = GraphReport(total=len(part.compute),
                         uncaptured=[(op_name(n), r) for n, r in part.reasons.items()])
    programs: list[tuple[Region, Program | None, str]] = []
    for region in part.regions:
        try:
            programs.append((region, program_of(region.emitted), ""))
        except (ShapeError, ValueError) as err:
            programs.append((region, None, _one_line(err)))
    found = _kernels([p for _r, p, _e in programs if p is not None], opts)
    # every kernel is checked and raced before any region is replaced: a later region's
    # inputs may be an earlier one's outputs, whose replacements carry no example values
    chosen = []
    for region, program, error in programs:
        ops = [op_name(n) for n in region.nodes]
        name = program.name if program is not None else "-"
        entry = RegionReport(name, ops, region.emitted.ops, "fallback", error)
        report.regions.append(entry)
        if program is None:
            continue
        kernel, why = found.get(program.name, (None, "not looked up"))
        if kernel is not None and opts.check:
            why = check_kernel(kernel, region.emitted)
            kernel = kernel if not why else None
        shapes = [tuple(region.emitted.graph.tensors[t].shape)
                  for t in dict.fromkeys(t for _n, t in region.emitted.outputs)]
        if kernel is not None and opts.race:
            why = _race(kernel, region, shapes, program.dtype, entry)
            kernel = kernel if not why else None
        entry.reason = why
        if kernel is not None:
            entry.uncertain = getattr(kernel, "uncertain", "")
            chosen.append((region, program, kernel, shapes, entry))
    replaced: dict = {}
    for region, program, kernel, shapes, entry in chosen:
        register_kernel(program.name, kernel, shapes, program.dtype)  # type: ignore[arg-type]
        replace(gm, region.nodes, region.emitted, program.name, replaced)
        entry.status, entry.reason = "kernel", ""
    if replaced:
        finish(gm)
    return report


def _race(kernel: Any, region: Region, shapes: list, dtype: str, entry: RegionReport) -> str:
    """Time the kernel against PyTorch's own ops for the region: '' when it is faster."""
    from .direct import KernelCall
    from .race import race

    try:
        tdtype = getattr(torch, dtype)
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            ins = [torch.randn(s.shape).to(tdtype) for s in region.emitted.inputs]
        call = KernelCall("race", kernel, shapes, tdtype).call if hasattr(kernel, "entry") \
            else kernel
        mine, theirs = race(call, ins, region.nodes)
    except Exception as err:  # timing is advice: a region it cannot time keeps its kernel
        log.debug("race of %s skipped: %s", entry.program, _one_line(err))
        return ""
    entry.kernel_us, entry.torch_us = mine * 1e6, theirs * 1e6
    if mine < theirs:
        return ""
    return (f"PyTorch's own ops ran the region faster here ({theirs * 1e6:.1f} µs a call "
            f"against the kernel's {mine * 1e6:.1f} µs)")


def program_of(emitted: Emitted) -> Program:
    """The region as a program named by its structural hash; refused where the program
    language would not give back the same graph (an attribute it cannot say)."""
    graph: KernelGraph = emitted.graph
    name = f"torch_{structural_hash(graph)[:12]}"
    program = to_program(graph, name)
    if structural_hash(program.build()) != structural_hash(graph):
        raise ShapeError("the program language does not say this region exactly (an input "
                         "layout?)")
    return program


def _kernels(programs: list[Program], opts: Options) -> dict[str, tuple[Any, str]]:
    """name → (kernel, "") or (None, why not), after tuning or writing a job per ``tune``."""
    from .tuning import lookup, tune_now, write_job

    unique = list({p.name: p for p in programs}.values())
    found = lookup(unique, opts)
    missing = [p for p in unique if found[p.name][0] is None]
    if missing and opts.tune == "now":
        note = tune_now(missing, opts)
        found.update({k: v if v[0] is not None else (None, note or v[1])
                      for k, v in lookup(missing, opts).items()})
    elif missing and opts.tune == "job":
        path = write_job(missing, opts)
        found.update({p.name: (None, f"no tuned kernel yet; written to {path} for "
                                     "`tuner launch`") for p in missing})
    return found


# the check's tolerance, relative to the output's largest magnitude: float32 arithmetic, or
# outputs rounded to the program's half dtype (2**-11 and 2**-8 relative, with headroom)
_CHECK_TOL = {"float32": 2e-3, "float16": 4e-3, "bfloat16": 1.6e-2}


def check_kernel(kernel: Any, emitted: Emitted) -> str:
    """Run ``kernel`` once on real-scale random inputs against the float64 reference of
    the region's graph: '' when it agrees, else why it is not used."""
    from verifier import FloatArith, run

    dtype = getattr(torch, emitted.graph.tensors[emitted.graph.input_ids[0]].dtype)
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    # real torch tensors of the program's dtype, as the graph will hand them over (the
    # compile runs under Dynamo's fake mode, which would make them fake)
    with unset_fake_temporarily():
        try:
            for positive in (False, True):
                tensors = [torch.from_numpy(a).to(dtype)
                           for a in _check_inputs(emitted, positive)]
                logical = [np.swapaxes(t.double().numpy(), -1, -2) if s.kind == "transposed"
                           else t.double().numpy()
                           for t, s in zip(tensors, emitted.inputs, strict=True)]
                want = run(emitted.graph, logical, FloatArith())
                # a region whose inputs N(0, 1) takes out of its domain (a norm's mean of a
                # square computed in another region: rsqrt of a negative) is checked on
                # positive inputs, as the launch's checks draw them
                if all(np.all(np.isfinite(w)) for w in want):
                    break
            got = [torch.as_tensor(g).double().numpy() for g in kernel(*tensors)]
        except Exception as err:  # a kernel that cannot run is not used, whatever the reason
            return f"the kernel failed its check: {_one_line(err)}"
    tol = _CHECK_TOL.get(str(dtype).removeprefix("torch."), 2e-3)
    for g, w in zip(got, want, strict=True):
        scale = max(1.0, float(np.max(np.abs(w))))
        if g.shape != w.shape or not np.all(np.isfinite(g)) or \
                float(np.max(np.abs(g - w))) > tol * scale:
            return "the kernel failed its check against the float64 reference"
    return ""


def _check_inputs(emitted: Emitted, positive: bool) -> list[np.ndarray]:
    """Real-scale random inputs of the region: N(0, 1), or 0.5 + |N(0, 1)| (``positive``);
    a mask 0 / 1 with its first column set."""
    rng = np.random.default_rng(0)
    arrays = []
    for spec in emitted.inputs:
        if spec.kind == "mask":
            a = rng.integers(0, 2, spec.shape).astype(np.float32)
            a[..., 0] = 1.0
        else:
            a = rng.standard_normal(spec.shape, dtype=np.float32)
            if positive:
                a = (0.5 + np.abs(a)).astype(np.float32)
        arrays.append(a)
    return arrays


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300] or type(err).__name__
