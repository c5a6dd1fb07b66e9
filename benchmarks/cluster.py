"""Ray overheads on 1, 2 and 4 nodes of ``ray.cluster_utils`` on this machine, and a model of
N-node scaling built from them and from measured per-shard and per-trial costs.

    .venv/bin/python benchmarks/cluster.py [--nodes 1,2,4] [--tasks 200] [--calls 200]
                                           [--program rmsnorm_matmul] [--gpu-trial-s 2.0]
                                           [--json FILE]

MEASURED (this machine; all nodes share its cores, so this is overhead, never speedup):
  * task overhead: a no-op Ray task, submitted ``--tasks`` at once (throughput, ms/task) and one
    at a time (round trip);
  * actor overhead: start of one measurement-slot-like actor per GPU (each node declares one
    GPU), and the round trip of a no-op call;
  * slot overhead: a replay trial through ``cluster.SlotPool`` (the replay device answers from
    its table at once, so the time is the pool's own);
  * per-shard cost: the shard times of one search of ``--program`` (quickstart shapes) in
    this process (``ShardResult.elapsed_s``), and the per-trial cost of the replay path.
MODELLED (no cluster of GPU nodes here): the suite's job on N nodes of C CPUs and one GPU each:
  search  = max(sum(shards) / (N*C) + shards * task_overhead / (N*C), longest shard)
  tuning  = trials * (gpu_trial_s + slot_overhead) / N      (one slot per GPU)
  the longest shard is the straggler bound (shards are split to keep workers busy, but one
  shard cannot be split below its own time); ``--gpu-trial-s`` (default 2 s: nvcc compile +
  check + timing of one candidate) is an ASSUMPTION, not measured here: no GPU on this machine.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from cluster import LocalExecutor, SlotPool, TrialRequest, search_program  # noqa: E402
from kernels import ReplayDevice, get_spec  # noqa: E402
from kernels.machine import cpu_model  # noqa: E402
from search.ir.suite import load_program  # noqa: E402

STUDIES, TRIALS = 8 * 3, 30  # the suite's studies (programs x structures tuned), trials each
SUITE_TRIALS = STUDIES * TRIALS
SUITE_SHARD_FACTOR = 8  # the suite's search work relative to the measured program (assumed)


@ray.remote(num_cpus=1)
def _noop(x: int) -> int:
    return x


@ray.remote(num_cpus=0, num_gpus=1)
class _Echo:
    def ping(self) -> int:
        return 1


def overheads(n: int, tasks: int, calls: int) -> dict:
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(n):
        c.add_node(num_cpus=1, num_gpus=1)
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    try:
        ray.get([_noop.remote(i) for i in range(2 * n)])  # warm the workers
        t = time.perf_counter()
        ray.get([_noop.remote(i) for i in range(tasks)])
        burst = (time.perf_counter() - t) / tasks
        rt = []
        for i in range(min(50, tasks)):
            t = time.perf_counter()
            ray.get(_noop.remote(i))
            rt.append(time.perf_counter() - t)
        t = time.perf_counter()
        actors = [_Echo.remote() for _ in range(n)]
        ray.get([a.ping.remote() for a in actors])
        start = time.perf_counter() - t
        calls_s = []
        for _ in range(calls):
            t = time.perf_counter()
            ray.get(actors[0].ping.remote())
            calls_s.append(time.perf_counter() - t)
        for a in actors:
            ray.kill(a)
        table = {str(i): {"status": "ok", "median_s": 1e-3, "samples": [1e-3],
                          "source": "// replay"} for i in range(64)}
        dev = ReplayDevice(table, lambda cfg: str(cfg["i"]), "replay:bench", get_spec("A100"))
        pool = SlotPool(dev, n)
        reqs = [TrialRequest({}, {}, {"i": i % 64}, tag=i) for i in range(calls)]
        t = time.perf_counter()
        sent = done = 0
        while done < len(reqs):
            while pool.idle and sent < len(reqs):
                pool.submit("trial", reqs[sent])
                sent += 1
            pool.next_done()
            done += 1
        slot_s = (time.perf_counter() - t) / len(reqs)
        placed = len({node for _, node in pool.placement()})
        pool.close()
        return {"nodes": n, "task_burst_ms": burst * 1e3,
                "task_roundtrip_ms": statistics.median(rt) * 1e3,
                "actor_start_s": start, "actor_call_ms": statistics.median(calls_s) * 1e3,
                "slot_trial_ms": slot_s * 1e3, "slot_nodes": placed}
    finally:
        ray.shutdown()
        c.shutdown()


def shard_costs(program: str) -> dict:
    p = load_program(program, {"X": "16x256", "W": "256x256"}) if program == "rmsnorm_matmul" \
        else load_program(program)
    times: list[float] = []
    ex = LocalExecutor()
    task = ex.task

    def timed(payload: dict, shard):  # noqa: ANN001, ANN202
        res = task(payload, shard)
        times.append(res.elapsed_s)
        return res

    ex.task = timed
    t = time.perf_counter()
    result = search_program(p, executor=ex)
    wall = time.perf_counter() - t
    return {"program": program, "shards": len(times), "sum_s": sum(times),
            "max_s": max(times), "median_s": statistics.median(times), "wall_s": wall,
            "verified": len(result.verified)}


def model(n: int, cpus: int, shards: dict, task_ms: float, slot_ms: float,
          gpu_trial_s: float, concurrent: bool = False) -> float:
    """Seconds of the suite's job on ``n`` nodes (``cpus`` CPUs and one GPU each).

    As driven today a device's studies run one after another, each keeping at most
    ``min(slots, trials)`` trials in flight: ``STUDIES * ceil(TRIALS / min(n, TRIALS))``
    rounds.  ``concurrent``: every study at once (not built), all trials spread over all GPUs.
    """
    work = shards["sum_s"] * SUITE_SHARD_FACTOR
    count = shards["shards"] * SUITE_SHARD_FACTOR
    search = max(work / (n * cpus) + count * task_ms / 1e3 / (n * cpus), shards["max_s"])
    per_trial = gpu_trial_s + slot_ms / 1e3
    if concurrent:
        tuning = math.ceil(SUITE_TRIALS / n) * per_trial
    else:
        tuning = STUDIES * math.ceil(TRIALS / min(n, TRIALS)) * per_trial
    return search + tuning


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", default="1,2,4")
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--program", default="rmsnorm_matmul")
    ap.add_argument("--gpu-trial-s", type=float, default=2.0)
    ap.add_argument("--cpus-per-node", type=int, default=16)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = [overheads(int(n), args.tasks, args.calls) for n in args.nodes.split(",")]
    shards = shard_costs(args.program)
    print(f"MEASURED on {cpu_model()} ({platform.node()}), nodes of ray.cluster_utils, "
          "one CPU and one (declared) GPU each, all on this machine's cores:")
    print("nodes  task burst ms  task round trip ms  actor start s  actor call ms  "
          "replay trial via SlotPool ms  slot nodes")
    for r in rows:
        print(f"{r['nodes']:>5}  {r['task_burst_ms']:>13.2f}  {r['task_roundtrip_ms']:>18.2f}  "
              f"{r['actor_start_s']:>13.2f}  {r['actor_call_ms']:>13.2f}  "
              f"{r['slot_trial_ms']:>28.2f}  {r['slot_nodes']:>10}")
    print(f"search of {shards['program']} (quickstart shapes) in one process: "
          f"{shards['shards']} shards, sum {shards['sum_s']:.2f} s, median "
          f"{shards['median_s'] * 1e3:.1f} ms, longest {shards['max_s']:.2f} s, "
          f"{shards['verified']} verified")
    task_ms = max(r["task_burst_ms"] for r in rows)
    slot_ms = max(r["slot_trial_ms"] for r in rows)
    base = model(1, args.cpus_per_node, shards, task_ms, slot_ms, args.gpu_trial_s)
    print(f"\nMODELLED suite job ({SUITE_TRIALS} trials; search work = {SUITE_SHARD_FACTOR}x "
          f"the measured program's shards; ASSUMED {args.gpu_trial_s:g} s per GPU trial; "
          f"{args.cpus_per_node} CPUs and 1 GPU per node; worst measured overheads "
          f"{task_ms:.2f} ms/task, {slot_ms:.2f} ms/trial):")
    print("nodes  modelled s (today: one study at a time)  speedup  "
          "modelled s (studies concurrent, not built)  speedup")
    out = []
    for n in (1, 2, 4, 8, 16, 64):
        t = model(n, args.cpus_per_node, shards, task_ms, slot_ms, args.gpu_trial_s)
        tc = model(n, args.cpus_per_node, shards, task_ms, slot_ms, args.gpu_trial_s, True)
        out.append({"nodes": n, "seconds": t, "speedup": base / t,
                    "concurrent_seconds": tc, "concurrent_speedup": base / tc})
        print(f"{n:>5}  {t:>41.1f}  {base / t:>6.1f}x  {tc:>42.1f}  {base / tc:>6.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"measured": rows, "shards": shards,
                                               "modelled": out,
                                               "assumed_gpu_trial_s": args.gpu_trial_s},
                                              indent=2))


if __name__ == "__main__":
    main()
