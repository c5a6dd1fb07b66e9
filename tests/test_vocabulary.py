"""One vocabulary: each shared fact is defined in one module and imported everywhere else.

The facts and their homes:

- trial statuses (``ok``, ``compile_error``, ..., ``invalid``, ``node_lost``):
  ``kernels/devices/_status.py``;
- the device-name grammar (``cpu``, ``cuda``, ``cuda:N``, ``replay``; ``DEVICE_KINDS``,
  ``parse_device_name``, ``device_kind``): ``kernels/device_names.py``;
- the database URL default: ``db/_engine.py``; ``MAX_RANK`` and ``GRID_DIMS``:
  ``search/ir/ops.py``; Kernel Tuner's failure markers: ``costmodel/_store.py``.

The scan reads every module's syntax tree (never imports it) and reports a fact written out
again elsewhere:

- a collection literal holding two or more status words, or two or more device kinds (a
  re-declared vocabulary, e.g. ``("ok", "node_lost")`` or ``choices=("cpu", "cuda")``);
- a status word where a status is set or tested: the value of a ``"status"`` key or a
  ``status=`` keyword, either side of a comparison with ``status`` / ``x.status`` /
  ``x["status"]``, an argument of the calls that take a status (``RunResult``,
  ``TrialResult``, ``MeasuredConfig``, ``record_measurement``), or both branches of
  ``a if c else b`` (so ``TrialResult(NODE_LOST if lost else RUNTIME_ERROR, ...)`` passes and
  the same with strings does not);
- a regular expression naming a device kind, or a device name or key parsed by hand
  (``x.startswith("cuda")``);
- the default database URL in a string that is not a docstring;
- a module-level assignment to one of the facts' names (``MAX_RANK = 4``) outside its home.

Words used for other things (a dict key ``"ok"``, an Optuna attribute ``"invalid"``, a
docstring) are not facts and pass.  Alembic migrations are frozen history: they keep the
literals they were written with.
"""

from __future__ import annotations

import ast
from pathlib import Path

from kernels import DEVICE_KINDS, MEASUREMENT_STATUSES, REPLAY, TRIAL_STATUSES

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("search", "verifier", "kernels", "db", "costmodel", "cluster")
STATUS_HOME = "kernels/devices/_status.py"
DEVICE_HOME = "kernels/device_names.py"
URL_HOME = "db/_engine.py"
SKIP = ("db/migrations/",)

STATUS_WORDS = frozenset((*TRIAL_STATUSES, *MEASUREMENT_STATUSES))
DEVICE_WORDS = frozenset((*DEVICE_KINDS, REPLAY))
DEFAULT_URL_TEXT = "sqlite:///./tuner.db"
# a name defined once -> the module that defines it
NAME_HOMES = {
    "STATUSES": STATUS_HOME, "TRIAL_STATUSES": STATUS_HOME, "MEASUREMENT_STATUSES": STATUS_HOME,
    "DEVICE_KINDS": DEVICE_HOME, "DEVICE_NAME": DEVICE_HOME, "DEFAULT_URL": URL_HOME,
    "MAX_RANK": "search/ir/ops.py", "GRID_DIMS": "search/ir/ops.py",
    "KT_STATUS": "costmodel/_store.py",
}
STATUS_CALLS = {"RunResult", "TrialResult", "MeasuredConfig", "record_measurement"}
REGEX_CALLS = {"compile", "match", "fullmatch", "search", "findall", "finditer", "split", "sub"}


def _text(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _words(node: ast.AST, words: frozenset[str]) -> list[str]:
    """The ``words`` a value expression writes out: itself, or either branch of an ``if``."""
    if isinstance(node, ast.IfExp):
        return _words(node.body, words) + _words(node.orelse, words)
    if isinstance(node, ast.BoolOp):
        return [w for v in node.values for w in _words(v, words)]
    if isinstance(node, ast.Call):  # d.get(key, "runtime_error"): the default is a status
        return [w for a in node.args[1:] for w in _words(a, words)]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [w for e in node.elts for w in _words(e, words)]
    text = _text(node)
    return [text] if text in words else []


def _is_status(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "status"
            or isinstance(node, ast.Attribute) and node.attr == "status"
            or isinstance(node, ast.Subscript) and _text(node.slice) == "status")


def _callee(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and _text(body[0].value) is not None:
                out.add(id(body[0].value))
    return out


def violations_in(path: Path, rel: str) -> list[str]:
    """Every fact of the vocabulary that ``path`` writes out instead of importing."""
    tree = ast.parse(path.read_text(), rel)
    docs = _docstrings(tree)
    found: list[tuple[int, str]] = []

    def hit(node: ast.AST, what: str) -> None:
        found.append((node.lineno, what))

    for node in ast.walk(tree):
        statuses = rel != STATUS_HOME
        devices = rel != DEVICE_HOME
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            texts = [_text(e) for e in node.elts]
            if statuses and len({t for t in texts if t in STATUS_WORDS}) >= 2:
                hit(node, f"statuses {sorted(t for t in texts if t in STATUS_WORDS)}")
            if devices and len({t for t in texts if t in DEVICE_WORDS}) >= 2:
                hit(node, f"device kinds {sorted(t for t in texts if t in DEVICE_WORDS)}")
        elif isinstance(node, ast.Dict) and statuses:
            values = [w for v in node.values for w in _words(v, STATUS_WORDS)]
            keyed = [w for k, v in zip(node.keys, node.values, strict=True)
                     if k is not None and _text(k) == "status" for w in _words(v, STATUS_WORDS)]
            if keyed or len(set(values)) >= 2:
                hit(node, f"status literal(s) {sorted(set(keyed or values))}")
        elif isinstance(node, ast.keyword) and statuses and node.arg == "status":
            if words := _words(node.value, STATUS_WORDS):
                hit(node.value, f"status={words}")
        elif isinstance(node, ast.Compare) and statuses:
            sides = [node.left, *node.comparators]
            if any(_is_status(s) for s in sides):
                words = [w for s in sides for w in _words(s, STATUS_WORDS)]
                if words:
                    hit(node, f"status compared with {words}")
        elif isinstance(node, ast.IfExp) and statuses:
            if _words(node.body, STATUS_WORDS) and _words(node.orelse, STATUS_WORDS):
                hit(node, f"statuses {_words(node, STATUS_WORDS)}")
        if isinstance(node, ast.Call):
            name = _callee(node)
            if statuses and name in STATUS_CALLS:
                words = [w for a in node.args for w in _words(a, STATUS_WORDS)]
                if words:
                    hit(node, f"{name}({words})")
            pattern = _text(node.args[0]) if node.args else None
            if (devices and name in REGEX_CALLS and pattern is not None
                    and any(w in pattern for w in DEVICE_WORDS)):
                hit(node, f"a device-name regex {pattern!r}")
            prefix = _text(node.args[0]) if node.args else None
            if (devices and name == "startswith" and prefix is not None
                    and prefix.partition(":")[0] in DEVICE_WORDS):
                hit(node, f"a device name parsed by hand: startswith({prefix!r})")
        text = _text(node)
        if (text is not None and DEFAULT_URL_TEXT in text and rel != URL_HOME
                and id(node) not in docs):
            hit(node, f"the default database URL {text!r}")
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.col_offset == 0:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and t.id in NAME_HOMES and NAME_HOMES[t.id] != rel:
                    hit(node, f"{t.id} defined here, not in {NAME_HOMES[t.id]}")
    return [f"{rel}:{line}: {what}" for line, what in sorted(found)]


def scan(root: Path, packages: tuple[str, ...]) -> list[str]:
    out = []
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if not rel.startswith(SKIP):
                out += violations_in(path, rel)
    return out


def test_no_package_writes_out_a_fact_of_the_vocabulary():
    assert scan(ROOT, PACKAGES) == []


def test_tuner_writes_out_no_fact_of_the_vocabulary():
    assert scan(ROOT, ("tuner",)) == []


def test_the_scan_sees_each_kind_of_duplicate(tmp_path):
    """The checker itself: every rule fires on a module that breaks it, and passes the same
    module written with the imported names."""
    bad = tmp_path / "cluster" / "x.py"
    bad.parent.mkdir()
    bad.write_text(
        'import re\n'
        'STATUSES = ("ok", "timeout")\n'
        'MAX_RANK = 4\n'
        'DEVICE = re.compile(r"cpu|cuda(:\\d+)?")\n'
        'URL = "sqlite:///./tuner.db"\n'
        'def f(res, name, lost):\n'
        '    out = {"status": "invalid"}\n'
        '    out.update(status="wrong_result")\n'
        '    if res.status == "ok" or name.startswith("cuda:"):\n'
        '        return TrialResult("node_lost" if lost else "runtime_error", 1)\n'
        '    return ("cpu", "cuda"), {"a": "compile_error", "b": "runtime_error"}\n')
    found = scan(tmp_path, ("cluster",))
    assert {int(f.split(":")[1]) for f in found} == {2, 3, 4, 5, 7, 8, 9, 10, 11}, found
    line9 = " ".join(f for f in found if f.startswith("cluster/x.py:9:"))
    assert "status compared" in line9 and "startswith('cuda:')" in line9
    bad.write_text(
        'from kernels import INVALID, NODE_LOST, OK, RUNTIME_ERROR, parse_device_name\n'
        'def f(res, name, lost):\n'
        '    """Statuses such as "ok"; the default URL sqlite:///./tuner.db."""\n'
        '    out = {"status": INVALID, "ok": 1}\n'
        '    if res.status == OK and parse_device_name(name)[0] == "cuda":\n'
        '        return TrialResult(NODE_LOST if lost else RUNTIME_ERROR, 1)\n'
        '    return out\n')
    assert scan(tmp_path, ("cluster",)) == []
