"""benchmarks/sweep.py and benchmarks/peers.py over a sweep file, without a GPU: the configs a
sweep is given are measured first (unset knobs at the default), and peers.py takes a sweep's
fastest checked trial only where it is not slower than the default that sweep measured (an
H100 sweep cut short left mha one 50 ms trial, and the peers table showed it as ours)."""

from __future__ import annotations

import gzip
import itertools
import json
import random

from support import load_script

from search import handwritten, load_program, to_obj


def _load(name: str):
    return load_script(f"benchmarks/{name}.py")


def test_given_configs_are_measured_first_with_the_defaults_knobs():
    from kernels import config_space
    from tuner.pipeline.tune import warm_start

    sweep = _load("sweep")
    space = config_space(handwritten(load_program("rmsnorm_matmul")), "H100")
    start = warm_start(space)  # the first trials without --configs
    given = [{"F": 32, "g0": 48, "stages": 4, "splitk": 2},
             {"F": 3, "g0": 48}]  # F=3 divides nothing: left out
    first = list(itertools.islice(sweep.configs(space, random.Random(0), given), 3))
    assert first == [{**start[0], **given[0]}, start[0], start[1]]
    assert all(space.check(c) is None for c in first)
    # a Triton config that differs only in what the dialect never reads is the same kernel
    twins = [given[0], {**given[0], "lanes": 2, "smem_kb": 0}]
    first = list(itertools.islice(sweep.configs(space, random.Random(0), twins), 2))
    assert first == [{**start[0], **given[0]}, start[0]]


def _sweep_file(path, trials: list[tuple[str, float]], default_s: float) -> None:
    graph = to_obj(handwritten(load_program("mha")))
    records = [{"kind": "baseline", "program": "mha", "default_s": default_s},
               {"kind": "structure", "program": "mha", "hash": "h" * 10, "graph": graph}]
    records += [{"kind": "trial", "program": "mha", "structure": "h" * 10, "status": status,
                 "median_s": median, "config": {"F": 64, "n": i}}
                for i, (status, median) in enumerate(trials)]
    with gzip.open(path, "wt") as f:
        f.write("\n".join(json.dumps(r) for r in records) + "\n")


def test_peers_takes_the_fastest_checked_trial_unless_the_default_was_faster(tmp_path,
                                                                             capsys):
    peers = _load("peers")
    good = tmp_path / "good.jsonl.gz"
    _sweep_file(good, [("ok", 2e-4), ("wrong_result", 1e-5), ("ok", 1e-4)], default_s=1.8e-3)
    structure, config, label = peers.swept_best(str(good), "mha")
    assert config == {"F": 64, "n": 2} and "0.1000 ms there" in label
    cut_short = tmp_path / "cut.jsonl.gz"
    _sweep_file(cut_short, [("ok", 5e-2)], default_s=1.8e-3)
    assert peers.swept_best(str(cut_short), "mha") is None
    assert "slower than the default it measured" in capsys.readouterr().err


def test_a_malformed_configs_file_is_refused_in_one_line_with_exit_2(tmp_path, capsys):
    sweep = _load("sweep")
    bad = tmp_path / "bad.json"
    bad.write_text('[{"program": "lora"}]')
    code = sweep.main(["--device", "cuda", "--out", str(tmp_path / "o.jsonl"),
                       "--configs", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and f"{bad}: entry 0 is not" in err and "Traceback" not in err
    assert not (tmp_path / "o.jsonl").exists()
    good = tmp_path / "good.json"
    good.write_text('[{"program": "lora", "config": {"g0": 64}}]')
    assert sweep.read_configs([str(good)]) == {"lora": [{"g0": 64}]}
