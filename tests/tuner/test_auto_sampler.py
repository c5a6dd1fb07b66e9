"""``sampler: auto``, the default (issue 20, item 5): TPE where no model has proven itself on
the device, the stored model where its held-out tau there clears ``AUTO_MIN_TAU``, saying
which; and the retrain at the end of a launch (``--no-train`` skips it)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from support import run_cli, shared_cache

import costmodel
import db
from tuner.jobfile import parse_job
from tuner.samplers import AUTO_MIN_TAU, DEFAULT_SAMPLER
from tuner.samplers.factory import sampler_factory
from tuner.samplers.model import ModelSampler

REAL = shared_cache("dedispersion", "A4000")
needs_cache = pytest.mark.skipif(not REAL.exists(), reason=f"no Kernel Tuner cache at {REAL}")
KEY = "replay:NVIDIA RTX A4000"


def small_cache(tmp_path: Path, every: int = 20) -> Path:
    """Every ``every``-th configuration of a real dedispersion cache (A4000)."""
    doc = json.loads(gzip.decompress(REAL.read_bytes()))
    doc["cache"] = dict(list(doc["cache"].items())[::every])
    path = tmp_path / "A4000.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def test_a_job_file_with_sampler_auto_validates_and_auto_is_the_default(tmp_path):
    job = parse_job("programs: [softmax_rows]\ntuning: {sampler: auto}\n",
                    str(tmp_path / "j.yaml"), tmp_path)
    assert job.tuning.sampler == "auto"
    assert parse_job("programs: [softmax_rows]\n", str(tmp_path / "j.yaml"),
                     tmp_path).tuning.sampler == DEFAULT_SAMPLER == "auto"


@needs_cache
def test_auto_picks_tpe_without_a_model_and_the_model_once_it_is_good(tmp_path):
    url = f"sqlite:///{tmp_path / 'auto.db'}"
    said: list[str] = []
    with db.connect(url) as database:
        costmodel.import_kernel_tuner(database, small_cache(tmp_path))
        none = sampler_factory("auto", 0, database, KEY, said.append)
        assert none.chosen.startswith("tpe") and not isinstance(none(), ModelSampler)
        assert "TPE" in said[-1] and KEY in said[-1]
        out = costmodel.train(database, kind="gbdt", options={"trees": 300})
        tau = out["held_out"][KEY]["kendall_tau"]
        assert tau >= AUTO_MIN_TAU  # a real GPU's space, 20% of it held out
        good = sampler_factory("auto", 0, database, KEY, said.append)
        assert good.chosen.startswith(f"model {out['model_id']}")
        assert isinstance(good(), ModelSampler)
        assert f"held-out tau {tau:.2f}" in said[-1]
        # another device: the model (of every device) has no held-out figure there: TPE
        other = sampler_factory("auto", 0, database, "replay:NVIDIA A100-PCIE-40GB",
                                said.append)
        assert other.chosen.startswith("tpe") and "no held-out figure" in said[-1]


@needs_cache
def test_a_launch_retrains_at_its_end_and_no_train_skips_it(tmp_path):
    cache = small_cache(tmp_path, every=1)
    job = tmp_path / "job.yaml"
    job.write_text(f"programs:\n  - kernel_tuner: {cache}\ndevices: [replay]\n"
                   "tuning: {trials_per_structure: 30, seed: 1}\n")
    url = f"sqlite:///{tmp_path / 'skip.db'}"
    run = run_cli("launch", str(job), "--db", url, "--no-train", timeout=600)
    assert run.returncode == 0, run.stderr
    assert "not retrained (--no-train)" in run.stdout + run.stderr
    assert f"sampler on {KEY}: tpe (no cost model" in run.stdout
    with db.connect(url) as database:
        assert not db.models(database)
    url = f"sqlite:///{tmp_path / 'train.db'}"
    run = run_cli("launch", str(job), "--db", url, "--json", timeout=600)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    (trained,) = result["trained"]
    assert trained["trained"], trained.get("reason")
    assert trained["device_key"] == KEY and trained["rows"] >= 5
    with db.connect(url) as database:
        (model,) = db.models(database)
    assert model.kind == "gbdt" and model.device_key == KEY and "held_out" in model.metrics
