"""Draw the project's import graph and check it: no circles, no upward arrows.

    .venv/bin/python tools/import_graph.py [--mermaid | --dot] [--modules]

Every ``import`` of every module of the packages counts: function-local ones (they are where
circles hide) and those under ``if TYPE_CHECKING:`` too (a circle a type checker must walk is
still a circle, and an arrow a reader must follow still points somewhere).  Two checks:

- circles: no two modules import each other, directly or around a loop;
- layers: a package imports only the packages below it (``LAYERS``, from the architecture
  doc; the IR, ``search.ir``, is a layer of its own below the search algorithm in
  ``search``), and inside ``kernels`` the rooms follow machine < device_names < hardware <
  lowering < rendering < devices < the tuning helpers, inside ``tuner`` formatting,
  samplers < jobfile < identity < api < serving < dashboard < pipeline < cli, mirage_compat <
  pytorch, so no arrow points up.

Prints the package graph (``--modules``: the module graph) as Mermaid or Graphviz DOT and the
violations; exits 1 when there is one.

A third check is the one private-module rule (CONTRIBUTING.md): across layers an import names a
face — a package's ``__init__.py`` (``FACES``: the packages, ``search.ir`` and the rooms of
``kernels``) — never a module behind it, whatever that module's name.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("search", "verifier", "kernels", "db", "costmodel", "cluster", "tuner")
# the layers: each top-level package, and the IR inside search as a layer of its own
SUBLAYERS = ("search.ir",)
# what each layer may import (architecture.md); a layer not here may import nothing ours
LAYERS = {
    "search.ir": set(),
    # db: only the trial statuses, from kernels' face (kernels/devices/_status.py, a leaf that
    # imports nothing: its devices produce them, db stores them)
    "db": {"kernels"},
    "search": {"search.ir"},
    "verifier": {"search.ir"},
    "kernels": {"search.ir", "verifier"},
    "costmodel": {"search.ir", "kernels", "db"},
    "cluster": {"search", "search.ir", "verifier", "kernels", "db"},
    "tuner": {"search", "search.ir", "verifier", "kernels", "db", "costmodel", "cluster"},
}
# the rooms of kernels, bottom first: a room may import the rooms before it
KERNEL_ROOMS = ("kernels.machine", "kernels.device_names", "kernels.hardware", "kernels.lowering",
                "kernels.rendering", "kernels.devices", ("kernels.configspace", "kernels.speedup"))
# the rooms of tuner's wings, bottom first: the read-only dashboard sits below the launch
# (``tuner.pipeline``) and the CLI, so it can never stand on them
TUNER_ROOMS = (("tuner.formatting", "tuner.samplers"), "tuner.jobfile", "tuner.identity",
               "tuner.api", "tuner.serving", "tuner.dashboard", "tuner.pipeline",
               ("tuner.cli", "tuner.mirage_compat"), "tuner.pytorch")
ROOMS = {"kernels": KERNEL_ROOMS, "tuner": TUNER_ROOMS}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports (relative imports resolved; ``from pkg import
    sub`` counts as importing ``pkg.sub`` when that is a module)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[:len(up) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                     for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != me:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES if (ROOT / pkg).is_dir()
             for p in sorted((ROOT / pkg).rglob("*.py"))]
    modules = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, modules) for p in files}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def layer_of(module: str) -> str:
    """The layer a module belongs to: ``search.ir`` for the IR, else its top-level package."""
    for sub in SUBLAYERS:
        if module == sub or module.startswith(sub + "."):
            return sub
    return module.split(".")[0]


def _room(module: str, rooms: tuple = KERNEL_ROOMS) -> int | None:
    for i, room in enumerate(rooms):
        for r in (room if isinstance(room, tuple) else (room,)):
            if module == r or module.startswith(r + "."):
                return i
    return None


def upward(edges: dict[str, set[str]]) -> list[str]:
    """Arrows that point up: across packages against LAYERS, inside kernels and tuner against
    their rooms."""
    out = []
    for a, targets in sorted(edges.items()):
        pa = layer_of(a)
        for b in sorted(targets):
            pb = layer_of(b)
            if pa != pb and pb not in LAYERS.get(pa, set()):
                out.append(f"{a} -> {b} ({pa} may not import {pb})")
            elif pa == pb and pa in ROOMS:
                ra, rb = _room(a, ROOMS[pa]), _room(b, ROOMS[pa])
                if ra is not None and rb is not None and rb > ra:
                    out.append(f"{a} -> {b} (a lower {pa} room imports a higher one)")
    return out


def faces() -> set[str]:
    """The modules other layers may import: each package's face, the IR's, kernels' rooms."""
    rooms = {r for room in KERNEL_ROOMS for r in (room if isinstance(room, tuple) else (room,))}
    return {*PACKAGES, *SUBLAYERS, *rooms}


def _exported(face: str) -> set[str]:
    """The names in a face's ``__all__`` (a name a face exports may also be a module's name:
    ``from search.ir import handwritten`` is the face's function)."""
    path = ROOT.joinpath(*face.split("."), "__init__.py")
    if not path.is_file():
        return set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__all__"
                                                for t in node.targets):
            try:
                return set(ast.literal_eval(node.value))
            except ValueError:
                return set()
    return set()


def private(edges: dict[str, set[str]]) -> list[str]:
    """Imports across layers that name a module behind a face."""
    allowed = faces()

    def ok(b: str) -> bool:
        parent, _, name = b.rpartition(".")
        return b in allowed or (parent in allowed and name in _exported(parent))

    return [f"{a} -> {b} (import {layer_of(b)}'s face, not a module behind it)"
            for a, targets in sorted(edges.items()) for b in sorted(targets)
            if layer_of(a) != layer_of(b) and not ok(b)]


def node_of(module: str) -> str:
    """A module's node in the drawn graph: its layer, or its room inside kernels."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "kernels" and len(parts) > 1 else layer_of(module)


def collapse(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The package graph (kernels shown as its rooms)."""
    out: dict[str, set[str]] = defaultdict(set)
    for a, targets in edges.items():
        ca = node_of(a)
        out[ca]
        for b in targets:
            if node_of(b) != ca:
                out[ca].add(node_of(b))
    return dict(out)


def draw(edges: dict[str, set[str]], fmt: str) -> str:
    ident = {n: n.replace(".", "_") for n in edges}
    if fmt == "dot":
        lines = ["digraph imports {", "  rankdir=BT;"]
        lines += [f'  "{a}" -> "{b}";' for a in sorted(edges) for b in sorted(edges[a])]
        return "\n".join([*lines, "}"])
    lines = ["graph BT"]
    lines += [f"  {ident[a]}[{a}]" for a in sorted(edges)]
    lines += [f"  {ident[a]} --> {ident.get(b, b.replace('.', '_'))}"
              for a in sorted(edges) for b in sorted(edges[a])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--mermaid", action="store_const", dest="fmt", const="mermaid")
    fmt.add_argument("--dot", action="store_const", dest="fmt", const="dot")
    parser.add_argument("--modules", action="store_true", help="every module, not packages")
    args = parser.parse_args(argv)
    edges = graph()
    shown = edges if args.modules else collapse(edges)
    print(draw(shown, args.fmt or "mermaid"))
    problems = [f"circle: {' <-> '.join(c)}" for c in cycles(edges)] + upward(edges) + \
        private(edges)
    for p in problems:
        print(p, file=sys.stderr)
    print(f"# {len(edges)} modules, {sum(map(len, edges.values()))} imports, "
          f"{len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
