"""Measure many configs of each program's best structures on one device, to a JSON-lines file.

    .venv/bin/python benchmarks/sweep.py --device cuda --structures DIR --out sweep.jsonl
        [--only NAME ...] [--top 3] [--with-handwritten] [--seconds 30] [--seed 0]
        [--configs FILE ...]

For every program of the suite (and softmax_rows, rmsnorm_residual) at its default shapes, the
candidates are the search's verified structures in ``DIR/<program>.json`` (a ``tuner search
--out`` file), the hand-written structure and the program as written (a kernel per op); the
``--top`` best of them by the roofline estimate of the AStitch default on this device are swept.
Each is measured as the tuner's trials are (``kernels.trial.run_trial``: built, checked against
the program's float reference, timed in the isolated worker): the AStitch default first, then
its one-parameter moves to the ends of each range, then configs drawn at random from the
structure's space, until the program's ``--seconds`` are spent.  The op-by-op baseline
(numpy on a cpu, CuPy on a GPU) is measured once per program with the default structure.

Why: the tuner measures a few configs per study; this measures enough of each space to say
how far the default and a tuned config are from the best one, and the file is a table of real
timings (with every structure's µGraph in it) that a replay device and the cost model can be
trained and checked on, on a machine without that device.

Records (one JSON object per line, ``kind`` first): ``meta`` (device key, spec, host, git
commit, time), ``structure`` (program, shapes, dtype, hash, where from, the µGraph),
``baseline`` (program, the fused default vs op-by-op figures), ``trial`` (program, structure
hash, config, status, median_s, spread_s, samples, max_error, kernels, the roofline estimate,
message).  A summary table per program goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ("rmsnorm_matmul", "gated_mlp", "lora", "gqa", "qknorm_gqa", "mha", "mqa", "ntrans",
            "softmax_rows", "rmsnorm_residual")


def candidates(name: str, program, structures: Path | None, device, top: int,
               with_hand: bool = False) -> list[tuple]:
    """[(graph, hash, where from)] best first by the roofline estimate on ``device`` (and the
    hand-written structure after them, ``with_hand``)."""
    from kernels import rank_structures
    from search import handwritten, structural_hash
    from tuner.api import read_structures

    found: list[tuple] = []
    path = structures / f"{name}.json" if structures else None
    if path and path.is_file():
        for entry in read_structures(str(path)):
            g = entry.graph
            if [tuple(g.tensors[t].shape) for t in g.input_ids] == \
                    [tuple(s) for s in program.inputs.values()]:
                found.append((g, entry.hash, "search"))
    hand = handwritten(program)
    ref = program.build()
    found += [(hand, structural_hash(hand), "hand-written"),
              (ref, structural_hash(ref), "reference (kernel per op)")]
    seen, unique = set(), []
    for g, h, where in found:
        if h not in seen:
            seen.add(h)
            unique.append((g, h, where))
    order = rank_structures([g for g, _, _ in unique], device)
    chosen = [unique[i] for i in order[:top]]
    if with_hand and not any(where == "hand-written" for _, _, where in chosen):
        chosen += [c for c in unique if c[2] == "hand-written"]
    return chosen


def configs(space, rng: random.Random, first: list[dict] | None = None):
    """``first`` (where legal in ``space``; knobs they leave unset as the first warm start
    sets them), the warm start (``tuner.pipeline.tune.warm_start``: the defaults and their
    one-parameter moves to the ends), then random legal configs; each kernel once
    (``ConfigSpace.canonical``: a Triton config's lanes and smem_kb build the same kernel)."""
    from tuner.pipeline.tune import warm_start

    seen, start = [], list(warm_start(space))
    firsts = [{**(start[0] if start else {}), **c} for c in first or []]
    for config in [*[c for c in firsts if space.check(c) is None], *start]:
        config = space.canonical(config)
        if config in seen:
            continue
        seen.append(config)
        yield config
    if not space.params:
        return
    misses = 0
    while misses < 200:
        config = space.canonical({n: rng.choice(c) for n, c in space.params.items()})
        if config in seen or space.check(config) is not None:
            misses += 1
            continue
        misses = 0
        seen.append(config)
        yield config


def read_configs(paths: list[str]) -> dict[str, list[dict]]:
    """program -> configs, from JSON lists of {"program", "config"} (``--configs``);
    ValueError naming the file and what is wrong with it."""
    given: dict[str, list[dict]] = {}
    for path in paths:
        try:
            rows = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: {err}") from None
        if not isinstance(rows, list):
            raise ValueError(f"{path}: a JSON list of {{program, config}} objects expected")
        for i, row in enumerate(rows):
            if not (isinstance(row, dict) and isinstance(row.get("program"), str)
                    and isinstance(row.get("config"), dict)):
                raise ValueError(f"{path}: entry {i} is not {{\"program\": ..., \"config\": "
                                 "{...}} (benchmarks/weight_streams.py --json writes them)")
            given.setdefault(row["program"], []).append(row["config"])
    return given


def sweep(args: argparse.Namespace, out) -> None:
    from kernels import IsolatedWorker, config_space, estimate, get_device
    from search import load_program, to_obj
    from tuner.pipeline.tune import warm_start

    device = get_device(args.device)
    spec, key = device.spec, device.key
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=ROOT).stdout.strip()

    def emit(record: dict) -> None:
        out.write(json.dumps(record, default=str) + "\n")
        out.flush()

    emit({"kind": "meta", "device_key": key, "spec": spec.__dict__, "host": socket.gethostname(),
          "commit": commit, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())})
    rng = random.Random(args.seed)
    given = args.given
    with IsolatedWorker() as worker:
        for name in args.only or PROGRAMS:
            program = load_program(name)
            ref = program.build()
            shapes = {n: list(s) for n, s in program.inputs.items()}
            base = measure_baseline(device, program, worker)
            emit({"kind": "baseline", "program": name, "shapes": shapes, **base})
            cands = candidates(name, program, args.structures and Path(args.structures),
                               spec, args.top, args.with_handwritten)
            deadline = time.perf_counter() + args.seconds
            per = args.seconds / len(cands)
            best: dict[str, float] = {}
            counts: dict[str, int] = {}
            for i, (g, h, where) in enumerate(cands):
                emit({"kind": "structure", "program": name, "shapes": shapes,
                      "dtype": program.dtype, "hash": h, "from": where, "rank": i,
                      "graph": to_obj(g)})
                space = config_space(g, spec)
                default = space.canonical(next(iter(warm_start(space)), {}))
                stop = min(deadline, time.perf_counter() + per * (1.5 if i == 0 else 1.0))
                for config in configs(space, rng, given.get(name)):
                    if time.perf_counter() > stop:
                        break
                    try:
                        est = estimate(g, config, spec)
                    except ValueError as err:  # illegal (e.g. Triton tiles over shared memory)
                        emit({"kind": "trial", "program": name, "structure": h, "from": where,
                              "default": config == default, "config": config, "status": "invalid",
                              "message": str(err)[:500]})
                        counts["invalid"] = counts.get("invalid", 0) + 1
                        continue
                    res = device.run_trial(g, ref, config, worker=worker)
                    emit({"kind": "trial", "program": name, "structure": h, "from": where,
                          "default": config == default, "config": config,
                          "status": res["status"], "median_s": res.get("median_s"),
                          "spread_s": res.get("spread_s"), "samples": res.get("samples"),
                          "max_error": res.get("max_error"), "kernels": res.get("kernels"),
                          "estimate_s": est.seconds, "bytes": est.bytes_moved,
                          "flops": est.flops, "message": (res.get("message") or "")[:500],
                          "wall_s": res.get("wall_s")})
                    counts[res["status"]] = counts.get(res["status"], 0) + 1
                    if res["status"] == "ok":
                        tag = "default" if config == default else "tuned"
                        best[f"{h[:10]} {tag}"] = min(best.get(f"{h[:10]} {tag}", 1e9),
                                                      res["median_s"])
            lines = [f"{k}: {v * 1e3:.4f} ms" for k, v in sorted(best.items())]
            print(f"# {name}: baseline {base.get('baseline_s', float('nan')) * 1e3:.4f} ms; "
                  f"{counts}; " + "; ".join(lines), file=sys.stderr)


def measure_baseline(device, program, worker) -> dict:
    """The op-by-op baseline and the hand-written default, measured together."""
    from kernels import measure_program

    m = measure_program(program, None, None, device=device, worker=worker,
                        timing={"budget_s": 0.5})
    return {"status": m.status, "baseline_s": m.baseline_s, "default_s": m.kernel_s,
            "config": m.config, "message": m.message[:500]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--structures", metavar="DIR", help="search outputs, <program>.json")
    parser.add_argument("--out", required=True, help="JSON-lines file to write")
    parser.add_argument("--only", nargs="*", choices=PROGRAMS, help="these programs only")
    parser.add_argument("--top", type=int, default=3, help="structures per program (3)")
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="measuring time per program (30)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--configs", nargs="*", metavar="FILE",
                        help="JSON lists of {program, config} (benchmarks/weight_streams.py "
                        "--json) measured first on each structure whose space allows them")
    parser.add_argument("--with-handwritten", action="store_true",
                        help="sweep the hand-written structure too, after the --top ones")
    args = parser.parse_args(argv)
    try:
        args.given = read_configs(args.configs or [])
    except ValueError as err:
        print(f"sweep.py: --configs {err}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from kernels import DeviceUnavailable, get_device

    try:
        get_device(args.device)
    except DeviceUnavailable as err:
        print(f"sweep.py: {err}", file=sys.stderr)
        return 2
    with open(args.out, "w") as out:
        sweep(args, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
