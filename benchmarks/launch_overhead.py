"""What one call of our kernel costs on a CUDA GPU, launched each way we can launch it.

    .venv/bin/python benchmarks/launch_overhead.py [--programs lora ntrans] [--rounds 5]
        [--budget 0.2] [--json]

Why: on an H100 (2026-11-27) a CUDA-C kernel through CuPy's RawKernel cost ~0.013 ms a call,
lora's tiny Triton kernel ~0.044 ms.  Each ``kernel[grid](...)`` runs Triton's Python
``JITFunction.run`` (3.6 and 3.9): binding and specialising every argument (non-torch objects
miss the specialiser's type cache), the cache key, launch metadata for the launch hooks; the C
launcher then calls ``data_ptr()`` and ``cuPointerGetAttribute`` per pointer.  Rows, per
program (hand-written structure at its paper shape; Triton plan at
``kernels.triton_default_config``, CUDA C at the default config):

- empty CuPy kernel <<<1,1>>>: the floor of a launch from Python;
- cuda-c: ``build_kernel`` on the CUDA-C plan (CuPy RawKernel), as peers.py times it;
- triton jit (b): ``TritonKernel(launch="jit")``, what ``build_kernel`` gives today;
- triton jit, DLPack: the module's ``launch`` on torch tensors made once from the CuPy arrays
  (zero copy; torch tensors take the specialiser's fast path);
- triton direct: ``TritonKernel(launch="direct")`` (``TUNER_TRITON_LAUNCH=direct``): the kept
  ``CompiledKernel``'s launcher on integer pointers, no hooks;
- triton CompiledKernel[grid]: Triton's own runner on integer pointers (stream looked up);
- cuda-c / triton graph replay: the call captured once into a CUDA graph on a CuPy side stream
  (torch's current stream pointed at it, where Triton launches), replayed: the GPU time plus
  one cudaGraphLaunch, no Python dispatch.

ms/call: median over ``--rounds`` interleaved rounds of ``kernels.measure``'s median with CUDA
events (calls back to back: host dispatch slower than the kernel shows); host µs/call: 200
calls on the host clock, not waited for; (b)/row > 1: faster than today.  Each row's outputs
are checked against (b)'s first (Triton rows run (b)'s compiled kernel: bit for bit; CUDA C:
twice the dtype's tolerance); a row that fails says why in one line and is left out.  Without
a GPU: one line, exit 0.  torch is imported first, so Triton 3.9 too launches on torch's
current stream (3.6 always imports torch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST_CALLS = 200
BASE = "triton jit, _DevicePointer (b: today)"


class Row:
    def __init__(self, fn, outs=None, plan=None, exact: bool = True) -> None:
        self.fn, self.outs, self.plan, self.exact, self.name, self.note = fn, outs, plan, exact, "", ""
        self.ms: list[float] = []
        self.host_us: list[float] = []


def one_line(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:240]}"


def build_rows(name: str, cp, torch, say) -> list[Row]:
    """Every row that builds for program ``name`` (a failing one is said and left out)."""
    import numpy as np

    from kernels import devices as kd
    from kernels import get_device, triton_default_config
    from search import handwritten, load_program

    program = load_program(name)
    ref, structure, device = program.build(), handwritten(program), get_device("cuda")
    stored = kd.as_stored(kd.random_inputs(ref), kd.input_layouts(ref))
    rows: list[Row] = []
    state: dict = {}

    def ins(plan):
        return [cp.asarray(kd.to_storage(x, b.dtype)) for x, b in zip(stored, plan.inputs,
                                                                       strict=True)]

    def outs(plan):
        return [cp.asarray(kd.to_storage(np.full(b.shape, np.nan, np.float32), b.dtype))
                for b in plan.outputs]

    def graph(fn):  # captured on a side stream (torch's too); replayed on the current one
        stream = cp.cuda.Stream(non_blocking=True)
        ext = torch.cuda.ExternalStream(stream.ptr) if torch else None
        cp.cuda.Device().synchronize()
        ctx = torch.cuda.stream(ext) if torch else nullcontext()
        with stream, ctx:
            stream.begin_capture()
            try:
                fn()
            finally:  # a failed capture is ended too (which may raise its own error)
                g = stream.end_capture()
        return g.launch

    def empty():
        k = cp.RawKernel('extern "C" __global__ void empty() {}', "empty")
        return Row(lambda: k((1,), (1,), ()))

    def cuda_c():
        plan = device.lower(structure, None, name)
        kernel, xs, os = kd.build_kernel(cp, plan, device.render(plan)), ins(plan), outs(plan)
        state["cuda"] = (plan, kernel, xs)
        return Row(lambda: kernel(xs, os), os, plan, exact=False)

    def jit():
        plan = device.lower(structure, triton_default_config(structure, device.spec), name)
        source = device.render(plan)
        kernel = kd.TritonKernel(plan, source, cupy=cp, launch="jit")
        xs, os = ins(plan), outs(plan)
        state["triton"] = (plan, kernel, xs, source)
        return Row(lambda: kernel(xs, os), os, plan)

    def dlpack():  # bfloat16 is stored as uint16: viewed back as torch.bfloat16
        plan, kernel, xs, _ = state["triton"]
        os = outs(plan)

        def view(arrays, buffers):
            return [torch.from_dlpack(a).view(getattr(torch, b.dtype))
                    for a, b in zip(arrays, buffers, strict=True)]

        tx, to, tws = view(xs, plan.inputs), view(os, plan.outputs), torch.from_dlpack(
            kernel.ws.array)
        return Row(lambda: kernel.module.launch(tx, to, tws), os, plan)

    def direct():
        plan, _, xs, source = state["triton"]
        kernel, os = kd.TritonKernel(plan, source, cupy=cp, launch="direct"), outs(plan)
        kernel(xs, os)  # the first call goes through Triton and keeps the compiled kernels
        state["direct"] = kernel
        return Row(lambda: kernel(xs, os), os, plan)

    def runner():
        (plan, _, xs, _), kernel = state["triton"], state["direct"]
        os = outs(plan)
        ptrs = [a.data.ptr for a in xs] + [o.data.ptr for o in os] + [kernel.ws.data_ptr()]
        calls = [(c[(*ln.grid, 1, 1)[:3]], [ptrs[i] for i in ln.args])
                 for c, ln in zip(kernel.compiled, kernel.launches, strict=True)]
        return Row(lambda: [run(*args) for run, args in calls], os, plan)

    def replay(key):
        def make():
            plan, kernel, xs = state[key][:3]
            os = outs(plan)
            return Row(graph(lambda: kernel(xs, os)), os, plan, exact=key != "cuda")
        return make

    for label, make in [("empty CuPy kernel <<<1,1>>> (floor)", empty),
                        ("cuda-c (CuPy RawKernel)", cuda_c),
                        (BASE, jit),
                        ("triton jit, torch tensors via DLPack", dlpack),
                        ("triton direct launcher (TUNER_TRITON_LAUNCH=direct)", direct),
                        ("triton CompiledKernel[grid], int pointers", runner),
                        ("cuda-c, CUDA graph replay", replay("cuda")),
                        ("triton jit, CUDA graph replay", replay("triton"))]:
        try:
            row = make()
            row.name = label
            rows.append(row)
        except KeyError as e:  # most likely the state of an earlier row that failed
            say(f"# {name}: {label}: skipped: KeyError {e} (a row it needs failed?)")
        except Exception as e:  # noqa: BLE001 - one variant failing must not stop the rest
            say(f"# {name}: {label}: skipped: {one_line(e)}")
    return check(name, rows, ref, stored, cp, say)


def check(name, rows, ref, stored, cp, say) -> list[Row]:
    """Rows whose outputs match: (b) first, against the float64 reference within the dtype's
    tolerance; the others against (b)'s within twice that (or, without (b), as (b) is)."""
    import numpy as np

    from kernels import devices as kd

    base = next((r for r in rows if r.name == BASE), None)
    b_out, kept = None, []
    for row in sorted(rows, key=lambda r: r is not base):
        try:
            row.fn()
            cp.cuda.Device().synchronize()
            if row.outs is not None:
                plan = row.plan
                got = [kd.from_storage(cp.asnumpy(o), b.dtype).astype(np.float64)
                       for o, b in zip(row.outs, plan.outputs, strict=True)]
                want, k, what = b_out, 2.0, "(b)"
                if want is None:
                    rounded = [kd.from_storage(kd.to_storage(x, b.dtype), b.dtype)
                               for x, b in zip(stored, plan.inputs, strict=True)]
                    want = kd.reference(ref, kd.as_logical(rounded, kd.input_layouts(ref)))
                    k, what = 1.0, "float64"
                rtol, atol = kd.tolerance(plan.outputs[0].dtype)
                scale = max(float(np.max(np.abs(w), initial=0.0)) for w in want)
                errs, bad = kd.compare_outputs(got, want, k * rtol, k * max(atol, rtol * scale))
                if bad:
                    raise ValueError(f"differs from {what}: {bad}")
                same = all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
                row.note = f"identical to {what}" if same else f"max |diff| vs {what} " \
                    f"{max(errs):.2g}" + (" (expected identical)" if row.exact and b_out else "")
                if row is base:
                    b_out, row.note = got, f"(b); {row.note}"
            kept.append(row)
        except Exception as e:  # noqa: BLE001
            say(f"# {name}: {row.name}: left out: {one_line(e)}")
    return [r for r in rows if r in kept]  # in the rows' order


def time_rows(name, rows, cp, args, say) -> None:
    """Round robin: each round times every row once (events), then its host issue rate."""
    from kernels import measure
    from kernels.devices import EventClock

    clock = EventClock(cp)
    for _ in range(args.rounds):
        for row in list(rows):
            try:
                row.ms.append(measure(row.fn, budget_s=args.budget, clock=clock).median_s * 1e3)
                cp.cuda.Device().synchronize()
                t0 = time.perf_counter()
                for _ in range(HOST_CALLS):
                    row.fn()
                row.host_us.append((time.perf_counter() - t0) / HOST_CALLS * 1e6)
                cp.cuda.Device().synchronize()
            except Exception as e:  # noqa: BLE001
                say(f"# {name}: {row.name}: failed while timing: {one_line(e)}")
                rows.remove(row)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", nargs="+", default=["lora", "ntrans"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=0.2, help="seconds per measure()")
    parser.add_argument("--json", action="store_true",
                        help="print the rows as JSON on stdout (the table goes to stderr)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from kernels import cuda_available

    ok, why = cuda_available()
    if not ok:
        print(f"launch_overhead: no CUDA GPU here, nothing measured: {why}")
        return 0

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:  # before Triton's driver exists: Triton 3.9 then launches on torch's stream too
        import torch
    except ImportError as e:
        torch = None
        say(f"# torch is not importable ({e}): no DLPack row; graphs capture CuPy's stream")
    import cupy as cp

    versions = {"cupy": cp.__version__, "torch": getattr(torch, "__version__", None)}
    try:
        versions["triton"] = __import__("triton").__version__
    except ImportError as e:
        say(f"# Triton is not importable: {e}")
    gpu = cp.cuda.runtime.getDeviceProperties(0)["name"]
    gpu = gpu.decode() if isinstance(gpu, bytes) else gpu
    say(f"# {gpu}; {versions}; rounds {args.rounds}, budget {args.budget} s")
    report = []
    for name in args.programs:
        try:
            rows = build_rows(name, cp, torch, say)
        except Exception as e:  # noqa: BLE001 - e.g. an unknown program name
            say(f"# {name}: no rows: {one_line(e)}")
            continue
        time_rows(name, rows, cp, args, say)
        b_ms = next((statistics.median(r.ms) for r in rows if r.name == BASE), None)
        entry = {"program": name, "gpu": gpu, "versions": versions, "rows": [
            {"variant": r.name, "ms": statistics.median(r.ms),
             "host_us": statistics.median(r.host_us), "output": r.note or "not checked",
             "b_over_row": b_ms / statistics.median(r.ms) if b_ms else None, "ms_rounds": r.ms}
            for r in rows if r.ms]}
        report.append(entry)
        table = sys.stderr if args.json else sys.stdout  # --json: the table still shows
        print(f"\n{name} on {gpu} ({versions})\n| variant | ms/call | host µs/call | (b)/row "
              "| output |\n|---|--:|--:|--:|---|", file=table)
        for r in entry["rows"]:
            ratio = f"{r['b_over_row']:.2f}x" if r["b_over_row"] else "-"
            print(f"| {r['variant']} | {r['ms']:.4f} | {r['host_us']:.1f} | {ratio} | "
                  f"{r['output']} |", file=table, flush=True)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
