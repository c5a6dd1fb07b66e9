"""The µGraph search on the suite, with Ray workers, against the issue's targets.

    .venv/bin/python benchmarks/search.py [--programs a,b,...] [--workers 1,2] [--json FILE]
                                          [--time-limit S]

Rows: every program of search.ir.suite.SUITE at its default (paper) shapes, then
``rmsnorm_matmul@16x1024`` (X (16, 1024), W (1024, 1024): the instance Mirage's published
241.6 s search time is for) and ``lora@inputs4`` (lora with Limits(max_block_inputs=4): lora
reads four tensors, so with the default three block inputs no single kernel can hold it).

Each worker count gets one embedded Ray instance (RayExecutor(n), started once, closed at the
end); its start-up time is reported apart from the search times.  Per row: states explored,
pruned, verified, wall time until the driver holds the first verified single-kernel structure
(measured by wrapping the executor, which sees every shard result as it arrives; the summary's
``first_single_kernel_s`` is the elapsed time of the fastest verifying *shard*, shown beside
it), time to completion, the best structure's kernels and symbols, whether the target's
e-graph saturated, and the peak memory of the whole search: the RSS of this process plus
every descendant (Ray's raylet, GCS and workers), sampled every 0.2 s, summed per sample.

Targets (PASS/FAIL): rmsnorm_matmul@16x1024 completes in ≤ 12 s (Mirage: 241.6 s); every
suite program in ≤ 120 s; 2 workers ≥ 1.7x faster than 1 on the program with the most states;
peak memory ≤ 2 GB per program.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cluster import RayExecutor, search_program  # noqa: E402
from search import (  # noqa: E402
    SUITE,
    Limits,  # noqa: E402
    format_graph,  # noqa: E402
    from_obj,  # noqa: E402
    load_program,
)

MIRAGE_S = 241.6
RMSNORM_TARGET_S = 12.0
SUITE_TARGET_S = 120.0
SPEEDUP_TARGET = 1.7
MEMORY_TARGET_MB = 2048.0
SAMPLE_S = 0.2

# (row label, program, input overrides, Limits keywords)
ROWS: list[tuple[str, str, dict, dict]] = [(n, n, {}, {}) for n in SUITE] + [
    ("rmsnorm_matmul@16x1024", "rmsnorm_matmul", {"X": "16x1024", "W": "1024x1024"}, {}),
    ("lora@inputs4", "lora", {}, {"max_block_inputs": 4}),
]


class MemorySampler:
    """Peak of (RSS of this process + RSS of all its descendants), sampled in a thread.

    Summing RSS counts pages shared between processes more than once, so the figure is an
    upper bound on what the search really holds."""

    def __init__(self, interval_s: float = SAMPLE_S) -> None:
        self.proc = psutil.Process(os.getpid())
        self.interval_s = interval_s
        self.lock = threading.Lock()
        self.peak = self.peak_driver = 0
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def sample(self) -> tuple[int, int]:
        driver = self.proc.memory_info().rss
        total = driver
        for child in self.proc.children(recursive=True):
            try:
                total += child.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue  # a worker that exited between listing and reading
        return total, driver

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            total, driver = self.sample()
            with self.lock:
                self.peak = max(self.peak, total)
                self.peak_driver = max(self.peak_driver, driver)
            self.stop_event.wait(self.interval_s)

    def reset(self) -> tuple[float, float]:
        """The peaks (MB) since the last reset, and start a new window."""
        total, driver = self.sample()
        with self.lock:
            peak = max(self.peak, total) / 2**20
            peak_driver = max(self.peak_driver, driver) / 2**20
            self.peak, self.peak_driver = total, driver
        return peak, peak_driver

    def close(self) -> None:
        self.stop_event.set()
        self.thread.join()


def cpu_seconds(proc: psutil.Process) -> tuple[float, float]:
    """(busy CPU seconds of the whole machine, CPU seconds of ``proc`` and its descendants):
    the difference over a row is what other processes took from the search."""
    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    own = 0.0
    for p in (proc, *proc.children(recursive=True)):
        try:
            c = p.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        own += c.user + c.system
    return busy, own


def _driver_cpu(proc: psutil.Process) -> float:
    c = proc.cpu_times()
    return c.user + c.system


def _num_kernels(obj: dict) -> int:
    graph = from_obj(obj)
    return sum(op.kind not in ("input", "output") for op in graph.ops)


class TimedExecutor:
    """Passes shards through to an executor and notes when the driver first receives a
    verified single-kernel structure (search_program's own figure is per shard)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.workers = inner.workers
        self.start()
        # RayExecutor caches the put payload by id(payload); a later search's payload dict
        # may be allocated at a freed one's address and be taken for it.  Holding every
        # payload keeps ids unique for the life of this executor.
        self.payloads: dict[int, dict] = {}

    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.first_single_s: float | None = None
        self.log: list[tuple[str, str, float, int]] = []  # config, shard, elapsed s, verified

    def submit(self, shard, payload: dict) -> None:
        self.payloads.setdefault(id(payload), payload)
        self.inner.submit(shard, payload)

    def next_result(self):
        res = self.inner.next_result()
        if res is not None:
            self.log.append((res.config_id, res.shard_id, res.elapsed_s, len(res.verified)))
        if (res is not None and self.first_single_s is None
                and any(_num_kernels(obj) == 1 for obj in res.verified.values())):
            self.first_single_s = time.perf_counter() - self.t0
        return res

    def close(self) -> None:
        self.inner.close()


def work_profile(log: list[tuple[str, str, float, int]]) -> dict:
    """How parallel the search could be: total shard seconds, and the longest chain a
    configuration imposes (its op-count levels run one after another; a split level lasts as
    long as its slowest part).  Wall time is at least max(work / workers, chain)."""
    levels: dict[tuple[str, str], float] = {}
    for cid, sid, elapsed, _ in log:
        key = (cid, re.sub(r"\|op\d+$", "", sid))
        levels[key] = max(levels.get(key, 0.0), elapsed)
    chains: dict[str, float] = {}
    for (cid, _), elapsed in levels.items():
        chains[cid] = chains.get(cid, 0.0) + elapsed
    heavy = sorted(log, key=lambda x: -x[2])[:5]
    return {"work_s": sum(x[2] for x in log), "chain_s": max(chains.values(), default=0.0),
            "tasks": len(log), "configs": len(chains),
            "heaviest": [{"shard": sid, "elapsed_s": e} for _, sid, e, _ in heavy],
            "verifying_shards": {sid: n for _, sid, _, n in log if n}}


def run_row(label: str, name: str, overrides: dict, limit_kw: dict, executor: TimedExecutor,
            sampler: MemorySampler, time_limit_s: float | None) -> dict:
    program = load_program(name, overrides)
    limits = Limits(**limit_kw)
    sampler.reset()
    busy0, own0 = cpu_seconds(sampler.proc)
    driver0 = _driver_cpu(sampler.proc)
    executor.start()
    result = search_program(program, limits, executor=executor, time_limit_s=time_limit_s)
    wall = time.perf_counter() - executor.t0
    busy1, own1 = cpu_seconds(sampler.proc)
    peak_mb, driver_mb = sampler.reset()
    s = result.summary()
    best = s["best"] or {}
    return {
        "row": label, "program": name, "workers": executor.workers,
        "inputs": {k: list(v) for k, v in program.inputs.items()},
        "limits": dict(limit_kw),
        "states": s["states_explored"], "pruned": s["pruned"], "invalid": s["invalid"],
        "checked": s["checked"], "verified": s["verified"], "shards": s["shards"],
        "timed_out": s["timed_out"],
        "first_single_wall_s": executor.first_single_s,
        "first_single_shard_s": s["first_single_kernel_s"],
        "elapsed_s": wall, "search_elapsed_s": s["elapsed_s"],
        "best_kernels": best.get("num_kernels"), "best_graph_kernels":
            best.get("num_graph_kernels"), "best_block_ops": best.get("block_ops"),
        "best_symbols": best.get("symbols"), "best_hash": best.get("hash"),
        "best_graph": format_graph(result.verified[best["hash"]]) if best else None,
        "saturated": s["saturation"]["saturated"], "saturation": s["saturation"],
        "peak_mb": peak_mb, "peak_driver_mb": driver_mb,
        "search_cpu_s": own1 - own0,
        "other_load": max(0.0, (busy1 - busy0) - (own1 - own0)) / wall,
        "hashes": sorted(result.verified),
        "driver_cpu_s": _driver_cpu(sampler.proc) - driver0,
        **work_profile(executor.log),
        "leftover_tasks": len(getattr(executor.inner, "inflight", [])),
    }


def row_targets(row: dict) -> list[str]:
    """A timed-out search did not complete, whatever its elapsed time."""
    out = []
    done = not row["timed_out"]
    if row["row"] == "rmsnorm_matmul@16x1024":
        out.append(_verdict(done and row["elapsed_s"] <= RMSNORM_TARGET_S,
                            f"≤{RMSNORM_TARGET_S:g}s (Mirage {MIRAGE_S}s)"))
    elif row["row"] in SUITE:
        out.append(_verdict(done and row["elapsed_s"] <= SUITE_TARGET_S,
                            f"≤{SUITE_TARGET_S:g}s"))
    out.append(_verdict(row["peak_mb"] <= MEMORY_TARGET_MB, "≤2GB"))
    return out


def _verdict(ok: bool, what: str) -> str:
    return f"{'PASS' if ok else 'FAIL'} {what}"


def _fmt_s(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


HEADER = (f"{'row':<24}{'w':>2}{'states':>10}{'pruned':>11}{'verif':>6}{'1st 1k':>8}"
          f"{'(shard)':>8}{'total s':>9}{'best':>6}  {'symbols':<10}{'sat':>4}{'peak MB':>9}"
          f"{'other':>6}  targets")


def format_row(row: dict) -> str:
    best = "—" if row["best_kernels"] is None else f"{row['best_kernels']}k/{row['best_block_ops']}o"
    syms = ",".join(row["best_symbols"] or []) or "—"
    flag = " (timed out)" if row["timed_out"] else ""
    return (f"{row['row']:<24}{row['workers']:>2}{row['states']:>10,}{row['pruned']:>11,}"
            f"{row['verified']:>6}{_fmt_s(row['first_single_wall_s']):>8}"
            f"{_fmt_s(row['first_single_shard_s']):>8}{row['elapsed_s']:>9.2f}{best:>6}  "
            f"{syms:<10}{'yes' if row['saturated'] else 'NO':>4}{row['peak_mb']:>9.0f}"
            f"{row['other_load']:>6.2f}  "
            + "; ".join(row_targets(row)) + flag)


def speedup(rows: list[dict]) -> dict | None:
    """2-worker speedup on the program with the most states (at one worker)."""
    one = {r["row"]: r for r in rows if r["workers"] == 1}
    two = {r["row"]: r for r in rows if r["workers"] == 2}
    both = [k for k in one if k in two]
    if not both:
        return None
    largest = max(both, key=lambda k: one[k]["states"])
    ratio = one[largest]["elapsed_s"] / two[largest]["elapsed_s"]
    return {"row": largest, "states": one[largest]["states"],
            "one_s": one[largest]["elapsed_s"], "two_s": two[largest]["elapsed_s"],
            "speedup": ratio, "pass": ratio >= SPEEDUP_TARGET,
            "work_s": {w: r[largest]["work_s"] for w, r in ((1, one), (2, two))},
            "chain_s": {w: r[largest]["chain_s"] for w, r in ((1, one), (2, two))},
            "tasks": {w: r[largest]["tasks"] for w, r in ((1, one), (2, two))},
            "driver_cpu_s": {w: r[largest]["driver_cpu_s"] for w, r in ((1, one), (2, two))}}


def same_sets(rows: list[dict]) -> list[str]:
    """Rows whose verified hash set differs between worker counts (should be none)."""
    by_row: dict[str, set] = {}
    bad = []
    for r in rows:
        key = frozenset(r["hashes"])
        if r["row"] in by_row and by_row[r["row"]] != key:
            bad.append(r["row"])
        by_row.setdefault(r["row"], key)
    return bad


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    labels = [r[0] for r in ROWS]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--programs", help="comma-separated rows (default: all): " + ",".join(labels))
    p.add_argument("--workers", default="1,2", help="comma-separated Ray worker counts")
    p.add_argument("--time-limit", type=float, metavar="S", help="per-search time limit")
    p.add_argument("--json", metavar="FILE", help="also write every row as JSON")
    args = p.parse_args(argv)
    wanted = [x.strip() for x in (args.programs or ",".join(labels)).split(",") if x.strip()]
    unknown = [w for w in wanted if w not in labels]
    if unknown:
        p.error(f"--programs: unknown row(s) {', '.join(unknown)}; known: {', '.join(labels)}")
    args.rows = [r for r in ROWS if r[0] in wanted]
    try:
        args.worker_counts = [int(x) for x in args.workers.split(",") if x.strip()]
    except ValueError:
        p.error(f"--workers {args.workers!r}: write counts like 1,2")
    if not args.worker_counts or min(args.worker_counts) < 1:
        p.error("--workers: every count must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(f"search benchmark, {time.strftime('%Y-%m-%d %H:%M')}, {platform.node()}: "
          f"{os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB, "
          f"python {platform.python_version()}", flush=True)
    sampler = MemorySampler()
    rows: list[dict] = []
    startup: dict[int, dict] = {}
    try:
        for n in args.worker_counts:
            t = time.perf_counter()
            executor = TimedExecutor(RayExecutor(n))
            startup[n] = {"start_s": time.perf_counter() - t,
                          "idle_mb": sampler.sample()[0] / 2**20}
            print(f"\n== {n} Ray worker(s): Ray start-up {startup[n]['start_s']:.2f} s, "
                  f"{startup[n]['idle_mb']:.0f} MB (driver + Ray) before the first search",
                  flush=True)
            print(HEADER, flush=True)
            try:
                for label, name, overrides, limit_kw in args.rows:
                    row = run_row(label, name, overrides, limit_kw, executor, sampler,
                                  args.time_limit)
                    row["targets"] = row_targets(row)
                    rows.append(row)
                    print(format_row(row), flush=True)
                    if row["leftover_tasks"]:
                        print(f"  warning: {row['leftover_tasks']} task(s) still in flight "
                              "after the search; later rows may see their results", flush=True)
            finally:
                executor.close()
    finally:
        sampler.close()
    print("\n1st 1k: wall s until the driver received the first verified single-kernel "
          "structure; (shard): the fastest verifying shard's own elapsed s; best: kernels/"
          "block ops; sat: target e-graph saturated; peak MB: driver + Ray processes; other: "
          "cores busy with processes outside the search during the row")
    sp = speedup(rows)
    if sp:
        print(f"2 workers vs 1 on {sp['row']} ({sp['states']:,} states): {sp['one_s']:.1f} s"
              f" -> {sp['two_s']:.1f} s = {sp['speedup']:.2f}x  "
              + _verdict(sp["pass"], f"≥{SPEEDUP_TARGET}x"))
        for w in (1, 2):
            print(f"  {w} worker(s): {sp['tasks'][w]} tasks, {sp['work_s'][w]:.1f} s of shard "
                  f"work, longest configuration chain {sp['chain_s'][w]:.1f} s, driver CPU "
                  f"{sp['driver_cpu_s'][w]:.1f} s; wall ≥ max(work/{w}, chain) = "
                  f"{max(sp['work_s'][w] / w, sp['chain_s'][w]):.1f} s")
    differ = same_sets(rows)
    if len(args.worker_counts) > 1:
        print("verified sets equal across worker counts: "
              + ("yes" if not differ else f"NO ({', '.join(differ)})"))
    failed = [f"{r['row']} w{r['workers']}: {t}" for r in rows for t in r["targets"]
              if t.startswith("FAIL")]
    if sp and not sp["pass"]:
        failed.append(f"speedup {sp['speedup']:.2f}x < {SPEEDUP_TARGET}x on {sp['row']}")
    print("targets: " + ("all PASS" if not failed else "FAIL: " + "; ".join(failed)))
    if args.json:
        doc = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(),
               "ray_startup": startup, "rows": rows, "speedup": sp,
               "differing_sets": differ, "failed": failed}
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
