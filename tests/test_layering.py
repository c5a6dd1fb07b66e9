"""The import graph has no circles and no upward arrows (tools/import_graph.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" /
                                                  "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_module_imports_itself_around_a_circle():
    tool = _tool()
    assert tool.cycles(tool.graph()) == []


def test_no_import_points_up_the_layers():
    tool = _tool()
    assert tool.upward(tool.graph()) == []


def test_the_checker_sees_a_circle_and_an_upward_arrow():
    tool = _tool()
    edges = {"search.a": {"search.b"}, "search.b": {"search.a"},
             "kernels.hardware": {"kernels.devices._base"}, "kernels.devices._base": set(),
             "db.x": {"tuner.y"}}
    assert tool.cycles(edges) == [["search.a", "search.b"]]
    assert len(tool.upward(edges)) == 2


def test_the_ir_is_a_floor_below_the_search_algorithm():
    """verifier, kernels and costmodel stand on ``search.ir``; an arrow from them into the
    search algorithm (``search``, ``search.driver``, ...) points up, and so does one from the
    IR into the algorithm."""
    tool = _tool()
    allowed = {"verifier.interp": {"search.ir"}, "kernels.lowering._lower": {"search.ir.graph"},
               "costmodel._features": {"search.ir"}, "search.driver": {"search.ir"},
               "cluster.runtime": {"search", "search.ir"}}
    assert tool.upward(allowed) == []
    for bad in ({"verifier.interp": {"search"}}, {"kernels.devices._base": {"search.driver"}},
                {"costmodel._features": {"search.enumerate"}}, {"search.ir.graph": {"search.space"}},
                {"db._models": {"search.ir"}}):
        assert len(tool.upward(bad)) == 1, bad


def test_imports_for_type_checking_count(tmp_path, monkeypatch):
    """An import under ``if TYPE_CHECKING:`` is an arrow like any other: a circle hidden there
    is still found."""
    tool = _tool()
    pkg = tmp_path / "search"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\n\n"
                              "if TYPE_CHECKING:\n    from .a import x\n")
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    assert tool.cycles(tool.graph()) == [["search.a", "search.b"]]


def test_the_dashboard_cannot_stand_on_the_launch():
    """tuner's rooms: the read-only dashboard may read identity and the job file, never the
    launch pipeline or the CLI."""
    tool = _tool()
    edges = {"tuner.dashboard.progress": {"tuner.identity", "tuner.pipeline.run"},
             "tuner.identity": set(), "tuner.pipeline.run": {"tuner.identity"}}
    assert tool.upward(edges) == ["tuner.dashboard.progress -> tuner.pipeline.run (a lower "
                                  "tuner room imports a higher one)"]


def test_other_layers_import_only_faces():
    """The one private-module rule (CONTRIBUTING.md): across layers, a package's face (or the
    IR's, or a room of kernels), never a module behind it, whatever its name."""
    tool = _tool()
    assert tool.private(tool.graph()) == []
    edges = {"tuner.x": {"kernels.devices._cuda", "kernels.devices", "search.ir.handwritten"},
             "cluster.y": {"search.ir.lang"}}
    assert tool.private(edges) == [
        "cluster.y -> search.ir.lang (import search.ir's face, not a module behind it)",
        "tuner.x -> kernels.devices._cuda (import kernels's face, not a module behind it)"]


def test_db_reads_only_the_trial_status_names_from_kernels():
    """db's one arrow out (docs/architecture.md): the status vocabulary, nothing else."""
    import ast

    from kernels.devices import _status

    allowed = set(_status.__all__)
    for path in sorted((ROOT / "db").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "kernels":
                names = {a.name for a in node.names}
                assert node.module == "kernels" and names <= allowed, (path, names - allowed)
            if isinstance(node, ast.Import):
                assert not any(a.name.split(".")[0] == "kernels" for a in node.names), path
