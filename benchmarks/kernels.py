"""Fused C++ kernels vs op-by-op numpy on this CPU, with the issue's targets checked per row.

    .venv/bin/python benchmarks/kernels.py [--device cpu|cuda] [--threads N] [--structures DIR]
                                           [--budget S] [--rounds N] [--only NAME ...] [--json]

``--device cuda`` measures on the GPU instead: the fused CUDA kernel against the reference run
op by op with CuPy in the program's dtype (cuBLAS for the matmuls), both timed with CUDA events
in the isolated worker; bandwidth is judged against a device-to-device copy measured in the run.

Rows: every suite program (search.ir.suite.SUITE) at its default shapes, softmax_rows at the three
AStitch mapping shapes, and rmsnorm_residual.  Each row builds the structure (hand-written, or
the winner of a search output in ``--structures DIR``) with the AStitch default config, checks
it against the float64 reference, then times the fused kernel (in the isolated worker) and the
reference graph run op by op with numpy in float32, one after the other in the same run.
``--rounds N`` repeats the whole pass N times and reports per row the median fused and numpy
times and the median of the per-round ratios: on a VM whose neighbours come and go, one pass
can catch a slow moment for one row.

``--threads N`` sets OMP_NUM_THREADS / OPENBLAS_NUM_THREADS for both sides before numpy loads
(default: all cores); bandwidth is then judged against the copy bandwidth measured with the
same number of threads (kernels.devices.measure_cpu_bandwidth: one-thread or all-core copy,
cached from a quiet moment).  The copy is also re-measured at the start and the end of the
run ("copy now", the better of the two): on a machine shared with other processes it says
how much of the shortfall is the machine rather than the kernel.

Targets (PASS/FAIL per row): ratio ≥ 1.0 everywhere; ≥ 2.0 on ntrans, softmax_rows and
rmsnorm_residual; memory-bound rows (FLOPs per byte below the machine balance, peak FLOP/s /
copy bandwidth) at ≥ 60 % of copy bandwidth — the cached figure or the one measured now,
whichever is higher.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (row label, program, parameter overrides, why these shapes)
ROWS = [(n, n, {}) for n in ("rmsnorm_matmul", "gated_mlp", "lora", "gqa", "qknorm_gqa", "mha",
                             "mqa", "ntrans")] + [
    ("softmax_rows 750000x32", "softmax_rows", {"rows": 750000, "cols": 32}),
    ("softmax_rows 64x30000", "softmax_rows", {"rows": 64, "cols": 30000}),
    ("softmax_rows 4096x1024", "softmax_rows", {"rows": 4096, "cols": 1024}),
    ("rmsnorm_residual", "rmsnorm_residual", {}),
]
TWO_X = ("ntrans", "softmax_rows", "rmsnorm_residual")
MEMORY_TARGET = 0.60


def flops(graph) -> int:
    """FLOPs of a reference graph: 2·M·N·K per matmul, one per output element otherwise."""
    total = 0
    for op in graph.ops:
        if op.kind in ("input", "output"):
            continue
        out = math.prod(graph.tensors[op.outputs[0]].shape)
        if op.kind == "matmul":
            total += 2 * out * graph.tensors[op.inputs[0]].shape[-1]
        else:
            total += out
    return total


def winner(structures: Path, name: str, program, device: str = "cpu"):
    """The structure of a search output in ``structures`` for ``name``, or the program as
    written, with the fastest roofline estimate on ``device`` (what ``tuner measure
    --structure best`` and a launch's first study pick), or None."""
    from kernels import rank_structures
    from tuner.api import check_inputs, read_structures

    candidates = [structures / f"{name}.json"] + sorted(structures.glob("*.json"))
    for path in candidates:
        if not path.is_file():
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if path.stem != name and (not isinstance(doc, dict) or doc.get("program") != name):
            continue
        found = read_structures(str(path))
        try:
            check_inputs(program, found[0]["graph"], str(path))
        except ValueError:
            continue  # found at other shapes
        graphs = [s["graph"] for s in found] + [program.build()]
        if device == "cuda":
            from kernels import cuda_device_spec

            device = cuda_device_spec()
        first = rank_structures(graphs, device)[0]
        if first == len(found):
            return graphs[first], "reference (kernel per op)"
        return graphs[first], f"search {found[first]['hash'][:10]}"
    return None


def gpu_copy_gbs(nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Best device-to-device copy on the GPU in GB/s, bytes read + written (STREAM)."""
    import cupy as cp

    src = cp.ones(nbytes // 4, cp.float32)
    dst = cp.empty_like(src)
    begin, end = cp.cuda.Event(), cp.cuda.Event()
    best = float("inf")
    for _ in range(repeats):
        begin.record()
        dst[...] = src
        end.record()
        end.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(begin, end) * 1e-3)
    return 2 * nbytes / best / 1e9


def run(args: argparse.Namespace) -> list[dict]:
    from kernels import (
        IsolatedWorker,
        local_cpu_spec,
        measure_copy_bandwidth,
        measure_cpu_bandwidth,
    )

    if args.device == "cuda":
        from kernels import cuda_device_spec, device_key

        spec = cuda_device_spec()
        threads, copy = 0, gpu_copy_gbs()
        balance = spec.peak_fp32_flops / (copy * 1e9)
        print(f"# {device_key('cuda')}, {spec.sm_count} SMs; device-to-device copy {copy:.0f} "
              f"GB/s (datasheet {spec.mem_bandwidth_gbs:.0f}); balance {balance:.1f} FLOP/B "
              "(fp32 CUDA cores)", file=sys.stderr)

        def measure_copy() -> float:
            return gpu_copy_gbs()
    else:
        spec = local_cpu_spec()
        bw = measure_cpu_bandwidth()
        threads = args.threads or spec.sm_count
        copy = bw["copy_1t_gbs"] if threads == 1 else bw["copy_gbs"]
        balance = spec.peak_fp32_flops * threads / spec.sm_count / (copy * 1e9)
        print(f"# {spec.name}, {spec.sm_count} cores, {threads} thread(s); copy bandwidth "
              f"{copy:.1f} GB/s ({'one thread' if threads == 1 else 'all cores'}, measured "
              f"{bw['measured_at']}); balance {balance:.1f} FLOP/B; load "
              f"{os.getloadavg()[0]:.2f}", file=sys.stderr)

        def measure_copy() -> float:
            return measure_copy_bandwidth(256 << 20, 3, threads)
    now = [measure_copy()]
    rows: dict[str, dict] = {}
    with IsolatedWorker() as worker:
        for rnd in range(args.rounds):
            for label, name, overrides in ROWS:
                if args.only and not any(o in label for o in args.only):
                    continue
                row = measure_row(args, worker, label, name, overrides, copy, balance)
                if label in rows:
                    rows[label]["rounds"].append(row)
                else:
                    rows[label] = {**row, "rounds": [row]}
                print(f"# {label}: {row['status']} in {row['seconds']:.1f} s"
                      f"{f' (round {rnd + 1})' if args.rounds > 1 else ''}", file=sys.stderr)
    rows = [combine(r) for r in rows.values()]
    now.append(measure_copy())
    print(f"# copy now: {now[0]:.1f} GB/s at the start, {now[1]:.1f} GB/s at the end",
          file=sys.stderr)
    for row in rows:
        row["of_copy"] = row["gbs"] / copy
        row["of_copy_now"] = row["gbs"] / max(now)
        # judged against the better copy figure: a cache taken at a busy moment, or a busy
        # moment now, must not flatter the kernel
        row["of_best_copy"] = row["gbs"] / max(copy, *now)
        row["fails"] = targets(row, row.pop("name"))
    return rows


def measure_row(args: argparse.Namespace, worker, label: str, name: str, overrides: dict,
                copy: float, balance: float) -> dict:
    """One row, both sides timed one after the other."""
    from kernels import measure_program
    from search import handwritten, load_program

    program = load_program(name, overrides)
    found = winner(Path(args.structures), name, program, args.device) \
        if args.structures else None
    structure, source = found or (handwritten(program), "hand-written")
    t0 = time.perf_counter()
    m = measure_program(program, structure, None, device=args.device, worker=worker,
                        timing={"budget_s": args.budget})
    intensity = flops(program.build()) / max(1, m.bytes_moved or 1)
    return {"label": label, "name": name, "shapes": ", ".join(
        f"{n} {'x'.join(map(str, s))}" for n, s in program.inputs.items()),
        "structure": source, "status": m.status, "fused_ms": m.kernel_s * 1e3,
        "numpy_ms": m.baseline_s * 1e3, "ratio": m.speedup, "gbs": m.achieved_gbs,
        "bytes": m.bytes_moved, "memory_bound": intensity < balance,
        "flop_per_byte": intensity, "max_err": m.max_error, "message": m.message,
        "seconds": time.perf_counter() - t0}


def combine(row: dict) -> dict:
    """A row over its rounds: the median fused and numpy times, the median of the per-round
    ratios (each from one round, both sides back to back), the worst status."""
    rounds = row.pop("rounds")
    bad = [r for r in rounds if r["status"] != "ok"]
    if bad:
        return {**row, **bad[0]}
    med = {k: statistics.median(r[k] for r in rounds) for k in ("fused_ms", "numpy_ms", "ratio")}
    return {**row, **med, "gbs": row["bytes"] / (med["fused_ms"] * 1e-3) / 1e9,
            "fused_range_ms": (min(r["fused_ms"] for r in rounds),
                               max(r["fused_ms"] for r in rounds)) if len(rounds) > 1 else None,
            "seconds": sum(r["seconds"] for r in rounds)}


def targets(row: dict, name: str) -> list[str]:
    """The targets this row misses (empty: PASS)."""
    if row["status"] != "ok":
        return [row["status"]]
    need = 2.0 if name in TWO_X else 1.0
    fails = [f"ratio<{need:g}"] if not row["ratio"] >= need else []
    if row["memory_bound"] and not row["of_best_copy"] >= MEMORY_TARGET:
        fails.append(f"bw<{MEMORY_TARGET:.0%}")
    return fails


def table(rows: list[dict], device: str = "cpu") -> str:
    base = "cupy ms" if device == "cuda" else "numpy ms"
    head = (f"| program | shapes | structure | fused ms | {base} | ratio | GB/s | of copy | "
            "of copy now | bound | target |\n|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        verdict = "PASS" if not r["fails"] else "FAIL (" + ", ".join(r["fails"]) + ")"
        fused = f"{r['fused_ms']:.3f}"
        if r.get("fused_range_ms"):
            fused += " ({:.3f}–{:.3f})".format(*r["fused_range_ms"])
        lines.append(f"| {r['label']} | {r['shapes']} | {r['structure']} | {fused} | "
                     f"{r['numpy_ms']:.3f} | {r['ratio']:.2f} | {r['gbs']:.1f} | "
                     f"{r['of_copy']:.0%} | {r['of_copy_now']:.0%} | "
                     f"{'memory' if r['memory_bound'] else 'compute'} | "
                     f"{verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="the CPU (C++ vs numpy) or the GPU (CUDA vs CuPy op by op)")
    parser.add_argument("--threads", type=int, default=0,
                        help="threads for both sides (default: all cores)")
    parser.add_argument("--structures", metavar="DIR",
                        help="directory of search outputs (<program>.json); default: the "
                             "hand-written structures")
    parser.add_argument("--budget", type=float, default=1.0,
                        help="timing budget per side and row, seconds (default 1)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every row this many times, round robin, and report the "
                             "medians (default 1)")
    parser.add_argument("--only", nargs="*", help="rows whose label contains one of these")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be ≥ 1")
    if args.threads < 0:
        parser.error("--threads must be ≥ 1 (or 0 for all cores)")
    if args.threads:  # before numpy (OpenBLAS) and the worker (OpenMP) start
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    if args.structures and not Path(args.structures).is_dir():
        parser.error(f"--structures {args.structures}: not a directory")
    sys.path.insert(0, str(ROOT))
    rows = run(args)
    print(json.dumps(rows, indent=2) if args.json else table(rows, args.device))
    return 0 if all(not r["fails"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
