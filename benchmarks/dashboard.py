"""Response times of `tuner dashboard` with 100,000 measurements in the database.

Fills a fresh SQLite database (bulk inserts) the way a big job would: one job over the ten
suite programs at their default shapes, each with 3 verified structures (their real fused
µGraphs) tuned on two device keys, ~1,650 configs each, 5 % of them failing, the fastest
re-timed twice, Optuna's studies and trials beside them, finished search shards with their
stats; plus a few smaller jobs.  Then starts `tuner dashboard` as a user would (uvicorn, in its
own process) and times every page and JSON API over HTTP from this process, reporting p50 /
p95 / max per endpoint and overall.  Target from issue 10: p95 <= 200 ms.

    python benchmarks/dashboard.py [--measurements 100000] [--repeat 30] [--json]

Every request is timed, the first included (the dashboard reads every aggregate once when it
starts, then only the rows added since; a chart's series is read on its first request).  The
rows are written through db's own tables (and Optuna's), as the dashboard reads them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from optuna.trial import TrialState  # noqa: E402
from sqlalchemy import func, select  # noqa: E402

import db  # noqa: E402
from search import load_program, to_obj  # noqa: E402
from tuner import api  # noqa: E402
from tuner.dashboard.tables import (  # noqa: E402  (db's and Optuna's own tables)
    MEASURED,
    M,
    S,
    T,
    meas_t,
    otrials_t,
    shards_t,
    studies_t,
    trials_t,
)
from tuner.identity import job_key, program_key  # noqa: E402
from tuner.jobfile import load_job  # noqa: E402
from tuner.pipeline.tune import study_name  # noqa: E402

PROGRAMS = ("rmsnorm_matmul", "gated_mlp", "lora", "gqa", "qknorm_gqa", "mha", "mqa",
            "ntrans", "softmax_rows", "rmsnorm_residual")
DEVICES = ("cpu:AMD EPYC:2c", "cuda:NVIDIA H100 80GB HBM3")
STRUCTURES = 3
FAILS = ("compile_error", "runtime_error", "timeout", "wrong_result")
TARGET_MS = 200.0


def _insert(conn, table, rows: list[dict]) -> None:
    """Bulk rows into one of db's (or Optuna's) own tables."""
    for i in range(0, len(rows), 5000):
        conn.execute(table.insert(), rows[i:i + 5000])


def fill(url: str, measurements: int, folder: Path, seed: int = 0,
         programs: tuple[str, ...] = PROGRAMS) -> dict:
    """The big job (and two small ones); returns what the timed requests need."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.storages.RDBStorage(url)  # Optuna's tables, as a launch creates them
    rng = random.Random(seed)
    job_file = folder / "suite.yaml"
    job_file.write_text("programs:\n" + "".join(f"  - name: {p}\n" for p in programs)
                        + "tuning:\n  trials_per_structure: 2000\n  structures: 3\n"
                        "devices: [cpu, cuda]\n")
    key = job_key(load_job(job_file))
    per_study = max(1, measurements // (len(programs) * STRUCTURES * len(DEVICES)))
    start = datetime.now(timezone.utc) - timedelta(hours=2)
    with db.connect(url) as database:
        job = database.start_job(key, str(job_file))
        for name in ("small-a:0001", "small-b:0002"):
            small = database.start_job(name, f"/elsewhere/{name}.yaml")
            database.finish_job(small.id, "finished", {"total_s": 60})
        out = {"job": job.id, "programs": [], "trials": []}
        made = []  # written through the API first: SQLite has one writer at a time
        for name in programs:
            program = load_program(name)
            pk = program_key(program)
            pid = database.record_program(pk.program_hash, pk.shapes, pk.dtype, name,
                                          to_obj(program.build()))
            fused = to_obj(api.program_graph(name, fused=True))
            sids = [(database.record_structure(pid, f"{k}{pk.program_hash[1:]}", fused,
                                               {"verdict": "equivalent", "tests": 4}, 1),
                     f"{k}{pk.program_hash[1:]}") for k in range(STRUCTURES)]
            made.append((name, pk, pid, fused, sids))
        with database.engine.begin() as conn:
            clock = start
            for name, pk, pid, fused, sids in made:
                out["programs"].append(pid)
                _insert(conn, shards_t, [{
                    "job_id": job.id, "shard_key": f"{pk.program_hash[:16]}/shard{s}",
                    "status": "finished", "updated_at": start,
                    "stats_json": json.dumps({"shard_id": f"shard{s}", "stats": {
                        "states": rng.randint(100, 5000), "pruned": 10, "invalid": 1,
                        "candidates": 5, "timed_out": False},
                        "verified": {f"h{s}{k}": fused for k in range(2)}})}
                    for s in range(20)])
                out.setdefault("structure", sids[0][0])
                for sid, shash in sids:
                    for dev in DEVICES:
                        sname = study_name(name, pk.program_hash, db.shapes_key(pk.shapes),
                                           shash, dev)
                        _insert(conn, studies_t, [{"study_name": sname}])
                        study_id = conn.execute(select(func.max(studies_t.c.study_id))).scalar()
                        trials = [{"structure_id": sid, "device_key": dev,
                                   "config_hash": f"{dev}:{n}", "study_name": sname,
                                   "trial_number": n, "created_at": start,
                                   "config_json": json.dumps({"F": 2 ** rng.randint(0, 8),
                                                              "g0": 2 ** rng.randint(0, 10)},
                                                             sort_keys=True)}
                                  for n in range(per_study)]
                        _insert(conn, trials_t, trials)
                        tids = list(conn.execute(select(T.id).where(
                            T.structure_id == sid, T.device_key == dev).order_by(T.id)).scalars())
                        base = rng.uniform(1e-5, 1e-3)
                        rows, otrials = [], []
                        for n, tid in enumerate(tids):
                            clock += timedelta(milliseconds=40)
                            failed = rng.random() < 0.05
                            t = None if failed else base * rng.uniform(0.5, 3.0)
                            rows.append({"trial_id": tid, "device_key": dev, "attempt": 0,
                                         "status": rng.choice(FAILS) if failed else "ok",
                                         "median_s": t, "spread_s": None if failed else t / 20,
                                         "samples_json": None if failed else json.dumps([t] * 3),
                                         "max_error": None if failed else 1e-6,
                                         "message": "nvcc: error: too many resources requested "
                                                    "for launch" if failed else None,
                                         "host": f"node{n % 4}", "measured_at": clock})
                            otrials.append({"number": n, "study_id": study_id,
                                            "state": TrialState.FAIL if failed
                                            else TrialState.COMPLETE, "datetime_start": clock})
                        for extra in range(per_study // 10):  # roofline skips
                            otrials.append({"number": per_study + extra, "study_id": study_id,
                                            "state": TrialState.PRUNED, "datetime_start": clock})
                        _insert(conn, meas_t, rows)
                        _insert(conn, otrials_t, otrials)
                        out["trials"].append(tids[0])
        # the confirmation: the 3 fastest configs of each program x device re-timed twice,
        # the best through the real API
        with database.engine.begin() as conn:
            for pid in out["programs"]:
                for dev in DEVICES:
                    fastest = conn.execute(
                        select(M.trial_id, M.median_s).select_from(MEASURED)
                        .where(S.program_id == pid, M.device_key == dev, M.status == "ok")
                        .order_by(M.median_s).limit(3)).all()
                    _insert(conn, meas_t, [
                        {"trial_id": tid, "device_key": dev, "attempt": a, "status": "ok",
                         "median_s": t * 1.01, "spread_s": t / 20,
                         "samples_json": json.dumps([t] * 3), "max_error": 1e-6,
                         "message": None, "host": "node0", "measured_at": clock}
                        for tid, t in fastest for a in (1, 2)])
                    out.setdefault("best_trials", []).append(fastest[0][0])
        for tid in out["best_trials"]:
            database.confirm_best(tid, "// kernel source\n" * 60, baseline_s=2e-3)
        database.finish_job(job.id, "finished", {"total_s": 7200})
        out["counts"] = database.row_counts()
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read()
        status = r.status
    return time.perf_counter() - t0, status, len(body)


def time_endpoints(base: str, endpoints: dict[str, str], repeat: int
                   ) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {k: [] for k in endpoints}
    for _ in range(repeat):
        for name, path in endpoints.items():
            dt, status, _size = _get(base + path)
            assert status == 200, (path, status)
            times[name].append(dt)
    return times


def write_while(url: str, ids: dict, stop: threading.Event) -> None:
    """A launch's writes, faster than a real one: a new config of the first program on the
    first device and its timing every 50 ms (what the job page, its series and the failures
    page then have to follow)."""
    rng = random.Random(1)
    with db.connect(url) as database:
        n = 0
        while not stop.is_set():
            tid = database.record_trial(ids["structure"], DEVICES[0],
                                        {"F": 1000 + n, "g0": 2 ** rng.randint(0, 10)})
            failed = rng.random() < 0.05
            t = None if failed else rng.uniform(1e-5, 1e-3)
            database.record_measurement(tid, "timeout" if failed else "ok", median_s=t,
                                        spread_s=None, samples=None, max_error=None,
                                        message="timed out" if failed else None, host="node0")
            n += 1
            ids["written"] = n
            stop.wait(0.05)


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measurements", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=50, help="requests per endpoint")
    parser.add_argument("--programs", type=int, default=len(PROGRAMS),
                        help="how many suite programs share the measurements (1: one program "
                             "with every measurement, the heaviest job and chart pages)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        url = f"sqlite:///{folder / 'bench.db'}"
        t0 = time.perf_counter()
        ids = fill(url, args.measurements, folder, programs=PROGRAMS[:args.programs])
        fill_s = time.perf_counter() - t0
        port = _free_port()
        server = subprocess.Popen([sys.executable, "-m", "tuner.cli", "dashboard", "--db", url,
                                   "--port", str(port)], cwd=ROOT, stderr=subprocess.PIPE,
                                  text=True)
        base = f"http://127.0.0.1:{port}"
        try:
            for _ in range(300):
                try:
                    _get(base + "/healthz")
                    break
                except OSError:
                    time.sleep(0.1)
            pid, job = ids["programs"][0], ids["job"]
            dev = quote(DEVICES[0])
            endpoints = {
                "jobs page": "/", "jobs API": "/api/jobs",
                "job page": f"/jobs/{job}", "job API": f"/api/jobs/{job}",
                "program page": f"/programs/{pid}",
                "series API": f"/api/programs/{pid}/series?device={dev}",
                "kernel page (best)": f"/kernels/{ids['best_trials'][0]}",
                "kernel page (rendered)": f"/kernels/{ids['trials'][0]}",
                "failures page": "/failures", "failures API": "/api/failures",
                "failures filtered": "/failures?status=timeout&program=mha",
                "cluster page": "/cluster",
            }
            phases = {"idle": time_endpoints(base, endpoints, args.repeat)}
            stop = threading.Event()
            writer = threading.Thread(target=write_while, args=(url, ids, stop), daemon=True)
            writer.start()
            try:
                phases["live"] = time_endpoints(base, endpoints, args.repeat)
            finally:
                stop.set()
                writer.join(timeout=30)
        finally:
            server.terminate()
            server.wait(timeout=10)
    result = {
        "cpu": cpu_name(), "cores": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "measurements": ids["counts"][meas_t.name],
        "trials": ids["counts"][trials_t.name], "fill_s": round(fill_s, 1),
        "programs": args.programs, "target_p95_ms": TARGET_MS, "phases": {},
    }
    for phase, times in phases.items():
        every = [t for ts in times.values() for t in ts]
        result["phases"][phase] = {
            "requests": len(every),
            "endpoints": {k: {"first_ms": round(v[0] * 1e3, 1),
                              "p50_ms": round(pct(v, 0.5) * 1e3, 1),
                              "p95_ms": round(pct(v, 0.95) * 1e3, 1),
                              "max_ms": round(max(v) * 1e3, 1)} for k, v in times.items()},
            "p50_ms": round(pct(every, 0.5) * 1e3, 1),
            "p95_ms": round(pct(every, 0.95) * 1e3, 1),
            "max_ms": round(max(every) * 1e3, 1),
        }
    result["written_while_live"] = ids.get("written", 0)
    result["meets_target"] = all(
        e["p95_ms"] <= TARGET_MS for ph in result["phases"].values()
        for e in ph["endpoints"].values())
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"tuner dashboard, {result['measurements']:,} measurements "
          f"({result['trials']:,} configs, {args.programs} program(s) x {len(DEVICES)} "
          f"devices), SQLite; {result['cpu']}, {result['cores']} cores, "
          f"load {result['load_avg_1m']}; database filled in {result['fill_s']} s")
    width = max(map(len, endpoints))
    for phase, ph in result["phases"].items():
        print(f"\n{phase}: {args.repeat} requests per endpoint" + (
            f", {result['written_while_live']} measurements written meanwhile into the timed "
            "program (one every 50 ms)" if phase == "live" else ""))
        print(f"{'endpoint':<{width}}  {'first':>7}  {'p50 ms':>7}  {'p95 ms':>7}  {'max ms':>7}")
        for name, e in ph["endpoints"].items():
            print(f"{name:<{width}}  {e['first_ms']:>7}  {e['p50_ms']:>7}  {e['p95_ms']:>7}  "
                  f"{e['max_ms']:>7}")
        print(f"{'all ' + str(ph['requests']) + ' requests':<{width}}  {'':>7}  "
              f"{ph['p50_ms']:>7}  {ph['p95_ms']:>7}  {ph['max_ms']:>7}")
    print(f"\ntarget p95 <= {TARGET_MS:.0f} ms (every endpoint, both phases): "
          f"{'met' if result['meets_target'] else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
