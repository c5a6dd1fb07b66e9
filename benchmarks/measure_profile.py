"""Where a CPU trial's time goes: a per-phase breakdown of the random-program dataset's trials.

    .venv/bin/python benchmarks/measure_profile.py [--programs 4] [--seed 0] [--configs 8]
        [--search-seconds 5] [--json]

For programs ``search.random_program(seed + i)`` (as ``benchmarks/dataset.py`` draws them),
the search runs in this process (``--search-seconds``), the best structures by the roofline are
taken, and up to ``--configs`` configs of each are measured two ways, each phase timed on its
own:

- ``one-by-one`` (the launch's path, ``Device.run_trial``): lowering, the finite-field check,
  rendering, the float reference, the compiler (cold: a fresh cache), the isolated worker's job
  (arrays to /dev/shm, dlopen, the numeric check, the timing loop), the three database writes.
- ``batched`` (``kernels.devices.measure_batch``): the same configs rendered into one
  translation unit, compiled by one compiler call, checked and timed by one worker job, and
  written in one transaction.

The compiler's fixed cost (``g++`` on an empty file, and on the kernels' shared prelude,
with the kernels' flags) is printed first.  Figures are wall seconds on this machine; on a machine shared with other work they
are slower than on a quiet one, but the two paths run interleaved on the same configs, so
their ratio is fair.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import db  # noqa: E402
from cluster.runtime import LocalExecutor  # noqa: E402
from kernels import config_space, rank_structures  # noqa: E402
from kernels.devices import CpuDevice, IsolatedWorker, cpp_flags, field_check  # noqa: E402
from kernels.devices._base import TRIAL_TIMING  # noqa: E402
from kernels.devices._batch import MARKER  # noqa: E402
from kernels.devices._check import expected, random_inputs  # noqa: E402
from kernels.devices._compile import compile_cpp  # noqa: E402
from kernels.devices._isolate import run_isolated  # noqa: E402
from kernels.lowering import concretize  # noqa: E402
from search import random_program, run_search, to_obj  # noqa: E402
from verifier import well_conditioned  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from dataset import sample_configs  # noqa: E402

PHASES = ("lower", "field_check", "render", "reference", "compile", "worker_io", "check",
          "timing", "database")


def cold_cache(path: Path) -> None:
    """Compile into an empty cache at ``path`` from now on (TUNER_CACHE_DIR), keeping the
    machine's measured facts (its copy bandwidth: measured again, under load, it would change
    the cpu's spec and cost seconds)."""
    import shutil

    from kernels.machine import cache_root

    facts = [f for f in cache_root().glob("*.json")]
    path.mkdir(parents=True, exist_ok=True)
    for f in facts:
        if not (path / f.name).exists():
            shutil.copy(f, path / f.name)
    os.environ["TUNER_CACHE_DIR"] = str(path)


def structures_of(seed: int, search_s: float) -> tuple:
    """(program, reference graph, structures by the roofline, search seconds)."""
    program = random_program(seed, accept=lambda p: well_conditioned(p.build()))
    t0 = time.perf_counter()
    result = run_search(program, None, LocalExecutor(), time_limit_s=search_s)
    spent = time.perf_counter() - t0
    reference = program.build()
    graphs = [result.verified[s["hash"]] for s in result.structures] or [reference]
    return program, reference, graphs, spent


def one_by_one(device: CpuDevice, worker: IsolatedWorker, database: db.Database, sid: int,
               structure, reference, config: dict, phases: dict) -> str:
    """``Device.run_trial``'s steps, each timed; returns the status."""
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        phases[name] += now - t
        t = now

    try:
        bound, _, _ = concretize(structure, config, device.spec)
        plan = device.lower(structure, config, "trial")
    except ValueError:  # ShapeError too: the config does not lower, nothing is measured
        lap("lower")
        return "invalid"
    lap("lower")
    why = field_check(reference, bound)
    lap("field_check")
    if why:
        return "wrong_result"
    source = device.render(plan)
    lap("render")
    xs = device.stored(plan, random_inputs(reference, 0))
    want = expected(reference, xs, device.compute_dtype(plan))
    lap("reference")
    lib = compile_cpp(source)
    lap("compile")
    job = {"library": str(lib), "inputs": xs, "outputs": [tuple(b.shape) for b in plan.outputs],
           "timing": dict(TRIAL_TIMING), "env": device.worker_env(),
           "expected": want.outputs, "slack": want.slack, "rtol": want.rtol, "atol": want.atol}
    res = run_isolated(job, 60.0, worker)
    now = time.perf_counter()
    tm = res.payload.get("timing") or {}
    first = res.payload.get("first_call_s", 0.0)
    phases["timing"] += tm.get("total_s", 0.0)
    phases["check"] += first
    phases["worker_io"] += now - t - tm.get("total_s", 0.0) - first
    t = now
    if res.ok:
        tid = database.record_trial(sid, device.key, config, "profile", None)
        mid = database.record_measurement(tid, "ok", median_s=tm["median_s"],
                                          spread_s=tm["iqr_s"], samples=tm["samples_s"],
                                          max_error=max(res.payload.get("max_abs_err") or [0]))
        database.update_best(mid, source, None)
        lap("database")
    return res.status


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--programs", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", type=int, default=8, help="configs per structure")
    p.add_argument("--structures", type=int, default=3)
    p.add_argument("--search-seconds", type=float, default=5.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="measure-profile-"))
    cold_cache(tmp / "cache")  # every compile is cold
    device = CpuDevice()
    database = db.connect(f"sqlite:///{tmp / 'profile.db'}")
    t0 = time.perf_counter()
    for i in range(3):
        compile_cpp(f'extern "C" void kernel{i}(float** a, float** b) {{}}\n')
    compiler_start = (time.perf_counter() - t0) / 3

    phases: dict[str, float] = defaultdict(float)
    statuses: dict[str, int] = defaultdict(int)
    batched: dict[str, float] = defaultdict(float)
    walls: dict[str, float] = defaultdict(float)
    batched_ok = 0
    prelude_s: float | None = None
    search_s = 0.0
    trials = 0
    with IsolatedWorker() as worker:
        for seed in range(args.seed, args.seed + args.programs):
            program, reference, graphs, spent = structures_of(seed, args.search_seconds)
            search_s += spent
            pid = database.record_program(f"p{seed}", {}, "float32", program.name,
                                          to_obj(reference))
            for k in rank_structures(graphs, device.spec)[:args.structures]:
                graph = graphs[k]
                sid = database.record_structure(pid, f"s{seed}-{k}", to_obj(graph), {}, 1)
                space = config_space(graph, device.spec)
                configs = sample_configs(space, args.configs, seed)
                if prelude_s is None:  # the compiler on the shared prelude alone
                    src = device.render(device.lower(graph, space.default, "trial"))
                    t0 = time.perf_counter()
                    compile_cpp(src.split(MARKER, 1)[0] + "\n")
                    prelude_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                for config in configs:
                    statuses[one_by_one(device, worker, database, sid, graph, reference,
                                        config, phases)] += 1
                    trials += 1
                walls["one-by-one"] += time.perf_counter() - t0
                cold_cache(tmp / f"cache-batch-{seed}-{k}")
                t0 = time.perf_counter()
                results = device.run_trials(graph, reference, configs, worker=worker)
                t1 = time.perf_counter()
                ids = db.record_trials(database, sid, device.key,
                                       [{**r, "config": {**r["config"], "batch": 1}}
                                        for r in results])
                batched["database"] += time.perf_counter() - t1
                for name, sec in results[0]["phases"].items():
                    batched[name[:-2]] += sec * len(results)
                batched_ok += sum(r["status"] == "ok" for r in results)
                walls["batched"] += time.perf_counter() - t0
                cold_cache(tmp / "cache")
                assert len(ids) == len(results)
    wall = walls["one-by-one"]
    out = {"cpu": cpu_model(), "flags": " ".join(cpp_flags()), "compiler_start_s": compiler_start,
           "compiler_prelude_s": prelude_s,
           "trials": trials, "statuses": dict(statuses), "search_s": search_s,
           "per_trial_s": {k: phases[k] / max(1, trials) for k in PHASES},
           "trial_wall_s": wall / max(1, trials),
           "batched_per_trial_s": {k: v / max(1, trials) for k, v in batched.items()},
           "batched_wall_s": walls["batched"] / max(1, trials),
           "one_by_one_wall_s": walls["one-by-one"] / max(1, trials),
           "ok": {"one-by-one": statuses["ok"], "batched": batched_ok}}
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{out['cpu']}, flags {out['flags']}")
    print(f"compiler fixed cost: {compiler_start * 1e3:.0f} ms on an empty file, "
          f"{(prelude_s or 0) * 1e3:.0f} ms on the kernels' shared prelude")
    print(f"{trials} trials {dict(statuses)}; search {search_s:.1f} s for "
          f"{args.programs} programs")
    print(f"one by one (the launch's path): {out['one_by_one_wall_s'] * 1e3:.0f} ms a trial")
    for k in PHASES:
        print(f"  {k:12s} {out['per_trial_s'][k] * 1e3:8.1f} ms")
    print(f"batched (run_trials + record_trials): {out['batched_wall_s'] * 1e3:.0f} ms a trial "
          f"({out['one_by_one_wall_s'] / max(out['batched_wall_s'], 1e-9):.1f}x)")
    for k, v in out["batched_per_trial_s"].items():
        print(f"  {k:12s} {v * 1e3:8.1f} ms")
    return 0


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
