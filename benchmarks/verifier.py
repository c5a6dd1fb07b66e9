"""How long the verifier takes per candidate (a report: always exits 0).

The search checks every candidate µGraph it keeps, so the time of one ``equivalent()`` call
bounds how many candidates a worker can check per second.  The headline figure is the
hand-written ``rmsnorm_matmul`` structure, bound with g0=2, F=2, at its small instance (every
input dim capped at 16), against its reference; the target is a median under 2 ms.  The same
is measured for every built-in program, in both arithmetics, and once more with binding the
config inside the call (what the search pays when it checks a structure).

    .venv/bin/python benchmarks/verifier.py [--reps 300] [--tests 4]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from search import (  # noqa: E402
    HANDWRITTEN,  # noqa: E402
    builtin_names,
    load_program,
    small_instance,
)
from verifier import (
    build_tables,  # noqa: E402
    equivalent,  # noqa: E402
)

TARGET_MS = 2.0
HEADLINE = "rmsnorm_matmul"


def median_ms(call: Callable[[], object], reps: int) -> float:
    """Median wall time of ``call`` in milliseconds over ``reps`` runs (after one warm-up)."""
    call()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def measure(name: str, reps: int, tests: int) -> dict[str, float]:
    program = small_instance(load_program(name))
    reference = program.build()
    structure = HANDWRITTEN[name](program)
    config = {s: 2 for s in structure.symbols()}
    bound = structure.bind(config)
    row: dict[str, float] = {}
    for arithmetic in ("field", "float"):
        verdict = equivalent(reference, bound, tests=tests, arithmetic=arithmetic)
        if not verdict.equivalent:
            raise SystemExit(f"{name}: the hand-written structure is not equivalent "
                             f"({arithmetic}): {verdict.reason}")
        row[arithmetic] = median_ms(
            lambda a=arithmetic: equivalent(reference, bound, tests=tests, arithmetic=a), reps)
    row["field+bind"] = median_ms(
        lambda: equivalent(reference, structure, tests=tests, config=config), reps)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=300, help="timed calls per figure")
    parser.add_argument("--tests", type=int, default=4, help="random tests per call")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    build_tables()
    tables_s = time.perf_counter() - start
    print(f"verifier benchmark: median time per candidate, {args.reps} calls each, "
          f"{args.tests} random tests per call")
    print(f"python {platform.python_version()} on {platform.machine()}, "
          f"field tables built once in {tables_s:.2f} s (not counted)\n")

    rows = {name: measure(name, args.reps, args.tests) for name in builtin_names()}
    width = max(map(len, rows))
    print(f"{'program':<{width}}  {'field ms':>9}  {'float ms':>9}  {'field+bind ms':>13}")
    for name, row in rows.items():
        print(f"{name:<{width}}  {row['field']:>9.3f}  {row['float']:>9.3f}  "
              f"{row['field+bind']:>13.3f}")

    print()
    for arithmetic in ("field", "float"):
        ms = rows[HEADLINE][arithmetic]
        verdict = "PASS" if ms < TARGET_MS else "FAIL"
        print(f"{HEADLINE} (g0=2, F=2, small instance), {arithmetic} arithmetic: "
              f"{ms:.3f} ms per candidate, target < {TARGET_MS} ms: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
