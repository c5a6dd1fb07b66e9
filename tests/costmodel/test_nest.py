"""The loop nests' work per core (``costmodel._nest``): what a config changes on one core is
what the cost model reads."""

from __future__ import annotations

from dataclasses import replace

import pytest
from support import mha_structure

from costmodel import featurize
from costmodel._features import GRAPH_NEST
from costmodel._nest import NEST_NAMES, nest_features
from kernels import get_spec, lower
from search import from_obj

CPU = replace(get_spec("cpu"), sm_count=2, arch="x86_64-avx512")


def nest(graph, config, spec=CPU) -> dict[str, float]:
    plan = lower(graph, config, spec, "t")
    return dict(zip(NEST_NAMES, nest_features(plan, spec), strict=True))


def test_blocks_spread_over_the_cores_halve_what_one_core_runs():
    graph = from_obj(mha_structure("heads"))
    one, two, four = (nest(graph, {"g0": g0, "F": 2}) for g0 in (1, 2, 4))
    # the same work in all, one core running all of it, then half, then half in two waves
    assert one["all_cores_total"] == two["all_cores_total"] == four["all_cores_total"]
    assert one["core_total"] == pytest.approx(two["core_total"] + 1.0, abs=1e-3)  # log2
    assert four["core_total"] == pytest.approx(two["core_total"], abs=1e-3)
    assert (one["max_waves"], two["max_waves"]) == (1.0, 1.0) and four["max_waves"] > 1.0
    # and the graph vector the models read carries them
    s = featurize(graph, {"g0": 1, "F": 2}, CPU)
    assert s.graph[GRAPH_NEST + NEST_NAMES.index("core_total")] == pytest.approx(
        one["core_total"])


def test_columns_outside_whole_vectors_follow_the_devices_vector_width():
    """24 columns fill one and a half AVX-512 vectors (16 floats) and three AVX2 ones (8)."""
    graph = from_obj(mha_structure("heads", dim=24))
    wide = nest(graph, {"g0": 2, "F": 2})
    narrow = nest(graph, {"g0": 2, "F": 2}, replace(CPU, arch="x86_64-avx2"))
    assert wide["vector_share"] < 1.0 and narrow["vector_share"] == 1.0


def test_a_for_loop_body_runs_its_loops_once_per_iteration():
    graph = from_obj(mha_structure("heads"))
    short, long = nest(graph, {"g0": 2, "F": 1}), nest(graph, {"g0": 2, "F": 4})
    assert long["core_loop_entries"] > short["core_loop_entries"]
    assert long["max_forloop"] > short["max_forloop"]
