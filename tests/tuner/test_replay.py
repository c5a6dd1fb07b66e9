"""Replay launches of Kernel Tuner spaces, and joining a cluster started with Ray's CLI.

``programs: [{kernel_tuner: FILE.json.gz}]`` with ``devices: [replay]``: no search, the
cache's parameters are the space, every trial is answered from the file, only what the study
measured is stored, under ``replay:<GPU>``.  The cluster test starts a head with
``ray start --head --num-gpus 2`` (token authentication on, as Ray's default) and launches
with ``--address``: the replay slots are its two GPUs.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from support import shared_cache

import db
from costmodel import read_kernel_tuner
from tuner.identity import space_identity
from tuner.jobfile import JobError, parse_job

ROOT = Path(__file__).resolve().parents[2]
CONV = shared_cache("convolution", "A100")
DEDISP = shared_cache("dedispersion", "A4000")
needs_caches = pytest.mark.skipif(not CONV.exists(), reason=f"no Kernel Tuner cache at {CONV}")
TUNER = [sys.executable, "-m", "tuner.cli"]


def _error(text: str, tmp_path: Path) -> JobError:
    with pytest.raises(JobError) as err:
        parse_job(text, str(tmp_path / "job.yaml"), tmp_path)
    return err.value


@needs_caches
def test_job_file_errors_of_replay_entries_name_file_line_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"not gzip, not json")
    cases = [
        (f"programs:\n  - softmax_rows\n  - kernel_tuner: {CONV}\n", 3,
         "programs[1].kernel_tuner", "add 'replay' to devices"),
        ("programs: [softmax_rows]\ndevices: [cpu, replay]\n", 2, "devices[1]",
         "replay answers Kernel Tuner spaces only"),
        ("programs:\n  - kernel_tuner: nowhere.json.gz\ndevices: [replay]\n", 2,
         "programs[0].kernel_tuner", "no file 'nowhere.json.gz'"),
        ("programs:\n  - kernel_tuner: bad.json.gz\ndevices: [replay]\n", 2,
         "programs[0].kernel_tuner", "not a readable Kernel Tuner cache"),
        (f"programs:\n  - kernel_tuner: {CONV}\n    set: {{X: 4}}\ndevices: [replay]\n", 3,
         "programs[0].set", "remove 'set'"),
        (f"programs:\n  - kernel_tuner: {CONV}\n  - kernel_tuner: {CONV}\n"
         "devices: [replay]\n", 3, "programs[1]", "list each cache once"),
        ("programs: [softmax_rows]\ndevices: [replay:0]\n", 2, "devices[0]",
         "replay (Kernel Tuner spaces)"),
    ]
    for text, line, key, words in cases:
        err = _error(text, tmp_path)
        assert (err.line, err.key) == (line, key), (text, str(err))
        assert words in err.reason, str(err)
        assert str(err).startswith(f"{tmp_path / 'job.yaml'}:{line}: {key}: ")


@needs_caches
def test_a_replay_job_parses_to_the_caches_space(tmp_path: Path) -> None:
    job = parse_job(f"programs:\n  - kernel_tuner: {CONV}\n  - softmax_rows\n"
                    "devices: [cpu, replay]\n", str(tmp_path / "j.yaml"), tmp_path)
    entry = job.programs[0]
    assert entry.kind == "kernel_tuner" and entry.program is None
    assert entry.space.device_key == "replay:NVIDIA A100-PCIE-40GB"
    assert entry.name == "convolution_kernel" and job.devices == ("cpu", "replay")


@needs_caches
def test_a_replay_space_holds_the_files_configs_not_the_product_of_their_values() -> None:
    """The product of each parameter's values holds 2-3x the configs the GPU ran: a sampler
    ranking it drew its candidates mostly from configs that only fail (the model sampler's
    2048 of 10,240 held 876 of the A100 file's 4,362)."""
    from tuner.pipeline.recorded import config_space_of

    cache = read_kernel_tuner(CONV)
    space = config_space_of(cache)
    listed = sorted(tuple(sorted((k, int(v)) for k, v in c.items())) for c in cache.configs)
    ours = sorted(tuple(sorted(c.items())) for c in space.configs())
    assert ours == listed and math.prod(map(len, space.params.values())) > 2 * len(listed)
    other = next(c for c in ({k: v[0] for k, v in space.params.items()},
                             {k: v[-1] for k, v in space.params.items()})
                 if tuple(sorted(c.items())) not in set(listed))
    assert "not one of the" in (space.check(other) or "")
    assert space.check(space.default) is None and space.default == {
        k: int(v) for k, v in cache.configs[0].items()}


def _launch(*args: str, env: dict | None = None, timeout: float = 420) -> dict:
    out = subprocess.run([*TUNER, "launch", *args, "--json"], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, **(env or {})}, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def _check_stored(url: str, report: dict, path: Path) -> list:
    space = read_kernel_tuner(path)
    phash = space_identity(space)[1]
    recorded = {db.config_hash({k: int(v) for k, v in c.items()}): (t, f)
                for c, t, f in zip(space.configs, space.times_s, space.failures, strict=True)}
    with db.connect(url) as database:
        rows = database.history(phash, device_key=space.device_key)
        assert len(rows) == report["trials"] < len(space.configs)  # never the whole file
        for h in rows:
            seconds, marker = recorded[db.config_hash(h.config)]
            if h.status == "ok":
                assert h.median_s == pytest.approx(seconds)
            else:
                assert math.isnan(seconds) and h.status in ("compile_error", "runtime_error")
        best = min(h.median_s for h in rows if h.status == "ok")
        assert report["best_s"] == pytest.approx(best)  # seconds, as for every device
        assert report["device_key"] == space.device_key
        return [m for h in rows for m in database.measurements(h.trial_id)]


@needs_caches
def test_replay_launch_stores_only_measured_trials_and_the_best_in_seconds(
        tmp_path: Path) -> None:
    job = tmp_path / "replay.yaml"
    job.write_text(f"programs:\n  - kernel_tuner: {DEDISP}\ndevices: [replay]\n"
                   "tuning: {trials_per_structure: 12, seed: 2}\n")
    url = f"sqlite:///{tmp_path / 'r.db'}"
    out = _launch(str(job), "--db", url)
    (rep,) = out["programs"]
    assert rep["trials"] == 12 and rep["new_trials"] == 12
    _check_stored(url, rep, DEDISP)
    again = _launch(str(job), "--db", url)  # a relaunch measures nothing again
    assert again["resumed"] and again["programs"][0]["new_trials"] == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head():
    """``ray start --head --num-gpus 2`` as a user would type it (in its own process group,
    stopped by signalling that group: ``ray stop`` would stop every Ray on the machine)."""
    ray_cli = Path(sys.executable).with_name("ray")
    port = _free_port()
    temp = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # Ray's socket paths must stay short
    proc = subprocess.Popen(
        [str(ray_cli), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
         "--num-gpus=2", "--include-dashboard=false", f"--temp-dir={temp}",
         f"--dashboard-agent-listen-port={_free_port()}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if "Ray runtime started" in line or proc.poll() is not None:
            break
    if proc.poll() is not None or not any("Ray runtime started" in x for x in lines):
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("ray start --head did not start:\n" + "".join(lines[-20:]))
    try:
        yield f"127.0.0.1:{port}"
    finally:
        # SIGINT, as Ctrl-C: `ray start --block` then stops its processes in ~2 s; it sat out
        # SIGTERM past 30 s, which cost each test a 15 s wait and a SIGKILL
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@needs_caches
def test_launch_joins_a_cluster_started_with_the_ray_cli(ray_head: str, tmp_path: Path) -> None:
    """The issue's first failure: InvalidAuthToken on ``--address``.  A tiny job with a
    searched program on cpu and a Kernel Tuner space on the head's two GPUs."""
    job = tmp_path / "cluster.yaml"
    job.write_text("programs:\n  - {name: softmax_rows, set: {rows: 64, cols: 64}}\n"
                   f"  - kernel_tuner: {CONV}\ndevices: [cpu, replay]\n"
                   "tuning: {trials_per_structure: 8, structures: 1, confirm: 0, seed: 1}\n")
    url = f"sqlite:///{tmp_path / 'c.db'}"
    out = _launch(str(job), "--db", url, "--address", ray_head)
    cpu, rep = out["programs"]
    assert cpu["device_key"].startswith("cpu:") and cpu["best_s"] > 0
    measurements = _check_stored(url, rep, CONV)
    hosts = {m.host for m in measurements}
    assert len({h.split(":")[1] for h in hosts}) == 1  # one node, the head
    assert {h.rsplit(":", 1)[1] for h in hosts} == {"gpu0", "gpu1"}  # both its GPU slots


def test_a_machine_without_the_token_is_refused_at_once_in_one_line(
        ray_head: str, tmp_path: Path) -> None:
    """The head runs token authentication (``ray start``'s default); a machine whose home has
    no ~/.ray/auth_token and no RAY_AUTH_TOKEN: `tuner launch --address` exits 2 with one
    line on what to do, in seconds (ray.init alone retries ~20 s), and writes no database."""
    job = tmp_path / "cluster.yaml"
    job.write_text("programs:\n  - {name: softmax_rows, set: {rows: 64, cols: 64}}\n"
                   "devices: [cpu]\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token here
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "tuner.cli", "launch", str(job), "--db",
                          f"sqlite:///{tmp_path / 'c.db'}", "--address", ray_head],
                         capture_output=True, text=True, timeout=120, env=env,
                         cwd=Path(__file__).resolve().parents[2])
    took = time.perf_counter() - t0
    assert res.returncode == 2, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "token authentication" in lines[0], res.stderr[-2000:]
    assert "~/.ray/auth_token" in lines[0] and "RAY_AUTH_TOKEN" in lines[0]
    assert took < 15, f"refused after {took:.0f} s"
    assert not (tmp_path / "c.db").exists()


def test_a_join_that_fails_for_want_of_a_token_says_what_to_do_in_one_line(monkeypatch) -> None:
    import ray

    from cluster import ClusterJoinError, join_ray

    def refuse(**_kwargs):  # what ray.init raises after ~20 s of InvalidAuthToken lines
        raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379")

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # as on a machine without the token
    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(ClusterJoinError) as err:
        join_ray("10.0.0.5:6379")
    msg = str(err.value)
    assert "\n" not in msg and "~/.ray/auth_token" in msg and "RAY_AUTH_TOKEN" in msg
