"""Several Ray nodes on this machine (``ray.cluster_utils.Cluster``): search shards on
several nodes, measurement slots per node and GPU, the node of every measurement, nodes
removed mid-search and mid-tuning, dead slots replaced.  docs/cluster.md.

The nodes declare GPUs they do not have: the ``replay`` device takes a GPU slot as ``cuda``
does, so these tests run exactly the path real GPUs take.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray import cloudpickle  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from support import shared_cache  # noqa: E402

import db  # noqa: E402
from cluster import (  # noqa: E402
    LocalExecutor,
    RayExecutor,
    SlotPool,
    Speculation,
    TrialRequest,
    cpu_slot_nodes,
    run_and_verify,
    search_program,
)
from costmodel import read_kernel_tuner  # noqa: E402
from kernels import ReplayDevice, device_key  # noqa: E402
from search import handwritten, to_obj  # noqa: E402
from search.ir.suite import load_program  # noqa: E402

CONV = shared_cache("convolution", "A100")
pytestmark = pytest.mark.skipif(not CONV.exists(), reason=f"no Kernel Tuner cache at {CONV}")

SEARCHED = load_program("rmsnorm_matmul", {"X": "16x256", "W": "256x256"})  # quickstart's


class SlowReplay(ReplayDevice):
    """A replay device whose trials take ``delay_s``: trials stay in flight long enough for
    a node to be removed under them."""

    delay_s = 0.4

    def run_trial(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        time.sleep(self.delay_s)
        return super().run_trial(*args, **kwargs)


cloudpickle.register_pickle_by_value(__import__(__name__))


def _traced(payload: dict, shard):  # noqa: ANN001, ANN202
    """A search shard that also says which Ray node ran it."""
    res = run_and_verify(payload, shard)
    time.sleep(0.2)  # long enough that a node can be removed while shards run
    return res, ray.get_runtime_context().get_node_id()


class TracingExecutor(RayExecutor):
    """The search's Ray executor, remembering the node of every finished shard."""

    def __init__(self) -> None:
        super().__init__(task=_traced, address="auto")
        self.nodes: Counter = Counter()
        self.first = threading.Event()

    def _result(self, value):  # noqa: ANN001, ANN202
        res, node = value
        self.nodes[node] += 1
        self.first.set()
        return res


@pytest.fixture(scope="module")
def nodes():
    """A head (no CPU: the driver's) and two worker nodes, each with one CPU, two GPUs and
    its own custom resource; node B builds cpu kernels for x86-64-v2, so its cpu device key
    differs from the driver's."""
    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    a = c.add_node(num_cpus=1, num_gpus=2, resources={"node_a": 1})
    b = c.add_node(num_cpus=1, num_gpus=2, resources={"node_b": 1},
                   env_vars={"TUNER_CPU_MARCH": "x86-64-v2"})
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c, {"a": a.node_id, "b": b.node_id}
    finally:
        ray.shutdown()
        c.shutdown()


def _space_device(delay: float | None = None) -> tuple[object, ReplayDevice]:
    from tuner.pipeline.recorded import replay_device

    space = read_kernel_tuner(CONV)
    dev = replay_device(space, str(CONV))
    if delay is not None:
        dev = SlowReplay(dev.table, dev.key_of, dev.key, dev.spec)
        dev.delay_s = delay
    return space, dev


def _requests(space, n: int) -> list[TrialRequest]:  # noqa: ANN001
    ok = [c for c, t in zip(space.configs, space.times_s, strict=True) if t == t][:n]
    return [TrialRequest({}, {}, {k: int(v) for k, v in c.items()}, tag=i)
            for i, c in enumerate(ok)]


def test_search_shards_run_on_several_nodes_and_verify_what_one_node_does(nodes) -> None:
    local = search_program(SEARCHED, executor=LocalExecutor())
    ex = TracingExecutor()
    try:
        spread = search_program(SEARCHED, executor=ex)
    finally:
        ex.close()
    _, ids = nodes
    assert set(spread.verified) == set(local.verified) and local.verified
    assert set(ex.nodes) == {ids["a"], ids["b"]}, ex.nodes  # the head has no CPU


def test_replay_slots_are_one_per_gpu_placed_on_every_gpu_node(nodes) -> None:
    space, dev = _space_device()
    pool = SlotPool(dev, 4)
    try:
        placed = Counter(node for _, node in pool.placement())
        _, ids = nodes
        assert placed == {ids["a"]: 2, ids["b"]: 2}
        for r in _requests(space, 4):
            pool.submit("trial", r)
        results = [pool.next_done() for _ in range(4)]
        assert pool.next_done() is None
        assert {r.status for r in results} == {"ok"}
        hosts = {r.host for r in results}
        assert hosts <= {label for label, _ in pool.placement()}  # each names its node
    finally:
        pool.close()


def test_a_cpu_slot_files_its_timings_under_its_own_nodes_device_key(nodes) -> None:
    pool = SlotPool("cpu", 1, resources={"num_cpus": 0, "resources": {"node_b": 0.01}})
    try:
        (label, node), = pool.placement()
        _, ids = nodes
        assert node == ids["b"]
        assert pool.key.endswith(":x86-64-v2") and pool.key != device_key("cpu")
    finally:
        pool.close()


def test_a_cpu_pool_takes_one_slot_on_each_cpu_node_of_one_device_key(nodes) -> None:
    """Nodes a and d time as this machine's cpu, node b as x86-64-v2: a cpu pool pinned to
    every CPU node keeps one slot on a and one on d (two trials at once, one on each) and
    leaves b out, saying which key it has, so one study never mixes two CPUs' timings."""
    c, ids = nodes
    extra = c.add_node(num_cpus=1, resources={"node_d": 1})
    c.wait_for_nodes()
    try:
        assert set(cpu_slot_nodes()) == {ids["a"], ids["b"], extra.node_id}  # not the head
        pool = SlotPool("cpu", pin=cpu_slot_nodes(), prefer_key=device_key("cpu"))
        try:
            assert pool.key == device_key("cpu")
            assert sorted(n for _, n in pool.placement()) == sorted([ids["a"], extra.node_id])
            assert pool.left_out == [(ids["b"], device_key("cpu") + ":x86-64-v2")]
            program = load_program("softmax_rows", {"rows": 8, "cols": 16})
            reference, structure = to_obj(program.build()), to_obj(handwritten(program))
            assert pool.idle == 2
            for tag in (1, 2):
                pool.submit("trial", TrialRequest(reference, structure, {"g0": 2, "split": 1},
                                                  tag=tag, timing={"budget_s": 0.1}))
            results = [pool.next_done(), pool.next_done()]
            assert {r.tag for r in results} == {1, 2}
            assert all(r.status == "ok" for r in results), [r.message for r in results]
            assert {r.host.split(":")[1] for r in results} == {ids["a"][:12],
                                                               extra.node_id[:12]}
        finally:
            pool.close()
    finally:
        c.remove_node(extra)


def test_a_replay_launch_on_the_cluster_spreads_trials_over_the_gpu_slots(
        nodes, tmp_path: Path) -> None:
    from tuner.pipeline import launch

    job = tmp_path / "replay.yaml"
    job.write_text(f"programs:\n  - kernel_tuner: {CONV}\ndevices: [replay]\n"
                   "tuning: {trials_per_structure: 16, seed: 3}\n")
    url = f"sqlite:///{tmp_path / 'r.db'}"
    result = launch(job, db_url=url)
    (rep,) = result.reports
    space = read_kernel_tuner(CONV)
    assert rep.device_key == space.device_key == "replay:" + space.device
    assert rep.trials == 16 and rep.best_s is not None and rep.best_s < 1.0  # seconds
    with db.connect(url) as database:
        rows = database.history(_phash(space), device_key=rep.device_key)
        assert len(rows) == 16  # only what the study measured, never the rest of the file
        recorded = dict(zip(map(db.config_hash, ({k: int(v) for k, v in c.items()}
                                                 for c in space.configs)),
                            space.times_s, strict=True))
        for h in rows:
            if h.status == "ok":
                assert h.median_s == pytest.approx(recorded[db.config_hash(h.config)])
        hosts = {m.host for h in rows for m in database.measurements(h.trial_id)}
        _, ids = nodes
        assert {h.split(":")[1] for h in hosts} == {ids["a"][:12], ids["b"][:12]}
        best = database.best_kernel(_phash(space), {"problem_size": list(space.problem_size)},
                                    "kernel_tuner", space.device_key)
        assert best.time_s == min(h.median_s for h in rows if h.status == "ok")


def _phash(space) -> str:  # noqa: ANN001
    from tuner.identity import space_identity

    return space_identity(space)[1]


def test_a_killed_slot_actor_is_replaced_and_its_trial_run_again(nodes) -> None:
    space, dev = _space_device(delay=1.0)
    pool = SlotPool(dev, 2)
    try:
        reqs = _requests(space, 2)
        for r in reqs:
            pool.submit("trial", r)
        time.sleep(0.3)
        ray.kill(pool.slots[0], no_restart=True)
        results = sorted((pool.next_done() for _ in reqs), key=lambda r: r.tag)
        assert [r.status for r in results] == ["ok", "ok"]
        assert pool.replaced == 1 and len(pool.slots) == 2
    finally:
        pool.close()


def test_a_node_removed_mid_search_changes_nothing_verified(nodes) -> None:
    c, _ = nodes
    extra = c.add_node(num_cpus=1, resources={"node_c": 1})
    c.wait_for_nodes()
    local = search_program(SEARCHED, executor=LocalExecutor())
    ex = TracingExecutor()
    killer = threading.Thread(target=lambda: (ex.first.wait(60), c.remove_node(extra)))
    killer.start()
    try:
        spread = search_program(SEARCHED, executor=ex)
    finally:
        killer.join()
        ex.close()
    assert set(spread.verified) == set(local.verified)
    assert extra.node_id not in {n["NodeID"] for n in ray.nodes() if n["Alive"]}


def test_a_node_removed_mid_tuning_loses_no_trial(nodes, tmp_path: Path) -> None:
    """A study on 6 GPU slots over three nodes; the third node is removed while its slots
    hold trials: every trial asked is stored exactly once (re-run on a surviving slot, or
    stored as node_lost), and the study measures all it was asked to."""
    from tuner.identity import space_identity
    from tuner.jobfile import TuningSpec
    from tuner.pipeline import optuna_storage
    from tuner.pipeline.recorded import ReplayStudyRunner, config_space_of
    from tuner.pipeline.tune import StudyTask, study_name

    c, _ = nodes
    extra = c.add_node(num_cpus=0, num_gpus=2, resources={"node_c": 1})
    c.wait_for_nodes()
    space, dev = _space_device(delay=0.3)
    pool = SlotPool(dev, 6)
    url = f"sqlite:///{tmp_path / 't.db'}"
    database = db.connect(url)
    try:
        assert extra.node_id in {n for _, n in pool.placement()}
        program, phash = space_identity(space)
        shapes = {"problem_size": list(space.problem_size)}
        pid = database.record_program(phash, shapes, "kernel_tuner", space.kernel, program)
        sid = database.record_structure(pid, phash, program, {"verdict": "recorded"}, 1)
        done = Counter()

        def on_trial(task, res) -> None:  # noqa: ANN001
            done[res.status] += 1
            if sum(done.values()) == 4:
                c.remove_node(extra)

        runner = ReplayStudyRunner(database, optuna_storage(database),
                                   TuningSpec(seed=1).make_sampler, pool, trials=24, seed=1,
                                   on_trial=on_trial)
        task = StudyTask(space.kernel, sid, phash, None, program, program,
                         config_space_of(space), pool.key, pool.spec,
                         study_name(space.kernel, phash, db.shapes_key(shapes), phash,
                                    pool.key))
        out = runner.run(task, phash)
        rows = database.history(phash, device_key=pool.key)
        assert out.measured == 24 == len(rows)
        assert len({db.config_hash(h.config) for h in rows}) == 24  # none twice
        assert all(len(database.measurements(h.trial_id)) == 1 for h in rows)
        assert {h.status for h in rows} <= {"ok", "node_lost", "runtime_error",
                                            "compile_error"}
        assert len(pool.slots) == 4  # the lost node's GPUs are gone; no slot waits for them
        alive = {n for _, n in pool.placement()}
        assert extra.node_id not in alive
    finally:
        database.close()
        pool.close()


def _slow_once(marker: str, delay_s: float):  # noqa: ANN202
    """A search shard task: the first shard to run anywhere takes ``delay_s`` longer (a
    worker that straggles), every other one runs as usual."""
    def task(payload: dict, shard):  # noqa: ANN001, ANN202
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            time.sleep(delay_s)
        except FileExistsError:
            pass
        return run_and_verify(payload, shard)
    return task


def test_a_straggling_shard_does_not_hold_the_search(nodes, tmp_path: Path) -> None:
    """One shard takes 30 s longer on its worker: it is re-issued to an idle worker once it
    is out far longer than the others take, the search ends long before 30 s, and the
    verified set is the one a single node finds."""
    local = search_program(SEARCHED, executor=LocalExecutor())
    ex = RayExecutor(address="auto", task=_slow_once(str(tmp_path / "slow"), 30.0),
                     speculation=Speculation(floor_s=0.5))
    heard = []
    ex.on_reissue = lambda sid, out_s, limit_s: heard.append((sid, out_s, limit_s))
    try:
        t0 = time.perf_counter()
        spread = search_program(SEARCHED, executor=ex)
        took = time.perf_counter() - t0
    finally:
        ex.close()
    assert (tmp_path / "slow").exists(), "no shard straggled: the test proved nothing"
    assert took < 15, f"the search took {took:.1f} s: the straggler held it"
    assert set(spread.verified) == set(local.verified) and local.verified
    assert ex.reissued and spread.reissued == ex.reissued
    assert [h[0] for h in heard] == ex.reissued
    assert all(out_s > limit_s >= 0.5 for _, out_s, limit_s in heard)


def test_a_node_lost_mid_launch_stores_every_trial_once(nodes, tmp_path: Path) -> None:
    """`tuner launch` of a replay job with a third GPU node whose slots hold every trial
    60 s: once the others have measured all but the trials stuck there, the node is removed;
    the launch finishes long before 60 s, every trial the study asked for is stored once
    (re-run on a live slot, or node_lost; a config the GPU itself failed keeps the file's
    status), and `tuner status` shows the job finished."""
    import sqlite3

    from tuner.pipeline import launch
    from tuner.serving import status

    c, ids = nodes
    extra = c.add_node(num_cpus=0, num_gpus=2, resources={"node_c": 1},
                       env_vars={"TUNER_FAULT_SLOW_TRIAL_S": "60"})
    c.wait_for_nodes()
    job = tmp_path / "replay.yaml"
    job.write_text(f"programs:\n  - kernel_tuner: {CONV}\ndevices: [replay]\n"
                   "tuning: {trials_per_structure: 16, seed: 3}\n")
    url = f"sqlite:///{tmp_path / 'r.db'}"
    stuck: list[int] = []

    def remove_when_stuck() -> None:
        last, since = -1, time.time()
        while time.time() - since < 120:
            time.sleep(0.2)
            try:
                with sqlite3.connect(tmp_path / "r.db", timeout=5) as conn:
                    n = conn.execute("SELECT count(*) FROM tuner_measurements "
                                     "WHERE attempt = 0").fetchone()[0]
            except sqlite3.Error:
                continue
            if n != last:
                last, since = n, time.time()
            elif n > 0 and time.time() - since > 1.5:  # no progress: trials held on node c
                break
        stuck.append(last)
        c.remove_node(extra)

    killer = threading.Thread(target=remove_when_stuck)
    killer.start()
    try:
        t0 = time.perf_counter()
        result = launch(job, db_url=url)
        took = time.perf_counter() - t0
    finally:
        killer.join()
    (rep,) = result.reports
    assert stuck and 0 < stuck[0] < 16, f"no trial was held on the slow node: {stuck}"
    assert took < 50, f"the launch waited for the lost node ({took:.0f} s)"
    assert rep.trials == 16
    with db.connect(url) as database:
        rows = database.history(_phash(read_kernel_tuner(CONV)), device_key=rep.device_key)
        firsts = [h for h in rows if h.attempt == 0]
        assert len(firsts) == len({db.config_hash(h.config) for h in firsts}) == 16
        for h in firsts:  # a failure is the node's loss, or the GPU's own, as the file says
            if h.status not in ("ok", "node_lost"):
                said = [m.message or "" for m in database.measurements(h.trial_id)]
                assert said and all(m.startswith("Kernel Tuner recorded") for m in said), said
        hosts = {m.host.split(":")[1] for h in firsts for m in database.measurements(h.trial_id)
                 if m.host}
        assert extra.node_id[:12] not in hosts and hosts <= {ids["a"][:12], ids["b"][:12]}
    st = status(url)
    assert [j.status for j in st.jobs] == ["finished"]
    assert st.programs[0].summary.timings == len(rows)


def test_a_driver_killed_on_the_cluster_resumes_with_nothing_lost(nodes, tmp_path: Path) -> None:
    """`tuner launch --address` of a cpu job joins the cluster, and is SIGKILLed once it has
    stored trials; `--resume` (this process, joined to the same cluster) keeps every stored
    measurement as it was, reuses the search shards and measures only what is missing, every
    trial once, on the cluster's cpu node."""
    import signal
    import sqlite3
    import subprocess

    from support import REPO, TUNER, write_job

    from tuner.pipeline import launch

    c, ids = nodes
    job = write_job(tmp_path, trials=6, structures=2)
    path = tmp_path / "k.db"
    url = f"sqlite:///{path}"
    proc = subprocess.Popen([*TUNER, "launch", str(job), "--db", url, "--address", c.address,
                             "--quiet"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    measured, deadline = 0, time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None and measured < 2:
            time.sleep(0.2)
            try:
                with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1) as conn:
                    measured = conn.execute("SELECT count(*) FROM tuner_measurements "
                                            "WHERE attempt = 0").fetchone()[0]
            except sqlite3.Error:
                continue
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert measured >= 2 and proc.returncode == -signal.SIGKILL, \
        f"the launch ended before tuning (exit {proc.returncode}): {proc.stderr.read().decode()[-3000:]}"
    with db.connect(url, migrate_schema=False) as database:
        kept = {m.measurement_id: (m.config, m.median_s, m.measured_at)
                for m in _tuned(database)}
        shards = database.row_counts()["tuner_search_shards"]
    assert len(kept) >= 2
    result = launch(job, db_url=url, resume=True)
    assert result.resumed
    (rep,) = result.reports
    assert rep.shards_reused == shards > 0
    with db.connect(url) as database:
        rows = _tuned(database)
        for m in rows:
            if m.measurement_id in kept:  # nothing measured was lost or redone
                assert (m.config, m.median_s, m.measured_at) == kept[m.measurement_id]
        firsts = [m for m in rows if m.attempt == 0]
        assert rep.trials == len(firsts)
        assert len({(m.structure_id, db.config_hash(m.config)) for m in firsts}) == len(firsts)
        hosts = {x.host.split(":")[1] for m in firsts for x in database.measurements(m.trial_id)}
        assert hosts == {ids["a"][:12]}  # node b builds for x86-64-v2: another device


def _tuned(database: db.Database) -> list:
    """Every measurement of the database's programs but the library path's."""
    return [m for p in database.programs() for m in database.history(p.program_hash)
            if not m.structure_hash.startswith(db.LIBRARY_PREFIX)]
