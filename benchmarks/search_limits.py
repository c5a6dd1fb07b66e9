"""Search time of every built-in program with the old block-input limit (3, Mirage's) and the
adaptive default (max(3, the program's inputs)), interleaved in one process.

    .venv/bin/python benchmarks/search_limits.py [--skip qknorm_gqa] [--repeats 2]

In-process executor (no Ray), so the figures are the search's own; each row prints as JSON
(old_s / new_s: the best of the repeats; old / new: best structure's kernels, verified count).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cluster import LocalExecutor, search_program  # noqa: E402
from search import Limits, builtin_names, load_program  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--skip", default="", help="comma-separated programs to leave out")
    p.add_argument("--only", default="", help="comma-separated programs to run (default all)")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    skip = {x for x in args.skip.split(",") if x}
    only = {x for x in args.only.split(",") if x}
    executor = LocalExecutor()
    for name in builtin_names():
        if name in skip or (only and name not in only):
            continue
        program = load_program(name)
        n = len(program.inputs)
        old_limits, new_limits = Limits(max_block_inputs=3), Limits()
        times: dict[str, list[float]] = {"old": [], "new": []}
        found: dict[str, tuple] = {}
        for _ in range(args.repeats):
            for label, limits in (("old", old_limits), ("new", new_limits)):
                t0 = time.perf_counter()
                res = search_program(program, limits, executor=executor)
                times[label].append(time.perf_counter() - t0)
                found[label] = (res.best["num_kernels"] if res.best else None,
                                len(res.verified))
        print(json.dumps({"program": name, "inputs": n,
                          "limit_new": new_limits.for_program(n).max_block_inputs,
                          "old_s": min(times["old"]), "new_s": min(times["new"]),
                          "old": found["old"], "new": found["new"]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
