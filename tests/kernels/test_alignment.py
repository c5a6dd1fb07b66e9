"""benchmarks/alignment.py: our cpu kernels timed on arrays where numpy puts them (16 bytes past
a cache line) beside the same arrays 64-byte aligned, each kernel checked first."""

from __future__ import annotations

from support import load_script


def _alignment():
    return load_script("benchmarks/alignment.py")


def test_the_table_names_the_cpu_and_times_both_placements(capsys):
    assert _alignment().main(["--programs", "ntrans", "--rounds", "1", "--budget", "0.02"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# cpu:") and "16 bytes past" in out
    [row] = [line for line in out.splitlines() if line.startswith("| ntrans |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    aligned, user, ratio = float(cells[2]), float(cells[3]), cells[4]
    assert aligned > 0 and user > 0 and ratio.endswith("x") and float(ratio[:-1]) > 0


def test_bad_rounds_are_one_line_and_exit_2(capsys):
    assert _alignment().main(["--rounds", "0"]) == 2
    assert "--rounds must be >= 1" in capsys.readouterr().err
