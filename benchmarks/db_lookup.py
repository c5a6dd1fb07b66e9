"""Latency of the best-kernel lookup (what `tuner best` runs) on a populated database.

Fills a fresh database with ``--measurements`` rows spread over programs, structures, trials
and two devices (bulk inserts for speed; the best rows go through ``Database.update_best``),
then times ``Database.best_kernel`` in-process — hits, cross-device lookups and misses —
and reports p50 / p99 of wall time (and of CPU time, which shows what is left when other
processes hold the CPUs). Target from the issue: p99 <= 2 ms with 100,000 measurements (SQLite).

    python benchmarks/db_lookup.py [--measurements 100000] [--lookups 20000] [--url URL] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import db  # noqa: E402
from db import MeasurementRow, ProgramRow, StructureRow, TrialRow  # noqa: E402

DEVICES = ("cpu:bench", "cuda:bench")
SHAPES = {"x": [64, 4096], "w": [4096, 1024]}


def populate(database: db.Database, measurements: int, programs: int, seed: int) -> list[str]:
    """Programs × 8 structures × 2 devices × N configs, one measurement each."""
    rng = random.Random(seed)
    structures_per_program = 8
    per_structure = max(1, measurements // (programs * structures_per_program * len(DEVICES)))
    now = datetime.now(timezone.utc)
    hashes = [f"bench-program-{i:04d}" for i in range(programs)]
    with database.session() as s:
        conn = s.connection()
        conn.execute(
            ProgramRow.__table__.insert(),
            [
                {
                    "program_hash": h,
                    "shapes_key": db.shapes_key(SHAPES),
                    "dtype": "float32",
                    "name": h,
                    "graph_json": "{}",
                    "created_at": now,
                }
                for h in hashes
            ],
        )
        pids = [
            p
            for (p,) in conn.execute(
                ProgramRow.__table__.select()
                .with_only_columns(ProgramRow.id)
                .order_by(ProgramRow.id)
            )
        ]
        conn.execute(
            StructureRow.__table__.insert(),
            [
                {
                    "program_id": pid,
                    "structure_hash": f"s{j}",
                    "structure_json": "{}",
                    "verification_json": '{"verdict":"equivalent"}',
                    "num_kernels": 1,
                    "bytes_moved": 1 << 20,
                    "created_at": now,
                }
                for pid in pids
                for j in range(structures_per_program)
            ],
        )
        sids = [
            r
            for (r,) in conn.execute(
                StructureRow.__table__.select()
                .with_only_columns(StructureRow.id)
                .order_by(StructureRow.id)
            )
        ]
        trial_rows = [
            {
                "structure_id": sid,
                "device_key": dev,
                "config_hash": f"{dev}-{k}",
                "config_json": json.dumps({"grid": [k + 1]}),
                "created_at": now,
            }
            for sid in sids
            for dev in DEVICES
            for k in range(per_structure)
        ]
        conn.execute(TrialRow.__table__.insert(), trial_rows)
        trials = conn.execute(
            TrialRow.__table__.select()
            .with_only_columns(TrialRow.id, TrialRow.device_key)
            .order_by(TrialRow.id)
        ).all()
        conn.execute(
            MeasurementRow.__table__.insert(),
            [
                {
                    "trial_id": tid,
                    "device_key": dev,
                    "attempt": 0,
                    "status": "ok",
                    "median_s": rng.uniform(1e-5, 1e-2),
                    "spread_s": 1e-7,
                    "samples_json": "[0.001,0.001,0.001]",
                    "host": "bench",
                    "measured_at": now,
                }
                for tid, dev in trials
            ],
        )
    # The best rows go through the real API: one per program × device, from a real measurement.
    with database.engine.connect() as conn:
        for pid in pids:
            for dev in DEVICES:
                mid = conn.execute(
                    MeasurementRow.__table__.select()
                    .with_only_columns(MeasurementRow.id)
                    .join(TrialRow, TrialRow.id == MeasurementRow.trial_id)
                    .join(StructureRow, StructureRow.id == TrialRow.structure_id)
                    .where(StructureRow.program_id == pid, TrialRow.device_key == dev)
                    .order_by(MeasurementRow.median_s)
                    .limit(1)
                ).scalar_one()
                database.update_best(mid, "// kernel source\n" * 40, baseline_s=0.02)
    return hashes


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measurements", type=int, default=100_000)
    parser.add_argument("--programs", type=int, default=50)
    parser.add_argument("--lookups", type=int, default=20_000)
    parser.add_argument("--url", help="database URL (default: a fresh SQLite file in a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        url = args.url or f"sqlite:///{Path(tmp) / 'bench.db'}"
        t0 = time.perf_counter()
        with db.connect(url) as database:
            hashes = populate(database, args.measurements, args.programs, args.seed)
            fill_s = time.perf_counter() - t0
            counts = database.row_counts()
            rng = random.Random(args.seed + 1)
            queries = []
            for _ in range(args.lookups):
                kind = rng.random()
                h = rng.choice(hashes)
                if kind < 0.8:
                    queries.append((h, rng.choice(DEVICES)))  # hit on one device
                elif kind < 0.9:
                    queries.append((h, None))  # fastest over devices
                else:
                    queries.append((h + "-unknown", DEVICES[0]))  # miss
            for h, dev in queries[:500]:  # warm the pool and the statement cache
                database.best_kernel(h, SHAPES, "float32", dev)
            times, cpu_times, hits = [], [], 0
            for h, dev in queries:
                start, cpu_start = time.perf_counter(), time.thread_time()
                best = database.best_kernel(h, SHAPES, "float32", dev)
                cpu_times.append(time.thread_time() - cpu_start)
                times.append(time.perf_counter() - start)
                hits += best is not None
    times.sort()
    cpu_times.sort()
    result = {
        "backend": db.normalize_url(url).get_backend_name(),
        "measurements": counts["tuner_measurements"],
        "best_rows": counts["tuner_best_kernels"],
        "fill_s": round(fill_s, 2),
        "lookups": len(times),
        "hits": hits,
        "p50_ms": round(percentile(times, 0.50) * 1e3, 4),
        "p99_ms": round(percentile(times, 0.99) * 1e3, 4),
        "mean_ms": round(statistics.fmean(times) * 1e3, 4),
        "max_ms": round(times[-1] * 1e3, 4),
        # CPU time of this thread: what the lookup costs when the machine is not oversubscribed
        "cpu_p50_ms": round(percentile(cpu_times, 0.50) * 1e3, 4),
        "cpu_p99_ms": round(percentile(cpu_times, 0.99) * 1e3, 4),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
        "target_p99_ms": 2.0,
    }
    result["meets_target"] = result["p99_ms"] <= result["target_p99_ms"]
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"best_kernel lookup on {result['backend']} with {result['measurements']:,}"
            f" measurements ({result['best_rows']} best rows, filled in {result['fill_s']} s)"
        )
        print(
            f"  {result['lookups']:,} lookups, {hits:,} hits: p50 {result['p50_ms']} ms,"
            f" p99 {result['p99_ms']} ms, mean {result['mean_ms']} ms,"
            f" max {result['max_ms']} ms (target p99 <= 2 ms:"
            f" {'met' if result['meets_target'] else 'MISSED'})"
        )
        print(
            f"  CPU time per lookup: p50 {result['cpu_p50_ms']} ms, p99 {result['cpu_p99_ms']}"
            f" ms (load average {result['load_avg_1m']} on {result['cpus']} CPUs: wall-clock"
            " time above the CPU time is waiting for a CPU)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
