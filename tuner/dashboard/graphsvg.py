"""A µGraph (canonical JSON object) drawn as SVG: ops as boxes in layers, top to bottom, an
arrow per operand.  The kernel graph is one drawing; each graph-defined kernel's block graph is
another, titled with its grid, for-loop range and block size.  Every label is escaped here, so
the markup can be put in a page as it is."""

from __future__ import annotations

from html import escape
from typing import Any

BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 170, 44, 24, 38, 12
KIND_CLASS = {"input": "in", "output": "out", "graph_kernel": "gk"}


def _outputs(entry: dict) -> int:
    kind = entry.get("op")
    if kind == "output":
        return 0
    if kind == "graph_kernel":
        ops = (entry.get("block_graph") or {}).get("ops") or []
        return max(1, sum(1 for o in ops if o.get("op") == "output"))
    return 1


def _label(entry: dict, block: bool) -> tuple[str, str]:
    kind = str(entry.get("op", "?"))
    name = entry.get("name")
    head = f"{kind} {name}" if name else kind
    details = []
    if kind == "input" and not block:
        details.append("x".join(map(str, entry.get("shape") or [])))
        if entry.get("dtype"):
            details.append(str(entry["dtype"]))
    if kind == "input" and block:
        details.append(f"in {entry.get('index')} imap {tuple(entry.get('imap') or ())}")
        details.append(f"fmap {entry.get('fmap')}")
    if kind == "output" and block:
        details.append(f"omap {tuple(entry.get('omap') or ())}")
    if kind == "accum":
        details.append(str(entry.get("kind", "")))
    if kind == "graph_kernel":
        bg = entry.get("block_graph") or {}
        details.append(f"grid {tuple(bg.get('grid') or ())} F={bg.get('forloop_range')}")
    for key in ("dim", "dims", "axis", "value", "kind") if kind not in ("accum",) else ():
        if key in entry and key != "kind":
            details.append(f"{key}={entry[key]}")
    return head, " ".join(str(d) for d in details)


def draw(ops: list[dict], block: bool = False, title: str = "") -> str:
    """One graph's SVG markup (escaped labels)."""
    producer: dict[int, int] = {}
    tensor = 0
    for i, entry in enumerate(ops):
        for _ in range(_outputs(entry)):
            producer[tensor] = i
            tensor += 1
    layer: list[int] = []
    for entry in ops:
        srcs = [producer[t] for t in entry.get("in") or [] if t in producer]
        layer.append(1 + max((layer[s] for s in srcs), default=-1))
    rows: dict[int, list[int]] = {}
    for i, lay in enumerate(layer):
        rows.setdefault(lay, []).append(i)
    widest = max((len(v) for v in rows.values()), default=1)
    width = max(PAD * 2 + widest * BOX_W + (widest - 1) * GAP_X, PAD * 2 + 7 * len(title))
    top = PAD + (22 if title else 0)
    height = top + len(rows) * (BOX_H + GAP_Y) - GAP_Y + PAD
    pos: dict[int, tuple[float, float]] = {}
    for lay, members in sorted(rows.items()):
        row_w = len(members) * BOX_W + (len(members) - 1) * GAP_X
        x0 = (width - row_w) / 2
        for k, i in enumerate(members):
            pos[i] = (x0 + k * (BOX_W + GAP_X), top + lay * (BOX_H + GAP_Y))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="mugraph" width="{width:.0f}" '
           f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" role="img">',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
           'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z"/>'
           '</marker></defs>']
    if title:
        out.append(f'<text x="{PAD}" y="{PAD + 10}" class="title">{escape(title)}</text>')
    for i, entry in enumerate(ops):
        x, y = pos[i]
        for t in entry.get("in") or []:
            if t in producer:
                sx, sy = pos[producer[t]]
                out.append(f'<line x1="{sx + BOX_W / 2:.0f}" y1="{sy + BOX_H:.0f}" '
                           f'x2="{x + BOX_W / 2:.0f}" y2="{y:.0f}" marker-end="url(#arrow)"/>')
    for i, entry in enumerate(ops):
        x, y = pos[i]
        head, detail = _label(entry, block)
        cls = KIND_CLASS.get(str(entry.get("op")), "op")
        out.append(f'<g class="node {cls}"><title>{escape(head)} {escape(detail)}</title>'
                   f'<rect x="{x:.0f}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="6"/>'
                   f'<text x="{x + BOX_W / 2:.0f}" y="{y + 18:.0f}">{escape(head[:26])}</text>'
                   f'<text x="{x + BOX_W / 2:.0f}" y="{y + 34:.0f}" class="detail">'
                   f'{escape(detail[:30])}</text></g>')
    out.append("</svg>")
    return "".join(out)


def drawings(structure: Any) -> list[str]:
    """The kernel graph, then each graph-defined kernel's block graph."""
    if not isinstance(structure, dict) or not isinstance(structure.get("ops"), list):
        return []
    ops = structure["ops"]
    out = [draw(ops, title="kernel graph")]
    for n, entry in enumerate(ops):
        bg = entry.get("block_graph") if isinstance(entry, dict) else None
        if isinstance(bg, dict) and isinstance(bg.get("ops"), list):
            title = (f"block graph of op {n}: grid {tuple(bg.get('grid') or ())}, "
                     f"for-loop {bg.get('forloop_range')}, block {tuple(bg.get('block') or ())}")
            out.append(draw(bg["ops"], block=True, title=title))
    return out
