"""The dataset file (issue 20, item 3): ``tuner export dataset`` appends what a file lacks,
``tuner import dataset`` stores it (again: nothing new), a malformed file exits 2 naming the
file, the line and what is wrong and writes nothing, and the H100 sweep in benchmarks/data
imports the same way as any µGraph measurements."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from support import kernel_tuner_cache, mha_structure, run_main

import costmodel
import db
from kernels import OK, RUNTIME_ERROR

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "benchmarks" / "data" / "sweep_h100_76096fd.jsonl.gz"
CPU = "cpu:Some Test CPU:2c"


def _measure(database: db.Database, configs: list[tuple[dict, str, float | None]]) -> None:
    """Store measurements of one of mha's real structures on a cpu key (what a launch
    stores: a program, its structure, one trial and measurement per config)."""
    graph = mha_structure("heads")
    db.record_measured_space(
        database, program_hash="mha-small", shapes={"Q": [4, 8, 16]}, dtype="float16",
        name="mha", graph=graph, structure_hash="s" * 64, structure=graph, device_key=CPU,
        configs=[db.MeasuredConfig(c, st, t, None if st == OK else "failed to run")
                 for c, st, t in configs])


def _training(url: str) -> list[tuple]:
    with db.connect(url) as database:
        return sorted((r.device_key, json.dumps(r.config, sort_keys=True), r.median_s)
                      for r in db.training_rows(database))


def test_export_appends_import_is_idempotent_and_round_trips(capsys, tmp_path):
    src = f"sqlite:///{tmp_path / 'src.db'}"
    with db.connect(src) as database:
        _measure(database, [({"g0": 4, "F": 2}, OK, 1e-4), ({"g0": 2, "F": 4}, OK, 2e-4),
                            ({"g0": 1, "F": 8}, RUNTIME_ERROR, None)])
        costmodel.import_kernel_tuner(database, kernel_tuner_cache(tmp_path))
    file = tmp_path / "dataset_test.jsonl.gz"
    code, out, err = run_main(capsys, "export", "dataset", str(file), "--devices", "",
                              "--db", src, "--json")
    assert code == 0, err
    first = json.loads(out)
    assert first["added"] == 3 + 49 and first["bytes"] == file.stat().st_size
    header = json.loads(gzip.open(file, "rt").readline())
    assert header["kind"] == "header" and header["version"] == costmodel.FORMAT_VERSION
    assert {"cpu", "isa", "feature_version", "device_key"} <= set(header)
    # nothing new: nothing written
    code, out, _ = run_main(capsys, "export", "dataset", str(file), "--devices", "",
                            "--db", src, "--json")
    assert json.loads(out)["added"] == 0 and file.stat().st_size == first["bytes"]
    # a later run appends its new measurements; the earlier ones stay as they were
    with db.connect(src) as database:
        _measure(database, [({"g0": 8, "F": 1}, OK, 3e-4)])
    code, out, _ = run_main(capsys, "export", "dataset", str(file), "--devices", "cpu:",
                            "--db", src, "--json")
    assert json.loads(out)["added"] == 1 and file.stat().st_size > first["bytes"]
    assert len(costmodel.read_dataset(file).measurements) == 3 + 49 + 1
    # into a fresh database: the same training rows; again: nothing added
    dst = f"sqlite:///{tmp_path / 'dst.db'}"
    code, out, err = run_main(capsys, "import", "dataset", str(file), "--db", dst, "--json")
    assert code == 0, err
    assert json.loads(out)["added"] == 53
    assert _training(dst) == _training(src)
    code, out, _ = run_main(capsys, "import", "dataset", str(file), "--db", dst, "--json")
    assert code == 0 and json.loads(out)["added"] == 0


def _exported_pair(capsys, tmp_path) -> tuple:
    """A dataset file of two measured configs, exported as a user would, and its lines."""
    src = f"sqlite:///{tmp_path / 'src.db'}"
    with db.connect(src) as database:
        _measure(database, [({"g0": 4, "F": 2}, OK, 1e-4), ({"g0": 2, "F": 4}, OK, 2e-4)])
    good = tmp_path / "good.jsonl.gz"
    assert run_main(capsys, "export", "dataset", str(good), "--db", src)[0] == 0
    return good, gzip.open(good, "rt").read().splitlines()


def test_a_malformed_dataset_exits_2_names_the_line_and_writes_nothing(capsys, tmp_path):
    good, lines = _exported_pair(capsys, tmp_path)
    last = json.loads(lines[-1])
    last["st"] = "fast"
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(("\n".join([*lines[:-1], json.dumps(last)]) + "\n").encode()))
    dst = f"sqlite:///{tmp_path / 'dst.db'}"
    with db.connect(dst) as database:
        before = database.row_counts()
    code, _, err = run_main(capsys, "import", "dataset", str(good), str(bad), "--db", dst)
    assert code == 2 and f"bad.jsonl.gz:{len(lines)}" in err and "'fast'" in err
    assert "nothing was imported" in err and len(err.strip().splitlines()) == 1
    with db.connect(dst) as database:
        assert database.row_counts() == before
    not_gzip = tmp_path / "x.jsonl.gz"
    not_gzip.write_bytes(b"\x1f\x8b garbage")
    code, _, err = run_main(capsys, "import", "dataset", str(not_gzip), "--db", dst)
    assert code == 2 and "x.jsonl.gz" in err


def test_a_config_the_structure_cannot_take_is_refused_at_its_line(capsys, tmp_path):
    """A measurement whose config is not whole numbers, or binds other symbols than its
    structure's, once imported fine and then failed every ``tuner model train`` after."""
    good, lines = _exported_pair(capsys, tmp_path)
    dst = f"sqlite:///{tmp_path / 'dst.db'}"
    for config, fragment in [({"g0": "4", "F": 2}, "'g0' is not a whole number"),
                             ({"g0": 4, "Q": 2}, "binds ['Q', 'g0']"),
                             ({"g0": 4, "F": 2.0}, "'F' is not a whole number")]:
        last = {**json.loads(lines[-1]), "c": config}
        bad = tmp_path / "bad.jsonl"
        bad.write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")
        code, _, err = run_main(capsys, "import", "dataset", str(bad), "--db", dst)
        assert code == 2 and f"bad.jsonl:{len(lines)}: " in err and fragment in err, err
    with db.connect(dst) as database:
        assert not db.training_rows(database)
    # the knobs beside the symbols, or no symbols at all (the AStitch default), are configs
    last = {**json.loads(lines[-1]), "c": {"g0": 4, "F": 2, "split": 2}}
    ok = tmp_path / "ok.jsonl"
    ok.write_text("\n".join([*lines[:-1], json.dumps(last), json.dumps({**last, "c": {}})])
                  + "\n")
    assert run_main(capsys, "import", "dataset", str(ok), "--db", dst)[0] == 0


def test_the_h100_sweep_imports_as_gpu_ugraph_data(capsys, tmp_path):
    url = f"sqlite:///{tmp_path / 'h100.db'}"
    code, out, err = run_main(capsys, "import", "dataset", str(SWEEP), "--db", url, "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["devices"] == ["cuda:NVIDIA H100 80GB HBM3:sm_90"] and res["programs"] == 10
    assert res["added"] > 400 and res["structures"] == 30
    with db.connect(url) as database:
        rows = db.training_rows(database)
        samples = costmodel.samples_from_rows(rows[:40])  # features of the stored µGraphs
    assert len(rows) > 400 and all(s.seconds > 0 for s in samples)
    code, out, _ = run_main(capsys, "import", "dataset", str(SWEEP), "--db", url, "--json")
    assert json.loads(out)["added"] == 0


def test_a_sweep_with_configs_the_lowering_refused_imports_its_measurements(capsys, tmp_path):
    """A later sweep records the configs the lowering refused (status ``invalid``: a Triton
    tile over the H100's shared memory), which are no measurement; the file was refused
    whole ("status 'invalid'; one of ok, ...") and nothing of it could be imported."""
    sweep = ROOT / "benchmarks" / "data" / "sweep_h100_4052033.jsonl.gz"
    url = f"sqlite:///{tmp_path / 'h100.db'}"
    code, out, err = run_main(capsys, "import", "dataset", str(sweep), "--db", url, "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["not_measured"] == 12 and res["added"] == res["measurements"] == 102
    with db.connect(url) as database:
        statuses = {r.status for r in db.dataset_rows(database, None)}
    assert OK in statuses and "invalid" not in statuses
    code, out, err = run_main(capsys, "import", "dataset", str(sweep), "--db", url)
    assert code == 0 and "12 trials of configs the lowering refused" in out, out + err
