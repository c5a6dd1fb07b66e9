"""The cost model: features of a known structure, reading Kernel Tuner caches, models that
rank a synthetic space correctly, and a model's round trip through bytes."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest
from support import kernel_tuner_cache, mha_structure

from costmodel import (
    CacheFormatError,
    evaluate,
    expected_random_best,
    featurize,
    featurize_params,
    kernel_tuner_samples,
    load_model,
    make_model,
    read_kernel_tuner,
)
from kernels import get_spec
from search import from_obj

SPEC = get_spec("NVIDIA H100 80GB HBM3")


def test_features_of_a_known_structure():
    graph = from_obj(mha_structure("heads"))
    s = featurize(graph, {"g0": 4, "F": 2}, SPEC, group="mha", program="mha", device="cuda")
    # 3 inputs + 1 output of the kernel graph, and the block graph: 3 inputs, 6 compute ops,
    # 1 output
    assert len(s.opcodes) == 3 + 1 + 3 + 6 + 1
    assert s.nodes.shape[0] == len(s.opcodes) and np.isfinite(s.nodes).all()
    assert s.edges.shape[0] == 2 and s.edges.max() < len(s.opcodes)
    # data flows from every block input to some compute op: no node is left unconnected
    assert set(range(len(s.opcodes))) == set(s.edges.ravel().tolist())
    assert s.estimate_s > 0 and s.config["g0"] == 4
    # a config that moves more work into each block changes the kernel features
    other = featurize(graph, {"g0": 1, "F": 2}, SPEC)
    assert not np.array_equal(other.nodes, s.nodes)


def test_graph_samples_have_the_kernel_tuner_width_and_train_graphsage(tmp_path):
    """A µGraph's node rows were two short of NODE_DIM: GraphSAGE failed on the first batch
    of our own measurements ("mat1 and mat2 shapes cannot be multiplied") and could not mix
    them with Kernel Tuner rows. Both kinds now share one width and train one model."""
    graph = from_obj(mha_structure("heads"))
    ours = []
    for g0 in (1, 2, 4):
        for f in (1, 2, 4, 8):
            s = featurize(graph, {"g0": g0, "F": f}, SPEC, group="mha", program="mha",
                          device="cuda")
            s.seconds = 1e-4 * g0 / f
            ours.append(s)
    theirs = kernel_tuner_samples(read_kernel_tuner(kernel_tuner_cache(tmp_path)))
    assert len({s.nodes.shape[1] for s in ours + theirs}) == 1
    model = make_model("graphsage", steps=20)
    model.fit(ours + theirs)
    assert np.isfinite(model.predict(ours)).all()


def test_a_held_out_program_with_nothing_to_rank_leaves_tau_in_the_mean(tmp_path):
    """A program tuned as written has one config per structure: its fold's tau is nan. The
    mean over folds once dropped tau altogether; it averages the folds that define it."""
    import dataclasses

    from costmodel import cross_validate

    samples = kernel_tuner_samples(read_kernel_tuner(kernel_tuner_cache(tmp_path)))
    other = [dataclasses.replace(s, program="other", group="other@replay") for s in samples]
    lone = [dataclasses.replace(s, program="lone", group=f"lone{i}@replay")
            for i, s in enumerate(samples[:6])]  # six structures of one config each
    out = cross_validate([*samples, *other, *lone], "program", kinds=("gbdt",),
                         options={"gbdt": {"trees": 20}})
    folds = {f["test"]: f for f in out["folds"]["gbdt"]}
    assert math.isnan(folds["lone"]["kendall_tau"])
    mean = out["mean"]["gbdt"]
    assert mean["kendall_tau"] == pytest.approx(
        (folds["toy"]["kendall_tau"] + folds["other"]["kendall_tau"]) / 2)
    assert mean["mape"] == pytest.approx(sum(f["mape"] for f in folds.values()) / 3)


def test_kernel_tuner_cache_reads_times_in_seconds_and_drops_failures(tmp_path):
    space = read_kernel_tuner(kernel_tuner_cache(tmp_path))
    assert space.device_key == "replay:NVIDIA A100-PCIE-40GB"
    assert len(space.configs) == 49 and math.isnan(space.times_s[-1])
    assert space.times_s[0] == pytest.approx(10e-3)  # 10 ms in the file
    assert len(kernel_tuner_samples(space)) == 48


@pytest.mark.parametrize("text, why", [
    (b"not json", "not a readable"),
    (json.dumps({"cache": {}}).encode(), "tune_params_keys"),
    (json.dumps({"tune_params_keys": ["a"], "cache": {"1": {"b": 1}}}).encode(), "lacks"),
])
def test_a_malformed_cache_is_refused_with_the_file_named(tmp_path, text, why):
    path = tmp_path / "bad.json"
    path.write_bytes(text)
    with pytest.raises(CacheFormatError, match=why) as err:
        read_kernel_tuner(path)
    assert "bad.json" in str(err.value)


@pytest.mark.parametrize("kind, options", [("gbdt", {"trees": 100}),
                                           ("graphsage", {"steps": 300})])
def test_a_model_ranks_a_synthetic_space(tmp_path, kind, options):
    samples = kernel_tuner_samples(read_kernel_tuner(kernel_tuner_cache(tmp_path)))
    model = make_model(kind, **options)
    model.fit(samples)
    pred = model.predict(samples)
    scores = evaluate([s.group for s in samples], [s.seconds for s in samples], pred)
    assert scores["kendall_tau"] > 0.8
    assert scores["top1_slowdown"] < 0.1


def test_a_model_round_trips_through_bytes(tmp_path):
    samples = kernel_tuner_samples(read_kernel_tuner(kernel_tuner_cache(tmp_path)))
    model = make_model("graphsage", steps=50)
    model.fit(samples)
    again = load_model(model.to_bytes())
    assert np.allclose(again.predict(samples), model.predict(samples))
    stale = make_model("roofline")
    stale.feature_version = -1
    with pytest.raises(ValueError, match="train it again"):
        load_model(stale.to_bytes())


def test_the_device_features_tell_gpus_apart():
    a = featurize_params({"a": 1}, ["a"], [64], get_spec("NVIDIA RTX A4000"), group="g",
                         program="p", device="d")
    b = featurize_params({"a": 1}, ["a"], [64], get_spec("MI250X"), group="g", program="p",
                         device="d")
    assert not np.array_equal(a.graph, b.graph)
    assert np.array_equal(a.nodes, b.nodes)


def test_a_model_stored_before_the_learned_kinds_moved_still_loads():
    """Models in users' databases were pickled when the trees and GraphSAGE lived in
    ``costmodel._models``; they moved to ``_gbdt`` / ``_sage``."""
    for kind in ("gbdt", "graphsage"):
        blob = pickle.dumps(make_model(kind), protocol=0)
        old = blob.replace(f"costmodel._{'gbdt' if kind == 'gbdt' else 'sage'}".encode(),
                           b"costmodel._models")
        assert old != blob
        assert load_model(old).kind == kind


def test_models_stored_compressed_and_bare_both_load(tmp_path):
    """``to_bytes`` compresses; a model a database holds from before it did is a bare pickle
    (the default protocol) and still loads, predicting the same."""
    samples = kernel_tuner_samples(read_kernel_tuner(kernel_tuner_cache(tmp_path)))
    model = make_model("gbdt", trees=50)
    model.fit(samples)
    bare, packed = pickle.dumps(model), model.to_bytes()
    assert len(packed) < len(bare) / 2
    assert np.array_equal(load_model(bare).predict(samples), load_model(packed).predict(samples))


def test_first_k_scores_the_top_of_an_order_against_random_draws():
    """The figure `sampler: auto` reads on a new GPU: the best of an order's first k configs
    against the exact mean best of k random draws (without replacement)."""
    from costmodel._metrics import first_k

    # the best of 2 draws of {1, 2, 3, 4}: 1 in 3 of the 6 pairs, 2 in 2, 3 in 1
    assert expected_random_best([4.0, 1.0, 3.0, 2.0], 2)[-1] == pytest.approx(10 / 6)
    times = [1.0, 2.0, 3.0, 4.0, 5.0]
    got = first_k(["g"] * 5, times, [5.0, 4.0, 3.0, 2.0, 1.0], k=2)  # the order reversed
    assert got["first_slowdown"] == pytest.approx(3.0)  # 4 and 5 first: 4 / 1 - 1
    assert got["random_slowdown"] == pytest.approx(expected_random_best(times, 2)[-1] - 1)
    assert first_k(["g"] * 5, times, times, k=2)["first_slowdown"] == 0.0
    assert first_k(["g"] * 2, times[:2], times[:2], k=2) == {}  # every config fits in k
