"""Programs bigger than the search handles whole are searched in pieces and joined.

A 10-op decode attention block (benchmarks/programs) at its small instance must get one verified
structure of several kernels with the default limits, which the verifier accepts against the
whole program and the cpu device builds and runs; the cut keeps the big intermediates on chip;
the default time limit scales with the program and a search that hits it says so; programs of
the suite's size are not partitioned.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from support import build_cpu

from cluster import LocalExecutor, search_program, verify_structure
from search import (
    Limits,
    default_time_limit,
    from_obj,
    join_pieces,
    load_program,
    parse_program,
    plan_pieces,
    small_instance,
)
from search.partition import needs_pieces

PROGRAMS = Path(__file__).resolve().parents[2] / "benchmarks" / "programs"


def decode_attention():
    return small_instance(load_program(str(PROGRAMS / "decode_attention.yaml")))


@pytest.fixture(scope="module")
def decode_search():
    saved: dict = {}
    result = search_program(decode_attention(), executor=LocalExecutor(),
                            on_shard=lambda r: saved.setdefault(r.shard_id, r))
    return result, saved


def test_a_nine_op_block_gets_one_verified_structure_of_several_kernels(decode_search):
    result, _ = decode_search
    program = decode_attention()
    assert len([op for op in program.build().ops if op.kind not in ("input", "output")]) >= 9
    assert result.best is not None and not result.time_limit_hit
    structure = from_obj(result.best["graph"])
    assert result.best["num_kernels"] >= 2
    assert result.partition["verified_whole"] is True
    assert len(result.partition["pieces"]) >= 2
    assert all(p["ops"] <= Limits().max_piece_ops for p in result.partition["pieces"])
    ok, reason = verify_structure(structure, program.build())  # the whole program, again
    assert ok, reason
    # what tuner launch / tuner search print about it
    from tuner.pipeline import search_notes

    (note,) = search_notes("decode_attention", result)
    assert "pieces" in note and "verified against the whole program" in note


def test_the_joined_structure_builds_and_runs_on_the_cpu(decode_search):
    from kernels import default_config, get_spec

    structure = from_obj(decode_search[0].best["graph"])
    res = build_cpu(structure, default_config(structure, get_spec("cpu")), name="pieces")
    assert res.status == "ok", res.message
    assert len(res.plan.kernels) >= decode_search[0].best["num_kernels"]


def test_a_resumed_partitioned_search_reuses_every_piece_shard(decode_search):
    first, saved = decode_search
    assert saved and all("/" in sid for sid in saved)  # piece shard ids name their piece

    second = search_program(decode_attention(), executor=NoRun(), done=saved)
    assert [s["hash"] for s in second.structures] == [s["hash"] for s in first.structures]


class NoRun(LocalExecutor):
    def submit(self, shard, payload):
        raise AssertionError(f"shard {shard.id} ran again")


def test_each_piece_joins_the_structure_the_caller_chooses(decode_search):
    """``choose_piece`` picks each piece's structure among its verified ones (the cluster's
    search passes the roofline estimate's ranking: the search's own cannot see a grid whose
    blocks all re-read a weight); the pick is reported and the joined structure verified."""
    from kernels import rank_structures
    from search import run_search

    first, saved = decode_search
    offered: list[list] = []

    def last(structures):
        offered.append(structures)
        return len(structures) - 1

    program = decode_attention()
    small = small_instance(program).build()
    result = run_search(program, None, NoRun(), done=saved, choose_piece=last,
                        verify=lambda g: verify_structure(g, small))
    pieces = result.partition["pieces"]
    assert [p["chosen"] for p in pieces if p["verified"] > 1] == \
        [len(o) - 1 for o in offered] and offered
    assert result.partition["verified_whole"] is True
    assert [s["hash"] for s in result.structures] != [s["hash"] for s in first.structures]
    # the cluster's search joins what the estimate ranks first
    assert [p["chosen"] for p in first.partition["pieces"] if p["verified"] > 1] == \
        [rank_structures(o, "cpu")[0] for o in offered]


def test_the_cut_keeps_the_big_intermediate_on_chip():
    program = parse_program("""
name: cut
dtype: float32
inputs:
  X: [64, 128]
  W: [128, 256]
body: |
  E = exp(matmul(X, W))
  S = sum(E, 1)
  T = sqrt(S * 2)
  O = T * S
outputs: [O]
""")
    pieces = plan_pieces(program, max_piece_ops=4)
    # cutting after the matmul or exp would write and read a 64x256 tile; after four ops, two
    # 64x1 columns (S and S*2); after the row sum, S alone (the matmul's inner dim, 128, is
    # short: one block holds it whole, so it may be fused with the row sum)
    assert [p.ops for p in pieces] == [(0, 1, 2), (3, 4, 5)]
    assert [program.build().tensors[t].shape for t in pieces[0].outputs] == [(64, 1)]
    # each piece is a program of its own, and joining their references gives the program back
    joined = join_pieces(program, pieces, [p.program.build() for p in pieces])
    assert verify_structure(joined, program.build())[0]


def test_a_long_contraction_is_not_fused_with_what_reduces_its_rows():
    program = load_program(str(PROGRAMS / "decode_attention.yaml"))
    bodies = [p.program.body for p in plan_pieces(program, max_piece_ops=4)]
    # the query projection (over 1024) ends its piece before the scores contract Q's row,
    # and the scores (over 1024) end theirs before the softmax sums their row
    assert bodies[0].rstrip().endswith("Q = matmul(t5, Wq)")
    assert "exp" not in bodies[1] and "sum" in bodies[2]


def test_no_cut_exists_below_one_op():
    with pytest.raises(ValueError, match="max_piece_ops"):
        plan_pieces(decode_attention(), max_piece_ops=0)


def test_the_default_time_limit_scales_with_the_program_and_is_reported():
    assert default_time_limit(9) > default_time_limit(7) > default_time_limit(2) > 0
    program = load_program("rmsnorm_matmul")
    result = search_program(program, executor=LocalExecutor())
    assert result.time_limit_s == default_time_limit(2) and not result.time_limit_hit
    assert result.summary()["time_limit_s"] == default_time_limit(2)
    assert result.partition is None  # two ops: searched whole, as before


def test_a_search_cut_by_its_time_limit_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="search"):
        result = search_program(load_program("qknorm_gqa"), executor=LocalExecutor(),
                                time_limit_s=0.5)
    assert result.time_limit_hit and result.summary()["time_limit_hit"]
    assert any("time limit" in r.getMessage() for r in caplog.records)
    from tuner.pipeline import search_notes

    assert any("stopped at its time limit" in n for n in search_notes("qknorm_gqa", result))


def test_partitioning_can_be_turned_off():
    limits = Limits(partition_above=None, max_block_ops=1, max_kernel_ops=1)
    result = search_program(decode_attention(), limits, executor=LocalExecutor(),
                            time_limit_s=5)
    assert result.partition is None
    with pytest.raises(ValueError, match="partition_above"):
        Limits(partition_above=0)


def test_a_piece_that_finds_nothing_is_cut_in_halves():
    program = parse_program("""
name: chain
dtype: float32
inputs:
  X: [8, 16]
body: |
  S = sum(exp(X), 1)
outputs: [S]
""")
    # one kernel at most, and no exp in a block graph: exp then sum cannot be one kernel, so
    # the 2-op piece finds nothing and is searched again as two 1-op pieces
    limits = Limits(partition_above=1, partition_min_heavy=0, max_piece_ops=2, max_kernel_ops=1,
                    block_ops=("add", "accum"))
    result = search_program(program, limits, executor=LocalExecutor())
    pieces = result.partition["pieces"]
    assert [(p["ops"], p["kernels"]) for p in pieces] == [(2, None), (1, 1), (1, 1)]
    assert result.best["num_kernels"] == 2 and result.partition["verified_whole"] is True


def test_a_piece_program_names_every_tensor_once():
    program = parse_program("""
name: names
dtype: float32
inputs:
  t3: [4, 8]
  W: [8, 8]
body: |
  t2 = exp(matmul(t3, W))
  O = t2 * sum(t2, 1)
outputs: [O]
""")
    pieces = plan_pieces(program, max_piece_ops=2)
    for piece in pieces:  # each piece parses and builds: no name given to two tensors
        built = piece.program.build()
        names = [built.tensors[t].name for t in range(len(built.tensors))
                 if built.tensors[t].name]
        assert len(names) == len(set(names)), piece.program.body
    joined = join_pieces(program, pieces, [p.program.build() for p in pieces])
    assert verify_structure(joined, program.build())[0]


SWIGLU = """
name: swiglu
dtype: float32
inputs:
  X: [4, {model}]
  Wg: {{shape: [{model}, {hidden}], layout: transposed}}
  Wu: {{shape: [{model}, {hidden}], layout: transposed}}
  Wd: {{shape: [{hidden}, {model}], layout: transposed}}
body: |
  H = silu(matmul(X, Wg)) * matmul(X, Wu)
  O = matmul(H, Wd)
outputs: [O]
"""


def test_a_weight_streamed_then_contracted_is_searched_in_pieces_at_any_size():
    """A Llama MLP (5 ops: the default threshold is 7) is cut after its gate and up
    projections, whose 2 MB weights every block of the down projection would otherwise read
    again; LoRA's (X·A)·B, whose A is 256 x 16, and the rest of the suite stay whole, and
    partition_above=None still means never."""
    mlp = parse_program(SWIGLU.format(model=512, hidden=1024))
    limits = Limits()
    assert needs_pieces(mlp.build(), limits.partition_above, limits.partition_min_heavy)
    assert not needs_pieces(mlp.build(), None, limits.partition_min_heavy)
    tiny = parse_program(SWIGLU.format(model=64, hidden=128))  # 32 KB weights: fused is fine
    assert not needs_pieces(tiny.build(), limits.partition_above, limits.partition_min_heavy)
    for name in ("rmsnorm_matmul", "gated_mlp", "lora", "gqa", "qknorm_gqa", "mha", "mqa",
                 "ntrans"):
        graph = load_program(name).build()
        assert not needs_pieces(graph, limits.partition_above, limits.partition_min_heavy), name
    result = search_program(mlp, executor=LocalExecutor())
    assert result.partition is not None and result.partition["verified_whole"]
    assert [p["ops"] for p in result.partition["pieces"]] == [4, 1]
