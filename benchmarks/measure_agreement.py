"""The fast measurement path against the launch's, interleaved on the same configs: do the
timings agree, and how many measurements an hour does each give?

    .venv/bin/python benchmarks/measure_agreement.py [--programs 6] [--seed 0] [--configs 16]
        [--structures 2] [--search-seconds 5] [--json]

For random programs drawn as ``benchmarks/dataset.py`` draws them, the best ``--structures``
structures by the roofline and ``--configs`` configs of each (the dataset's sampling), each
structure is measured by both paths, alternately first, each from a cold compiler cache and
into a database of its own:

- ``old``: ``Device.run_trial`` per config, and the launch's three writes per trial;
- ``new``: ``Device.run_trials`` (one translation unit per compiler call, parallel compilers,
  one worker job per library) and ``db.record_trials`` (one transaction per batch).

Then every config is timed once more by the old path (its library cached: only the timing), so
each kernel has ``old``, ``new`` and ``old again`` medians.  Agreement: the distribution of
new / old against old again / old, the same kernel timed twice by the same path, which is the
noise of this machine.  Throughput: ok measurements per hour of wall time of each path, and
their ratio, measured in one run on the same configs (on a machine shared with other work the
rates are lower than on a quiet one; the ratio is the fair figure).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import db  # noqa: E402
from kernels import config_space, rank_structures  # noqa: E402
from kernels.devices import CpuDevice, IsolatedWorker  # noqa: E402
from search import to_obj  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from dataset import sample_configs  # noqa: E402
from measure_profile import cold_cache, cpu_model, structures_of  # noqa: E402


def old_path(device, worker, database, sid, structure, reference, configs) -> list[dict]:
    out = []
    for config in configs:
        r = device.run_trial(structure, reference, config, worker=worker)
        if r["status"] in db.MEASUREMENT_STATUSES:
            tid = database.record_trial(sid, device.key, r["config"], "old", None)
            ok = r["status"] == "ok"
            mid = database.record_measurement(
                tid, r["status"], median_s=r.get("median_s") if ok else None,
                spread_s=r.get("spread_s") if ok else None,
                samples=r.get("samples") if ok else None, max_error=r.get("max_error"),
                message=r.get("message") or None)
            if ok:
                database.update_best(mid, r["source"], None)
        out.append(r)
    return out


def new_path(device, worker, database, sid, structure, reference, configs) -> list[dict]:
    results = device.run_trials(structure, reference, configs, worker=worker)
    ids = db.record_trials(database, sid, device.key, results, study_name="new")
    ok = [(r["median_s"], i) for r, i in zip(results, ids, strict=True)
          if r["status"] == "ok" and i >= 0]
    if ok:
        database.update_best(min(ok)[1], results[ids.index(min(ok)[1])]["source"], None)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--programs", type=int, default=6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", type=int, default=16)
    p.add_argument("--structures", type=int, default=2)
    p.add_argument("--search-seconds", type=float, default=5.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="measure-agreement-"))
    device = CpuDevice()
    dbs = {k: db.connect(f"sqlite:///{tmp / f'{k}.db'}") for k in ("old", "new")}
    wall = {"old": 0.0, "new": 0.0}
    ok = {"old": 0, "new": 0}
    pairs = []  # (old, new, old again) medians of one kernel
    turn = 0
    with IsolatedWorker() as worker:
        for seed in range(args.seed, args.seed + args.programs):
            program, reference, graphs, _ = structures_of(seed, args.search_seconds)
            for k in rank_structures(graphs, device.spec)[:args.structures]:
                graph = graphs[k]
                configs = sample_configs(config_space(graph, device.spec), args.configs, seed)
                got = {}
                for path in (("old", "new") if turn % 2 == 0 else ("new", "old")):
                    database = dbs[path]
                    pid = database.record_program(f"p{seed}", {}, "float32", program.name,
                                                  to_obj(reference))
                    sid = database.record_structure(pid, f"s{seed}-{k}", to_obj(graph), {}, 1)
                    cold_cache(tmp / f"cache-{path}-{turn}")
                    t0 = time.perf_counter()
                    run = old_path if path == "old" else new_path
                    got[path] = run(device, worker, database, sid, graph, reference, configs)
                    wall[path] += time.perf_counter() - t0
                    ok[path] += sum(r["status"] == "ok" for r in got[path])
                cold_cache(tmp / f"cache-old-{turn}")  # the old path's libraries: cached
                again = [device.run_trial(graph, reference, c, worker=worker) for c in configs]
                for o, n, a in zip(got["old"], got["new"], again, strict=True):
                    if o["status"] == n["status"] == a["status"] == "ok":
                        pairs.append((o["median_s"], n["median_s"], a["median_s"]))
                turn += 1
                print(f"[{sum(wall.values()) / 60:4.1f} min] {program.name} structure {k}: "
                      f"{len(configs)} configs; old {ok['old']} ok in {wall['old']:.0f} s, "
                      f"new {ok['new']} ok in {wall['new']:.0f} s", file=sys.stderr, flush=True)
    out = summarize(pairs, wall, ok)
    out["cpu"] = cpu_model()
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{out['cpu']}: {out['kernels']} kernels timed by both paths")
    print(f"new / old median ratio: median {out['new_old']['median']:.3f}, IQR "
          f"{out['new_old']['q1']:.3f}-{out['new_old']['q3']:.3f}, within 10%: "
          f"{out['new_old']['within_10pct']:.0%}")
    print(f"old again / old (the noise): median {out['again_old']['median']:.3f}, IQR "
          f"{out['again_old']['q1']:.3f}-{out['again_old']['q3']:.3f}, within 10%: "
          f"{out['again_old']['within_10pct']:.0%}")
    print(f"throughput: old {out['per_hour']['old']:,.0f} ok/h, new "
          f"{out['per_hour']['new']:,.0f} ok/h: {out['speedup']:.1f}x (same configs, "
          "interleaved)")
    return 0


def summarize(pairs: list[tuple[float, float, float]], wall: dict, ok: dict) -> dict:
    def dist(ratios: list[float]) -> dict:
        if len(ratios) < 2:
            return {"median": float("nan"), "q1": float("nan"), "q3": float("nan"),
                    "within_10pct": 0.0}
        q = statistics.quantiles(ratios, n=4)
        return {"median": statistics.median(ratios), "q1": q[0], "q3": q[2],
                "within_10pct": sum(abs(r - 1) <= 0.1 for r in ratios) / len(ratios)}

    per_hour = {k: ok[k] / wall[k] * 3600 if wall[k] else 0.0 for k in wall}
    return {"kernels": len(pairs), "new_old": dist([n / o for o, n, _ in pairs]),
            "again_old": dist([a / o for o, _, a in pairs]), "per_hour": per_hour,
            "wall_s": wall, "ok": ok,
            "speedup": per_hour["new"] / per_hour["old"] if per_hour["old"] else float("nan")}


if __name__ == "__main__":
    sys.exit(main())
