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
