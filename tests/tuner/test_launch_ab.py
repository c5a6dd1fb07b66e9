"""benchmarks/launch_ab.py: what several launches stored, timed side by side; the arms are
paired by seed, a database without a best is named, bad arguments exit 2."""

from __future__ import annotations

from support import load_script


def _launch_ab():
    return load_script("benchmarks/launch_ab.py")


def test_the_arms_are_compared_with_the_first_pair_by_pair():
    medians = {"p": {"new_s0": 1.0, "old_s0": 2.0, "new_s1": 4.0, "old_s1": 2.0, "tpe_s0": 0.5}}
    said = _launch_ab()._ratios(medians, ["new_s0", "old_s0", "new_s1", "old_s1", "tpe_s0"])
    old, tpe = said.splitlines()
    # old against new: 2/1 on seed 0, 2/4 on seed 1 (never old_s0 against new_s1)
    assert old.startswith("old / new: faster on 1 of 2, geometric mean 1.000")
    assert tpe == "tpe / new: faster on 1 of 1, geometric mean 0.500 (min 0.500, max 0.500)"


def test_a_database_without_a_best_is_named_and_bad_arguments_exit_2(tmp_path, capsys):
    bench = _launch_ab()
    assert bench.main(["--db", "a=sqlite:///x.db"]) == 2
    assert "give two or more --db NAME=URL" in capsys.readouterr().err
    urls = [f"a=sqlite:///{tmp_path / 'a.db'}", f"b=sqlite:///{tmp_path / 'b.db'}"]
    assert bench.main(["--db", urls[0], "--db", urls[1], "--programs", "lora"]) == 2
    assert "launch_ab: a: no database at" in capsys.readouterr().err
    import db

    for url in urls:  # databases, but nothing tuned in them
        db.connect(url.split("=", 1)[1]).close()
    assert bench.main(["--db", urls[0], "--db", urls[1], "--programs", "lora"]) == 1
    assert "a stored no best of lora" in capsys.readouterr().err
