"""A GPU the device table lacks (issue 20, item 1): a real Kernel Tuner cache renamed to an
RTX 2080 Ti imports, trains, evaluates, predicts and tunes model-guided; each command says in
one line what is unknown, none stops with an error."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from support import run_cli, run_main, shared_cache

import costmodel
import db

REAL = shared_cache("convolution", "A4000")
needs_cache = pytest.mark.skipif(not REAL.exists(), reason=f"no Kernel Tuner cache at {REAL}")
GPU = "NVIDIA GeForce RTX 2080 Ti"
KEY = f"replay:{GPU}"
NOTE = "is not in kernels/hardware.py's table"


def unknown_gpu_cache(tmp_path: Path, every: int = 8) -> Path:
    """Every ``every``-th configuration of the A4000's real convolution cache, filed under a
    GPU the device table does not list (as a user's own cache would be)."""
    doc = json.loads(gzip.decompress(REAL.read_bytes()))
    doc["device_name"] = GPU
    doc["cache"] = dict(list(doc["cache"].items())[::every])
    path = tmp_path / "RTX2080Ti.json.gz"
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


def _notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if NOTE in line]


def test_the_device_profile_of_an_unknown_gpu_is_its_closest_sibling() -> None:
    known = costmodel.device_profile("replay:NVIDIA RTX A4000")
    assert known.known and known.note is None
    p = costmodel.device_profile(KEY)
    assert not p.known and p.spec.kind == "cuda" and p.spec.name == GPU
    assert p.sibling in ("RTX A4000", "RTX A6000")  # shares "RTX"
    assert GPU in p.note and p.sibling in p.note
    amd = costmodel.device_profile("replay:AMD Radeon RX 7900 XTX")
    assert amd.spec.kind == "hip" and not amd.known
    sm = costmodel.device_profile("cuda:NVIDIA GeForce RTX 3090:sm_86")
    assert sm.spec.arch == "sm_86" and sm.sibling in ("RTX A4000", "RTX A6000")
    # the features say which devices' speeds are guessed
    a = costmodel.featurize_params({"x": 1}, ["x"], [8], p.spec, group="g", program="p",
                                   device=KEY, known_device=False)
    b = costmodel.featurize_params({"x": 1}, ["x"], [8], known.spec, group="g", program="p",
                                   device=KEY)
    assert a.graph[-1] == 1.0 and b.graph[-1] == 0.0


@needs_cache
def test_import_train_eval_predict_and_tune_on_a_gpu_the_table_lacks(capsys, tmp_path):
    url = f"sqlite:///{tmp_path / 'any.db'}"
    cache = unknown_gpu_cache(tmp_path)
    code, out, err = run_main(capsys, "import", "kernel-tuner", str(cache), "--db", url, "--json")
    assert code == 0, err
    assert json.loads(out)["device_key"] == KEY
    code, out, err = run_main(capsys, "model", "train", "--kind", "gbdt", "--db", url, "--json")
    assert code == 0, err
    trained = json.loads(out)
    assert trained["trained"] and len(_notes(err)) == 1 and GPU in _notes(err)[0]
    assert trained["held_out"][KEY]["kendall_tau"] > 0.5  # it learned this GPU from its data
    code, out, err = run_main(capsys, "model", "eval", "--split", "random", "--steps", "30",
                              "--db", url, "--json")
    assert code == 0, err
    assert len(_notes(err)) == 1 and json.loads(out)["baselines"]["gbdt"]["kendall_tau"] > 0.5
    code, out, err = run_main(capsys, "model", "predict", "convolution_kernel", "--device", KEY,
                              "--top", "3", "--db", url, "--json")
    assert code == 0, err
    assert len(json.loads(out)["top"]) == 3 and len(_notes(err)) == 1
    # a model-guided study of its space: the stored model ranks it, the launch says what is
    # unknown in one line, and the studied configs are the file's
    job = tmp_path / "job.yaml"
    job.write_text(f"programs:\n  - kernel_tuner: {cache}\ndevices: [replay]\n"
                   "tuning: {trials_per_structure: 12, seed: 0, sampler: model}\n")
    run = run_cli("launch", str(job), "--db", url, "--no-train", timeout=600)
    assert run.returncode == 0, run.stderr
    said = run.stdout + run.stderr
    assert len(_notes(said)) == 1
    assert f"cost model {trained['model_id']} (gbdt" in said
    assert f"sampler on {KEY}: model {trained['model_id']}" in run.stdout
    with db.connect(url) as database:
        assert len(db.models(database)) == 1  # --no-train: nothing retrained


@needs_cache
def test_a_gpu_never_trained_on_is_ranked_by_its_siblings_in_the_sampler_and_predict(tmp_path):
    """The model sampler and `tuner model predict` name a config as the training rows do
    (``costmodel.group_name``), so a GPU the model never trained on gets its siblings'
    measurements of the same configs.  They named it otherwise, found no sibling's rank of
    any config and ranked the GPU by the trees alone: here 0 of 837 configs, and Kendall tau
    0.634 against the GPU's own times where the siblings give 0.749."""
    import re
    from dataclasses import replace

    import optuna
    from scipy.stats import kendalltau

    from tuner.api.models import predict_configs
    from tuner.pipeline.recorded import config_space_of
    from tuner.pipeline.tune import Codec, StudyTask
    from tuner.samplers.model import ModelSampler, study_samples

    url = f"sqlite:///{tmp_path / 'siblings.db'}"
    with db.connect(url) as database:
        for gpu in ("A6000", "A100"):  # two NVIDIA GPUs the table lists: the siblings
            doc = json.loads(gzip.decompress(shared_cache("convolution", gpu).read_bytes()))
            doc["cache"] = dict(list(doc["cache"].items())[::8])
            path = tmp_path / f"{gpu}.json.gz"
            path.write_bytes(gzip.compress(json.dumps(doc).encode()))
            costmodel.import_kernel_tuner(database, path)
        costmodel.train(database, kind="gbdt", options={"trees": 60, "leaves": 15})
        model, _ = costmodel.model_for(database, KEY)
        structure = database.structures(database.programs()[0].program_id)[0]
        configs = db.structure_configs(database, structure.id)
    # the GPU's own times (the A4000's, renamed), which no model here was trained on
    own = json.loads(gzip.decompress(unknown_gpu_cache(tmp_path, every=8).read_bytes()))
    keys = own["tune_params_keys"]
    truth = {tuple(c[k] for k in keys): c["time"] for c in own["cache"].values()
             if isinstance(c.get("time"), float)}

    def tau(configs: list[dict], predicted) -> float:
        pairs = [(p, truth[tuple(c[k] for k in keys)])
                 for c, p in zip(configs, predicted, strict=True)
                 if tuple(c[k] for k in keys) in truth]
        assert len(pairs) > 400
        return kendalltau(*zip(*pairs, strict=True))[0]

    task = StudyTask("convolution_kernel", structure.id, structure.structure_hash, None,
                     structure.structure, {}, None, KEY, costmodel.device_profile(KEY).spec,
                     "siblings")
    kept, samples = study_samples(task, configs)
    found = np.isfinite(model.measured.ranks(samples))
    assert found.mean() > 0.9, f"siblings' ranks found for {found.sum()} of {len(samples)}"
    assert tau(kept, model.predict(samples)) > 0.7
    _, ranked, measured = predict_configs(url, "convolution_kernel", None, KEY)
    assert tau([r["config"] for r in ranked], [r["predicted_s"] for r in ranked]) > 0.7
    assert measured is not None and measured > 0.9 * len(ranked)
    # a launch's sampler says, per study, how many candidates the siblings measured
    said: list[str] = []
    space = config_space_of(costmodel.read_kernel_tuner(unknown_gpu_cache(tmp_path, every=8)))
    codec = Codec(space.params)
    ModelSampler(model, log=said.append).bind(replace(task, space=space), codec,
                                              codec.distributions(optuna))
    assert len(said) == 1 and "never trained on" in said[0], said
    found, total = map(int, re.search(r"measured (\d+) of its (\d+) candidate", said[0]).groups())
    # the candidates are the file's configs (546), not a sample of the product of the
    # parameters' values, most of which no GPU ran (measured then: 147 of 2048)
    assert 500 < total < 600 and found > 0.9 * total, said[0]
    trained_on = replace(task, device_key="replay:NVIDIA RTX A6000", space=space)
    ModelSampler(model, log=said.append).bind(trained_on, codec, codec.distributions(optuna))
    assert len(said) == 1  # a device the model trained on: nothing to say


SWEEP = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "sweep_h100_4052033.jsonl.gz"
H100 = "cuda:NVIDIA H100 80GB HBM3:sm_90"


def test_predict_ranks_a_ugraph_program_on_a_gpu_never_trained_on_by_its_siblings(
        capsys, tmp_path):
    """`tuner model predict` of a suite program's µGraph structures on an H200, with a model
    trained on an H100 sweep only: the H100's measurements of the same configs rank them
    (the predict path named configs otherwise until 6f746de and found none), and predict says
    how many, as a launch's model sampler does."""
    from scipy.stats import kendalltau

    url = f"sqlite:///{tmp_path / 'sweep.db'}"
    code, _, err = run_main(capsys, "import", "dataset", str(SWEEP), "--db", url, "--json")
    assert code == 0, err
    code, _, err = run_main(capsys, "model", "train", "--kind", "gbdt", "--db", url, "--json")
    assert code == 0, err
    with db.connect(url) as database:
        measured = {(r.structure_hash, json.dumps(r.config, sort_keys=True)): r.median_s
                    for r in db.training_rows(database)
                    if r.device_key == H100 and r.program == "lora"}
    h200 = "cuda:NVIDIA H200:sm_90"
    code, out, err = run_main(capsys, "model", "predict", "lora", "--device", h200,
                              "--top", "100000", "--db", url, "--json")
    assert code == 0, err
    got = json.loads(out)
    pairs = [(r["predicted_s"], measured[k]) for r in got["top"]
             if (k := (r["structure"], json.dumps(r["config"], sort_keys=True))) in measured]
    # each distinct kernel once (canonical configs), the H100's measurements found for those
    # it measured as a launch stores them
    kernels = {(r["structure"], json.dumps(r["config"], sort_keys=True)) for r in got["top"]}
    assert len(kernels) == got["candidates"] == len(got["top"]) > 500
    assert len(pairs) >= 20 and got["siblings_measured"] >= len(pairs)
    assert f"other devices measured {got['siblings_measured']} of its " in err
    assert kendalltau(*zip(*pairs, strict=True))[0] > 0.8  # the H100's order of them
    code, out, err = run_main(capsys, "model", "predict", "lora", "--device", H100,
                              "--db", url, "--json")
    assert code == 0 and json.loads(out)["siblings_measured"] is None  # trained on: nothing
    assert "other devices measured" not in err



@pytest.mark.parametrize("program", ["rmsnorm_matmul", "lora"])
def test_a_new_gpu_s_candidates_keep_every_kernel_its_siblings_measured(program, tmp_path):
    """On a GPU the model never trained on, the model sampler and `tuner model predict` keep
    every kernel another device measured among the candidates they rank (those
    measurements rank them), however large the space they sample (rmsnorm_matmul), and read
    the measurements as the canonical kernels a launch stores now, whatever knobs the dialect
    ignores they were stored with (lora).  Before: an H200 ranked by a model trained on the
    H100 sweep found 0 of the 12 rmsnorm_matmul kernels the H100 measured, 23 of lora's 61.
    The sampler counts a trial of a kernel under another name as that kernel measured."""
    import re

    import optuna

    from kernels import config_space, get_spec
    from search import from_obj
    from tuner.api.models import predict_configs
    from tuner.pipeline.tune import Codec, StudyTask
    from tuner.samplers.model import ModelSampler

    url = f"sqlite:///{tmp_path / 'sweep.db'}"
    h200 = "cuda:NVIDIA H200:sm_90"
    spec = get_spec(h200)
    with db.connect(url) as database:
        costmodel.import_dataset(database, costmodel.read_dataset(SWEEP))
        costmodel.train(database, kind="gbdt", options={"trees": 40, "leaves": 15})
        model, _ = costmodel.model_for(database, h200)
        rows = [r for r in db.training_rows(database) if r.program == program]
        structure = next(s for p in database.programs() if p.name == program
                         for s in database.structures(p.program_id))
    graph = from_obj(structure.structure)
    space = config_space(graph, spec)
    stored = [r.config for r in rows if r.structure_hash == structure.structure_hash]
    measured = {json.dumps(space.canonical(c), sort_keys=True) for c in stored}
    if program == "lora":  # some were stored before the CUDA C `stages` was canonical
        assert sum(space.canonical(c) != c for c in stored) >= 20
    else:  # a sample of 2,048 holds few of them by chance
        assert len(measured) >= 10 and space.size > 10 * 2048
    said: list[str] = []
    task = StudyTask(program, structure.id, structure.structure_hash, graph,
                     structure.structure, {}, space, h200, spec, "h200")
    codec = Codec(space.params)
    sampler = ModelSampler(model, log=said.append)
    sampler.bind(task, codec, codec.distributions(optuna))
    ranked = [codec.decode(p) for p in sampler._params]
    kernels = {json.dumps(c, sort_keys=True) for c in ranked}
    assert len(kernels) == len(ranked) and all(space.canonical(c) == c for c in ranked)
    assert measured <= kernels
    found = int(re.search(r"measured (\d+) of its", said[0]).group(1))
    assert found == len(measured), said[0]
    # a trial that measured a kernel under another name (a warm-start config with a knob the
    # dialect ignores; the tuner stores it canonical) counts as that candidate measured
    study = optuna.create_study()
    first = sampler.sample_relative(study, None, codec.distributions(optuna))
    config = codec.decode(first)
    knob = "stages" if not config.get("triton") else "smem_kb"
    twin = {**config, knob: next(v for v in space.params[knob] if v != config[knob])}
    assert space.canonical(twin) == config != twin
    study.add_trial(optuna.trial.create_trial(params=codec.encode(twin), value=1e-3,
                                              distributions=codec.distributions(optuna)))
    assert sampler.sample_relative(study, None, codec.distributions(optuna)) != first
    _, top, siblings = predict_configs(url, program, None, h200)
    assert measured <= {json.dumps(r["config"], sort_keys=True) for r in top
                        if r["structure"] == structure.structure_hash}
    assert siblings == len(measured)
