"""The ``tuner`` command line: help, programs, show, verify and its exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import one_line_error, run_main

from search import builtin_names, from_json, load_program, structural_hash, to_json
from tuner.cli import main

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--set", "X=2x16", "--set", "W=16x16"]




@pytest.fixture
def graphs(tmp_path, capsys) -> dict[str, Path]:
    """Reference, fused structure (bound) and a mutant of rmsnorm_matmul as JSON files."""
    files = {}
    code, out, _ = run_main(capsys, "show", "rmsnorm_matmul", *SMALL, "--json")
    assert code == 0
    files["ref"] = tmp_path / "ref.json"
    files["ref"].write_text(out)
    code, out, _ = run_main(capsys, "show", "rmsnorm_matmul", *SMALL, "--fused", "--config", "g0=2",
                        "--config", "F=2", "--json")
    assert code == 0
    files["fused"] = tmp_path / "fused.json"
    files["fused"].write_text(out)
    doc = json.loads(out)
    block = doc["ops"][2]["block_graph"]
    rms = [op for op in block["ops"] if op.get("kind") == "rms"]
    assert len(rms) == 1
    rms[0]["kind"] = "mean"  # drops the sqrt
    files["mutant"] = tmp_path / "mutant.json"
    files["mutant"].write_text(json.dumps(doc))
    return files


# --- help and listings ------------------------------------------------------------------------

def test_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for word in ("programs", "show", "verify", "PROGRAM"):
        assert word in out
    code, out, _ = run_main(capsys)
    assert code == 0 and "usage: tuner" in out


def test_programs_lists_every_builtin_with_shapes(capsys):
    code, out, _ = run_main(capsys, "programs")
    assert code == 0
    for name in builtin_names():
        program = load_program(name)
        line = next(ln for ln in out.splitlines() if ln.startswith(name + " "))
        for input_name, shape in program.inputs.items():
            assert f"{input_name} {shape}" in line, line
    assert "X (2, 4096), W (4096, 6144)" in out and "[params: batch=1]" in out


def test_programs_json(capsys):
    code, out, _ = run_main(capsys, "programs", "--json")
    rows = json.loads(out)
    assert code == 0 and [r["name"] for r in rows] == list(builtin_names())
    row = rows[0]
    assert row["inputs"] == {"X": [2, 4096], "W": [4096, 6144]} and row["dtype"] == "float16"


def test_show_reference(capsys):
    code, out, _ = run_main(capsys, "show", "rmsnorm_matmul")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("X = input()") and "(2, 4096) float16" in lines[0]
    assert any("rms_norm(X)" in ln for ln in lines)
    assert any(ln.startswith("O = matmul(") and "(2, 6144)" in ln for ln in lines)
    assert lines[-1].startswith("output(O)")


def test_show_with_overrides(capsys):
    code, out, _ = run_main(capsys, "show", "rmsnorm_matmul", "--set", "batch=8")
    assert code == 0 and "(16, 4096)" in out and "(16, 6144)" in out


def test_show_fused_json_round_trips(capsys):
    code, out, _ = run_main(capsys, "show", "rmsnorm_matmul", "--fused", "--json")
    assert code == 0
    graph = from_json(out)
    assert to_json(graph, indent=2) == out.rstrip("\n")
    assert graph.symbols() == {"g0", "F"}
    (bg,) = graph.block_graphs()
    assert bg.grid == ("g0", 1, 1) and bg.forloop_range == "F"
    code, out, _ = run_main(capsys, "show", "rmsnorm_matmul", "--fused", "--config", "g0=64",
                        "--config", "F=16", "--json")
    assert code == 0 and from_json(out).is_concrete()
    code, plain, _ = run_main(capsys, "show", "rmsnorm_matmul", "--fused")
    assert code == 0 and "graph_kernel(X, W)" in plain and "accum(" in plain


def test_show_json_of_reference_matches_the_api(capsys):
    code, out, _ = run_main(capsys, "show", "softmax_rows", "--json")
    assert code == 0
    assert structural_hash(from_json(out)) == structural_hash(load_program("softmax_rows").build())


def test_show_program_file(tmp_path, capsys):
    path = tmp_path / "p.yaml"
    path.write_text("name: p\ninputs: {X: [4, 8]}\nbody: |\n  O = exp(X) / sum(exp(X), 1)\n"
                    "outputs: [O]\n")
    code, out, _ = run_main(capsys, "show", str(path))
    assert code == 0 and "sum(" in out and "(4, 1)" in out


@pytest.mark.parametrize("argv,fragment", [
    (["show", "nope"], "nope: not a built-in program"),
    (["show", "rmsnorm_matmul", "--set", "batch"], "--set 'batch': write NAME=VALUE"),
    (["show", "rmsnorm_matmul", "--set", "batch=0"], "a parameter must be a positive integer"),
    (["show", "rmsnorm_matmul", "--fused", "--config", "g0=x"], "--config g0=x"),
    (["show", "rmsnorm_matmul", "--fused", "--config", "g0=3", "--config", "F=3"],
     "not divisible by 3"),
])
def test_show_bad_input_exits_2_with_one_line(capsys, argv, fragment):
    code, out, err = run_main(capsys, *argv)
    assert code == 2 and out == ""
    assert fragment in one_line_error(err, "show")


# --- verify -------------------------------------------------------------------------------------

def test_verify_equivalent_exits_0(capsys, graphs):
    code, out, err = run_main(capsys, "verify", str(graphs["ref"]), str(graphs["fused"]))
    assert code == 0 and err == ""
    assert out.startswith("EQUIVALENT: all 1 output(s) agree on 4 random tests")


def test_verify_mutant_exits_1(capsys, graphs):
    code, out, _ = run_main(capsys, "verify", str(graphs["ref"]), str(graphs["mutant"]))
    assert code == 1 and out.startswith("NOT EQUIVALENT: output 0 differs")
    code, out, _ = run_main(capsys, "verify", str(graphs["ref"]), str(graphs["mutant"]),
                        "--arithmetic", "float", "--json")
    verdict = json.loads(out)
    assert code == 1 and verdict["equivalent"] is False and verdict["arithmetic"] == "float"


def test_verify_program_file_against_structure_with_config(capsys, tmp_path):
    program = tmp_path / "gated.yaml"
    program.write_text("name: gated_mlp\ninputs:\n  X: [8, 64]\n  W1: [64, 64]\n"
                       "  W2: [64, 64]\nbody: |\n  O = silu(matmul(X, W1)) * matmul(X, W2)\n"
                       "outputs: [O]\n")
    code, out, _ = run_main(capsys, "show", str(program), "--fused", "--json")
    assert code == 0
    path = tmp_path / "gated.json"
    path.write_text(out)
    code, out, _ = run_main(capsys, "verify", str(program), str(path), "--config", "g0=4",
                        "--config", "F=8", "--tests", "2", "--seed", "3", "--json")
    verdict = json.loads(out)
    assert code == 0 and verdict["equivalent"] and verdict["tests"] == 2 and verdict["seed"] == 3
    code, out, _ = run_main(capsys, "verify", str(program), str(path))  # no config: a reason
    assert code == 1 and "unbound symbols" in out


def test_verify_malformed_json_exits_2(capsys, graphs, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": ')
    code, out, err = run_main(capsys, "verify", str(graphs["ref"]), str(bad))
    assert code == 2 and out == ""
    assert f"{bad}: not valid JSON" in one_line_error(err, "verify")
    doc = json.loads(graphs["fused"].read_text())
    doc["ops"][2]["block_graph"]["ops"][2]["op"] = "matmult"
    bad.write_text(json.dumps(doc))
    code, _, err = run_main(capsys, "verify", str(graphs["ref"]), str(bad))
    line = one_line_error(err, "verify")
    assert code == 2 and f"{bad}: $.ops[2].block_graph.ops[2]: unknown op 'matmult'" in line


def test_verify_missing_file_exits_2(capsys, graphs, tmp_path):
    missing = tmp_path / "missing.json"
    code, _, err = run_main(capsys, "verify", str(missing), str(graphs["ref"]))
    assert code == 2 and f"{missing}: cannot read" in one_line_error(err, "verify")
    code, _, err = run_main(capsys, "verify", str(graphs["ref"]), str(tmp_path / "missing.yaml"))
    assert code == 2 and "missing.yaml" in one_line_error(err, "verify")


def test_verify_malformed_program_file_exits_2_with_line(capsys, graphs, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ninputs: {X: [2, 16], W: [16, 16]}\nbody: |\n"
                   "  N = rms_norm(X)\n  O = matmul(N, W\noutputs: [O]\n")
    code, _, err = run_main(capsys, "verify", str(bad), str(graphs["ref"]))
    line = one_line_error(err, "verify")
    assert code == 2 and f"{bad}:5: syntax error in body" in line


def test_verify_non_finite_constant_is_not_a_crash(capsys, graphs, tmp_path):
    doc = json.loads(graphs["ref"].read_text())
    rms = doc["ops"][2]
    assert rms["op"] == "rms_norm"
    for op in doc["ops"][3:]:  # tensor 2 becomes the scaled X, so later ids shift by one
        op["in"] = [t + 1 if t >= 2 else t for t in op["in"]]
    doc["ops"].insert(2, {"op": "mul_scalar", "in": [0], "scalar": float("inf")})
    rms["in"] = [2]
    from_json(json.dumps(doc).replace("Infinity", "1.0"))  # otherwise a valid document
    path = tmp_path / "inf.json"
    path.write_text(json.dumps(doc))
    code, _, err = run_main(capsys, "verify", str(graphs["ref"]), str(path))
    assert code in (1, 2)
    if code == 2:
        one_line_error(err, "verify")


def test_verify_bad_tests_count_exits_2(capsys, graphs):
    code, _, err = run_main(capsys, "verify", str(graphs["ref"]), str(graphs["ref"]), "--tests", "0")
    assert code == 2 and "--tests 0" in one_line_error(err, "verify")


def _tuner_command() -> list[str]:
    script = Path(sys.executable).parent / "tuner"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tuner.cli"]


def test_console_command_in_a_subprocess(graphs, tmp_path):
    cmd = _tuner_command()
    ok = subprocess.run([*cmd, "verify", str(graphs["ref"]), str(graphs["fused"])],
                        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert ok.returncode == 0 and ok.stdout.startswith("EQUIVALENT"), ok.stderr
    no = subprocess.run([*cmd, "verify", str(graphs["ref"]), str(graphs["mutant"])],
                        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert no.returncode == 1 and no.stdout.startswith("NOT EQUIVALENT")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ninputs: {X: [2, 16]}\nbody: |\n  O = exp(X)\n  P = X.T\n"
                   "outputs: [O]\n")
    err = subprocess.run([*cmd, "verify", str(bad), str(graphs["ref"])],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert err.returncode == 2 and err.stdout == ""
    assert err.stderr.strip().splitlines() == [
        f"tuner verify: error: {bad}:5: 'X.T' is outside the program language "
        "(use names, numbers, + - * / @ and op calls)"]
    helped = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "verify" in helped.stdout


def test_python_dash_m_tuner_is_the_console_command(tmp_path):
    """``python -m tuner`` runs the console script's entry point: its help, its commands,
    its exit code 2 and one-line error on bad input."""
    cmd = [sys.executable, "-m", "tuner"]
    helped = subprocess.run([*cmd, "--help"], capture_output=True, text=True, cwd=ROOT,
                            timeout=120)
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: tuner ") and "launch" in helped.stdout
    listed = subprocess.run([*cmd, "programs", "--json"], capture_output=True, text=True,
                            cwd=ROOT, timeout=120)
    assert listed.returncode == 0
    assert [r["name"] for r in json.loads(listed.stdout)] == list(builtin_names())
    bad = subprocess.run([*cmd, "show", "no_such_program"], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    assert one_line_error(bad.stderr, "show")


def test_times_and_progress_lines_read_as_they_did(capsys):
    """One formatter and one progress class print every command's times and progress lines,
    word for word what each command printed before (the lines of README's `make demo`)."""
    from tuner.cli._console import Progress
    from tuner.cli.search import SEARCH_LINE
    from tuner.formatting import ms

    assert (ms(1.6e-5), ms(None), ms(float("nan"))) == ("0.016 ms", "-", "-")
    assert ms(1.01e-5, unit="") == "0.010"  # the summary and status tables (headed "ms")
    assert ms(1.23456e-3, spec=".4g") == "1.235 ms"  # tuner measure
    info = {"states": 1472, "verified": 15, "elapsed_s": 1.14}
    trial = {"status": "ok", "median_s": 1.6e-5, "config": {"g0": 8, "F": 4}}
    launch = Progress()
    launch.tty = False  # lines, as in a log or CI (a terminal gets tqdm bars)
    launch.search("rmsnorm_matmul", info)
    launch.trial("rmsnorm_matmul", "6fcfac231e2cc295", trial)
    launch.trial("rmsnorm_matmul", "6fcfac231e2cc295", {"status": "timeout", "config": {}})
    launch.log("done")
    search = Progress(search_line=SEARCH_LINE)
    search.tty = False
    search.search("", info)
    Progress(enabled=False).search("x", info)  # --json / --quiet: nothing
    assert capsys.readouterr().err.splitlines() == [
        "search rmsnorm_matmul: states 1,472  verified 15  1.1s",
        "tune rmsnorm_matmul [6fcfac231e] F=4 g0=8: 0.016 ms",
        "tune rmsnorm_matmul [6fcfac231e] : timeout",
        "done",
        "search: states 1,472  verified 15  elapsed 1.1s",
    ]


def test_launch_hint_names_what_tuner_best_takes(tmp_path, capsys, monkeypatch):
    """`query it later: tuner best ...` after a launch: a program file's path (a user who
    copied the hint for examples/gpt2_mlp_cpu.yaml got "not a built-in program"), a built-in's
    name, nothing for an inline program (tuner best cannot name one)."""
    from tuner.cli.jobs import _best_spec
    from tuner.jobfile import load_job, parse_job

    monkeypatch.chdir(ROOT)
    spec = _best_spec(load_job("examples/gpt2_mlp_cpu.yaml"), "gpt2_mlp_small")
    assert spec == "examples/programs/gpt2_mlp_small.yaml"
    code, out, err = run_main(capsys, "show", spec)
    assert code == 0 and "O = matmul(H, W2)" in out, err
    assert _best_spec(load_job("examples/quickstart.yaml"), "softmax_rows") == "softmax_rows"
    inline = parse_job("programs:\n  - program:\n      name: e\n      dtype: float32\n"
                       "      inputs: {X: [4, 4]}\n      body: O = exp(X)\n      outputs: [O]\n",
                       str(tmp_path / "job.yaml"), base_dir=str(tmp_path))
    assert _best_spec(inline, "e") is None


def test_best_on_a_device_without_a_kernel_names_the_devices_that_have_one(tmp_path, capsys):
    """`tuner best --device tpu` (or `tuner.load(..., device=...)`) where the program is tuned
    on another device once said only "no tuned kernel ... tune it with tuner launch"; and
    `--device cuda` on a machine without a GPU was a RuntimeError traceback."""
    import db
    import tuner
    from kernels import cuda_available
    from tuner.api import InputError
    from tuner.identity import program_key

    url = f"sqlite:///{tmp_path / 'b.db'}"
    key = program_key(load_program("softmax_rows", {"rows": 8, "cols": 8}))
    with db.connect(url) as database:
        pid = database.record_program(key.program_hash, key.shapes, key.dtype, "softmax_rows",
                                      {"ops": []})
        sid = database.record_structure(pid, "s" * 64, {"ops": []}, {"verdict": "ok"}, 1)
        tid = database.record_trial(sid, "cpu:Elsewhere:2c", {"g0": 2})
        database.update_best(database.record_measurement(tid, "ok", median_s=1e-3), "src")
    sets = ["--set", "rows=8", "--set", "cols=8", "--db", url]
    code, _, err = run_main(capsys, "best", "softmax_rows", *sets, "--device", "tpu")
    line = one_line_error(err, "best")
    assert code == 2 and "on 'tpu'" in line and "'cpu:Elsewhere:2c'" in line
    with pytest.raises(InputError, match="it has one on 'cpu:Elsewhere:2c'"):
        tuner.load("softmax_rows", {"rows": 8, "cols": 8}, device="tpu", url=url)
    code, _, err = run_main(capsys, "best", "softmax_rows", "--set", "rows=16", "--set",
                            "cols=8", "--db", url, "--device", "tpu")  # not at these shapes
    assert code == 2 and "tuner launch" in one_line_error(err, "best")
    if not cuda_available()[0]:
        code, _, err = run_main(capsys, "best", "softmax_rows", *sets, "--device", "cuda")
        assert code == 2 and "stored device key" in one_line_error(err, "best")
