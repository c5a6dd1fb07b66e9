"""Reading YAML nodes with their lines: the helpers every section of the validator uses.

The validator walks the composed node tree, not the loaded data, so each error names
``FILE:LINE: key.path``; these helpers check one node each and raise ``JobError`` there.
"""

from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any

import yaml

from .schema import JobError

Pairs = dict[str, tuple[yaml.Node, yaml.Node]]


class NodeReader:
    """One job file's text and loader; ``fail`` makes the error of a node."""

    def __init__(self, text: str, source: str, base_dir: Path) -> None:
        self.text, self.source, self.base_dir = text, source, base_dir
        self.loader = yaml.SafeLoader(text)

    # --- node helpers --------------------------------------------------------------------

    @staticmethod
    def line(node: yaml.Node | None) -> int:
        """The job-file line an error at ``node`` names (1: the file as a whole)."""
        return node.start_mark.line + 1 if node else 1

    def fail(self, node: yaml.Node | None, key: str, reason: str) -> JobError:
        return JobError(self.source, self.line(node), key, reason)

    def value(self, node: yaml.Node) -> Any:
        return self.loader.construct_document(node)

    @staticmethod
    def is_null(node: yaml.Node) -> bool:
        return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"

    def mapping(self, node: yaml.Node, path: str, keys: tuple[str, ...] | None,
                what: str) -> Pairs:
        """Key → (key node, value node); unknown and duplicate keys are errors."""
        if self.is_null(node):
            return {}
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, path, f"{what} must be a mapping"
                            + (f" with keys {', '.join(keys)}" if keys else "")
                            + "; write 'key: value' lines indented under it")
        self.loader.flatten_mapping(node)
        pairs: Pairs = {}
        for k, v in node.value:
            name = k.value if isinstance(k, yaml.ScalarNode) else None
            sub = f"{path}.{name}" if path else str(name)
            if not isinstance(name, str) or not name:
                raise self.fail(k, path or "job", "keys must be plain names; remove this key")
            if name in pairs:
                raise self.fail(k, sub, f"duplicate key (first on line "
                                f"{pairs[name][0].start_mark.line + 1}); keep one of them")
            if keys is not None and name not in keys:
                close = difflib.get_close_matches(name, keys, n=1)
                raise self.fail(k, sub, "unknown key; " + (f"did you mean {close[0]!r}? " if
                                close else "") + f"{what} takes {', '.join(keys)}")
            pairs[name] = (k, v)
        return pairs

    def integer(self, node: yaml.Node, path: str, lo: int, hi: int | None = None,
                null: bool = False) -> int | None:
        v = self.value(node)
        if v is None and null:
            return None
        if type(v) is not int or v < lo or (hi is not None and v > hi):
            span = f"from {lo} to {hi}" if hi is not None else f"at least {lo}"
            raise self.fail(node, path, f"got {v!r}; write a whole number {span}"
                            + (" (or null)" if null else ""))
        return v

    def seconds(self, node: yaml.Node, path: str, null: bool = True) -> float | None:
        v = self.value(node)
        if v is None and null:
            return None
        if v is None or isinstance(v, bool) or not isinstance(v, int | float) \
                or not math.isfinite(v) or v <= 0:
            raise self.fail(node, path, f"got {v!r}; write a number of seconds > 0"
                            + (", or null for no limit" if null else ""))
        return float(v)

    def string(self, node: yaml.Node, path: str, hint: str) -> str:
        v = self.value(node)
        if not isinstance(v, str) or not v.strip():
            raise self.fail(node, path, f"got {v!r}; {hint}")
        return v.strip()
