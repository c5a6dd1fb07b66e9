"""The contract every tuning sampler of the one registry (``tuner.samplers.SAMPLERS``) keeps.

Each is named by a job file and made as a launch makes it (``sampler_factory``, the cost
model's from a model stored in a real database), proposes only configs of a real config space
(the hand-written rmsnorm_matmul structure on this cpu) through the study driver's ``Codec``,
and, where the registry says it is seeded, proposes the same configs again from the same seed.
A sampler added to the registry is covered here without a new test.
"""

from __future__ import annotations

from dataclasses import replace

import optuna
import pytest

import db
from costmodel import FEATURE_VERSION, featurize, make_model
from kernels import config_space, estimate, local_cpu_spec
from search import handwritten, load_program
from tuner.jobfile import JobError, parse_job
from tuner.pipeline.tune import Codec, StudyTask
from tuner.samplers import NOT_OFFERED, SAMPLERS
from tuner.samplers.factory import sampler_factory

DEVICE = "cpu:contract"
ASKS = 12


@pytest.fixture(scope="module")
def task() -> StudyTask:
    program = load_program("rmsnorm_matmul", {"X": "16x256", "W": "256x256"})
    structure, spec = handwritten(program), local_cpu_spec()
    space = config_space(structure, spec)
    assert space.size > ASKS  # room to propose without repeating
    return StudyTask(program.name, 1, "contract", structure, {}, {}, space, DEVICE, spec,
                     "contract")


@pytest.fixture(scope="module")
def database(tmp_path_factory, task: StudyTask):
    """A database holding a cost model for ``DEVICE``: gradient-boosted trees trained on the
    roofline times of the space's legal configs (what ``sampler: model`` loads)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('samplers') / 'contract.db'}"
    legal = [c for c in task.space.configs() if task.space.check(c) is None][:64]
    samples = [replace(featurize(task.structure, c, task.spec, group="contract",
                                 device=DEVICE),
                       seconds=estimate(task.structure, c, task.spec).seconds) for c in legal]
    model = make_model("gbdt", trees=20, leaves=7, threads=1)
    model.fit(samples)
    with db.connect(url) as database:
        db.save_model(database, kind="gbdt", device_key=DEVICE, feature_version=FEATURE_VERSION,
                      weights=model.to_bytes(), trained_on={"rows": len(samples)}, metrics={})
    database = db.connect(url)
    yield database
    database.close()


def _make(name: str, seed: int, database: db.Database) -> optuna.samplers.BaseSampler:
    """The sampler a launch makes for ``tuning: {sampler: name, seed: seed}``."""
    job = parse_job(f"programs: [softmax_rows]\ntuning: {{sampler: {name}, seed: {seed}}}\n")
    assert (job.tuning.sampler, job.tuning.seed) == (name, seed)
    return sampler_factory(job.tuning.sampler, job.tuning.seed, database, DEVICE)()


def _proposals(sampler: optuna.samplers.BaseSampler, task: StudyTask) -> list[dict]:
    """``ASKS`` configs asked of ``sampler`` as the study driver asks, each told its
    roofline time (an illegal one told failed)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    codec = Codec(task.space.params)
    dists = codec.distributions(optuna)
    if hasattr(sampler, "bind"):
        sampler.bind(task, codec, dists)
    study = optuna.create_study(sampler=sampler, direction="minimize")
    out = []
    for _ in range(ASKS):
        trial = study.ask(dists)
        config = codec.decode(trial.params)
        out.append(config)
        if task.space.check(config) is None:
            study.tell(trial, estimate(task.structure, config, task.spec).seconds)
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return out


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_a_job_file_names_each_sampler_and_the_launch_makes_it(name, database) -> None:
    sampler = _make(name, 3, database)
    assert isinstance(sampler, optuna.samplers.BaseSampler)
    if SAMPLERS[name].auto:  # the fixture's model has no held-out figure here: TPE
        assert type(sampler).__name__ == "TPESampler"
    elif SAMPLERS[name].model:  # the stored model ranks the space, not the fallback
        from tuner.samplers.model import ModelSampler

        assert isinstance(sampler, ModelSampler)
    else:
        assert type(sampler).__name__ == SAMPLERS[name].optuna_class


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_each_sampler_proposes_only_configs_of_the_space(name, task, database) -> None:
    configs = _proposals(_make(name, 0, database), task)
    for config in configs:
        assert set(config) == set(task.space.params)
        assert all(config[k] in task.space.params[k] for k in config), config
    if SAMPLERS[name].model and not SAMPLERS[name].auto:  # legal configs only, no repeats
        assert all(task.space.check(c) is None for c in configs)
        assert len({tuple(sorted(c.items())) for c in configs}) == len(configs)


@pytest.mark.parametrize("name", [n for n, k in SAMPLERS.items() if k.seeded])
def test_a_seeded_sampler_proposes_the_same_configs_from_the_same_seed(name, task,
                                                                       database) -> None:
    first = _proposals(_make(name, 7, database), task)
    assert _proposals(_make(name, 7, database), task) == first


def test_a_model_sampler_without_a_stored_model_falls_back_to_tpe_and_says_so(tmp_path) -> None:
    said: list[str] = []
    with db.connect(f"sqlite:///{tmp_path / 'empty.db'}") as database:
        sampler = sampler_factory("model", 0, database, DEVICE, said.append)()
    assert isinstance(sampler, optuna.samplers.TPESampler)
    assert said and "no trained cost model" in said[0]


@pytest.mark.parametrize("name", sorted(NOT_OFFERED))
def test_a_sampler_not_offered_is_refused_with_the_registry_s_reason(name) -> None:
    with pytest.raises(JobError) as err:
        parse_job(f"programs: [softmax_rows]\ntuning: {{sampler: {name}}}\n")
    assert NOT_OFFERED[name] in str(err.value)
    assert all(known in str(err.value) for known in SAMPLERS)


def test_the_model_sampler_leaves_out_configs_the_lowering_refuses(database) -> None:
    """Binding the model sampler to a space holding configs the lowering refuses leaves them
    out (it had raised the lowering's ValueError and failed the whole launch: a transformers
    Llama layer's tune="now" compile, whose RoPE regions' spaces held ``split`` values the
    row a block gets cannot take, before the space's check knew that rule; on a GPU the
    check still does not know every limit of a Triton tile).  What it proposes all lower."""
    from support import row_cut_structure

    from tuner.samplers.model import ModelSampler

    structure, spec = row_cut_structure(), local_cpu_spec()
    space = replace(config_space(structure, spec), row_tiles=())  # a check missing a rule
    refused = []
    for config in space.configs():
        try:
            featurize(structure, config, spec)
        except ValueError:
            refused.append(config)
    assert refused, "the space holds no config the lowering refuses"
    task = StudyTask("row_cut", 1, "row_cut", structure, {}, {}, space, DEVICE, spec,
                     "row_cut")
    sampler = _make("model", 0, database)  # as a launch makes it, from the stored model
    assert isinstance(sampler, ModelSampler)
    proposed = _proposals(sampler, task)
    assert all(c not in refused for c in proposed)
    for config in proposed:
        featurize(structure, config, spec)  # lowers
