"""The retrain at a launch's end on a model trained on many rows (``costmodel.update``): the
model a launch uses is taught what was measured since, in place of fitting the whole database
again; a full model and its newest update are kept; ``tuner model train`` still fits in full."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from support import run_cli, shared_cache

import costmodel
import db
from costmodel import evaluate, load_model, samples_from_rows
from tuner.pipeline.run import retrain

REAL = shared_cache("dedispersion", "A4000")
KEY = "replay:NVIDIA RTX A4000"
pytestmark = pytest.mark.skipif(not REAL.exists(), reason=f"no Kernel Tuner cache at {REAL}")


def part(tmp_path: Path, start: int, every: int = 16) -> Path:
    """Every ``every``-th configuration of a real dedispersion cache (A4000) from ``start``:
    parts of one space, as later launches would measure more of it (the first, every 4th
    from 0, holds more than the later ones together: a model is taught fewer rows than it
    was fitted on)."""
    doc = json.loads(gzip.decompress(REAL.read_bytes()))
    doc["cache"] = dict(list(doc["cache"].items())[start::every])
    path = tmp_path / f"A4000_{start}.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def tau_on_new(database: db.Database, model_blob: bytes, after: int) -> float:
    rows = db.training_rows(database, KEY, after=after)
    samples = samples_from_rows(rows)
    got = evaluate([s.group for s in samples], [s.seconds for s in samples],
                   load_model(model_blob).predict(samples))
    return got["kendall_tau"]


def test_a_model_is_taught_new_measurements_and_only_its_newest_update_is_kept(tmp_path):
    with db.connect(f"sqlite:///{tmp_path / 'u.db'}") as database:
        costmodel.import_kernel_tuner(database, part(tmp_path, 0, every=4))
        full = costmodel.train(database, kind="gbdt", options={"trees": 60, "leaves": 15})
        first_rows = full["rows"]
        assert costmodel.update(database, KEY, from_rows=100)["trained"] is False  # nothing new
        # fewer rows than ``from_rows``: not taught, fitted again by the caller
        costmodel.import_kernel_tuner(database, part(tmp_path, 1))
        assert costmodel.update(database, KEY, from_rows=first_rows + 1) is None

        before_blob = db.best_model(database, KEY).weights
        out = costmodel.update(database, KEY, from_rows=100)
        assert out["updated"] and out["from"] == full["model_id"]
        assert out["device_key"] == db.ALL_DEVICES  # the model taught keeps its key
        assert out["new_rows"] == len(db.training_rows(database, KEY, after=full[
            "newest_measurement"]))
        assert out["rows"] == first_rows + out["new_rows"]
        assert -1 <= out["before"]["kendall_tau"] <= 1
        taught = db.best_model(database, KEY)
        assert taught.id == out["model_id"] and taught.trained_on["full_fit"] == full["model_id"]
        assert taught.metrics["update"]["before"] == out["before"]
        assert taught.metrics["held_out"] == full["held_out"]  # the base's, said as such
        # it learned the new configs: ranks them better than before it was taught
        after = full["newest_measurement"]
        assert tau_on_new(database, taught.weights, after) > \
            tau_on_new(database, before_blob, after) + 0.05
        model = load_model(taught.weights)
        assert model.level.num_trees() == 60 + costmodel.UPDATE_TREES

        # another launch's update replaces the first update; the full fit stays
        costmodel.import_kernel_tuner(database, part(tmp_path, 2))
        again = costmodel.update(database, KEY, from_rows=100)
        assert again["from"] == out["model_id"] and again["model_id"] > out["model_id"]
        # taught from the full fit again, every row since: the model does not grow per launch
        assert again["full_fit"] == full["model_id"]
        assert again["since_full_fit"] == out["new_rows"] + again["new_rows"]
        assert load_model(db.best_model(database, KEY).weights).level.num_trees() == \
            60 + costmodel.UPDATE_TREES
        ids = sorted(m.id for m in db.models(database))
        assert ids == [full["model_id"], again["model_id"]]

        listed = run_cli("model", "list", "--db", f"sqlite:///{tmp_path / 'u.db'}")
        assert listed.returncode == 0, listed.stderr
        assert (f"model {full['model_id']} taught the launches' measurements since (2 update(s)"
                in listed.stdout)
        # ``tuner model train`` fits in full after an update: it is not "up to date"
        refit = costmodel.train(database, kind="gbdt", options={"trees": 20, "leaves": 15})
        assert refit["trained"] and refit["rows"] == again["rows"]
        assert "full_fit" not in db.best_model(database, KEY).trained_on


def test_a_launch_retrain_teaches_the_model_it_used(tmp_path, monkeypatch):
    """``retrain`` (the launch's last step): the model a launch on the device uses is taught,
    and what it did is said in one line."""
    monkeypatch.setattr(costmodel._update, "UPDATE_FROM_ROWS", 100)
    with db.connect(f"sqlite:///{tmp_path / 'r.db'}") as database:
        costmodel.import_kernel_tuner(database, part(tmp_path, 0, every=4))
        full = costmodel.train(database, kind="gbdt", options={"trees": 30, "leaves": 15})
        costmodel.import_kernel_tuner(database, part(tmp_path, 3))
        said: list[str] = []
        (done,) = retrain(database, [KEY], 30.0, said.append)
        assert done["updated_from"] == full["model_id"] and done["trained"]
        assert done["new_rows"] > 0 and done["held_out_tau"] is not None
        assert (f"model {full['model_id']} taught the {done['new_rows']} measurements since it "
                f"was fitted, {done['new_rows']} of them new on {KEY}") in said[-1]
        assert f"(model {full['model_id']} had ranked those at tau" in said[-1]
        assert np.isfinite(done["seconds"])


def test_old_structures_learned_again_beside_the_new_are_drawn_whole_and_seeded():
    from costmodel._update import _replayed

    counts = {f"s{i}": 10 for i in range(50)}
    picked = _replayed(counts, {"s0", "s1"}, 95, seed=7)
    assert not picked & {"s0", "s1"} and len(picked) == 10  # whole structures to >= 95 rows
    assert picked == _replayed(counts, {"s0", "s1"}, 95, seed=7)
    assert picked != _replayed(counts, {"s0", "s1"}, 95, seed=8)
    assert _replayed(counts, set(counts), 95, seed=7) == set()  # nothing else learned


def test_the_retrain_benchmark_says_what_is_missing_and_exits_2(tmp_path, capsys):
    from support import load_script

    bench = load_script("benchmarks/retrain.py")
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    assert bench.main(["--db", url, "--device", KEY]) == 2
    assert f"no ok measurements of {KEY!r}" in capsys.readouterr().err


def test_a_new_device_teaches_only_a_model_of_its_kind(tmp_path):
    """A model of Kernel Tuner caches knows nothing of a CPU's µGraphs: a CPU's launch does
    not teach it (the caller fits one on the CPU's rows); nor does a GPU it never trained on
    (its siblings' measurements rank it), nor one trained on too few rows."""
    from costmodel._update import _base

    with db.connect(f"sqlite:///{tmp_path / 'k.db'}") as database:
        stored = db.save_model(database, kind="gbdt", device_key=db.ALL_DEVICES,
                               feature_version=costmodel.FEATURE_VERSION, weights=b"",
                               trained_on={"rows": 6000, "devices": [KEY]}, metrics={})
        assert _base(database, "cpu:AMD EPYC (family 25 model 17):2c", 100) is None
        assert _base(database, "replay:NVIDIA RTX A6000", 100) is None
        assert _base(database, KEY, 100).id == stored
        assert _base(database, KEY, 6001) is None  # too few rows


def test_the_new_device_benchmark_says_what_is_missing_and_exits_2(tmp_path, capsys):
    from support import load_script

    bench = load_script("benchmarks/retrain_new_device.py")
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    assert bench.main(["--db", url, "--base-device", KEY, "--device", "cpu:x"]) == 2
    assert f"no ok measurements of {KEY!r}" in capsys.readouterr().err
    assert bench.main(["--db", url, "--base-device", KEY, "--device", "cpu:x",
                       "--launch", "0"]) == 2
    assert "--launch and --next must be >= 1" in capsys.readouterr().err


@pytest.mark.skipif(not shared_cache("dedispersion", "A6000").exists(),
                    reason="no Kernel Tuner caches")
def test_a_model_of_every_device_is_taught_every_devices_rows_since_its_full_fit(tmp_path):
    other = shared_cache("dedispersion", "A6000")
    doc = json.loads(gzip.decompress(other.read_bytes()))
    with db.connect(f"sqlite:///{tmp_path / 'two.db'}") as database:
        def other_part(start: int, every: int = 16) -> Path:
            d = dict(doc, cache=dict(list(doc["cache"].items())[start::every]))
            path = tmp_path / f"A6000_{start}.json.gz"
            path.write_bytes(gzip.compress(json.dumps(d).encode()))
            return path

        costmodel.import_kernel_tuner(database, part(tmp_path, 0, every=4))
        costmodel.import_kernel_tuner(database, other_part(0, every=4))
        full = costmodel.train(database, kind="gbdt", options={"trees": 20, "leaves": 15})
        (key_b,) = set(full["devices"]) - {KEY}
        costmodel.import_kernel_tuner(database, other_part(1))  # B measured first ...
        costmodel.import_kernel_tuner(database, part(tmp_path, 1))  # ... then A
        first = costmodel.update(database, KEY, from_rows=100)
        since = full["newest_measurement"]
        b_rows = len(db.training_rows(database, key_b, after=since))
        a_rows = len(db.training_rows(database, KEY, after=since))
        # the model of every device learns each device's rows since its full fit
        assert first["updated"] and first["since_full_fit"] == a_rows + b_rows
        assert first["new_rows"] == a_rows
        assert costmodel.update(database, key_b, from_rows=100)["trained"] is False
        costmodel.import_kernel_tuner(database, other_part(2))
        second = costmodel.update(database, key_b, from_rows=100)
        assert second["updated"] and second["from"] == first["model_id"]
        b_new = len(db.training_rows(database, key_b, after=since)) - b_rows
        assert second["new_rows"] == b_new and second["since_full_fit"] == a_rows + b_rows + b_new
        assert costmodel.update(database, KEY, from_rows=100)["trained"] is False


INTEL_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / \
    "dataset_intel-r-xeon-r-processor-family-6-model-167.jsonl.gz"


def cpu_dataset(tmp_path: Path, name: str, device_key: str, programs: slice):
    """Some programs of the repository's Intel Xeon dataset file, as measured on
    ``device_key`` (a CPU's file imported, or a launch on another CPU)."""
    lines = [json.loads(line) for line in gzip.decompress(INTEL_FILE.read_bytes()).splitlines()]
    keep = {p["key"] for p in [d for d in lines if d["kind"] == "program"][programs]}
    out = []
    for d in lines:
        if d["kind"] == "header":
            out.append(dict(d, device_key=device_key, cpu=device_key.split(":")[1]))
        elif d.get("key" if d["kind"] == "program" else
                   "program" if d["kind"] == "structure" else "p") in keep:
            out.append(dict(d, d=device_key) if d["kind"] == "m" else d)
    path = tmp_path / f"{name}.jsonl.gz"
    path.write_bytes(gzip.compress("\n".join(json.dumps(d) for d in out).encode() + b"\n"))
    return costmodel.read_dataset(path)


def test_a_cpu_the_model_never_trained_on_teaches_the_model_of_every_device(
        tmp_path, monkeypatch):
    """Another CPU's dataset file trained on, launches on this CPU: its rows teach the model
    of every device, whose held-out figure here is how it ranked each launch's rows before
    learning them — what the next launch's ``sampler: auto`` weighs — not a model fitted on
    one launch's rows."""
    from tuner.samplers.factory import held_out_tau

    monkeypatch.setattr(costmodel._update, "UPDATE_FROM_ROWS", 100)
    replays: list[str] = []  # the devices whose structures are read whole (replayed or new)
    rows_of = db.training_rows

    def spy(database, device_key=None, **kw):
        if kw.get("structures") is not None:
            replays.append(device_key)
        return rows_of(database, device_key, **kw)

    monkeypatch.setattr(db, "training_rows", spy)
    other, here = "cpu:Other CPU:2c", "cpu:This CPU:2c"
    with db.connect(f"sqlite:///{tmp_path / 'new.db'}") as database:
        costmodel.import_dataset(database, cpu_dataset(tmp_path, "other", other, slice(0, 6)))
        costmodel.import_kernel_tuner(database, part(tmp_path, 0, every=8))  # a GPU's cache too
        full = costmodel.train(database, kind="gbdt", options={"trees": 30, "leaves": 15})
        assert sorted(full["devices"]) == sorted([other, KEY])
        costmodel.import_dataset(database, cpu_dataset(tmp_path, "l1", here, slice(6, 8)))
        said: list[str] = []
        (done,) = retrain(database, [here], 30.0, said.append)
        # replayed beside the new CPU's rows: the other CPU's structures, not the GPU's space
        assert set(replays) == {here, other}
        first_rows = len(db.training_rows(database, here))
        assert done["updated_from"] == full["model_id"] and done["new_rows"] == first_rows
        assert "it had never trained on this device" in said[-1] and here in said[-1]
        assert done["device_key"] == here and done["model_device_key"] == db.ALL_DEVICES
        taught = db.best_model(database, here)
        assert taught.device_key == db.ALL_DEVICES
        assert sorted(taught.trained_on["devices"]) == sorted([other, KEY, here])
        figure = taught.metrics["held_out"][here]
        assert figure["n"] == first_rows and figure["launches"] == 1
        assert figure["kendall_tau"] == taught.metrics["update"]["before"]["kendall_tau"]
        assert held_out_tau(taught, here) == pytest.approx(figure["kendall_tau"])
        assert taught.metrics["held_out"][other] == full["held_out"][other]
        assert [m.id for m in db.models(database)] == [taught.id, full["model_id"]]  # no own fit

        # the next launch: taught again from the full fit, every row of this CPU; the figure
        # pools both launches' (configs the models never saw)
        costmodel.import_dataset(database, cpu_dataset(tmp_path, "l2", here, slice(8, 10)))
        again = costmodel.update(database, here, from_rows=100)
        rows_now = len(db.training_rows(database, here))
        assert again["from"] == taught.id and again["since_full_fit"] == rows_now
        assert again["new_rows"] == rows_now - first_rows
        pooled = db.best_model(database, here).metrics["held_out"][here]
        assert pooled["n"] == rows_now and pooled["launches"] == 2
        b = again["before"]["kendall_tau"]
        assert pooled["kendall_tau"] == pytest.approx(
            (figure["kendall_tau"] * first_rows + b * again["new_rows"]) / rows_now)
        assert costmodel.update(database, other, from_rows=100)["trained"] is False
    listed = run_cli("model", "list", "--db", f"sqlite:///{tmp_path / 'new.db'}")
    assert listed.returncode == 0, listed.stderr
    assert "but on 1 CPU(s) it never trained on, how the updates ranked" in listed.stdout


def test_a_retrain_that_fails_is_said_and_the_launch_goes_on(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("LightGBM ran out of memory")

    monkeypatch.setattr(costmodel, "update", broken)
    said: list[str] = []
    with db.connect(f"sqlite:///{tmp_path / 'f.db'}") as database:
        (done,) = retrain(database, [KEY], 30.0, said.append)
    assert not done["trained"] and done["reason"] == "RuntimeError: LightGBM ran out of memory"
    assert said == [f"cost model: not retrained for {KEY}: RuntimeError: LightGBM ran out of "
                    "memory"]
