"""Program files: built-ins, overrides, and errors with file and line (never eval)."""

from __future__ import annotations

from pathlib import Path

import pytest

from search import (
    ProgramError,
    ShapeError,
    builtin_names,
    builtin_program,
    load_program,
    load_program_file,
    new_kernel_graph,
    parse_program,
    structural_hash,
    to_json,
)

# Output shapes of the built-ins at their default sizes (../shared/docs/benchmarks.md).
BUILTIN_OUTPUTS = {
    "rmsnorm_matmul": [(2, 6144)],
    "gated_mlp": [(8, 4096)],
    "lora": [(16, 4096)],
    "gqa": [(2, 256, 64)],
    "qknorm_gqa": [(2, 256, 64)],
    "mha": [(32, 16, 64)],
    "mqa": [(1, 1024, 64)],
    "ntrans": [(8, 4096)],
    "softmax_rows": [(4096, 1024)],
    "rmsnorm_residual": [(1024, 4096), (1024, 4096)],
}


def _output_shapes(graph) -> list[tuple]:
    return [graph.tensors[t].shape for t in graph.output_ids]


def test_there_are_ten_builtins():
    assert set(builtin_names()) == set(BUILTIN_OUTPUTS) and len(builtin_names()) == 10


@pytest.mark.parametrize("name", list(BUILTIN_OUTPUTS))
def test_builtin_loads_and_builds(name):
    program = load_program(name)
    assert program.name == name and program.description
    graph = program.build()
    assert _output_shapes(graph) == BUILTIN_OUTPUTS[name]
    assert [graph.tensors[t].name for t in graph.input_ids] == list(program.inputs)
    assert graph.is_concrete()
    assert builtin_program(name).inputs == program.inputs


def test_program_builds_the_same_graph_as_the_builder():
    g = new_kernel_graph()
    X = g.new_input((2, 4096), "float16")
    W = g.new_input((4096, 6144), "float16")
    g.mark_output(g.matmul(g.rms_norm(X), W))
    assert structural_hash(load_program("rmsnorm_matmul").build()) == structural_hash(g)


def test_scalar_constants_neg_and_eps_map_to_ops():
    text = """name: ops
dtype: float32
inputs:
  X: [4, 8]
  W: {shape: [8, 16], layout: transposed}
body: |
  A = X + 1e-6
  B = 1 - X
  C = X - 2
  D = rms_norm(X, eps=1e-5) + rsqrt(tanh(A)) + rms_norm(X)
  O = matmul(A + B + C + D, W)
outputs: [O]
"""
    g = parse_program(text, "ops.yaml").build()
    kinds = [(op.kind, op.attrs.get("scalar", op.attrs.get("eps"))) for op in g.ops
             if op.kind not in ("input", "output")]
    assert kinds[:4] == [("add_scalar", 1e-6), ("neg", None), ("add_scalar", 1.0),
                         ("add_scalar", -2.0)]
    assert ("rms_norm", 1e-5) in kinds and ("rms_norm", None) in kinds  # eps 0: not stored
    assert ("rsqrt", None) in kinds and ("tanh", None) in kinds
    assert [op.attrs.get("layout") for op in g.ops_of("input")] == [None, "transposed"]
    assert g.input_layout(g.input_ids[1]) == "transposed"
    assert _output_shapes(g) == [(4, 16)]
    # the builder spells the same graph
    h = new_kernel_graph()
    x = h.new_input((4, 8), "float32", "X")
    w = h.new_input((8, 16), "float32", "W", layout="transposed")
    a = h.add_scalar(x, 1e-6)
    b = h.add_scalar(h.neg(x), 1.0)
    c = h.add_scalar(x, -2.0)
    d = h.add(h.add(h.rms_norm(x, eps=1e-5), h.rsqrt(h.tanh(a))), h.rms_norm(x))
    h.mark_output(h.matmul(h.add(h.add(h.add(a, b), c), d), w))
    assert structural_hash(h) == structural_hash(g)
    # a row-major input, or eps 0, is stored as before: the same hash as without them
    r = new_kernel_graph()
    r.mark_output(r.rms_norm(r.new_input((4, 8), "float32", "X", layout="row"), eps=0.0))
    s = new_kernel_graph()
    s.mark_output(s.rms_norm(s.new_input((4, 8), "float32", "X")))
    assert structural_hash(r) == structural_hash(s) and to_json(r) == to_json(s)
    with pytest.raises(ShapeError, match="at least 2 dims"):
        new_kernel_graph().new_input((8,), "float32", layout="transposed")
    with pytest.raises(ShapeError, match="eps must be ≥ 0"):
        r.rms_norm(r.tensor(r.input_ids[0]), eps=-1.0)


def test_operators_map_to_ops():
    text = """name: ops
dtype: float32
inputs:
  A: [4, 8]
  B: [8, 4]
body: |
  C = A @ B
  D = -C
  E = C / 4
  F = 2 * E + D - sqrt(square(C)) * relu(C)
  G = mean(exp(F), dim=1)
outputs: [G]
"""
    g = parse_program(text, "ops.yaml").build()
    assert [op.kind for op in g.ops if op.kind not in ("input", "output")] == [
        "matmul", "neg", "mul_scalar", "mul_scalar", "add", "square", "sqrt", "relu",
        "mul", "sub", "exp", "mean"]
    scalars = [op.attrs["scalar"] for op in g.ops if op.kind == "mul_scalar"]
    assert scalars == [0.25, 2.0]
    assert _output_shapes(g) == [(4, 1)]
    assert {g.tensors[t].dtype for t in range(len(g.tensors))} == {"float32"}


# --- overrides ----------------------------------------------------------------------------------

def test_batch_override_changes_shapes():
    p = load_program("rmsnorm_matmul", {"batch": "8"})
    assert p.inputs == {"X": (16, 4096), "W": (4096, 6144)}
    assert _output_shapes(p.build()) == [(16, 6144)]
    p = load_program("gqa", {"batch": 4})
    assert p.inputs["Q"] == (8, 256, 64) and p.inputs["V"] == (8, 4096, 64)
    p = load_program("softmax_rows", {"rows": "8", "cols": "32"})
    assert _output_shapes(p.build()) == [(8, 32)]


def test_per_input_override():
    p = load_program("rmsnorm_matmul", {"X": "16x1024", "W": "1024,512"})
    assert p.inputs == {"X": (16, 1024), "W": (1024, 512)}
    assert _output_shapes(p.build()) == [(16, 512)]
    p = load_program("rmsnorm_matmul", {"X": (4, 4096)})
    assert p.inputs["X"] == (4, 4096)
    # an input override wins over the parameter it was computed from
    p = load_program("rmsnorm_matmul", {"batch": "8", "X": "4x4096"})
    assert p.inputs["X"] == (4, 4096)


@pytest.mark.parametrize("overrides,fragment", [
    ({"batch": "0"}, "batch=0: a parameter must be a positive integer"),
    ({"batch": "two"}, "batch=two: a parameter must be a positive integer"),
    ({"nope": "3"}, "rmsnorm_matmul has no parameter or input 'nope' (known: batch, W, X)"),
    ({"X": "16xq"}, "X=16xq: write a shape as NxM"),
    ({"X": "0x4096"}, "X=0x4096: dims must be positive"),
])
def test_bad_overrides(overrides, fragment):
    with pytest.raises(ProgramError) as err:
        load_program("rmsnorm_matmul", overrides)
    assert fragment in str(err.value)
    assert str(err.value).startswith("<builtin rmsnorm_matmul>")


def test_override_that_breaks_a_shape_rule_names_the_body_line():
    p = load_program("rmsnorm_matmul", {"X": "2x16"})
    with pytest.raises(ProgramError) as err:
        p.build()
    assert err.value.line == 9 and "matmul: inner dims differ" in str(err.value)


def test_override_with_too_many_dims_is_a_program_error():
    with pytest.raises(ProgramError, match="X"):
        load_program("rmsnorm_matmul", {"X": "1x2x3x4x5"}).build()


def test_unknown_program():
    with pytest.raises(ProgramError, match="not a built-in program and no such file"):
        load_program("rmsnorm_matmull")
    with pytest.raises(ProgramError, match="cannot read program file"):
        load_program("missing/program.yaml")
    with pytest.raises(ProgramError, match="no built-in program of that name"):
        builtin_program("softmax")


# --- errors: file:line: reason ------------------------------------------------------------------

BASE = """name: demo
description: a test program
dtype: float16
inputs:
  X: [8, 16]
  W: [16, 32]
body: |
  A = matmul(X, W)
  B = exp(A)
  O = B / sum(B, 1)
outputs: [O]
"""


def _edit(line: int, text: str) -> str:
    lines = BASE.splitlines()
    lines[line - 1] = text
    return "\n".join(lines) + "\n"


MISTAKES = {
    # name: (program text, line of the error, fragment of the reason)
    "syntax error": (_edit(9, "  B = exp(A"), 9, "syntax error in body"),
    "bad indentation": (_edit(10, "    O = B / sum(B, 1)"), 10, "syntax error in body"),
    "unknown op": (_edit(9, "  B = expo(A)"), 9, "unknown op 'expo'"),
    "unknown name": (_edit(9, "  B = exp(Z)"), 9, "unknown name 'Z'"),
    "assign to input": (_edit(9, "  X = exp(A)"), 9, "cannot assign to input 'X'"),
    "constant / tensor": (_edit(9, "  B = 1 / A"), 9, "not be divided by one"),
    "bad layout": (_edit(6, "  W: {shape: [16, 32], layout: columns}"), 6,
                   "layout 'columns' is not one of row, transposed"),
    "wrong arity": (_edit(9, "  B = exp(A, W)"), 9, "exp takes 1 tensor argument"),
    "missing operand": (_edit(8, "  A = matmul(X)"), 8, "matmul takes 2 tensor argument"),
    "missing attribute": (_edit(10, "  O = B / sum(B)"), 10, "sum needs 1 attribute"),
    "unknown keyword": (_edit(10, "  O = B / sum(B, axis=1)"), 10, "no argument 'axis'"),
    "bad reduction dim": (_edit(10, "  O = B / sum(B, 2)"), 10, "sum: dim 2 is out of range"),
    "matmul shape mismatch": (_edit(8, "  A = matmul(W, X)"), 8,
                              "matmul: inner dims differ: (16, 32) @ (8, 16)"),
    "broadcast mismatch": (_edit(9, "  B = A + X"), 9, "add: shapes (8, 32) and (8, 16)"),
    "division by zero": (_edit(9, "  B = A / 0"), 9, "division by the constant 0"),
    "naming a constant": (_edit(9, "  B = 2"), 9, "would be a constant"),
    "not an assignment": (_edit(9, "  import os"), 9, "one assignment"),
    "two targets": (_edit(9, "  B = C = exp(A)"), 9, "one assignment"),
    "eval injection": (_edit(9, "  B = __import__('os').system('true')"), 9,
                       "call op names directly"),
    "exec by name": (_edit(9, "  B = exec('1')"), 9, "unknown op 'exec'"),
    "attribute access": (_edit(9, "  B = A.T"), 9, "'A.T' is outside the program language"),
    "power": (_edit(9, "  B = A ** 2"), 9, "outside the program language"),
    "subscript": (_edit(9, "  B = A[0]"), 9, "outside the program language"),
    "lambda": (_edit(9, "  B = (lambda: A)()"), 9, "call op names directly"),
    "bad dtype": (_edit(3, "dtype: float64"), 3, "dtype 'float64' is not one of"),
    "unknown top-level key": (_edit(2, "descriptoin: typo"), 2, "unknown key 'descriptoin'"),
    "too many dims": (_edit(6, "  W: [16, 32, 1, 1, 1]"), 6, "input W: shape must be a list"),
    "bad input name": (_edit(6, "  W-1: [16, 32]"), 6, "input name 'W-1' is not an identifier"),
    "bad YAML": (_edit(5, "  X: [8, 16"), 6, "not valid YAML"),
    "body not a block": (BASE.replace(BASE[BASE.index("body"):BASE.index("outputs")],
                                      "body: [1, 2]\n"), 7, "body is a block of assignments"),
    "empty outputs": (_edit(11, "outputs: []"), 11, "outputs lists the names"),
}


@pytest.mark.parametrize("name", list(MISTAKES))
def test_mistake_reports_file_line_and_reason(name, tmp_path):
    text, line, fragment = MISTAKES[name]
    path = tmp_path / "demo.yaml"
    path.write_text(text)
    with pytest.raises(ProgramError) as err:
        load_program_file(path)
    assert err.value.line == line, str(err.value)
    assert str(err.value).startswith(f"{path}:{line}: "), str(err.value)
    assert fragment in err.value.reason, str(err.value)
    assert "\n" not in str(err.value)


def test_the_base_program_is_valid(tmp_path):
    path = tmp_path / "demo.yaml"
    path.write_text(BASE)
    g = load_program(str(path)).build()
    assert _output_shapes(g) == [(8, 32)]


def test_missing_outputs_key():
    with pytest.raises(ProgramError) as err:
        parse_program(BASE.replace("outputs: [O]\n", ""), "demo.yaml")
    assert str(err.value) == "demo.yaml: missing required key 'outputs'"


def test_undefined_output_is_named():
    with pytest.raises(ProgramError, match=r"^demo.yaml.*output 'Z' is not defined"):
        parse_program(BASE.replace("outputs: [O]", "outputs: [Z]"), "demo.yaml")


def test_not_a_mapping():
    with pytest.raises(ProgramError, match=r"^demo.yaml:1: a program file is a mapping"):
        parse_program("- a\n- b\n", "demo.yaml")


def test_error_line_inside_a_multi_line_expression():
    text = _edit(8, "  A = matmul(X,\n             Y)")
    with pytest.raises(ProgramError) as err:
        parse_program(text, "demo.yaml")
    assert err.value.line == 9 and "unknown name 'Y'" in err.value.reason


def test_body_with_comments_and_blank_lines_keeps_lines():
    text = _edit(8, "  # a comment\n\n  A = matmul(X, W)").replace("B = exp(A)", "B = expo(A)")
    with pytest.raises(ProgramError) as err:
        parse_program(text, "demo.yaml")
    assert err.value.line == 11


def test_dim_expression_error_names_the_input_line():
    text = _edit(6, "  W: [16, batch]")
    with pytest.raises(ProgramError) as err:
        parse_program(text, "demo.yaml")
    assert "input W: dim 'batch' may use integers" in err.value.reason
    assert err.value.line == 6  # W's line, not the line of 'inputs:'
    with pytest.raises(ProgramError) as err:
        parse_program(_edit(5, "  X: [8, 2 ** 4]"), "demo.yaml")
    assert err.value.line == 5


# --- never evaluates Python --------------------------------------------------------------------

def test_injection_has_no_side_effect(tmp_path):
    marker = tmp_path / "pwned"
    attempts = [
        f"  B = __import__('os').system('touch {marker}')",
        f"  B = exec(\"open('{marker}', 'w')\")",
        f"  B = eval(\"open('{marker}', 'w')\")",
        f"  B = exp(open('{marker}', 'w'))",
        f"  B = [open('{marker}', 'w') for _ in A]",
    ]
    for line in attempts:
        with pytest.raises(ProgramError) as err:
            parse_program(_edit(9, line), "demo.yaml")
        assert err.value.line == 9
    # shapes are expressions too: they are parsed, not evaluated
    shape = f"  X: [8, \"__import__('os').system('touch {marker}') or 16\"]"
    with pytest.raises(ProgramError, match="input X"):
        parse_program(_edit(5, shape), "demo.yaml")
    assert not marker.exists()


def test_dim_expressions_over_params():
    text = """name: p
params: {n: 3}
inputs:
  X: [2*n+1, n*n - 1, 16 // n]
body: |
  O = exp(X)
outputs: [O]
"""
    p = parse_program(text, "p.yaml")
    assert p.inputs["X"] == (7, 8, 5)
    assert p.with_overrides({"n": 4}).inputs["X"] == (9, 15, 4)


def test_aliasing_an_input_keeps_its_name():
    text = "name: a\ninputs: {X: [4, 4]}\nbody: |\n  O = X\noutputs: [O]\n"
    g = parse_program(text, "a.yaml").build()
    assert [g.tensors[t].name for t in g.input_ids] == ["X"]


def test_builtin_files_exist_in_the_package():
    import search.ir

    folder = Path(search.ir.__file__).parent / "programs"
    assert sorted(p.stem for p in folder.glob("*.yaml")) == sorted(builtin_names())
