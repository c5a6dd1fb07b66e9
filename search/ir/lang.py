"""Program files: a small YAML language for tensor programs, parsed with ``ast`` (never eval).

    name: rmsnorm_matmul
    dtype: float16
    params: {batch: 1}            # optional integer parameters usable in shapes
    inputs:
      X: [2*batch, 4096]
      W: [4096, 6144]
    body: |
      O = matmul(rms_norm(X), W)
    outputs: [O]

``body`` holds one assignment per line: operators ``+ - * / @``, unary ``-``, numeric constants
(``x + 1e-6``, ``1 - x``, ``x - c``, ``c * x``, ``x / c``: add_scalar, neg and mul_scalar), and
calls of op-table ops such as ``exp(x)``, ``sum(x, 2)`` or ``rms_norm(x, eps=1e-6)``.  An input
is ``name: [dims]``, or ``name: {shape: [dims], layout: transposed}`` for a tensor whose memory
holds the contiguous transpose of its last two dims (a Linear layer's weight read as ``W.t()``).
Every error names the file and line.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .dims import ShapeError
from .graph import KernelGraph, Tensor
from .ops import COMPUTE_OPS, DTYPES, KERNEL, LAYOUTS, OPS

PROGRAM_KEYS = ("name", "dtype", "params", "inputs", "body", "outputs", "description")
_BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.MatMult: "matmul"}


class ProgramError(ValueError):
    """A program file is malformed: ``file:line: reason``."""

    def __init__(self, where: str, line: int | None, reason: str) -> None:
        self.where, self.line, self.reason = where, line, reason
        super().__init__(f"{where}:{line}: {reason}" if line else f"{where}: {reason}")


@dataclass
class Program:
    """A parsed program file: enough to build its reference graph at any shapes."""

    name: str
    dtype: str
    inputs: dict[str, tuple[int, ...]]
    body: str
    outputs: list[str]
    params: dict[str, int] = field(default_factory=dict)
    description: str = ""
    source: str = "<string>"
    body_line: int = 1  # file line of the body's first line, for error messages
    outputs_line: int | None = None
    shape_exprs: dict[str, list[Any]] = field(default_factory=dict)
    layouts: dict[str, str] = field(default_factory=dict)  # inputs not stored row-major

    def with_overrides(self, overrides: Mapping[str, Any]) -> Program:
        """Apply ``--set`` style overrides: a param (``batch=8``) or an input (``X=16x1024``)."""
        params = dict(self.params)
        fixed: dict[str, tuple[int, ...]] = {}
        for key, value in overrides.items():
            if key in self.inputs:
                fixed[key] = _parse_shape_override(key, value, self.source)
            elif key in params:
                if not (isinstance(value, int) or str(value).isdigit()) or int(value) < 1:
                    raise ProgramError(self.source, None, f"--set {key}={value}: a parameter "
                                       "must be a positive integer")
                params[key] = int(value)
            else:
                known = sorted(self.params) + sorted(self.inputs)
                raise ProgramError(self.source, None, f"--set {key}: {self.name} has no "
                                   f"parameter or input {key!r} (known: {', '.join(known)})")
        inputs = {n: fixed.get(n) or _eval_shape(self.shape_exprs.get(n, list(s)), params,
                                                  self.source, n)
                  for n, s in self.inputs.items()}
        return Program(self.name, self.dtype, inputs, self.body, self.outputs, params,
                       self.description, self.source, self.body_line, self.outputs_line,
                       self.shape_exprs, dict(self.layouts))

    def build(self) -> KernelGraph:
        """The reference µGraph of this program."""
        return _Builder(self).build()


def _parse_shape_override(name: str, value: Any, where: str) -> tuple[int, ...]:
    if isinstance(value, list | tuple):
        parts = list(value)
    else:
        parts = str(value).lower().replace(",", "x").split("x")
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise ProgramError(where, None, f"--set {name}={value}: write a shape as "
                           "NxM (for example 16x1024)") from None
    if not shape or any(d < 1 for d in shape):
        raise ProgramError(where, None, f"--set {name}={value}: dims must be positive")
    if len(shape) > 4:
        raise ProgramError(where, None, f"--set {name}={value}: tensors have 1 to 4 dims")
    return shape


def _eval_dim(expr: Any, params: Mapping[str, int], where: str, name: str) -> int:
    """A shape entry: an int, or an expression over params with + - * // only."""
    if isinstance(expr, int) and not isinstance(expr, bool):
        return expr
    if not isinstance(expr, str):
        raise ProgramError(where, None, f"input {name}: dims are integers or expressions over "
                           f"params, got {expr!r}")
    try:
        tree = ast.parse(expr, mode="eval").body
    except SyntaxError:
        raise ProgramError(where, None, f"input {name}: cannot parse dim {expr!r}") from None

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in params:
            return params[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub, ast.Mult,
                                                            ast.FloorDiv):
            a, b = ev(node.left), ev(node.right)
            return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}.get(
                type(node.op), a // b if b else 0)
        raise ProgramError(where, None, f"input {name}: dim {expr!r} may use integers, the "
                           f"params {sorted(params)} and + - * // only")

    return ev(tree)


def _eval_shape(exprs: list[Any], params: Mapping[str, int], where: str,
                name: str) -> tuple[int, ...]:
    shape = tuple(_eval_dim(e, params, where, name) for e in exprs)
    if any(d < 1 for d in shape):
        raise ProgramError(where, None, f"input {name}: shape {shape} has a dim < 1")
    return shape


def parse_program(text: str, source: str = "<string>") -> Program:
    """Parse a program file's text; every error names ``source`` and the line."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        raise ProgramError(source, mark.line + 1 if mark else None,
                           f"not valid YAML: {getattr(err, 'problem', err)}") from None
    if not isinstance(root, yaml.MappingNode):
        raise ProgramError(source, 1, "a program file is a mapping with keys "
                           + ", ".join(PROGRAM_KEYS))
    nodes = {k.value: (k, v) for k, v in root.value}
    data = yaml.safe_load(text)

    def line(key: str) -> int:
        return nodes[key][0].start_mark.line + 1

    for key in nodes:
        if key not in PROGRAM_KEYS:
            raise ProgramError(source, line(key), f"unknown key {key!r}; a program has "
                               + ", ".join(PROGRAM_KEYS))
    for key in ("name", "inputs", "body", "outputs"):
        if key not in nodes:
            raise ProgramError(source, None, f"missing required key {key!r}")
    dtype = data.get("dtype", "float16")
    if dtype not in DTYPES:
        raise ProgramError(source, line("dtype"), f"dtype {dtype!r} is not one of "
                           + ", ".join(DTYPES))
    params = data.get("params") or {}
    if not isinstance(params, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and v > 0 for k, v in params.items()):
        raise ProgramError(source, line("params"), "params maps names to positive integers")
    inputs = data["inputs"]
    if not isinstance(inputs, dict) or not inputs:
        raise ProgramError(source, line("inputs"), "inputs maps each input name to its shape")
    shape_exprs: dict[str, list[Any]] = {}
    layouts: dict[str, str] = {}
    for k_node, _ in nodes["inputs"][1].value:
        name = k_node.value
        if not name.isidentifier():
            raise ProgramError(source, k_node.start_mark.line + 1,
                               f"input name {name!r} is not an identifier")
        value = inputs[name]
        if isinstance(value, dict):
            value, layout = _input_entry(name, value, source, k_node.start_mark.line + 1)
            if layout != "row":
                layouts[name] = layout
        if not isinstance(value, list) or not 1 <= len(value) <= 4:
            raise ProgramError(source, k_node.start_mark.line + 1,
                               f"input {name}: shape must be a list of 1 to 4 dims")
        shape_exprs[name] = value
        try:
            _eval_shape(value, params, source, name)
        except ProgramError as err:
            raise ProgramError(source, k_node.start_mark.line + 1, err.reason) from None
    shapes = {n: _eval_shape(e, params, source, n) for n, e in shape_exprs.items()}
    body = data["body"]
    if not isinstance(body, str):
        raise ProgramError(source, line("body"), "body is a block of assignments (use 'body: |')")
    body_node = nodes["body"][1]
    body_line = body_node.start_mark.line + 1 + (1 if body_node.style in ("|", ">") else 0)
    outputs = data["outputs"]
    if isinstance(outputs, str):
        outputs = [outputs]
    if not isinstance(outputs, list) or not outputs or not all(isinstance(o, str)
                                                              for o in outputs):
        raise ProgramError(source, line("outputs"), "outputs lists the names to return")
    name = data["name"]
    if not isinstance(name, str) or not name:
        raise ProgramError(source, line("name"), "name must be a non-empty string")
    program = Program(name, dtype, shapes, body, outputs, dict(params),
                      str(data.get("description") or ""), source, body_line, line("outputs"),
                      shape_exprs, layouts)
    program.build()  # report body errors now, with their lines
    return program


def _input_entry(name: str, entry: dict, source: str, line: int) -> tuple[Any, str]:
    """``{shape: [...], layout: row|transposed}``: the shape and the layout of one input."""
    unknown = sorted(set(entry) - {"shape", "layout"})
    if unknown or "shape" not in entry:
        raise ProgramError(source, line, f"input {name}: write [dims] or {{shape: [dims], "
                           f"layout: row|transposed}}" + (f" (unknown key(s) {unknown})"
                                                          if unknown else ""))
    layout = entry.get("layout", "row")
    if layout not in LAYOUTS:
        raise ProgramError(source, line, f"input {name}: layout {layout!r} is not one of "
                           + ", ".join(LAYOUTS))
    if layout == "transposed" and isinstance(entry["shape"], list) and len(entry["shape"]) < 2:
        raise ProgramError(source, line, f"input {name}: a transposed input has at least 2 "
                           "dims (its last two are swapped in memory)")
    return entry["shape"], layout


def load_program_file(path: str | Path) -> Program:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ProgramError(str(path), None, f"cannot read program file: {err.strerror}") from None
    return parse_program(text, str(path))


class _Builder:
    """Walks the body's Python AST and emits kernel-graph ops through the builder."""

    def __init__(self, program: Program) -> None:
        self.p = program
        self.g = KernelGraph()
        self.env: dict[str, Tensor] = {}
        self.line = program.body_line

    def fail(self, node: ast.AST | None, reason: str) -> ProgramError:
        offset = getattr(node, "lineno", 1) - 1 if node is not None else 0
        return ProgramError(self.p.source, self.p.body_line + offset, reason)

    def build(self) -> KernelGraph:
        for name, shape in self.p.inputs.items():
            self.env[name] = self.g.new_input(shape, self.p.dtype, name,
                                              layout=self.p.layouts.get(name, "row"))
        try:
            tree = ast.parse(self.p.body)
        except SyntaxError as err:
            raise ProgramError(self.p.source, self.p.body_line + (err.lineno or 1) - 1,
                               f"syntax error in body: {err.msg}") from None
        for stmt in tree.body:
            if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                    and isinstance(stmt.targets[0], ast.Name)):
                raise self.fail(stmt, "each body line must be one assignment 'name = expression'")
            target = stmt.targets[0].id
            if target in self.p.inputs:
                raise self.fail(stmt, f"cannot assign to input {target!r}")
            value = self.expr(stmt.value)
            if not isinstance(value, Tensor):
                raise self.fail(stmt, f"{target} would be a constant; only tensors can be named")
            if value.id not in self.g.input_ids:  # `O = X` must not rename the input X
                self.g.tensors[value.id].name = target
            self.env[target] = value
        for out in self.p.outputs:
            if out not in self.env:
                raise ProgramError(self.p.source, self.p.outputs_line,
                                   f"output {out!r} is not defined in body "
                                   f"(defined: {', '.join(self.env)})")
            self.g.mark_output(self.env[out])
        return self.g

    def apply(self, node: ast.AST, op: str, *args: Any) -> Tensor:
        try:
            return self.g.apply(op, *args)
        except ShapeError as err:
            raise self.fail(node, str(err)) from None

    def expr(self, node: ast.AST) -> Tensor | float:
        if isinstance(node, ast.Name):
            if node.id not in self.env:
                raise self.fail(node, f"unknown name {node.id!r}; defined so far: "
                                + ", ".join(self.env))
            return self.env[node.id]
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) \
                and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            inner = self.expr(node.operand)
            return -inner if isinstance(inner, float) else self.apply(node, "neg", inner)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return self.binop(node)
        if isinstance(node, ast.Call):
            return self.call(node)
        raise self.fail(node, f"{ast.unparse(node)!r} is outside the program language "
                        "(use names, numbers, + - * / @ and op calls)")

    def binop(self, node: ast.BinOp) -> Tensor | float:
        op = _BINOPS[type(node.op)]
        a, b = self.expr(node.left), self.expr(node.right)
        if isinstance(a, Tensor) and isinstance(b, Tensor):
            return self.apply(node, op, a, b)
        if isinstance(a, float) and isinstance(b, float):
            raise self.fail(node, "arithmetic between two constants; write the value instead")
        if op in ("mul", "add"):
            t, c = (a, b) if isinstance(a, Tensor) else (b, a)
            return self.apply(node, f"{op}_scalar", t, c)
        if op == "sub" and isinstance(a, Tensor):  # x - c = x + (-c)
            return self.apply(node, "add_scalar", a, -float(b))  # type: ignore[arg-type]
        if op == "sub" and isinstance(b, Tensor):  # c - x = (-x) + c
            return self.apply(node, "add_scalar", self.apply(node, "neg", b), a)
        if op == "div" and isinstance(a, Tensor) and not isinstance(b, Tensor):
            if b == 0:
                raise self.fail(node, "division by the constant 0")
            return self.apply(node, "mul_scalar", a, 1.0 / b)
        raise self.fail(node, f"'{ast.unparse(node)}': a constant may be added to, subtracted "
                        "from, multiply or divide a tensor, but not be divided by one (there is no "
                        "op for c / x; pass c as an input tensor and write C / x)")

    def call(self, node: ast.Call) -> Tensor:
        if not isinstance(node.func, ast.Name):
            raise self.fail(node, "call op names directly, e.g. exp(x)")
        op = node.func.id
        if op not in OPS or op not in COMPUTE_OPS or KERNEL not in OPS[op].levels:
            raise self.fail(node, f"unknown op {op!r}; ops: " + ", ".join(COMPUTE_OPS))
        opdef = OPS[op]
        args = [self.expr(a) for a in node.args]
        tensors = [a for a in args if isinstance(a, Tensor)]
        if len(tensors) != opdef.arity or any(isinstance(a, Tensor) for a in args[len(tensors):]):
            raise self.fail(node, f"{op} takes {opdef.arity} tensor argument(s) first"
                            + (f", then {', '.join(opdef.attrs)}" if opdef.attrs else ""))
        attrs: list[Any] = [int(a) if float(a).is_integer() and "dim" in opdef.attrs else a
                            for a in args[len(tensors):] if not isinstance(a, Tensor)]
        kw: dict[str, Any] = {}
        for k in node.keywords:
            if k.arg not in opdef.attrs:
                raise self.fail(node, f"{op} has no argument {k.arg!r}"
                                + (f"; it takes {', '.join(opdef.attrs)}" if opdef.attrs
                                   else ""))
            value = self.expr(k.value)
            if isinstance(value, Tensor):
                raise self.fail(node, f"{op}: {k.arg} must be a number")
            kw[k.arg] = int(value) if k.arg == "dim" and float(value).is_integer() else value
        given = {*opdef.attrs[:len(attrs)], *kw}
        missing = [a for a in opdef.required if a not in given]
        if missing or len(attrs) > len(opdef.attrs) or len(given) != len(attrs) + len(kw):
            optional = [a for a in opdef.attrs if a not in opdef.required]
            raise self.fail(node, f"{op} needs {len(opdef.required)} attribute(s) "
                            f"({', '.join(opdef.required) or 'none'})"
                            + (f" and takes {', '.join(optional)} optionally" if optional
                               else ""))
        try:
            return self.g.apply(op, *tensors, *attrs, **kw)
        except ShapeError as err:
            raise self.fail(node, str(err)) from None
