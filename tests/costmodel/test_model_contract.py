"""What every cost-model kind promises (``costmodel.MODEL_KINDS``: roofline, gbdt, graphsage).

The tuner's model sampler and ``tuner model`` hold a ``CostModel`` without knowing its kind,
so each kind keeps the same promises, checked here on one set of samples:

- ``make_model(kind)`` is a ``CostModel`` of that kind, stamped with the current features;
- after ``fit``, ``predict`` gives one positive, finite time in seconds per µGraph sample (an
  ndarray of that length), and nothing but a positive time or nan ("cannot say") for a
  Kernel Tuner row, which has no µGraph;
- the same samples and seed give the same predictions;
- ``to_bytes`` / ``load_model`` (how a model travels through the database) predict the same;
- no samples, no predictions.

Sizes are small (20 trees, 10 GraphSAGE steps): the promises, not the accuracy.
"""

from __future__ import annotations

import numpy as np
import pytest
from support import kernel_tuner_cache, mha_structure

from costmodel import (
    FEATURE_VERSION,
    MODEL_KINDS,
    CostModel,
    featurize,
    kernel_tuner_samples,
    load_model,
    make_model,
    read_kernel_tuner,
)
from kernels import get_spec
from search.ir import from_obj

SMALL = {"roofline": {}, "gbdt": {"trees": 20}, "graphsage": {"steps": 10}}


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    """Twelve configs of one mha structure on an A100 (times made up: g0 / F), and a small
    Kernel Tuner space."""
    graph, spec = from_obj(mha_structure("heads")), get_spec("A100")
    ours = []
    for g0 in (1, 2, 4):
        for f in (1, 2, 4, 8):
            s = featurize(graph, {"g0": g0, "F": f}, spec, group="mha", program="mha",
                          device="cuda")
            s.seconds = 1e-4 * g0 / f
            ours.append(s)
    kt = kernel_tuner_samples(read_kernel_tuner(kernel_tuner_cache(tmp_path_factory.mktemp("kt"))))
    return ours, kt[::4]


@pytest.fixture(scope="module", params=MODEL_KINDS)
def fitted(request, samples):
    """Two models of one kind fitted on the same samples with the same seed."""
    ours, kt = samples
    models = []
    for _ in range(2):
        model = make_model(request.param, **SMALL[request.param])
        model.fit(ours + kt, seed=3)
        models.append(model)
    return request.param, models


def test_make_model_gives_a_model_of_that_kind(fitted):
    kind, (model, _) = fitted
    assert isinstance(model, CostModel) and model.kind == kind
    assert model.feature_version == FEATURE_VERSION


def test_a_unknown_kind_is_refused_naming_the_kinds():
    with pytest.raises(ValueError, match=", ".join(MODEL_KINDS)):
        make_model("forest")


def test_predictions_are_seconds_one_per_sample(fitted, samples):
    _, (model, _) = fitted
    ours, kt = samples
    pred = model.predict(ours)
    assert isinstance(pred, np.ndarray) and pred.shape == (len(ours),)
    assert np.isfinite(pred).all() and (pred > 0).all()
    theirs = model.predict(kt)
    assert theirs.shape == (len(kt),)
    assert all(np.isnan(p) or (np.isfinite(p) and p > 0) for p in theirs)


def test_the_same_samples_and_seed_give_the_same_model(fitted, samples):
    _, (first, second) = fitted
    both = samples[0] + samples[1]
    np.testing.assert_allclose(first.predict(both), second.predict(both), rtol=1e-6)


def test_a_model_predicts_the_same_after_the_database_round_trip(fitted, samples):
    _, (model, _) = fitted
    both = samples[0] + samples[1]
    again = load_model(model.to_bytes())
    assert again.kind == model.kind
    np.testing.assert_allclose(again.predict(both), model.predict(both), rtol=1e-6)


def test_no_samples_no_predictions(fitted):
    _, (model, _) = fitted
    assert model.predict([]).shape == (0,)
